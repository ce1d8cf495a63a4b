//! How many bytes of stack a DWARF sample needs for perf to unwind it whole,
//! measured on the live target, so that `--call-graph auto` chooses the
//! copy size per target: the smallest of [`CHOICES`] that keeps
//! [`WHOLE_GOAL`] of the samples whole once the report grafts cut stacks
//! (docs/unwinding.md, "How much stack a sample needs"; issue 28 §4).
//!
//! perf records the processes once with a large copy ([`FULL_BYTES`]).
//! Each `PERF_SAMPLE_STACK_USER` part of a sample ends with `dyn_size`, the
//! number of bytes the kernel did copy, and perf's unwinder reads no further
//! than that (`evsel__parse_sample()` in perf's evsel code sets
//! `user_stack.size` from it). So lowering `dyn_size` in the file to N
//! shows, exactly, what a recording with `dwarf,N` would have unwound from
//! the same samples, and `perf script` unwinds the file at each size. The
//! bench's stack-need table (tests/src/bin/bench/stack_need.rs) uses the
//! same functions.

use std::{
    collections::{HashMap, HashSet},
    fs,
    io::{self, Read, Seek, SeekFrom, Write},
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use super::graft::{Complete, is_start};
pub use super::jitdump::data_section;
use crate::{output::run_file::StackDonors, perf::unwind::Measured};

/// The copy the reference recording asks for, bytes: 32 KiB, which a sample
/// record (at most 64 KiB, its size being a `u16`) holds without the kernel
/// shrinking it.
pub const FULL_BYTES: u64 = 32768;

/// The copy sizes `auto` chooses from, bytes, smallest first: up to perf's
/// own default for `dwarf`, 8192, which is also taken when none smaller
/// keeps [`WHOLE_GOAL`].
pub const CHOICES: &[u64] = &[512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192];

/// The share of samples, percent, that the chosen size keeps whole.
pub const WHOLE_GOAL: f64 = 99.0;

/// How long the target is recorded for the measurement: 0.5 s at the run's
/// frequency (~500 samples of a busy thread at 999 Hz). The recording
/// itself adds ~0.1 s of perf start-up (measured 2026-12-03: 0.61 s for
/// `-- sleep 0.5` with `--no-bpf-event`, 1.09 s without).
pub const MEASURE_FOR: Duration = Duration::from_millis(500);

/// Fewer samples than this measure nothing (an idle target): `auto` then
/// keeps its fixed size.
pub const MIN_SAMPLES: usize = 100;

/// One sample as `perf script` unwound it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stack {
    pub tid: i32,
    /// Symbols, innermost first; `[unknown]` where perf has none.
    pub frames: Vec<String>,
}

/// The most of the measurement's whole stacks kept for the report, bytes
/// of JSON in run.json (whose reader takes at most 1 MiB): a few hundred
/// distinct stacks.
pub const DONOR_BYTES: usize = 256 << 10;

/// What the measurement found.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub measured: Measured,
    /// The recording's whole stacks as the report names them, for it to
    /// graft snapshots' cut stacks from (run.json).
    pub donors: StackDonors,
    /// Every sample's stack as [`script`] unwound it from the whole copy,
    /// in time order (the bench judges its own recording against them).
    pub stacks: Vec<Stack>,
}

/// Why the measurement chose no size (`auto` then keeps its fixed one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotMeasured {
    /// Fewer than [`MIN_SAMPLES`] samples in [`MEASURE_FOR`]: the target
    /// hardly ran.
    TooFewSamples(usize),
    /// perf failed, or its output could not be read: one line.
    Failed(String),
}

impl std::fmt::Display for NotMeasured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotMeasured::TooFewSamples(n) => write!(
                f,
                "{n} samples in {:.1} s (fewer than {MIN_SAMPLES}: the target hardly ran)",
                MEASURE_FOR.as_secs_f64()
            ),
            NotMeasured::Failed(why) => f.write_str(why),
        }
    }
}

