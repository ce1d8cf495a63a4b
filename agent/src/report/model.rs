//! Reads every snapshot of a run (in parallel, one `perf script` per file)
//! and builds what the page and the JSON show.

use std::{
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use super::{
    moments::{self, Folded, Span, ThreadParts},
    offcpu::{self, OffCpuView},
    pending_returns,
    profiles::{self, Profiles},
    samples::{self, Samples},
    timeline::{self, Timeline},
    timeline_page::{self, ThreadSamples},
};
use crate::output::{
    index::{IndexedHit, SnapshotLine},
    run_file::{self, StackDonors},
    runs::{RunDir, open_in},
};

/// What became of a snapshot file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Read.
    Read,
    /// `--keep` or `--max-disk` deleted it, as the index says, or, in a run
    /// in progress (whose index says so later), it is gone with every file
    /// listed before it: those delete the oldest first.
    Deleted,
    /// The index names it but it is gone (or is not a regular file).
    Missing(String),
    /// Shorter than the index says: cut short after the run.
    Truncated { have: u64, want: u64 },
    /// perf could not read it.
    Corrupt(String),
}

impl Status {
    /// A file that should be there and could not be read.
    pub fn is_bad(&self) -> bool {
        matches!(
            self,
            Status::Missing(_) | Status::Truncated { .. } | Status::Corrupt(_)
        )
    }

    /// One phrase for the page and the warnings.
    pub fn describe(&self) -> String {
        match self {
            Status::Read => "read".into(),
            Status::Deleted => "deleted by --keep or --max-disk".into(),
            Status::Missing(e) => format!("missing ({e})"),
            Status::Truncated { have, want } => {
                format!("truncated: {have} bytes of the {want} the index lists")
            }
            Status::Corrupt(e) => format!("unreadable: {e}"),
        }
    }
}

/// One hit's moment, folded.
#[derive(Debug)]
pub struct HitReport {
    pub hit: IndexedHit,
    pub span: Span,
    /// The moment on the hit's thread.
    pub moment: Folded,
    /// The rest of the same thread's samples in the snapshot.
    pub rest: Folded,
    /// Name of the folded file of the moment, relative to OUT/report.
    pub moment_file: PathBuf,
    /// The off-CPU breakdown, when the run recorded one (`--off-cpu`).
    pub off_cpu: Option<OffCpuView>,
    /// The moment in time order; `None` when the file was not read.
    pub timeline: Option<Timeline>,
    /// The hit thread's samples in the snapshot, for the page's range
    /// flame graph (empty when the file was not read).
    pub thread_samples: ThreadSamples,
}

/// One snapshot file.
#[derive(Debug)]
pub struct FileReport {
    /// The index directory, relative to OUT.
    pub dir: PathBuf,
    pub line: SnapshotLine<'static>,
    pub status: Status,
    /// Samples in the file.
    pub samples: u64,
    /// First and last sample times, CLOCK_MONOTONIC ns.
    pub span_ns: Option<(u64, u64)>,
    /// The whole process over the whole snapshot.
    pub all: Folded,
    pub all_file: PathBuf,
    pub hits: Vec<HitReport>,
    /// perf's command line, from the file's header.
    pub cmdline: Option<String>,
    /// The samples of each thread with a hit in the index directory, inside
    /// and outside the moments of all its hits (the run view's input).
    pub threads: Vec<ThreadParts>,
    /// `--pprof`: the file's profiles, when it was read.
    pub pprof: Option<Profiles>,
    /// Cut DWARF stacks the report completed (report/graft.rs).
    pub grafted: u64,
    /// Kept jitdump files its JIT code was named from, and why they could
    /// not be read, if so (report/jitdump.rs).
    pub jitdumps: u64,
    pub jitdump_error: Option<String>,
    /// Return addresses written back into its DWARF stack copies, and why
    /// they could not be, if so (report/pending_returns.rs).
    pub returns_restored: u64,
    pub returns_error: Option<String>,
}

