//! Where each frame of a DWARF sample lay on its thread's stack: its
//! canonical frame address (CFA), the value the stack pointer had in the
//! caller just before the call (DWARF 5, §6.4 "Call Frame Information";
//! on x86-64 the return address is the 8 bytes below it).
//!
//! `perf script` gives each frame's address and name, not its place on the
//! stack. So the report unwinds each sample's stack copy once more, with
//! framehop (docs/dependencies.md) and the same `.eh_frame` tables perf
//! uses, read from the run's build-id cache or, without one, from the
//! objects' paths. A frame whose return address lies beyond the copy still
//! gets its CFA: the unwinder asks for the return address there, and
//! [`BEYOND`] stands in for it, so the CFA is computed before the read
//! would fail. The frames perf gave are then matched to these by address
//! (report/samples.rs), and cut stacks are completed from other stacks
//! that had the same frame at the same CFA (report/graft.rs, `Links`;
//! docs/unwinding.md, "Completing cut stacks by frame address").

use std::{
    collections::HashMap,
    fs::File,
    io::{BufReader, Read as _},
    ops::Range,
    path::Path,
    sync::Arc,
};

use framehop::{
    ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder as _,
    x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
};
use linux_perf_data::{
    PerfFileReader, PerfFileRecord,
    linux_perf_event_reader::{
        EventRecord, Mmap2FileId, RawData, SampleRecord,
        constants::{PERF_REG_X86_BP, PERF_REG_X86_IP, PERF_REG_X86_SP},
    },
};
use object::{Object as _, ObjectSection as _, ObjectSegment as _};

use crate::{
    capture::build_id_cache,
    sys::safe_open::{Dir, Scope},
};

/// What the unwinder reads for an address past the end of a stack copy: a
/// return address no code has (the top of the non-canonical hole), so
/// the frame below it is known to be the copy's last, with its CFA.
const BEYOND: u64 = 0x5eed_0000_0000_0000;

/// The most frames followed in one stack (perf's own limit is 127 by
/// default, `kernel.perf_event_max_stack`; deeper recursion is cut).
const MAX_FRAMES: usize = 512;

/// The CFA given to a thread's first frame: above every other, as a
/// caller's CFA is above its callee's.
pub const FIRST_FRAME: u64 = u64::MAX;

/// One frame as the unwinder found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Index in [`Unwinds::objects`]; `u32::MAX` outside every mapping.
    pub object: u32,
    /// The address as `perf script` prints it: relative to the object's
    /// mapping (`map__map_ip`), and one less for a return address (perf
    /// names the call instruction, not the one after it).
    pub ip: u64,
    /// The frame's CFA; [`FIRST_FRAME`] for the thread's first frame,
    /// which the unwinder found nothing beyond.
    pub cfa: u64,
    /// Where the frame's function starts, as the object states it (the
    /// initial location of the `.eh_frame` entry holding it); 0 where not
    /// known. It tells apart the functions perf cannot name.
    pub function: u64,
}

/// One sample's frames, leaf first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unwound {
    /// The user stack pointer when the sample was taken: where its copy
    /// starts.
    pub sp: u64,
    pub frames: Vec<Frame>,
    /// The unwinder found the stack's end (a return address of 0, or the
    /// outermost frame's unwind rule says so): the last frame is the
    /// thread's first.
    pub reached_end: bool,
}

/// The samples of one perf.data file, unwound, by (tid, time).
#[derive(Debug, Default)]
pub struct Unwinds {
    /// The mapped files, as perf names them (the mmap's path).
    pub objects: Vec<String>,
    samples: HashMap<(u32, u64), Vec<Unwound>>,
}

impl Unwinds {
    /// The next unwound sample of thread `tid` at `time_ns` (perf's sample
    /// time), in file order.
    pub fn take(&mut self, tid: u32, time_ns: u64) -> Option<Unwound> {
        let list = self.samples.get_mut(&(tid, time_ns))?;
        (!list.is_empty()).then(|| list.remove(0))
    }
}

