//! How many bytes of stack a DWARF sample needs for perf to unwind it whole,
//! measured on the live target, so that `--call-graph auto` chooses the
//! copy size per target: the smallest of [`CHOICES`] that keeps
//! [`WHOLE_GOAL`] of the samples whole once the report completes cut
//! stacks (docs/unwinding.md, "What `auto` measures"; issue 28 §4).
//!
//! perf records the processes once with a large copy ([`FULL_BYTES`]), and
//! the recording is read as the report reads a snapshot, with each frame's
//! place on the stack (report/cfa.rs). A frame's return address lies just
//! below its callee's CFA, so the frames perf would have unwound from a
//! smaller copy follow from the places ([`Samples::as_if_copied`]), and
//! each size is judged without running perf again.
//!
//! The bench's stack-need table (tests/src/bin/bench/stack_need.rs) checks
//! that against perf itself: each `PERF_SAMPLE_STACK_USER` part of a
//! sample ends with `dyn_size`, the number of bytes the kernel did copy,
//! and perf's unwinder reads no further (`evsel__parse_sample()` in perf's
//! evsel code sets `user_stack.size` from it). So lowering `dyn_size` in
//! the file to N ([`set_copy_size`]) shows, exactly, what a recording with
//! `dwarf,N` would have unwound from the same samples, and `perf script`
//! unwinds the file at each size.

use std::{
    collections::HashSet,
    fs,
    io::{self, Read, Seek, SeekFrom, Write},
    ops::Range,
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use super::{cfa, graft::is_start};
pub use super::{
    jitdump::data_section,
    samples::{Samples, parse as parse_samples},
};
use crate::{
    output::run_file::StackDonors,
    perf::unwind::{Measured, UNSEEN_FLOOR},
    sys::proc::{is_alive, threads},
};

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

/// The most of the measurement's whole stacks kept for the report, bytes
/// of JSON in run.json (whose reader takes at most 1 MiB): a few hundred
/// distinct stacks.
pub const DONOR_BYTES: usize = 256 << 10;

/// What the measurement found.
#[derive(Debug, Clone)]
pub struct Measurement {
    pub measured: Measured,
    /// The recording's whole stacks as the report names them, with their
    /// frames' places on the stack, for it to complete snapshots' cut
    /// stacks from (run.json).
    pub donors: StackDonors,
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
        let full = read(perf, &file)?;
        let donors = full.whole_stacks(DONOR_BYTES);
        let sampled: HashSet<u32> = full.samples.iter().map(|s| s.tid).collect();
        let threads: HashSet<u32> = pids.iter().flat_map(|&p| threads(p)).collect();
        let unseen = threads.difference(&sampled).count();
        let floor = if unseen > 0 { UNSEEN_FLOOR } else { 0 };
        Ok((choose(&full, floor), donors, full.samples.len(), unseen))
    });
    let _ = fs::remove_file(&file);
    let ((bytes, whole_percent), donors, samples, unseen) = chosen.map_err(NotMeasured::Failed)?;
    if samples < MIN_SAMPLES {
        return Err(NotMeasured::TooFewSamples(samples));
    }
    let measured = Measured {
        bytes,
        whole_percent,
        samples,
        threads_not_sampled: unseen,
        ms: started.elapsed().as_secs_f64() * 1e3,
    };
    Ok(Measurement { measured, donors })
}

/// A recording read as the report reads a snapshot: perf's stacks
/// (`samples::read_plain`), with their frames' places on the stack
/// (report/cfa.rs).
pub fn read(perf: &Path, file: &Path) -> Result<Samples, String> {
    let mut samples = super::samples::read_plain(perf, file)?;
    let f = fs::File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
    samples.attach_cfas(cfa::unwind(&f, None)?);
    Ok(samples)
}

/// `perf record` of `pids` into `file` for [`MEASURE_FOR`] with a
/// [`FULL_BYTES`] copy. perf refuses the whole list when one of them is
/// gone ("Couldn't create thread/CPU maps: No such process", hidden by
/// `-q`): a short-lived child (a PostgreSQL autovacuum worker) can exit
/// between its listing and perf's start, so the processes still there are
/// recorded, and once more if perf failed and one had gone in between.
fn record(perf: &Path, pids: &[i32], freq: u32, file: &Path) -> Result<(), String> {
    // perf refuses an exited process that its parent has not reaped yet
    // too: only those neither gone nor zombies (`sys::proc::is_alive`).
    let alive = || -> Vec<i32> { pids.iter().copied().filter(|&p| is_alive(p)).collect() };
    let first = alive();
    match record_once(perf, &first, freq, file) {
        Err(_) if alive().len() < first.len() => record_once(perf, &alive(), freq, file),
        done => done,
    }
}

