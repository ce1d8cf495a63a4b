//! A snapshot's JIT code named from the jitdump files the run kept
//! (capture/jit_maps.rs), through `perf inject --jit` (docs/jit-maps.md,
//! "Jitdump files in the report").
//!
//! perf inject finds a jitdump by the `PERF_RECORD_MMAP2` of a file named
//! `jit-<pid>.dump`, opens it at the path that record names, and writes one
//! ELF file per function next to it (`jit_detect()`, `jit_open()`,
//! `jit_repipe_code_load()` in tools/perf/util/jitdump.c). Once the process
//! is gone that path is gone too, and the report must not write beside it
//! anyway. So the report gives perf a copy of the snapshot where that
//! record names `./jit-<pid>.dump`, and runs perf inject in a temporary
//! directory holding the kept prefix there: the ELF files are written
//! there as `./jitted-<pid>-<n>.so`, and `perf script` reads them from it.
//!
//! The pure parts, unit-tested: [`rewrite_marks`] (the perf.data copy) and
//! [`copy_dump`] (the jitdump copy, its records given the pid perf.data
//! names: a process in a pid namespace writes its own pid there, and perf
//! inject gives the functions' mmaps that pid).

use std::{
    fs::File,
    io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write},
    os::unix::process::CommandExt as _,
    path::Path,
    process::Stdio,
};

use crate::capture::jit_maps::KeptDump;

/// perf.data's file header (`struct perf_file_header`,
/// tools/perf/util/header.h): magic, size, attr_size, then the attrs, data
/// and event_types sections ({offset, size}, u64 each) and the feature
/// bitmap (256 bits).
const FILE_HEADER_BYTES: usize = 104;
pub const DATA_SECTION_AT: usize = 40;
const FEATURES_AT: usize = 72;
/// `HEADER_CMDLINE`, the feature bit of perf's command line.
const HEADER_CMDLINE: usize = 11;
const PERF_RECORD_MMAP: u32 = 1;
const PERF_RECORD_MMAP2: u32 = 10;
/// Where the file name starts in those records (include/uapi/linux/
/// perf_event.h): after the header, pid, tid, start, len, pgoff, and for
/// MMAP2 the device/inode (or build-id) block, prot and flags.
const MMAP_NAME_AT: usize = 40;
const MMAP2_NAME_AT: usize = 72;

/// What [`rewrite_marks`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Rewritten {
    /// Records renamed: mmaps of a `jit-<pid>.dump` file.
    pub marks: usize,
    /// The recording's command line (the `HEADER_CMDLINE` feature, its
    /// words joined by spaces as `perf script --header` prints them):
    /// perf inject writes its own.
    pub cmdline: Option<String>,
}

/// Copies perf.data `src` to `dst`, renaming every mmap of a
/// `.../jit-<N>.dump` file to `./jit-<pid>.dump`, `pid` being the
/// record's. A renamed record changes size, so the data section's size and
/// the feature sections' offsets, which follow it, move by as much.
/// Errors: not a little-endian perf.data file (`PERFILE2`), a malformed
/// record, I/O.
pub fn rewrite_marks(
    src: &mut (impl Read + Seek),
    dst: &mut (impl Write + Seek),
) -> io::Result<Rewritten> {
    let mut header = [0u8; FILE_HEADER_BYTES];
    src.seek(SeekFrom::Start(0))?;
    src.read_exact(&mut header)?;
    if &header[..8] != b"PERFILE2" {
        return Err(bad("not a little-endian perf.data file"));
    }
    let (data_at, data_size) = (
        u64_at(&header, DATA_SECTION_AT),
        u64_at(&header, DATA_SECTION_AT + 8),
    );
    src.seek(SeekFrom::Start(0))?;
    let copied = io::copy(&mut (&mut *src).take(data_at), dst)?;
    if copied != data_at {
        return Err(bad("the file ends before its data section"));
    }
    let mut out = Rewritten::default();
    let new_size = copy_records(&mut (&mut *src).take(data_size), dst, &mut out.marks)?;
    let delta = new_size as i64 - data_size as i64;
    let features: Vec<usize> = (0..256)
        .filter(|&b| header[FEATURES_AT + b / 8] & (1 << (b % 8)) != 0)
        .collect();
    let mut table = vec![0u8; features.len() * 16];
    src.read_exact(&mut table)?;
    let sections: Vec<(u64, u64)> = (0..features.len())
        .map(|i| (u64_at(&table, i * 16), u64_at(&table, i * 16 + 8)))
        .collect();
    for (i, (at, _)) in sections.iter().enumerate() {
        table[i * 16..i * 16 + 8].copy_from_slice(&((*at as i64 + delta) as u64).to_le_bytes());
    }
    dst.write_all(&table)?;
    io::copy(src, dst)?;
    if let Some(i) = features.iter().position(|&b| b == HEADER_CMDLINE) {
        out.cmdline = read_cmdline(src, sections[i]).ok();
    }
    dst.seek(SeekFrom::Start((DATA_SECTION_AT + 8) as u64))?;
    dst.write_all(&new_size.to_le_bytes())?;
    Ok(out)
}