/// Unwinds every sample of `file` that carries a user stack copy and user
/// registers. Objects come from `buildid_dir` (the run's build-id cache,
/// by the build-id perf recorded) when it holds them, else from their
/// paths when their build-id matches. Errors: the file is not perf.data.
pub fn unwind(file: &File, buildid_dir: Option<&Path>) -> Result<Unwinds, String> {
    // A description of its own, at offset 0: the caller's offset stays.
    let f = super::jitdump::reopen(file).map_err(|e| e.to_string())?;
    let reader = PerfFileReader::parse_file(BufReader::with_capacity(1 << 20, f))
        .map_err(|e| format!("reading perf.data: {e}"))?;
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = reader;
    let build_ids: HashMap<Vec<u8>, Vec<u8>> = perf_file
        .build_ids()
        .unwrap_or_default()
        .into_values()
        .map(|d| (d.path, d.build_id))
        .collect();
    let mut state = State {
        loader: Loader::new(buildid_dir, build_ids),
        processes: HashMap::new(),
        cache: CacheX86_64::new(),
        out: Unwinds::default(),
    };
    while let Ok(Some(r)) = record_iter.next_record(&mut perf_file) {
        if let PerfFileRecord::EventRecord { record, .. } = r
            && let Ok(e) = record.parse()
        {
            state.record(e);
        }
    }
    Ok(state.out)
}

/// A mapping of a process: its addresses and what perf names it by.
#[derive(Clone)]
struct Map {
    avma: Range<u64>,
    pgoff: u64,
    object: u32,
    /// The object's unwind tables, and where its address 0 is mapped.
    code: Option<(Arc<Sections>, u64)>,
}

#[derive(Clone, Default)]
struct Process {
    unwinder: UnwinderX86_64<Arc<[u8]>>,
    maps: Vec<Map>,
}

struct State {
    loader: Loader,
    processes: HashMap<i32, Process>,
    cache: CacheX86_64,
    out: Unwinds,
}

impl State {
    fn record(&mut self, e: EventRecord) {
        match e {
            EventRecord::Mmap2(m) => {
                let build_id = match &m.file_id {
                    Mmap2FileId::BuildId(b) => Some(b.clone()),
                    Mmap2FileId::InodeAndVersion(_) => None,
                };
                let exec = m.protection & libc::PROT_EXEC as u32 != 0;
                let at = (m.address..m.address + m.length, m.page_offset);
                self.map(m.pid, at, m.path.as_slice().to_vec(), build_id, exec);
            }
            EventRecord::Mmap(m) => {
                let at = (m.address..m.address + m.length, m.page_offset);
                self.map(m.pid, at, m.path.as_slice().to_vec(), None, m.is_executable);
            }
            EventRecord::Fork(f) if f.pid != f.ppid => {
                let parent = self.processes.get(&f.ppid).cloned().unwrap_or_default();
                self.processes.insert(f.pid, parent);
            }
            EventRecord::Comm(c) if c.is_execve => {
                self.processes.insert(c.pid, Process::default());
            }
            EventRecord::Sample(s) => self.sample(&s),
            _ => {}
        }
    }

    /// Maps `path` in `pid` at (addresses, file offset).
    fn map(
        &mut self,
        pid: i32,
        (avma, pgoff): (Range<u64>, u64),
        path: Vec<u8>,
        build_id: Option<Vec<u8>>,
        exec: bool,
    ) {
        let name = String::from_utf8_lossy(&path).into_owned();
        let object = match self.out.objects.iter().position(|o| *o == name) {
            Some(i) => i as u32,
            None => {
                self.out.objects.push(name.clone());
                (self.out.objects.len() - 1) as u32
            }
        };
        let code = (exec && name.starts_with('/'))
            .then(|| self.loader.sections(&path, build_id))
            .flatten()
            .map(|s| {
                let base = s.base(&avma, pgoff);
                (s, base)
            });
        let p = self.processes.entry(pid).or_default();
        p.maps
            .retain(|m| m.avma.end <= avma.start || m.avma.start >= avma.end);
        if let Some((s, base)) = &code {
            p.unwinder.add_module(s.module(&name, avma.clone(), *base));
        }
        p.maps.push(Map {
            avma,
            pgoff,
            object,
            code,
        });
    }

