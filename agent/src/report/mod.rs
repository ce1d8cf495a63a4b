//! `mt-agent report OUT`: each hit's moment as flame graphs in one page.
//!
//! * [`runs`]: the index directories of OUT and their lines;
//! * [`samples`]: a snapshot's samples, through `perf script` (every perf
//!   command goes through [`samples::perf_command`], which sets perf's
//!   `--buildid-dir` to the run's build-id cache);
//! * [`model`]: every snapshot read, in parallel, into folded stacks;
//! * [`moments`]: a hit's moment, folding, shares, the differential;
//! * [`offcpu`]: a hit's off-CPU breakdown and blocked stacks;
//!   [`offcpu_page`]: their part of the page;
//! * [`html`], [`runinfo`]: the page; [`run_view`]: its view of every hit
//!   at once, and `--json`'s `run` object; [`write`]: the files in OUT;
//! * [`profiles`], [`pprof`]: `--pprof`'s profiles (docs/pprof.md);
//!   [`wall_clock`]: times on the wall clock;
//! * [`run_file`]: `OUT/run.json`, the triggers a capture run records for
//!   the report.
//!
//! Exit codes: 0 the report is written; 2 OUT is not an mt-agent output,
//! holds no hit, or some snapshots could not be read (the report is still
//! written, those marked); 3 perf is missing; 4 the report cannot be
//! written.

pub mod cfa;
mod cut_stacks;
mod embed;
pub mod fleet;
pub mod graft;
mod html;
mod jitdump;
mod model;
mod moments;
mod offcpu;
mod offcpu_page;
mod pending_returns;
mod pprof;
mod profiles;
mod run_view;
mod runinfo;
mod samples;
pub mod stack_need;
mod timeline;
mod timeline_page;
mod wall_clock;

use std::{
    collections::HashMap,
    io::Write as _,
    path::{Path, PathBuf},
    time::Instant,
};

use serde_json::json;

use crate::output::{
    index::IndexedHit,
    run_file,
    runs::{self, RunDir},
    write,
};
use crate::{
    error::{ExitCode, Failure},
    flags::defs::ReportArgs,
    output::events::Printer,
};
use model::{FileReport, HitReport};

/// Name of the page in OUT.
pub const PAGE: &str = "report.html";
/// Directory of the folded files in OUT.
pub const FOLDED_DIR: &str = "report";

/// Everything the page is made of.
pub struct Page {
    pub out: PathBuf,
    pub runs: Vec<RunDir>,
    pub files: Vec<FileReport>,
    pub window_ns: u64,
    /// Stacks (over every file) that do not reach a thread's start, and all.
    pub truncated: (u64, u64),
    /// Cut DWARF stacks completed from their thread's complete ones, over
    /// every file (report/graft.rs).
    pub grafted: u64,
    /// First sample time of each index directory, CLOCK_MONOTONIC ns.
    starts: HashMap<PathBuf, u64>,
    /// Go binaries whose path holds another build than the run's
    /// (docs/build-ids.md, "Go binaries").
    pub go_replaced: Vec<crate::capture::build_id_cache::GoReplaced>,
    /// `--pprof`: write the profiles.
    pub pprof: bool,
}

impl Page {
    /// Seconds from the directory's first sample (of every snapshot the index
    /// lists, deleted ones included) to the hit.
    pub fn seconds_into_run(&self, f: &FileReport, hit: &IndexedHit) -> Option<f64> {
        let start = *self.starts.get(&f.dir)?;
        Some((hit.ktime_ns as f64 - start as f64) / 1e9)
    }
}

/// `mt-agent report`.
pub fn run(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    let t0 = Instant::now();
    let perf = crate::perf::binary::find_perf(args.perf.as_deref())?;
    let page = build(&args.out, &perf, args.window.as_nanos() as u64, args.pprof)?;
    let path = write_all(&page)?;
    let bad = warn_bad_files(&page);
    if args.json {
        let mut stdout = std::io::stdout().lock();
        for f in &page.files {
            for h in &f.hits {
                let _ = writeln!(stdout, "{}", hit_json(&page, f, h, &path));
            }
        }
        let _ = writeln!(stdout, "{}", run_view::json(&page, &path));
    } else {
        println!("{}", path.display());
    }
    log::debug!("report in {:.3} s", t0.elapsed().as_secs_f64());
    Ok(if bad > 0 {
        ExitCode::Usage
    } else {
        ExitCode::Ok
    })
}