/// Copies the records of a data section, renaming the jitdump mmaps;
/// returns the bytes written.
fn copy_records(src: &mut impl Read, dst: &mut impl Write, marks: &mut usize) -> io::Result<u64> {
    let mut written = 0u64;
    let mut rec = Vec::with_capacity(1 << 16);
    loop {
        let mut head = [0u8; 8];
        match src.read_exact(&mut head) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(written),
            r => r?,
        }
        let size = u16::from_le_bytes([head[6], head[7]]) as usize;
        if size < 8 {
            return Err(bad("a record shorter than its header"));
        }
        rec.clear();
        rec.extend_from_slice(&head);
        rec.resize(size, 0);
        src.read_exact(&mut rec[8..])?;
        let renamed = renamed_mark(&rec);
        if renamed.is_some() {
            *marks += 1;
        }
        let r = renamed.as_deref().unwrap_or(&rec);
        dst.write_all(r)?;
        written += r.len() as u64;
    }
}

/// The record `rec` with its file name `./jit-<pid>.dump`, if it is an
/// mmap of a file named `jit-<digits>.dump`. The name is padded with NULs
/// to a multiple of 8 bytes and the record's sample id follows it (the
/// kernel's `perf_event_mmap_event()`, perf's own synthesized mmaps), so
/// the tail after the padded name is kept as it is.
pub fn renamed_mark(rec: &[u8]) -> Option<Vec<u8>> {
    let kind = u32::from_le_bytes(rec[..4].try_into().ok()?);
    let at = match kind {
        PERF_RECORD_MMAP => MMAP_NAME_AT,
        PERF_RECORD_MMAP2 => MMAP2_NAME_AT,
        _ => return None,
    };
    let name_area = rec.get(at..)?;
    let len = name_area.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&name_area[..len]).ok()?;
    let base = name.rsplit_once('/')?.1;
    let digits = base.strip_prefix("jit-")?.strip_suffix(".dump")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let tail = rec.get(at + padded(len)..)?;
    let pid = u32::from_le_bytes(rec[8..12].try_into().ok()?);
    let new = format!("./jit-{pid}.dump");
    let mut out = rec[..at].to_vec();
    out.extend_from_slice(new.as_bytes());
    out.resize(at + padded(new.len()), 0);
    out.extend_from_slice(tail);
    let size = u16::try_from(out.len()).ok()?;
    out[6..8].copy_from_slice(&size.to_le_bytes());
    Some(out)
}

/// A name of `len` bytes with its NUL, padded to 8 bytes.
fn padded(len: usize) -> usize {
    (len + 1).div_ceil(8) * 8
}