/// Records `pids` for [`MEASURE_FOR`] at `freq` Hz with a [`FULL_BYTES`]
/// copy (a file in `dir`, removed after), keeps its whole stacks as
/// donors, then chooses the size ([`choose`]).
pub fn measure(
    perf: &Path,
    pids: &[i32],
    freq: u32,
    dir: &Path,
) -> Result<Measurement, NotMeasured> {
    let started = Instant::now();
    let file = dir.join("stack-need.data");
    let recorded = record(perf, pids, freq, &file);
    let chosen = recorded.and_then(|()| {
        let donors = super::samples::read_plain(perf, &file)?.whole_stacks(DONOR_BYTES);
        let (chosen, stacks) =
            choose(perf, &file).map_err(|e| format!("unwinding the samples: {e}"))?;
        Ok((chosen, donors, stacks))
    });
    let _ = fs::remove_file(&file);
    let ((bytes, whole_percent), donors, stacks) = chosen.map_err(NotMeasured::Failed)?;
    if stacks.len() < MIN_SAMPLES {
        return Err(NotMeasured::TooFewSamples(stacks.len()));
    }
    let measured = Measured {
        bytes,
        whole_percent,
        samples: stacks.len(),
        ms: started.elapsed().as_secs_f64() * 1e3,
    };
    Ok(Measurement {
        measured,
        donors,
        stacks,
    })
}

/// `perf record` of `pids` into `file` for [`MEASURE_FOR`] with a
/// [`FULL_BYTES`] copy.
fn record(perf: &Path, pids: &[i32], freq: u32, file: &Path) -> Result<(), String> {
    let list: Vec<String> = pids.iter().map(i32::to_string).collect();
    let out = crate::perf::binary::command(perf)
        // -B, --no-buildid-cache: no build-id pass at the end, nothing in
        // ~/.debug; --no-bpf-event: ~0.5 s less start-up (see MEASURE_FOR).
        .args(["record", "-q", "-B", "--no-buildid-cache", "--no-bpf-event"])
        .args(["-e", "cpu-clock", "-F", &freq.to_string(), "--call-graph"])
        .arg(format!("dwarf,{FULL_BYTES}"))
        .args(["-p", &list.join(","), "-o"])
        .arg(file)
        .args(["--", "sleep", &format!("{}", MEASURE_FOR.as_secs_f64())])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .map_err(|e| format!("perf record: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("failed");
        return Err(format!("perf record: {last}"));
    }
    Ok(())
}

/// The smallest of [`CHOICES`] at which ≥ [`WHOLE_GOAL`] of the samples of
/// `file` (recorded with a [`FULL_BYTES`] copy) are whole once grafted, by
/// bisection (the share grows with the size); the largest choice when none
/// is. The run's report grafts a snapshot's cut stacks from its own whole
/// ones and from this recording's (the donors), so the size is judged as
/// that: on the recording's second half, cut to the size and grafted from
/// its own whole stacks and then from the first half's whole copies.
/// Returns (bytes, percent whole there) and every sample's whole-copy
/// stack; with fewer than [`MIN_SAMPLES`] samples, (0, 0). The file is
/// patched in place.
pub fn choose(perf: &Path, file: &Path) -> io::Result<((u64, f64), Vec<Stack>)> {
    let full = script(perf, file)?;
    if full.len() < MIN_SAMPLES {
        // Too few to measure by (see `measure`): nothing unwound again.
        return Ok(((0, 0.0), full));
    }
    let mut f = fs::OpenOptions::new().read(true).write(true).open(file)?;
    let offsets = dyn_size_offsets_of(&mut f)?;
    let half = full.len() / 2;
    let mut at = |bytes: u64| -> io::Result<f64> {
        set_copy_size(&mut f, &offsets, bytes, |_| false)?;
        let cut = script(perf, file)?;
        if cut.len() != full.len() {
            return Err(io::Error::other(
                "perf script gave another number of samples",
            ));
        }
        Ok(whole_after_donors(
            &full[..half],
            &full[half..],
            &cut[half..],
        ))
    };
    let chosen = smallest_whole(CHOICES, &mut at)?;
    Ok((chosen, full))
}

/// Of the samples `cut` (their whole stacks in `full`), the percent whole
/// once grafted from the thread's complete stacks in `cut`, then from
/// `donors` (whole stacks of the same threads), as the report grafts.
pub fn whole_after_donors(donors: &[Stack], full: &[Stack], cut: &[Stack]) -> f64 {
    let n = donors.len();
    let whole: Vec<Stack> = donors.iter().chain(full).cloned().collect();
    let judged: Vec<Stack> = donors.iter().chain(cut).cloned().collect();
    grafted_whole(&whole, &judged, |i| i < n).1
}

/// Of `choices` (ascending), the first at which `at` (the percent whole
/// there, growing with the size) reaches [`WHOLE_GOAL`], by bisection; the
/// last when none does. Returns it and its percent.
fn smallest_whole(
    choices: &[u64],
    at: &mut impl FnMut(u64) -> io::Result<f64>,
) -> io::Result<(u64, f64)> {
    let (mut lo, mut hi) = (0, choices.len() - 1);
    let mut found = None;
    while lo < hi {
        let mid = (lo + hi) / 2;
        let pct = at(choices[mid])?;
        if pct >= WHOLE_GOAL {
            hi = mid;
            found = Some((mid, pct));
        } else {
            lo = mid + 1;
        }
    }
    let pct = match found {
        Some((k, pct)) if k == lo => pct,
        _ => at(choices[lo])?,
    };
    Ok((choices[lo], pct))
}

/// Where each stack sample's `dyn_size` lies in a perf.data file's data
/// section (at `data_offset`, `data_size` bytes, read from `data`), and its
/// value: (file offset, bytes copied). One record (≤ 64 KiB) is held at a
/// time.
///
/// A sample record holding a user stack copy of `copy` bytes has
/// `u64 size (= copy) | copy bytes | u64 dyn_size`, followed by the `u64`
/// fields that come after `PERF_SAMPLE_STACK_USER` in perf_event_open(2)'s
/// order: perf 6.1's `--call-graph dwarf` asks for one, `DATA_SRC`
/// (`perf evlist -v`). A record is taken as one when, for some number of
/// such fields (0 to 3), the `u64` `copy + 16` bytes before them is `copy`.
pub fn dyn_size_offsets(
    data: impl Read,
    data_offset: u64,
    data_size: u64,
    copy: u64,
) -> io::Result<Vec<(u64, u64)>> {
    const PERF_RECORD_SAMPLE: u32 = 9;
    let mut data = io::BufReader::new(data.take(data_size));
    let mut out = Vec::new();
    let (mut at, mut record) = (0u64, vec![0u8; 1 << 16]);
    loop {
        let mut header = [0u8; 8];
        match data.read_exact(&mut header) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            r => r?,
        }
        let kind = u32::from_le_bytes(header[0..4].try_into().unwrap());
        let size = u16::from_le_bytes(header[6..8].try_into().unwrap()) as usize;
        if size < 8 || data.read_exact(&mut record[..size - 8]).is_err() {
            break;
        }
        let body = &record[..size - 8];
        if let (PERF_RECORD_SAMPLE, Some((end, dyn_size))) = (kind, stack_end(body, copy)) {
            out.push((data_offset + at + 8 + end as u64 - 8, dyn_size));
        }
        at += size as u64;
    }
    Ok(out)
}