/// `--report` on a capture run: writes the report of `out` when the run
/// ends and says where (`report: PATH`, or a `report` JSON event); a
/// failure is a warning and does not change the run's exit code.
pub fn after_run(out: &Path, perf: Option<&Path>, printer: &Printer, json: bool) {
    let written = crate::perf::binary::find_perf(perf).and_then(|perf| {
        let page = build(out, &perf, DEFAULT_WINDOW_NS, false)?;
        let path = write_all(&page)?;
        warn_bad_files(&page);
        Ok(path)
    });
    match written {
        // The run ignores SIGPIPE: a reader that went away is not an error.
        Ok(path) if json => {
            let _ = writeln!(
                std::io::stdout(),
                "{}",
                json!({"event": "report", "path": path})
            );
        }
        Ok(path) => {
            let _ = writeln!(std::io::stdout(), "report: {}", path.display());
        }
        Err(f) => printer.warning(&format!("no report: {}", f.message)),
    }
}

/// Records the run's triggers in `out/run.json` for the report (see
/// [`run_file`]), with the whole stacks of `auto`'s measurement (`donors`,
/// [`run_file::StackDonors`]); a failure is a warning.
pub fn record_triggers(
    out: &Path,
    armed: &[crate::output::events::Armed],
    donors: &run_file::StackDonors,
    printer: &Printer,
) {
    if let Err(e) = run_file::write(out, armed, donors) {
        printer.warning(&format!(
            "cannot write {}: {e}",
            out.join(run_file::RUN_FILE).display()
        ));
    }
}

/// `--window` unless told otherwise: 1 s, ns.
pub const DEFAULT_WINDOW_NS: u64 = 1_000_000_000;

/// Reads OUT: errors (exit code 2) when it is not an mt-agent output or
/// holds no hit. With `pprof`, makes the pprof profiles too.
fn build(out: &Path, perf: &Path, window_ns: u64, pprof: bool) -> Result<Page, Failure> {
    let not_ours = |why: String| {
        Failure::usage(format!(
            "{} is not an mt-agent output directory ({why}); give the --output of a run",
            out.display()
        ))
    };
    let meta = std::fs::metadata(out).map_err(|e| not_ours(e.to_string()))?;
    if !meta.is_dir() {
        return Err(not_ours("not a directory".into()));
    }
    let out = &out.canonicalize().map_err(|e| not_ours(e.to_string()))?;
    let runs = runs::discover(out).map_err(|e| not_ours(e.to_string()))?;
    if runs.is_empty() {
        return Err(not_ours(format!(
            "no {} in it or below",
            crate::output::index::INDEX_FILE
        )));
    }
    let hits: usize = runs
        .iter()
        .flat_map(|r| &r.entries)
        .map(|e| e.snapshot.hits.len())
        .sum();
    if hits == 0 {
        return Err(Failure::usage(format!(
            "{}: the run has no hits (its index lists {} snapshot(s), none caused by a call of \
             the trigger); nothing to report",
            out.display(),
            runs.iter().map(|r| r.entries.len()).sum::<usize>()
        )));
    }
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    let files = model::build(&runs, perf, window_ns, jobs, pprof);
    let mut truncated = (0, 0);
    let grafted = files.iter().map(|f| f.grafted).sum();
    let mut starts: HashMap<PathBuf, u64> = HashMap::new();
    for f in &files {
        let (c, t) = moments::truncated(&f.all);
        truncated = (truncated.0 + c, truncated.1 + t);
        if let Some(lo) = earliest(f) {
            let s = starts.entry(f.dir.clone()).or_insert(lo);
            *s = (*s).min(lo);
        }
    }
    let mut caches: Vec<&PathBuf> = runs.iter().filter_map(|r| r.buildid_dir.as_ref()).collect();
    caches.sort();
    caches.dedup();
    let go_replaced = caches
        .into_iter()
        .flat_map(|d| crate::capture::build_id_cache::go_replaced(d))
        .collect();
    Ok(Page {
        out: out.to_path_buf(),
        runs,
        files,
        window_ns,
        truncated,
        grafted,
        starts,
        go_replaced,
        pprof,
    })
}