    fn sample(&mut self, s: &SampleRecord) {
        let (Some(pid), Some(tid), Some(time)) = (s.pid, s.tid, s.timestamp) else {
            return;
        };
        let (Some((stack, dyn_size)), Some(regs)) = (&s.user_stack, &s.user_regs) else {
            return;
        };
        let Some(p) = self.processes.get(&pid) else {
            return;
        };
        let bytes: std::borrow::Cow<[u8]> = match stack {
            RawData::Single(b) => (*b).into(),
            RawData::Split(a, b) => [*a, *b].concat().into(),
        };
        let copy = &bytes[..(*dyn_size as usize).min(bytes.len())];
        let reg = |r| regs.get(r).unwrap_or(0);
        let start = (
            reg(PERF_REG_X86_IP),
            reg(PERF_REG_X86_SP),
            reg(PERF_REG_X86_BP),
        );
        let unwound = unwind_copy(p, &mut self.cache, start, copy);
        let key = (tid as u32, time);
        self.out.samples.entry(key).or_default().push(unwound);
    }
}

/// Unwinds one stack copy taken at `(ip, sp, bp)`.
fn unwind_copy(
    p: &Process,
    cache: &mut CacheX86_64,
    start: (u64, u64, u64),
    copy: &[u8],
) -> Unwound {
    let (ip, sp, bp) = start;
    let mut read = |a: u64| -> Result<u64, ()> {
        let at = usize::try_from(a.checked_sub(sp).ok_or(())?).map_err(|_| ())?;
        match copy.get(at..at + 8) {
            Some(w) => Ok(u64::from_le_bytes(w.try_into().expect("8 bytes"))),
            None => Ok(BEYOND),
        }
    };
    let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
    let mut address = FrameAddress::from_instruction_pointer(ip);
    let mut out = Unwound {
        sp,
        ..Unwound::default()
    };
    while out.frames.len() < MAX_FRAMES {
        let step = p
            .unwinder
            .unwind_frame(address, &mut regs, cache, &mut read);
        let here = address.address();
        let (object, ip, function) =
            p.perf_ip(here, matches!(address, FrameAddress::ReturnAddress(_)));
        match step {
            Ok(Some(ra)) => {
                out.frames.push(Frame {
                    object,
                    ip,
                    cfa: regs.sp(),
                    function,
                });
                match FrameAddress::from_return_address(ra) {
                    Some(next) if ra != BEYOND => address = next,
                    _ => break,
                }
            }
            Ok(None) => {
                // The end of the stack: this frame is the first, and
                // nothing lies beyond it.
                out.frames.push(Frame {
                    object,
                    ip,
                    cfa: FIRST_FRAME,
                    function,
                });
                out.reached_end = true;
                break;
            }
            Err(_) => break,
        }
    }
    out
}

impl Process {
    /// `address` as perf prints it, with its object and its function's
    /// start ([`Frame`]).
    fn perf_ip(&self, address: u64, is_return: bool) -> (u32, u64, u64) {
        let address = address - u64::from(is_return);
        match self.maps.iter().find(|m| m.avma.contains(&address)) {
            Some(m) => {
                let function = m
                    .code
                    .as_ref()
                    .and_then(|(s, base)| s.function_start(address.wrapping_sub(*base)));
                let ip = address - m.avma.start + m.pgoff;
                (m.object, ip, function.unwrap_or(0))
            }
            None => (u32::MAX, address, 0),
        }
    }
}