/// In a sample's body (after its header), the end of a `copy`-byte stack
/// part (just after its `dyn_size`) and the `dyn_size`.
fn stack_end(body: &[u8], copy: u64) -> Option<(usize, u64)> {
    let u64_at = |o: usize| u64::from_le_bytes(body[o..o + 8].try_into().unwrap());
    let end = (0..4)
        .filter_map(|t| body.len().checked_sub(8 * t))
        .find(|&e| {
            e.checked_sub(copy as usize + 16)
                .is_some_and(|c| u64_at(c) == copy)
        })?;
    Some((end, u64_at(end - 8)))
}

/// [`dyn_size_offsets`] of an open perf.data file recorded with a
/// [`FULL_BYTES`] copy.
pub fn dyn_size_offsets_of(file: &mut fs::File) -> io::Result<Vec<(u64, u64)>> {
    let (offset, size) = super::jitdump::data_section(file)?;
    file.seek(SeekFrom::Start(offset))?;
    dyn_size_offsets(&mut *file, offset, size, FULL_BYTES)
}

/// Writes each sample's `dyn_size` as at most `bytes` (its own where
/// `keep(i)`): the file then reads as if recorded with `dwarf,bytes`.
pub fn set_copy_size(
    file: &mut fs::File,
    offsets: &[(u64, u64)],
    bytes: u64,
    keep: impl Fn(usize) -> bool,
) -> io::Result<()> {
    for (i, &(at, dyn_size)) in offsets.iter().enumerate() {
        let n = if keep(i) {
            dyn_size
        } else {
            dyn_size.min(bytes)
        };
        file.seek(SeekFrom::Start(at))?;
        file.write_all(&n.to_le_bytes())?;
    }
    file.flush()
}

/// `perf script` of `file`: each sample's thread and unwound stack.
pub fn script(perf: &Path, file: &Path) -> io::Result<Vec<Stack>> {
    let out = crate::perf::binary::command(perf)
        .args(["script", "--no-inline", "-F", "tid,ip,sym", "-i"])
        .arg(file)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "perf script -i {}",
            file.display()
        )));
    }
    Ok(parse_script(&String::from_utf8_lossy(&out.stdout)))
}