/// The page's id of a hit's section: `hit-<dir>-<file>-<seq>` (`/` in
/// the directory as `-`), stable across reports of the same OUT.
pub fn anchor(f: &FileReport, hit: &HitReport) -> String {
    let dir = f.dir.display().to_string().replace('/', "-");
    format!("hit-{dir}-{}-{}", f.line.snapshot.file, hit.hit.seq)
}

/// Reads every file of every index directory, `jobs` at a time; with
/// `pprof`, makes each file's pprof profiles too.
pub fn build(
    runs: &[RunDir],
    perf: &Path,
    window_ns: u64,
    jobs: usize,
    pprof: bool,
) -> Vec<FileReport> {
    // Each run's `auto` measurement stacks, read once (run.json).
    let donors: Vec<StackDonors> = runs
        .iter()
        .map(|r| run_file::donors_of(&r.out, r))
        .collect();
    let work: Vec<(&RunDir, &StackDonors, usize, &SnapshotLine<'static>)> = runs
        .iter()
        .zip(&donors)
        .flat_map(|(r, d)| r.entries.iter().enumerate().map(move |(i, e)| (r, d, i, e)))
        .collect();
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<(usize, FileReport)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, work.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((run, donors, pos, line)) = work.get(i) else {
                        break;
                    };
                    let r = one_file(run, donors, *pos, line, perf, window_ns, pprof);
                    done.lock().expect("not poisoned").push((i, r));
                }
            });
        }
    });
    let mut done = done.into_inner().expect("not poisoned");
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

fn one_file(
    run: &RunDir,
    donors: &StackDonors,
    pos: usize,
    line: &SnapshotLine<'static>,
    perf: &Path,
    window_ns: u64,
    pprof: bool,
) -> FileReport {
    let snapshot = &line.snapshot;
    let mut rep = FileReport {
        dir: run.rel.clone(),
        line: line.clone(),
        status: Status::Read,
        samples: 0,
        span_ns: None,
        all: Vec::new(),
        all_file: run.rel.join(format!("{}.all.folded", snapshot.file)),
        hits: Vec::new(),
        cmdline: None,
        pprof: None,
        threads: Vec::new(),
        grafted: 0,
        jitdumps: 0,
        jitdump_error: None,
        returns_restored: 0,
        returns_error: None,
    };
    let read = match open_in(&run.out, &run.rel.join(&snapshot.file)) {
        Err(_) if run.deleted.contains(&snapshot.file) => Err(Status::Deleted),
        Err(_) if rotated_away(run, pos) => Err(Status::Deleted),
        Err(e) => Err(Status::Missing(e.to_string())),
        Ok(f) => match f.metadata().map(|m| m.len()) {
            Ok(have) if have < snapshot.bytes => Err(Status::Truncated {
                have,
                want: snapshot.bytes,
            }),
            _ => {
                let calls = pending_returns::calls_of(&snapshot.hits);
                samples::read(perf, run.buildid_dir.as_deref(), &f, &calls, donors)
                    .map_err(Status::Corrupt)
            }
        },
    };
    match read {
        Ok(s) => {
            fill(&mut rep, &s, window_ns);
            rep.threads = moments::split_by_moments(&s, &dir_spans(run, window_ns));
            if pprof {
                rep.pprof = Some(pprof_of(run, &rep, &s));
            }
        }
        Err(status) => rep.status = status,
    }
    // Hits are listed even when their file could not be read.
    if rep.hits.is_empty() {
        rep.hits = snapshot
            .hits
            .iter()
            .map(|h| hit_report(&rep, h, window_ns))
            .collect();
    }
    rep
}