/// The earliest time a snapshot line knows, CLOCK_MONOTONIC ns: its first
/// sample as the index recorded it (so a file `--keep` deleted still counts),
/// the first sample read from the file, or a hit. The run's start, "s into
/// run"'s zero, is the earliest of its directory's.
fn earliest(f: &FileReport) -> Option<u64> {
    let s = &f.line.snapshot;
    [
        s.span.map(|sp| sp.first_sample_ns),
        f.span_ns.map(|(lo, _)| lo),
        s.hits.iter().map(|h| h.ktime_ns).min(),
    ]
    .into_iter()
    .flatten()
    .min()
}

/// Writes the folded files and the page; returns the page's path.
fn write_all(p: &Page) -> Result<PathBuf, Failure> {
    let fail = |e: std::io::Error| {
        Failure::runtime(format!(
            "cannot write the report in {}: {e}",
            p.out.display()
        ))
    };
    let folded = write::ensure_dir(&p.out, Path::new(FOLDED_DIR)).map_err(fail)?;
    for f in p.files.iter().filter(|f| f.status == model::Status::Read) {
        let dir = write::ensure_dir(&folded, &f.dir).map_err(fail)?;
        let name = |rel: &Path| dir.join(rel.file_name().expect("a file name"));
        write::replace(&name(&f.all_file), moments::folded_text(&f.all).as_bytes())
            .map_err(fail)?;
        for h in &f.hits {
            write::replace(
                &name(&h.moment_file),
                moments::folded_text(&h.moment).as_bytes(),
            )
            .map_err(fail)?;
            if let Some(o) = &h.off_cpu {
                write::replace(&name(&o.file), moments::folded_text(&o.folded).as_bytes())
                    .map_err(fail)?;
            }
        }
    }
    for f in p
        .files
        .iter()
        .filter(|f| f.status == model::Status::Deleted)
    {
        remove_stale_folded(&folded.join(&f.dir), &f.line.snapshot.file);
    }
    if p.pprof {
        write_pprof(p, &folded).map_err(fail)?;
    }
    let path = p.out.join(PAGE);
    write::replace(&path, html::page(p).as_bytes()).map_err(fail)?;
    Ok(path)
}

/// `--pprof`: beside each read snapshot's folded files, the same names with
/// `.pb.gz` for `.folded` (`<file>.all.pb.gz`, `<file>[.<seq>].moment.pb.gz`),
/// and `OUT/report/moments.pb.gz`, every hit's moment (docs/pprof.md).
fn write_pprof(p: &Page, folded: &Path) -> std::io::Result<()> {
    let pb = |rel: &Path| {
        let name = rel.file_name().expect("a file name").to_string_lossy();
        let stem = name.strip_suffix(".folded").unwrap_or(&name);
        folded.join(rel.with_file_name(format!("{stem}.pb.gz")))
    };
    let read = || p.files.iter().filter_map(|f| Some((f, f.pprof.as_ref()?)));
    for (f, prof) in read() {
        write::replace(&pb(&f.all_file), &pprof::gzipped(&prof.all))?;
        for (h, m) in f.hits.iter().zip(&prof.moments) {
            write::replace(&pb(&h.moment_file), &pprof::gzipped(m))?;
        }
    }
    let merged = profiles::merged(read().flat_map(|(_, prof)| &prof.moments));
    write::replace(&folded.join(MOMENTS_PPROF), &pprof::gzipped(&merged))
}

/// `--pprof`'s profile of every hit's moment, in OUT/report.
pub const MOMENTS_PPROF: &str = "moments.pb.gz";