/// What framehop needs of an object, read once per (path, build-id).
struct Sections {
    eh_frame: Option<(Range<u64>, Arc<[u8]>)>,
    eh_frame_hdr: Option<(Range<u64>, Arc<[u8]>)>,
    text: Option<Range<u64>>,
    got: Option<Range<u64>>,
    /// (file offset, file size, address) of each loadable segment.
    segments: Vec<(u64, u64, u64)>,
}

impl Sections {
    fn read(file: &File) -> Option<Sections> {
        let data = object::ReadCache::new(file);
        let elf = object::File::parse(&data).ok()?;
        let section = |name: &str| {
            let s = elf.section_by_name(name)?;
            Some((
                s.address()..s.address() + s.size(),
                Arc::<[u8]>::from(s.data().ok()?),
            ))
        };
        let range = |name: &str| {
            elf.section_by_name(name)
                .map(|s| s.address()..s.address() + s.size())
        };
        let segments = elf
            .segments()
            .map(|s| {
                let (offset, size) = s.file_range();
                (offset, size, s.address())
            })
            .collect();
        Some(Sections {
            eh_frame: section(".eh_frame"),
            eh_frame_hdr: section(".eh_frame_hdr"),
            text: range(".text"),
            got: range(".got"),
            segments,
        })
    }

    /// Where this object's address 0 is, mapped at `avma` from file offset
    /// `pgoff`: its addresses are the object's shifted by where the
    /// segment that mapping starts was put. That segment is the one whose
    /// page-aligned start is `pgoff` (an earlier segment may still hold
    /// that offset: Rust's executables start the code one page after the
    /// offset in the file, `p_vaddr = p_offset + 0x1000`).
    fn base(&self, avma: &Range<u64>, pgoff: u64) -> u64 {
        let page = |o: u64| o & !0xfff;
        let segment = self
            .segments
            .iter()
            .find(|(offset, _, _)| page(*offset) == pgoff)
            .or_else(|| {
                self.segments
                    .iter()
                    .find(|(offset, size, _)| (page(*offset)..offset + size).contains(&pgoff))
            });
        // A file offset o is at avma.start + (o - pgoff); the segment maps
        // its offset to its address.
        segment.map_or(avma.start, |(offset, _, vaddr)| {
            (avma.start + offset).wrapping_sub(pgoff + vaddr)
        })
    }

    /// The module for this object mapped at `avma`, its address 0 at
    /// `base`.
    fn module(&self, name: &str, avma: Range<u64>, base: u64) -> Module<Arc<[u8]>> {
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text.clone(),
            got_svma: self.got.clone(),
            eh_frame_svma: self.eh_frame.as_ref().map(|s| s.0.clone()),
            eh_frame: self.eh_frame.as_ref().map(|s| s.1.clone()),
            eh_frame_hdr_svma: self.eh_frame_hdr.as_ref().map(|s| s.0.clone()),
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(|s| s.1.clone()),
            ..Default::default()
        };
        Module::new(name.to_string(), avma, base, info)
    }

    /// Where the function holding the object's address `svma` starts.
    fn function_start(&self, svma: u64) -> Option<u64> {
        let (range, hdr) = self.eh_frame_hdr.as_ref()?;
        function_start(hdr, range.start, svma)
    }
}