fn record_once(perf: &Path, pids: &[i32], freq: u32, file: &Path) -> Result<(), String> {
    if pids.is_empty() {
        return Err("no traced process is running".into());
    }
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

/// The smallest of [`CHOICES`], from `floor` on, at which ≥ [`WHOLE_GOAL`]
/// of the samples of `full` (a recording with [`FULL_BYTES`] copies, read
/// with its frames' places: [`read`]) are whole once completed, by
/// bisection (the share grows with the size); the largest choice when
/// none is. The run's report completes a snapshot's cut stacks from its
/// own stacks and from this recording's whole ones (the donors), so the
/// size is judged as that, [`FOLDS`] times: each of the recording's
/// [`FOLDS`] spans of time in turn is cut to the size as perf would have
/// cut it ([`Samples::as_if_copied`]: no `perf script` per size) and
/// completed from its own stacks and then from the other spans' whole
/// copies. Returns (bytes, percent whole there); with fewer than
/// [`MIN_SAMPLES`] samples, (0, 0).
pub fn choose(full: &Samples, floor: u64) -> (u64, f64) {
    let n = full.samples.len();
    if n < MIN_SAMPLES {
        // Too few to measure by (see `measure`).
        return (0, 0.0);
    }
    let spans: Vec<Range<usize>> = (0..FOLDS)
        .map(|f| f * n / FOLDS..(f + 1) * n / FOLDS)
        .collect();
    let donors: Vec<StackDonors> = spans
        .iter()
        .map(|span| full.whole_stacks_of(|i| !span.contains(&i), usize::MAX))
        .collect();
    let mut at = |bytes: u64| {
        let cut = full.as_if_copied(bytes);
        let whole: usize = spans
            .iter()
            .zip(&donors)
            .map(|(span, d)| whole_count(full, cut.clone(), span.clone(), d))
            .sum();
        100.0 * whole as f64 / n as f64
    };
    let from = CHOICES
        .iter()
        .position(|&c| c >= floor)
        .unwrap_or(CHOICES.len() - 1);
    smallest_whole(&CHOICES[from..], &mut at)
}

/// How many spans of time [`choose`] judges a size on, each with the
/// others' whole stacks as donors: the run's donors are the whole
/// measurement's, so each span is judged with most of them (3 of 4), not
/// half as with two spans, and every sample is judged once. Measured on
/// PostgreSQL (docs/unwinding.md, "Completing cut stacks by frame
/// address"): with the donors of 250 samples 99.36% of the judged ones
/// were whole at 1024 bytes, with 500 99.92%.
pub const FOLDS: usize = 4;

/// Of the samples of `cut` from `from` on (the same file as `full`, its
/// copies cut), the percent whole once completed as the report completes
/// a snapshot made of them alone, with `donors`
/// ([`Samples::graft_cut_stacks`]): their stack then holds the one of the
/// same sample in `full` ([`holds`]).
pub fn whole_percent(full: &Samples, cut: Samples, from: usize, donors: &StackDonors) -> f64 {
    let judged = from.min(cut.samples.len())..cut.samples.len();
    let n = judged.len();
    100.0 * whole_count(full, cut, judged, donors) as f64 / n.max(1) as f64
}

/// Of the samples of `cut` in `judged`, how many are whole once completed
/// as a snapshot made of them alone ([`whole_percent`]).
fn whole_count(
    full: &Samples,
    mut cut: Samples,
    judged: Range<usize>,
    donors: &StackDonors,
) -> usize {
    cut.samples.truncate(judged.end);
    cut.samples.drain(..judged.start.min(cut.samples.len()));
    cut.graft_cut_stacks(donors);
    (0..cut.samples.len())
        .filter(|&i| {
            full.samples.get(judged.start + i).is_some()
                && holds(&names(&cut, i), &names(full, judged.start + i))
        })
        .count()
}

/// Sample `i`'s frame names, leaf first.
pub fn names(s: &Samples, i: usize) -> Vec<&str> {
    s.stack(&s.samples[i]).iter().map(|&f| s.name(f)).collect()
}

/// Of `choices` (ascending), the first at which `at` (the percent whole
/// there, growing with the size) reaches [`WHOLE_GOAL`], by bisection; the
/// last when none does. Returns it and its percent.
fn smallest_whole(choices: &[u64], at: &mut impl FnMut(u64) -> f64) -> (u64, f64) {
    let (mut lo, mut hi) = (0, choices.len() - 1);
    let mut found = None;
    while lo < hi {
        let mid = (lo + hi) / 2;
        let pct = at(choices[mid]);
        if pct >= WHOLE_GOAL {
            hi = mid;
            found = Some((mid, pct));
        } else {
            lo = mid + 1;
        }
    }
    let pct = match found {
        Some((k, pct)) if k == lo => pct,
        _ => at(choices[lo]),
    };
    (choices[lo], pct)
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

/// Whether `got` is as whole as `full` (the same sample unwound from the
/// whole copy): the same stack, or, where perf could not unwind even the
/// whole copy to the thread's start (its last frames `[unknown]`), a stack
/// that holds all of `full`'s named frames and goes on to the start (a
/// graft from a stack that did reach it).
pub fn holds(got: &[&str], full: &[&str]) -> bool {
    if got == full {
        return true;
    }
    let named = full.len() - full.iter().rev().take_while(|f| **f == "[unknown]").count();
    let reaches = |s: &[&str]| s.last().is_some_and(|f| is_start(f));
    !reaches(full) && reaches(got) && got.len() > named && got[..named] == full[..named]
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
    fn the_smallest_size_reaching_the_goal_is_found_in_few_unwinds() {
        // Whole from 1536 on: 99.5% there.
        let pct = |b: u64| if b >= 1536 { 99.5 } else { 80.0 };
        let mut asked = Vec::new();
        let mut at = |b: u64| {
            asked.push(b);
            pct(b)
        };
        assert_eq!(smallest_whole(CHOICES, &mut at), (1536, 99.5));
        assert!(asked.len() <= 4, "{asked:?}");
        // None reaches it: the largest, with its own figure.
        let mut low = |b: u64| b as f64 / 1000.0;
        assert_eq!(smallest_whole(CHOICES, &mut low), (8192, 8.192));
        // All do: the smallest.
        let mut high = |_| 100.0;
        assert_eq!(smallest_whole(CHOICES, &mut high), (512, 100.0));
    }

    fn run(samples: &[(u32, &str)]) -> Samples {
        super::super::samples::dwarf_run(samples)
    }

    #[test]
    fn a_cut_stack_counts_whole_once_completed_as_the_report_completes_it() {
        let whole = "f;loop;main;_start";
        let full = run(&[(1, whole), (1, whole), (2, "g;loop;main;_start")]);
        // Sample 1 lost main and _start: sample 0 completes it. Thread
        // 2's only sample is cut, with nothing to graft from.
        let cut = || run(&[(1, whole), (1, "f;loop;[unknown]"), (2, "g;loop;[unknown]")]);
        let none = StackDonors::default();
        let pct = whole_percent(&full, cut(), 0, &none);
        assert!((pct - 200.0 / 3.0).abs() < 1e-9, "{pct}");
        // From sample 1 on, sample 0 is not in the snapshot: only a donor
        // of thread 2's own completes thread 2.
        assert_eq!(whole_percent(&full, cut(), 1, &none), 0.0);
        let donors = run(&[(2, "h;g;loop;main;_start"), (3, "g;loop;other_main;_start")]);
        let donors = donors.whole_stacks(1 << 20);
        assert_eq!(whole_percent(&full, cut(), 1, &donors), 50.0);
        // A wrong graft is not whole: the donor's outer frames differ.
        let served = run(&[(1, whole), (1, whole), (2, "g;loop;serve;main;_start")]);
        assert_eq!(whole_percent(&served, cut(), 1, &donors), 0.0);
    }

    #[test]
    fn a_graft_beyond_what_the_whole_copy_unwound_holds_it() {
        let s = |f: &[&'static str]| f.to_vec();
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