/// Removes the folded files an earlier report wrote in `dir` for the
/// snapshot `file`, which `--keep` or `--max-disk` has since deleted:
/// `<file>.all.folded`, `<file>[.<seq>].moment.folded`, `...offcpu.folded`,
/// and `--pprof`'s `.pb.gz` beside them.
fn remove_stale_folded(dir: &Path, file: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!("{file}.");
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if is_folded_of(&name, &prefix) && e.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Whether `name` is a folded file of the snapshot `prefix` names
/// (`perf.data.<digits>.`): what follows is `all`, `moment` or `offcpu`
/// (`.folded`, or `.pb.gz` for the first two), after an optional hit number.
fn is_folded_of(name: &str, prefix: &str) -> bool {
    let Some(rest) = name.strip_prefix(prefix) else {
        return false;
    };
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    let rest = rest.strip_prefix('.').unwrap_or(rest);
    [
        "all.folded",
        "moment.folded",
        "offcpu.folded",
        "all.pb.gz",
        "moment.pb.gz",
    ]
    .contains(&rest)
}

/// One warning line per snapshot that could not be read; returns how many.
fn warn_bad_files(p: &Page) -> usize {
    let mut n = 0;
    for f in p.files.iter().filter(|f| f.status.is_bad()) {
        n += 1;
        eprintln!(
            "mt-agent: warning: {}: {}; the report marks it and shows the other snapshots",
            p.out.join(&f.dir).join(&f.line.snapshot.file).display(),
            f.status.describe()
        );
    }
    n
}

/// The `--json` object of one hit.
fn hit_json(p: &Page, f: &FileReport, h: &HitReport, page: &Path) -> serde_json::Value {
    let x = &h.hit;
    let read = f.status == model::Status::Read;
    let folded = |rel: &Path| read.then(|| Path::new(FOLDED_DIR).join(rel));
    let m = moments::total(&h.moment);
    json!({
        "event": "hit",
        "report": page,
        "dir": f.dir,
        "file": f.line.snapshot.file,
        "kind": f.line.snapshot.kind,
        "status": f.status.describe(),
        "seq": x.seq, "tgid": x.tgid, "tid": x.tid, "cpu": x.cpu,
        "ktime_ns": x.ktime_ns, "args": x.args,
        "duration_ns": x.duration_ns, "retval": x.retval, "merged": x.merged,
        "hit_to_kill_ns": f.line.snapshot.hit_to_kill_ns,
        "wall_clock": runinfo::wall_clock(f, x),
        "seconds_into_run": p.seconds_into_run(f, x),
        "file_samples": read.then_some(f.samples),
        "file_grafted_stacks": read.then_some(f.grafted),
        "file_jitdumps": read.then_some(f.jitdumps),
        "file_jitdump_error": f.jitdump_error,
        "file_returns_restored": read.then_some(f.returns_restored),
        "file_returns_error": f.returns_error,
        "moment": {
            "start_ns": h.span.start_ns, "end_ns": h.span.end_ns, "tid": h.span.tid,
            "call": h.span.call,
            "samples": m,
            "few_samples": read && m < html::FEW_SAMPLES,
            "folded": folded(&h.moment_file),
            "top": moments::shares(&h.moment, 20),
            "truncated_stacks": moments::truncated(&h.moment).0,
        },
        "all": {
            "samples": moments::total(&f.all),
            "folded": folded(&f.all_file),
            "top": moments::shares(&f.all, 20),
            "truncated_stacks": moments::truncated(&f.all).0,
        },
        "rest_of_thread_samples": moments::total(&h.rest),
        "diff": moments::deltas(&h.moment, &h.rest, 10),
        "off_cpu_from_ns": x.off_cpu.map(|o| o.off_cpu_from_ns),
        "on_cpu_ns": x.off_cpu.map(|o| o.breakdown.on_cpu_ns),
        "runnable_ns": x.off_cpu.map(|o| o.breakdown.runnable_ns),
        "blocked_ns": x.off_cpu.map(|o| o.breakdown.blocked_ns),
        "unknown_ns": x.off_cpu.map(|o| o.breakdown.unknown_ns),
        "off_cpu": h.off_cpu.as_ref().map(|o| offcpu::json(o, read)),
        "timeline": h.timeline.as_ref().map(timeline::json),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_files_are_matched_to_their_snapshot_only() {
        let p = "perf.data.2026120100000001.";
        for name in [
            "perf.data.2026120100000001.all.folded",
            "perf.data.2026120100000001.moment.folded",
            "perf.data.2026120100000001.3.moment.folded",
            "perf.data.2026120100000001.offcpu.folded",
            "perf.data.2026120100000001.12.offcpu.folded",
            "perf.data.2026120100000001.all.pb.gz",
            "perf.data.2026120100000001.3.moment.pb.gz",
        ] {
            assert!(is_folded_of(name, p), "{name}");
        }
        for name in [
            "perf.data.20261201000000012.all.folded",
            "perf.data.2026120100000001.all.folded.tmp",
            "perf.data.2026120100000001",
            "notes.txt",
        ] {
            assert!(!is_folded_of(name, p), "{name}");
        }
    }
}