/// The `HEADER_CMDLINE` feature: a u32 count, then that many strings, each
/// a u32 length and that many bytes, NUL-padded (`do_write_string()`,
/// tools/perf/util/header.c).
fn read_cmdline(src: &mut (impl Read + Seek), (at, size): (u64, u64)) -> io::Result<String> {
    let mut buf = vec![0u8; size.min(1 << 20) as usize];
    src.seek(SeekFrom::Start(at))?;
    src.read_exact(&mut buf)?;
    let mut words = Vec::new();
    let n = u32_at(&buf, 0).ok_or_else(|| bad("a short command line"))?;
    let mut p = 4;
    for _ in 0..n {
        let len = u32_at(&buf, p).ok_or_else(|| bad("a short command line"))? as usize;
        let word = buf
            .get(p + 4..p + 4 + len)
            .ok_or_else(|| bad("a short command line"))?;
        let end = word.iter().position(|&b| b == 0).unwrap_or(len);
        words.push(String::from_utf8_lossy(&word[..end]).into_owned());
        p += 4 + len;
    }
    Ok(words.join(" "))
}

/// The jitdump header's size field is at byte 8, the pid at 20; each
/// record is `{u32 id, u32 total_size, u64 timestamp}` then its body, and
/// `JIT_CODE_LOAD` (0) and `JIT_CODE_MOVE` (1) bodies start with the pid
/// and tid (tools/perf/util/jitdump.h).
const JITDUMP_MAGIC: u32 = 0x4A69_5444;
const JIT_CODE_LOAD: u32 = 0;
const JIT_CODE_MOVE: u32 = 1;

/// Copies the first `bytes` bytes of jitdump `src` to `dst`, with the pid
/// and tid of its header and code records set to `pid`: perf inject gives
/// each function's mmap the record's pid unless the process is alive in a
/// pid namespace (`jr_entry_pid()`, tools/perf/util/jitdump.c), and the
/// report's process is the one perf.data names. A byte-swapped dump is
/// copied as it is. Errors: I/O.
pub fn copy_dump(
    src: &mut impl Read,
    dst: &mut impl Write,
    bytes: u64,
    pid: u32,
) -> io::Result<()> {
    let mut src = src.take(bytes);
    let mut head = [0u8; 16];
    let n = read_up_to(&mut src, &mut head)?;
    let size = u32_at(&head, 8).unwrap_or(0) as usize;
    if n < head.len() || u32_at(&head, 0) != Some(JITDUMP_MAGIC) || size < 24 {
        dst.write_all(&head[..n])?;
        io::copy(&mut src, dst)?;
        return Ok(());
    }
    let mut header = head.to_vec();
    header.resize(size, 0);
    let got = read_up_to(&mut src, &mut header[16..])?;
    header.truncate(16 + got);
    if header.len() >= 24 {
        header[20..24].copy_from_slice(&pid.to_le_bytes());
    }
    dst.write_all(&header)?;
    let mut rec = Vec::new();
    loop {
        let mut prefix = [0u8; 16];
        let n = read_up_to(&mut src, &mut prefix)?;
        rec.clear();
        rec.extend_from_slice(&prefix[..n]);
        let total = u32_at(&prefix, 4).unwrap_or(0) as usize;
        if n == 16 && total > 16 {
            rec.resize(total, 0);
            let got = read_up_to(&mut src, &mut rec[16..])?;
            rec.truncate(16 + got);
        }
        let id = u32_at(&rec, 0);
        let whole = n == 16 && total >= 16 && rec.len() == total;
        if whole && total >= 24 && matches!(id, Some(JIT_CODE_LOAD | JIT_CODE_MOVE)) {
            rec[16..20].copy_from_slice(&pid.to_le_bytes());
            rec[20..24].copy_from_slice(&pid.to_le_bytes());
        }
        dst.write_all(&rec)?;
        if !whole {
            io::copy(&mut src, dst)?;
            return Ok(());
        }
    }
}