/// Whether the file at `pos` in `run`'s index was rotated away: in a run
/// in progress (perf's open `perf.data` is there), it is gone, and so is
/// every file listed before it. `--keep` (perf's
/// `--switch-max-files`) and `--max-disk` delete the oldest first, and the
/// recorder indexes that later. Checked when the file is found gone, so a
/// file rotated while the report runs counts too. A run that ended has
/// indexed its deletions, so a file gone from it is missing.
fn rotated_away(run: &RunDir, pos: usize) -> bool {
    let gone = |f: &str| std::fs::symlink_metadata(run.path.join(f)).is_err();
    !gone("perf.data")
        && all_gone(
            run.entries[..pos].iter().map(|e| e.snapshot.file.as_str()),
            gone,
        )
}

/// Whether `gone` holds for each of `files`. Pure.
fn all_gone<'a>(mut files: impl Iterator<Item = &'a str>, gone: impl Fn(&str) -> bool) -> bool {
    files.all(gone)
}

/// The moments of every hit the index directory lists.
fn dir_spans(run: &RunDir, window_ns: u64) -> Vec<Span> {
    run.entries
        .iter()
        .flat_map(|e| &e.snapshot.hits)
        .map(|h| moments::span(h, window_ns))
        .collect()
}

fn hit_report(rep: &FileReport, h: &IndexedHit, window_ns: u64) -> HitReport {
    let name = if rep.line.snapshot.hits.len() > 1 {
        format!("{}.{}.moment.folded", rep.line.snapshot.file, h.seq)
    } else {
        format!("{}.moment.folded", rep.line.snapshot.file)
    };
    let moment_file = rep.dir.join(name);
    HitReport {
        hit: h.clone(),
        span: moments::span(h, window_ns),
        moment: Vec::new(),
        rest: Vec::new(),
        off_cpu: offcpu::from_index(h, &moment_file, rep.line.snapshot.gaps()),
        moment_file,
        timeline: None,
        thread_samples: ThreadSamples::default(),
    }
}

/// A read file's pprof profiles (`--pprof`).
fn pprof_of(run: &RunDir, rep: &FileReport, s: &Samples) -> Profiles {
    let (trigger, period_ns) = profiles::source(run, rep.cmdline.as_deref());
    let src = profiles::Source {
        snapshot: &rep.line.snapshot,
        trigger: trigger.as_deref(),
        period_ns,
    };
    let hits: Vec<_> = rep.hits.iter().map(|h| (&h.hit, h.span)).collect();
    profiles::of_snapshot(s, &src, &hits)
}

fn fill(rep: &mut FileReport, s: &Samples, window_ns: u64) {
    rep.cmdline = s.cmdline.clone();
    rep.samples = s.samples.len() as u64;
    rep.grafted = s.grafted as u64;
    rep.jitdumps = s.jitdumps as u64;
    rep.jitdump_error = s.jitdump_error.clone();
    rep.returns_restored = s.returns_restored as u64;
    rep.returns_error = s.returns_error.clone();
    let lo = s.samples.iter().map(|x| x.time_ns).min();
    let hi = s.samples.iter().map(|x| x.time_ns).max();
    rep.span_ns = lo.zip(hi);
    rep.all = moments::fold(s, |_| true);
    for h in &rep.line.snapshot.hits {
        let mut hr = hit_report(rep, h, window_ns);
        let sp = hr.span;
        hr.moment = moments::fold(s, |x| sp.contains(x));
        hr.rest = moments::fold(s, |x| x.tid == sp.tid && !sp.contains(x));
        if let Some(o) = hr.off_cpu.as_mut() {
            offcpu::add_stacks(o, s, h.tid);
        }
        hr.thread_samples = timeline_page::thread_samples(s, h.tid);
        hr.timeline = Some(timeline::compute(s, h, &rep.line.snapshot, &sp));
        rep.hits.push(hr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_oldest_gone_files_count_as_rotated_away() {
        let gone = ["a", "b", "d"];
        let is_gone = |f: &str| gone.contains(&f);
        let before = |n: usize| ["a", "b", "c", "d", "e"].into_iter().take(n);
        // "b" is gone after gone files: rotated.
        assert!(all_gone(before(1), is_gone));
        // "d" is gone after "c", which is there: damage, not rotation.
        assert!(!all_gone(before(3), is_gone));
    }
}