/// Parses `perf script -F tid,ip,sym` with call chains: a header line
/// holding the tid, then one `\t ip sym+off` line per frame.
pub fn parse_script(text: &str) -> Vec<Stack> {
    let mut out: Vec<Stack> = Vec::new();
    for line in text.lines() {
        if line.starts_with('\t') {
            if let (Some(last), Some(sym)) = (out.last_mut(), line.split_whitespace().nth(1)) {
                let sym = sym.split('+').next().unwrap_or(sym);
                last.frames.push(sym.to_string());
            }
        } else if let Some(tid) = line.split_whitespace().next().and_then(|w| w.parse().ok()) {
            out.push(Stack {
                tid,
                frames: Vec::new(),
            });
        }
    }
    out
}

/// Complete stacks, leaf first.
type Stacks<'a> = Vec<&'a [String]>;

/// Whether `got` is as whole as `full` (the same sample unwound from the
/// whole copy): the same stack, or, where perf could not unwind even the
/// whole copy to the thread's start (its last frames `[unknown]`), a stack
/// that holds all of `full`'s named frames and goes on to the start (a
/// graft from a stack that did reach it).
fn holds(got: &[String], full: &[String]) -> bool {
    if got == full {
        return true;
    }
    let named = full.len() - full.iter().rev().take_while(|f| *f == "[unknown]").count();
    let reaches = |s: &[String]| s.last().is_some_and(|f| is_start(f));
    !reaches(full) && reaches(got) && got.len() > named && got[..named] == full[..named]
}