/// Where the function holding `svma` starts, from `.eh_frame_hdr`'s table
/// (at `hdr_svma`): the greatest initial location at or below `svma`. The
/// header is `version, eh_frame_ptr_enc, fde_count_enc, table_enc`, then
/// the pointer to `.eh_frame` and the count, then the sorted (initial
/// location, entry) pairs (the Linux Standard Base, "Exception Frames",
/// `.eh_frame_hdr`). Only the layout every GNU linker writes is read:
/// version 1, a 4-byte pointer, a `udata4` count and a `datarel | sdata4`
/// table; `None` for another.
pub fn function_start(hdr: &[u8], hdr_svma: u64, svma: u64) -> Option<u64> {
    const UDATA4: u8 = 0x03;
    const DATAREL_SDATA4: u8 = 0x3b;
    if hdr.len() < 12 || hdr[0] != 1 || hdr[1] & 0x0f != 0x0b || hdr[2] != UDATA4 {
        return None;
    }
    if hdr[3] != DATAREL_SDATA4 {
        return None;
    }
    let count = u32::from_le_bytes(hdr[8..12].try_into().ok()?) as usize;
    let table = hdr.get(12..12 + count.checked_mul(8)?)?;
    let start = |i: usize| {
        let rel = i32::from_le_bytes(table[8 * i..8 * i + 4].try_into().expect("4 bytes"));
        hdr_svma.wrapping_add_signed(i64::from(rel))
    };
    // The first entry starting above `svma`; the one before holds it.
    let (mut lo, mut hi) = (0, count);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if start(mid) <= svma {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo.checked_sub(1).map(start)
}

/// An object by (path, build-id).
type ObjectKey = (Vec<u8>, Option<Vec<u8>>);

/// Finds and reads the objects, once each.
struct Loader {
    cache_dir: Option<Dir>,
    /// perf.data's build-id table (`HEADER_BUILD_ID`): path → build-id.
    build_ids: HashMap<Vec<u8>, Vec<u8>>,
    read: HashMap<ObjectKey, Option<Arc<Sections>>>,
}

impl Loader {
    fn new(buildid_dir: Option<&Path>, build_ids: HashMap<Vec<u8>, Vec<u8>>) -> Self {
        Loader {
            cache_dir: buildid_dir.and_then(|d| Dir::open(d).ok()),
            build_ids,
            read: HashMap::new(),
        }
    }

    fn sections(&mut self, path: &[u8], build_id: Option<Vec<u8>>) -> Option<Arc<Sections>> {
        let build_id = build_id.or_else(|| self.build_ids.get(path).cloned());
        let key = (path.to_vec(), build_id);
        if let Some(s) = self.read.get(&key) {
            return s.clone();
        }
        let s = self
            .open(&key.0, key.1.as_deref())
            .and_then(|f| Sections::read(&f))
            .map(Arc::new);
        self.read.insert(key, s.clone());
        s
    }

    /// The object: the build-id cache's copy, else the file at its path
    /// if it is the one recorded (same build-id, where one was).
    fn open(&self, path: &[u8], build_id: Option<&[u8]>) -> Option<File> {
        let path = Path::new(std::str::from_utf8(path).ok()?);
        let hex = build_id.map(build_id_cache::hex);
        if let (Some(dir), Some(hex)) = (&self.cache_dir, &hex) {
            // The cache's `.build-id` link, relative to its root.
            let (_, link, _) = build_id_cache::layout(Path::new(""), path, hex);
            if let Ok(o) = dir.open_file(&link.join("elf"), Scope::InRoot) {
                return Some(o.file);
            }
        }
        let mut o = crate::sys::safe_open::open_labelled(path).ok()?;
        let mut magic = [0u8; 4];
        (o.file.read_exact(&mut magic).is_ok() && magic == *b"\x7fELF").then_some(())?;
        if let Some(want) = build_id {
            let found = crate::symbols::elf::gnu_build_id(&object::ReadCache::new(&o.file));
            (found.as_deref() == Some(want)).then_some(())?;
        }
        Some(o.file)
    }
}

/// Kernel addresses (the upper half), which perf prints as they are.
const KERNEL_START: u64 = 0xffff_8000_0000_0000;

/// Whether perf's frame `(ip, object)` is a kernel one (they come first).
pub fn is_kernel(ip: u64, object: &str) -> bool {
    ip >= KERNEL_START || object == "[kernel.kallsyms]"
}

/// How many of a sample's frames perf unwinds from a copy of `bytes` bytes
/// taken at stack pointer `sp`, given the CFA of each (`cfas`, parallel to
/// its frames with the whole copy, 0 where unknown; kernel frames first,
/// which `kernel` counts): the kernel ones, the leaf, then each frame whose
/// callee's CFA is below `sp + bytes`, as the frame's return address lies
/// just below its callee's CFA. perf's libunwind reads a word only where it
/// ends before the copy's end (`addr + sizeof(unw_word_t) >= end` is refused
/// in `access_mem()`, tools/perf/util/unwind-libunwind-local.c): a return
/// address in the copy's last 8 bytes is not read. An inlined frame shares
/// its frame's CFA and goes with it; an unknown CFA ends the stack.
/// Checked against perf script on PostgreSQL's samples cut to 1024, 1536,
/// 2048 and 4096 bytes: the same number of frames for 2,844 of 2,845.
pub fn frames_in_copy(cfas: &[u64], kernel: usize, sp: u64, bytes: u64) -> usize {
    let end = sp.saturating_add(bytes);
    let user = &cfas[kernel.min(cfas.len())..];
    let mut kept = user.len().min(1);
    while kept < user.len() {
        let callee = user[kept - 1];
        let inlined = user[kept] == callee && callee != 0;
        if !inlined && (callee == 0 || callee >= end) {
            break;
        }
        kept += 1;
    }
    kernel.min(cfas.len()) + kept
}

/// What perf prints for the object of an inlined function's frame
/// (`(inlined)`, perf 6.1 without `--no-inline`).
pub const INLINED: &str = "inlined";

/// Which of `u`'s frames each of perf's frames of one sample is: `perf`
/// is the sample's frames as `perf script` printed them (leaf first;
/// address and object), `u` the same sample unwound here, naming its
/// objects from `objects`. Kernel frames, which come first, are passed
/// over; then perf's frames and `u`'s are matched in order by address and
/// object. An inlined function's frame has the address of the frame it was
/// inlined into and [`INLINED`] for an object: the first of them takes the
/// next frame, the others the frame before. From the first frame that does
/// not match, `None`. Also returns whether the stack is whole: `u` reached
/// the stack's end and perf's frames matched all of `u`'s.
pub fn align(perf: &[(u64, &str)], u: &Unwound, objects: &[String]) -> (Vec<Option<usize>>, bool) {
    let mut out = vec![None; perf.len()];
    let mut k = 0;
    let mut previous: Option<u64> = None;
    let mut all = true;
    for (i, &(ip, object)) in perf.iter().enumerate() {
        if previous.is_none() && is_kernel(ip, object) {
            continue;
        }
        let next = u.frames.get(k).filter(|f| f.ip == ip);
        let named = |f: &&Frame| objects.get(f.object as usize).is_some_and(|o| o == object);
        if next.filter(named).is_some()
            || (next.is_some() && object == INLINED && previous != Some(ip))
        {
            out[i] = Some(k);
            k += 1;
        } else if previous == Some(ip) {
            out[i] = Some(k - 1);
        } else {
            all = false;
            break;
        }
        previous = Some(ip);
    }
    let whole = all && u.reached_end && k == u.frames.len();
    (out, whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unwound(frames: &[(u32, u64, u64)], reached_end: bool) -> Unwound {
        Unwound {
            sp: 0x1000,
            frames: frames
                .iter()
                .map(|&(object, ip, cfa)| Frame {
                    object,
                    ip,
                    cfa,
                    function: ip & !0xf,
                })
                .collect(),
            reached_end,
        }
    }

    #[test]
    fn a_functions_start_is_read_from_the_eh_frame_hdr_table() {
        // Functions at 0x1000, 0x1100 and 0x1300; the header at 0x800.
        let mut hdr = vec![1, 0x1b, 0x03, 0x3b];
        hdr.extend_from_slice(&0i32.to_le_bytes());
        hdr.extend_from_slice(&3u32.to_le_bytes());
        for f in [0x1000i32, 0x1100, 0x1300] {
            hdr.extend_from_slice(&(f - 0x800).to_le_bytes());
            hdr.extend_from_slice(&0i32.to_le_bytes());
        }
        let at = |svma| function_start(&hdr, 0x800, svma);
        assert_eq!(at(0x1000), Some(0x1000));
        assert_eq!(at(0x10ff), Some(0x1000));
        assert_eq!(at(0x1250), Some(0x1100));
        assert_eq!(at(0x5000), Some(0x1300));
        assert_eq!(at(0xfff), None);
        // Another table encoding is not read.
        let mut other = hdr.clone();
        other[3] = 0x1b;
        assert_eq!(function_start(&other, 0x800, 0x1000), None);
        assert_eq!(function_start(&hdr[..20], 0x800, 0x1000), None);
    }

    #[test]
    fn a_smaller_copy_keeps_the_frames_whose_return_address_it_holds() {
        // One kernel frame, then frames with CFAs 0x1040, 0x1080 (and an
        // inlined frame with it), 0x1100; sp 0x1000.
        let cfas = [0, 0x1040, 0x1080, 0x1080, 0x1100, FIRST_FRAME];
        let at = |bytes| frames_in_copy(&cfas, 1, 0x1000, bytes);
        // The leaf is always there; the next needs its return address at
        // 0x1038..0x1040, before the end.
        assert_eq!(at(0x40), 2);
        assert_eq!(at(0x48), 4);
        assert_eq!(at(0x88), 5);
        assert_eq!(at(0x1000), 6);
        // An unknown CFA ends the stack.
        assert_eq!(frames_in_copy(&[0x1040, 0, 0x1100], 0, 0x1000, 0x1000), 2);
        assert_eq!(frames_in_copy(&[], 0, 0x1000, 0x40), 0);
    }

    #[test]
    fn perfs_frames_get_the_cfas_of_the_frames_they_match() {
        let objects = vec!["/bin/t".to_string(), "/lib/libc.so.6".to_string()];
        let u = unwound(
            &[(1, 0x10, 100), (0, 0x20, 200), (0, 0x30, FIRST_FRAME)],
            true,
        );
        // Kernel frames first, an inlined frame (perf prints the address
        // of the frame it is in, and `(inlined)`), an inlined frame alone.
        let perf = [
            (0xffffffff81000000, "[kernel.kallsyms]"),
            (0x10, "/lib/libc.so.6"),
            (0x20, INLINED),
            (0x20, "/bin/t"),
            (0x30, INLINED),
        ];
        let cfas = |perf: &[(u64, &str)], u: &Unwound| {
            let (at, whole) = align(perf, u, &objects);
            let c: Vec<u64> = at
                .iter()
                .map(|k| k.map_or(0, |k| u.frames[k].cfa))
                .collect();
            (c, whole)
        };
        assert_eq!(cfas(&perf, &u), (vec![0, 100, 200, 200, FIRST_FRAME], true));
        // Recursion: the same address twice is two frames.
        let r = unwound(&[(0, 0x20, 200), (0, 0x20, 300)], false);
        let twice = [(0x20, "/bin/t"), (0x20, "/bin/t")];
        assert_eq!(cfas(&twice, &r).0, vec![200, 300]);
        // perf stopped early: not whole; a frame that differs ends the
        // match, and perf's garbage frame after a cut copy gets nothing.
        assert_eq!(cfas(&perf[..3], &u), (vec![0, 100, 200], false));
        let other = [(0x10, "/lib/libc.so.6"), (0x28, "/bin/t"), (0x30, "/bin/t")];
        assert_eq!(cfas(&other, &u), (vec![100, 0, 0], false));
        // The unwinder found an end where perf went on: not whole.
        let short = unwound(&[(1, 0x10, FIRST_FRAME)], true);
        assert_eq!(cfas(&perf, &short), (vec![0, FIRST_FRAME, 0, 0, 0], false));
        let cut = unwound(&[(1, 0x10, 100), (0, 0x20, 200)], false);
        let garbage = [
            (0x10, "/lib/libc.so.6"),
            (0x20, "/bin/t"),
            (u64::MAX, "[unknown]"),
        ];
        assert_eq!(cfas(&garbage, &cut), (vec![100, 200, 0], false));
    }
}