/// Reads until `buf` is full or `src` ends; returns the bytes read.
fn read_up_to(src: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match src.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// A snapshot injected with its kept jitdumps: a temporary directory that
/// holds the dumps, the ELF files perf inject wrote, and the injected
/// perf.data, gone when this is dropped. `perf script` runs in it (the
/// ELF files are named `./jitted-...`) and reads [`Injected::data`].
pub struct Injected {
    dir: tempfile::TempDir,
    pub data: File,
    /// The recording's command line, for `perf script`'s header, which
    /// now shows perf inject's.
    pub cmdline: Option<String>,
}

impl Injected {
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Runs perf inject on `snapshot` with `dumps`. Errors (one line): what
/// could not be written, or perf's last message.
pub fn inject(perf: &Path, snapshot: &File, dumps: &[KeptDump]) -> Result<Injected, String> {
    let dir = tempfile::Builder::new()
        .prefix("mt-agent-jitdump-")
        .tempdir()
        .map_err(|e| format!("a temporary directory: {e}"))?;
    let write_err = |what: &str, e: io::Error| format!("writing {what} for perf inject: {e}");
    for d in dumps {
        let name = format!("jit-{}.dump", d.pid);
        let mut out =
            BufWriter::new(File::create(dir.path().join(&name)).map_err(|e| write_err(&name, e))?);
        let mut src = BufReader::new(&d.file);
        copy_dump(&mut src, &mut out, d.bytes, d.pid as u32)
            .and_then(|()| out.flush())
            .map_err(|e| write_err(&name, e))?;
    }
    let input = dir.path().join("in.data");
    let rewritten = {
        let mut src =
            BufReader::new(reopen(snapshot).map_err(|e| format!("reopening the snapshot: {e}"))?);
        let mut dst = BufWriter::new(File::create(&input).map_err(|e| write_err("in.data", e))?);
        let r = rewrite_marks(&mut src, &mut dst).map_err(|e| write_err("in.data", e))?;
        dst.flush().map_err(|e| write_err("in.data", e))?;
        r
    };
    run_inject(perf, dir.path())?;
    let _ = std::fs::remove_file(&input);
    let data = File::open(dir.path().join("out.data"))
        .map_err(|e| format!("perf inject's output: {e}"))?;
    Ok(Injected {
        dir,
        data,
        cmdline: rewritten.cmdline,
    })
}

/// `perf --buildid-dir DIR/.debug inject --jit -i in.data -o out.data` in
/// `dir`, with `/proc` an empty tmpfs in a mount namespace of its own: perf
/// then finds no process alive, so it does not enter a live process's
/// mount namespace to open the dump or write the ELF files
/// (`nsinfo__mountns_enter()`), and the functions' mmaps take perf.data's
/// pid. Its build-id cache is the temporary one: perf inject adds the ELF
/// files it writes to it.
fn run_inject(perf: &Path, dir: &Path) -> Result<(), String> {
    let mut cmd = crate::perf::binary::command(perf);
    cmd.arg("--buildid-dir")
        .arg(dir.join(".debug"))
        .args(["inject", "--jit", "-i", "in.data", "-o", "out.data"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: tmpfs_with_files makes only async-signal-safe calls.
    unsafe {
        cmd.pre_exec(|| {
            crate::sys::mount_ns::tmpfs_with_files(c"/proc", &[]);
            Ok(())
        });
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", perf.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let errs = String::from_utf8_lossy(&out.stderr);
    Err(format!(
        "perf inject --jit failed ({}): {}",
        out.status,
        crate::perf::binary::last_message(&errs)
    ))
}

/// The data section of a perf.data file, (offset, size) in bytes, from its
/// header (`struct perf_file_header`: the data's `{offset, size}` at
/// [`DATA_SECTION_AT`]). Errors: not a little-endian perf.data file, I/O.
pub fn data_section(file: &mut (impl Read + Seek)) -> io::Result<(u64, u64)> {
    let mut h = [0u8; DATA_SECTION_AT + 16];
    file.seek(SeekFrom::Start(0))?;
    file.read_exact(&mut h)?;
    if &h[..8] != b"PERFILE2" {
        return Err(bad("not a little-endian perf.data file"));
    }
    Ok((u64_at(&h, DATA_SECTION_AT), u64_at(&h, DATA_SECTION_AT + 8)))
}

/// An open file opened again through `/proc/self/fd`, so that reading it
/// moves no offset the caller shares.
pub fn reopen(f: &File) -> io::Result<File> {
    use std::os::fd::AsRawFd as _;
    File::open(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// An MMAP2 record of `name` for `pid`, with an 8-byte sample id
    /// `0xAB...` after the padded name.
    fn mmap2(pid: u32, name: &str) -> Vec<u8> {
        let mut r = vec![0u8; MMAP2_NAME_AT];
        r[..4].copy_from_slice(&PERF_RECORD_MMAP2.to_le_bytes());
        r[8..12].copy_from_slice(&pid.to_le_bytes());
        r[12..16].copy_from_slice(&pid.to_le_bytes());
        r[16..24].copy_from_slice(&0x7f00_0000u64.to_le_bytes());
        r.extend_from_slice(name.as_bytes());
        r.resize(MMAP2_NAME_AT + padded(name.len()), 0);
        r.extend_from_slice(&[0xAB; 8]);
        let n = r.len() as u16;
        r[6..8].copy_from_slice(&n.to_le_bytes());
        r
    }

    fn name_of(rec: &[u8]) -> String {
        let area = &rec[MMAP2_NAME_AT..];
        String::from_utf8(area[..area.iter().position(|&b| b == 0).unwrap()].to_vec()).unwrap()
    }

    #[test]
    fn a_jitdump_mmap_is_renamed_to_the_pid_perf_names_and_keeps_its_sample_id() {
        let rec = mmap2(41234, "/app/jit-1.dump");
        let new = renamed_mark(&rec).unwrap();
        assert_eq!(name_of(&new), "./jit-41234.dump");
        assert_eq!(new.len() % 8, 0);
        assert_eq!(u16::from_le_bytes([new[6], new[7]]) as usize, new.len());
        assert_eq!(&new[new.len() - 8..], &[0xAB; 8]);
        assert_eq!(&new[..MMAP2_NAME_AT], {
            let mut h = rec[..MMAP2_NAME_AT].to_vec();
            h[6..8].copy_from_slice(&(new.len() as u16).to_le_bytes());
            h
        });
        for other in [
            "/usr/bin/node",
            "/app/jit-.dump",
            "/app/jit-12.dump.old",
            "/x/jit-1a.dump",
        ] {
            assert_eq!(renamed_mark(&mmap2(7, other)), None, "{other}");
        }
    }

    /// A perf.data file: header, one attr byte block, the data section,
    /// then the feature table (HEADER_CMDLINE and one more) and their data.
    fn perf_data(records: &[Vec<u8>]) -> Vec<u8> {
        let mut f = vec![0u8; FILE_HEADER_BYTES];
        f[..8].copy_from_slice(b"PERFILE2");
        f.extend_from_slice(&[0x55; 16]); // stands for the attrs
        let data_at = f.len() as u64;
        for r in records {
            f.extend_from_slice(r);
        }
        let data_size = f.len() as u64 - data_at;
        f[40..48].copy_from_slice(&data_at.to_le_bytes());
        f[48..56].copy_from_slice(&data_size.to_le_bytes());
        f[FEATURES_AT + 1] |= 1 << (HEADER_CMDLINE - 8);
        f[FEATURES_AT + 2] |= 1 << (17 - 16);
        let table_at = f.len() as u64;
        let mut cmd = 2u32.to_le_bytes().to_vec();
        for w in ["perf", "record"] {
            let mut s = w.as_bytes().to_vec();
            s.resize(64, 0);
            cmd.extend_from_slice(&64u32.to_le_bytes());
            cmd.extend_from_slice(&s);
        }
        let other = vec![0x77u8; 24];
        let cmd_at = table_at + 32;
        let other_at = cmd_at + cmd.len() as u64;
        for (at, len) in [(cmd_at, cmd.len()), (other_at, other.len())] {
            f.extend_from_slice(&at.to_le_bytes());
            f.extend_from_slice(&(len as u64).to_le_bytes());
        }
        f.extend_from_slice(&cmd);
        f.extend_from_slice(&other);
        f
    }

    #[test]
    fn the_copy_moves_the_feature_sections_by_what_the_renamed_records_grew() {
        let sample = {
            let mut r = vec![0u8; 16];
            r[..4].copy_from_slice(&9u32.to_le_bytes());
            r[6..8].copy_from_slice(&16u16.to_le_bytes());
            r
        };
        let records = [sample.clone(), mmap2(1234567, "/jit-1.dump"), sample];
        let src = perf_data(&records);
        let mut dst = Cursor::new(Vec::new());
        let r = rewrite_marks(&mut Cursor::new(&src), &mut dst).unwrap();
        assert_eq!(r.marks, 1);
        assert_eq!(r.cmdline.as_deref(), Some("perf record"));
        let out = dst.into_inner();
        // "/jit-1.dump" takes 16 bytes, "./jit-1234567.dump" 24.
        assert_eq!(out.len(), src.len() + 8);
        let (data_at, size) = (u64_at(&out, 40) as usize, u64_at(&out, 48) as usize);
        assert_eq!(size, u64_at(&src, 48) as usize + 8);
        let second = &out[data_at + 16..];
        assert_eq!(name_of(second), "./jit-1234567.dump");
        // The feature table right after the data, its offsets moved: each
        // section reads back what it held.
        let table = data_at + size;
        for i in 0..2 {
            let (at, len) = (
                u64_at(&out, table + i * 16) as usize,
                u64_at(&out, table + i * 16 + 8) as usize,
            );
            let (src_at, src_len) = {
                let t = u64_at(&src, 40) as usize + u64_at(&src, 48) as usize;
                (
                    u64_at(&src, t + i * 16) as usize,
                    u64_at(&src, t + i * 16 + 8) as usize,
                )
            };
            assert_eq!(len, src_len);
            assert_eq!(out[at..at + len], src[src_at..src_at + src_len]);
        }
        let mut not_perf = src.clone();
        not_perf[..8].copy_from_slice(b"2ELIFREP");
        assert!(rewrite_marks(&mut Cursor::new(&not_perf), &mut Cursor::new(Vec::new())).is_err());
    }

    fn dump_record(id: u32, pid: u32, body: usize) -> Vec<u8> {
        let total = 16 + 8 + body;
        let mut r = id.to_le_bytes().to_vec();
        r.extend_from_slice(&(total as u32).to_le_bytes());
        r.extend_from_slice(&7u64.to_le_bytes());
        r.extend_from_slice(&pid.to_le_bytes());
        r.extend_from_slice(&pid.to_le_bytes());
        r.resize(total, 0x33);
        r
    }

    #[test]
    fn a_kept_dump_is_cut_at_its_length_and_its_code_records_take_the_pid() {
        let mut d = JITDUMP_MAGIC.to_le_bytes().to_vec();
        d.extend_from_slice(&1u32.to_le_bytes());
        d.extend_from_slice(&40u32.to_le_bytes());
        d.resize(40, 0);
        d[20..24].copy_from_slice(&1u32.to_le_bytes());
        let records = [
            dump_record(JIT_CODE_LOAD, 1, 40),
            dump_record(2, 1, 8),
            dump_record(JIT_CODE_MOVE, 1, 24),
            dump_record(JIT_CODE_LOAD, 1, 40),
        ];
        for r in &records {
            d.extend_from_slice(r);
        }
        let cut = (d.len() - 10) as u64;
        let mut out = Vec::new();
        copy_dump(&mut Cursor::new(&d), &mut out, cut, 4321).unwrap();
        assert_eq!(out.len() as u64, cut);
        assert_eq!(u32_at(&out, 20), Some(4321));
        let mut at = 40;
        for r in &records[..3] {
            let pid = u32_at(&out, at + 16).unwrap();
            let want = if u32_at(r, 0) == Some(2) { 1 } else { 4321 };
            assert_eq!((pid, u32_at(&out, at + 20).unwrap()), (want, want));
            assert_eq!(out[at + 24..at + r.len()], r[24..]);
            at += r.len();
        }
        // The last record, cut, is copied as it is: perf stops at it.
        assert_eq!(out[at..], d[at..cut as usize]);
        // Not a jitdump (or a byte-swapped one): copied as it is.
        let mut o = Vec::new();
        copy_dump(&mut Cursor::new(b"hello world"), &mut o, 99, 5).unwrap();
        assert_eq!(o, b"hello world");
    }
}