/// Of the samples of `cut` that are not references (`is_reference(i)`),
/// the percentages whole (their stack in `full`, the same samples unwound
/// from the whole copy) once [`Complete::graft`] completes the cut ones, as
/// the report does: (from the thread's other samples complete in `cut`,
/// from those and the references).
pub fn grafted_whole(
    full: &[Stack],
    cut: &[Stack],
    is_reference: impl Fn(usize) -> bool,
) -> (f64, f64) {
    let mut complete: HashMap<i32, (Stacks, Stacks)> = HashMap::new();
    let mut seen = HashSet::new();
    for (j, o) in cut.iter().enumerate() {
        let reference = is_reference(j);
        if o.frames.last().is_some_and(|f| is_start(f))
            && seen.insert((o.tid, reference, &o.frames))
        {
            let lists = complete.entry(o.tid).or_default();
            let list = if reference {
                &mut lists.1
            } else {
                &mut lists.0
            };
            list.push(o.frames.as_slice());
        }
    }
    let indexed: HashMap<i32, (Complete<String>, Complete<String>)> = complete
        .iter()
        .map(|(tid, (mine, refs))| {
            let all = mine.iter().chain(refs).copied();
            let own = Complete::new(mine.iter().copied());
            (*tid, (own, Complete::new(all)))
        })
        .collect();
    let unknown = |f: &String| f == "[unknown]";
    let (mut own, mut with_refs, mut n) = (0usize, 0usize, 0usize);
    for (i, (s, f)) in cut.iter().zip(full).enumerate() {
        if is_reference(i) {
            continue;
        }
        n += 1;
        let whole = |with: Option<&Complete<String>>| {
            let g = with.and_then(|c| c.graft(&s.frames, |f| is_start(f), unknown));
            holds(g.as_ref().unwrap_or(&s.frames), &f.frames)
        };
        let sets = indexed.get(&s.tid);
        own += usize::from(whole(sets.map(|c| &c.0)));
        with_refs += usize::from(whole(sets.map(|c| &c.1)));
    }
    let pct = |k: usize| 100.0 * k as f64 / n.max(1) as f64;
    (pct(own), pct(with_refs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32, body: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&kind.to_le_bytes());
        r.extend_from_slice(&0u16.to_le_bytes());
        r.extend_from_slice(&((8 + body.len()) as u16).to_le_bytes());
        r.extend_from_slice(body);
        r
    }

    #[test]
    fn finds_the_dyn_size_of_stack_samples_only() {
        let copy = 32u64;
        let mut sample = vec![7u8; 24]; // ip, pid/tid, time
        sample.extend_from_slice(&copy.to_le_bytes());
        sample.extend_from_slice(&[0xaa; 32]);
        sample.extend_from_slice(&20u64.to_le_bytes());
        sample.extend_from_slice(&0u64.to_le_bytes()); // DATA_SRC
        let mut data = record(3, &[1u8; 16]); // a COMM record
        let at = data.len();
        data.extend(record(9, &sample));
        data.extend(record(9, &[0u8; 16])); // a sample without a stack
        let found = dyn_size_offsets(&data[..], 1000, data.len() as u64, copy).unwrap();
        assert_eq!(found, vec![(1000 + at as u64 + 8 + 24 + 8 + 32, 20)]);
        // A section cut inside a record ends the walk there.
        let cut = dyn_size_offsets(&data[..at + 20], 1000, data.len() as u64, copy).unwrap();
        assert!(cut.is_empty());
    }

    #[test]
    fn parses_perf_scripts_tid_and_frames() {
        let text = " 8859 \n\t            1056 main\n\t           27304 \
                    __libc_start_main@@GLIBC_2.34\n\t            1090 _start\n\n 8860 \n\
                    \t            10 f+0x4\n\t ffff [unknown]\n";
        let s = parse_script(text);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].tid, 8859);
        assert_eq!(
            s[0].frames,
            ["main", "__libc_start_main@@GLIBC_2.34", "_start"]
        );
        assert_eq!(s[1].frames, ["f", "[unknown]"]);
    }

    #[test]
    fn the_smallest_size_reaching_the_goal_is_found_in_few_unwinds() {
        // Whole from 1536 on: 99.5% there.
        let pct = |b: u64| if b >= 1536 { 99.5 } else { 80.0 };
        let mut asked = Vec::new();
        let mut at = |b: u64| {
            asked.push(b);
            Ok(pct(b))
        };
        assert_eq!(smallest_whole(CHOICES, &mut at).unwrap(), (1536, 99.5));
        assert!(asked.len() <= 4, "{asked:?}");
        // None reaches it: the largest, with its own figure.
        let mut low = |b: u64| Ok(b as f64 / 1000.0);
        assert_eq!(smallest_whole(CHOICES, &mut low).unwrap(), (8192, 8.192));
        // All do: the smallest.
        let mut high = |_| Ok(100.0);
        assert_eq!(smallest_whole(CHOICES, &mut high).unwrap(), (512, 100.0));
    }

    fn st(tid: i32, frames: &[&str]) -> Stack {
        Stack {
            tid,
            frames: frames.iter().map(|f| f.to_string()).collect(),
        }
    }

    #[test]
    fn a_cut_stack_counts_whole_once_grafted_from_its_own_thread() {
        let whole = st(1, &["f", "loop", "main", "_start"]);
        let full = vec![
            whole.clone(),
            whole.clone(),
            st(2, &["g", "loop", "main", "_start"]),
        ];
        // Sample 1 lost main and _start: the graft from sample 0 completes
        // it. Thread 2's only sample is cut, with nothing to graft from.
        let cut = vec![
            whole.clone(),
            st(1, &["f", "loop", "[unknown]"]),
            st(2, &["g", "loop", "[unknown]"]),
        ];
        let (own, _) = grafted_whole(&full, &cut, |_| false);
        assert!((own - 200.0 / 3.0).abs() < 1e-9, "{own}");
        // As a reference, sample 0 is not counted, and still completes 1.
        let (own, refs) = grafted_whole(&full, &cut, |i| i == 0);
        assert_eq!((own, refs), (0.0, 50.0));
    }

    #[test]
    fn the_measurements_donors_complete_what_the_samples_cannot() {
        // Thread 2's samples are all cut; the donors (earlier whole copies
        // of the same threads) hold its start.
        let donors = vec![
            st(2, &["h", "g", "loop", "main", "_start"]),
            st(3, &["g", "loop", "other_main", "_start"]),
        ];
        let full = vec![st(2, &["g", "loop", "main", "_start"])];
        let cut = vec![st(2, &["g", "loop", "[unknown]"])];
        assert_eq!(whole_after_donors(&donors, &full, &cut), 100.0);
        // Another thread's donor does not count.
        assert_eq!(whole_after_donors(&donors[1..], &full, &cut), 0.0);
        // A wrong graft is not whole: the donor's outer frames differ.
        let full = vec![st(2, &["g", "loop", "serve", "main", "_start"])];
        assert_eq!(whole_after_donors(&donors, &full, &cut), 0.0);
    }

    #[test]
    fn a_graft_beyond_what_the_whole_copy_unwound_holds_it() {
        let s = |f: &[&str]| f.iter().map(|f| f.to_string()).collect::<Vec<_>>();
        let full = s(&["f", "loop", "[unknown]"]);
        // The same stack, or one that holds all of it and reaches the start.
        assert!(holds(&full, &full));
        assert!(holds(&s(&["f", "loop", "main", "_start"]), &full));
        // Not: one that does not reach the start, or changes a frame.
        assert!(!holds(&s(&["f", "loop", "work"]), &full));
        assert!(!holds(&s(&["f", "serve", "main", "_start"]), &full));
        // Where the whole copy reached the start, only that stack holds it.
        let whole = s(&["f", "loop", "main", "_start"]);
        assert!(!holds(&s(&["f", "loop", "x", "main", "_start"]), &whole));
    }
}
