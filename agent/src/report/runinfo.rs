//! What the page says about a run: target, event, frequency and time span
//! (from perf's command line in the snapshots' headers), counters (from the
//! index), and hit times on the wall clock (from perf's file names).

use super::{
    Page,
    model::{FileReport, Status},
};
use crate::output::{counters::CounterValues, index::IndexedHit, runs::RunDir};

/// One row of the page's "The run" table.
pub struct RunInfo {
    pub target: String,
    pub trigger: String,
    pub event: String,
    pub freq: String,
    pub span: String,
    pub counters: String,
}

/// The time span cell: the samples read (first to last, ns) and the files
/// they came from; files deleted by `--keep` or `--max-disk` are counted
/// apart, since nothing of them was read.
fn span_text(span: Option<(u64, u64)>, read: usize, deleted: usize) -> String {
    let gone = if deleted > 0 {
        format!(" ({deleted} more deleted by --keep or --max-disk)")
    } else {
        String::new()
    };
    match span {
        Some((a, b)) => format!(
            "{:.3} s of samples, in {read} file(s){gone}",
            b.saturating_sub(a) as f64 / 1e9
        ),
        None => format!("{read} file(s) read, no samples{gone}"),
    }
}

/// The row for one index directory.
pub fn of(p: &Page, r: &RunDir) -> RunInfo {
    let files: Vec<&FileReport> = p.files.iter().filter(|f| f.dir == r.rel).collect();
    let cmd = files
        .iter()
        .find_map(|f| f.cmdline.as_deref())
        .unwrap_or("");
    let tgids: Vec<String> = {
        let mut v: Vec<u32> = files
            .iter()
            .flat_map(|f| f.line.snapshot.hits.iter().map(|h| h.tgid))
            .collect();
        v.sort_unstable();
        v.dedup();
        v.iter().map(u32::to_string).collect()
    };
    let target = match option(cmd, &["-p", "--pid"]) {
        Some(pid) => format!("pid {pid}"),
        None if !tgids.is_empty() => format!("pid {}", tgids.join(", ")),
        None => "-".into(),
    };
    let hits: usize = files.iter().map(|f| f.line.snapshot.hits.len()).sum();
    let slow = files
        .iter()
        .any(|f| f.line.snapshot.hits.iter().any(|h| h.duration_ns.is_some()));
    let function = match crate::output::run_file::trigger_of(&p.out, r) {
        Some(t) => format!("{} in {}: ", t.symbol, t.object.display()),
        None => String::new(),
    };
    let trigger = format!(
        "{function}{hits} hit(s){}",
        if slow {
            ", slow calls (--slower-than)"
        } else {
            ""
        }
    );
    let lo = files.iter().filter_map(|f| f.span_ns.map(|s| s.0)).min();
    let hi = files.iter().filter_map(|f| f.span_ns.map(|s| s.1)).max();
    let read = files.iter().filter(|f| f.status == Status::Read).count();
    let deleted = files.iter().filter(|f| f.status == Status::Deleted).count();
    let span = span_text(lo.zip(hi), read, deleted);
    let counters = files
        .last()
        .map(|f| counters(&f.line.counters))
        .unwrap_or_default();
    RunInfo {
        target,
        trigger,
        event: option(cmd, &["-e", "--event"]).unwrap_or("-").to_string(),
        freq: option(cmd, &["-F", "--freq"]).unwrap_or("-").to_string(),
        span,
        counters,
    }
}

/// The value of a command-line option (`-F 999`, `--freq=999`).
/// How perf unwound the user stacks of the CPU samples, from its command
/// line: `fp` (`-g`, or `--call-graph fp`), `dwarf,SIZE`, another mode
/// (`lbr`), or `None` when the command line names none.
pub fn unwinding(cmd: &str) -> Option<String> {
    if let Some(mode) = option(cmd, &["--call-graph"]) {
        return Some(mode.to_string());
    }
    // `-g` alone or in a cluster of short flags (`-ag`) is fp.
    cmd.split_whitespace()
        .any(|w| w.starts_with('-') && !w.starts_with("--") && w.contains('g') && w.len() <= 4)
        .then(|| "fp".to_string())
}

/// What the page tells a reader whose stacks stop short of their thread's
/// start, for the unwinding the run used (never the one it already used).
pub fn truncation_advice(unwinding: Option<&str>) -> &'static str {
    match unwinding {
        Some(m) if m == "fp" || m.starts_with("fp,") => {
            "the objects were probably built without frame pointers. Their callers are missing \
             from the graphs; record with DWARF unwinding (<code>--call-graph dwarf</code>)."
        }
        Some(m) if m.starts_with("dwarf") => {
            "the run already used DWARF unwinding, which stops where a stack is deeper than the \
             copy perf took (record with <code>--call-graph dwarf,16384</code>) or where perf \
             cannot unwind a function's call-frame information, as perf 6.1 cannot Go's (Go \
             keeps frame pointers: record with <code>--call-graph fp</code>)."
        }
        _ => {
            "perf's unwinding stopped early. Their callers are missing from the graphs; \
             <code>--call-graph fp</code> suits code with frame pointers (and Go), \
             <code>--call-graph dwarf</code> code without."
        }
    }
}

fn option<'a>(cmd: &'a str, names: &[&str]) -> Option<&'a str> {
    let mut it = cmd.split_whitespace();
    while let Some(w) = it.next() {
        for n in names {
            if w == *n {
                return it.next();
            }
            if let Some(v) = w.strip_prefix(n).and_then(|r| r.strip_prefix('=')) {
                return Some(v);
            }
        }
    }
    None
}

fn counters(c: &CounterValues) -> String {
    format!(
        "seen {}, accepted {}, dropped {}, lost {}",
        c.seen,
        c.accepted,
        c.dropped.total(),
        c.lost
    )
}

/// The hit's wall-clock time, from the snapshot's name (see
/// [`super::wall_clock`]): the switch time less the hit's distance from
/// it, to about 10 ms.
pub fn wall_clock(f: &FileReport, hit: &IndexedHit) -> Option<String> {
    let switch_ms = super::wall_clock::switch_ms(&f.line.snapshot.file)?;
    let first = f.line.snapshot.hits.first()?.ktime_ns;
    let before_ns =
        f.line.snapshot.hit_to_kill_ns.unwrap_or(0) + first.saturating_sub(hit.ktime_ns);
    let ms = switch_ms - (before_ns / 1_000_000) as i64;
    let secs = ms.div_euclid(1000);
    // SAFETY: a zeroed tm is valid; gmtime_r gets valid pointers.
    unsafe {
        let mut out: libc::tm = std::mem::zeroed();
        libc::gmtime_r(&secs, &mut out);
        Some(format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:02}",
            out.tm_year + 1900,
            out.tm_mon + 1,
            out.tm_mday,
            out.tm_hour,
            out.tm_min,
            out.tm_sec,
            ms.rem_euclid(1000) / 10
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_span_counts_the_files_read_and_the_deleted_apart() {
        assert_eq!(
            span_text(Some((0, 1_500_000_000)), 20, 1567),
            "1.500 s of samples, in 20 file(s) (1567 more deleted by --keep or --max-disk)"
        );
        assert_eq!(
            span_text(Some((0, 0)), 3, 0),
            "0.000 s of samples, in 3 file(s)"
        );
        assert_eq!(
            span_text(None, 0, 2),
            "0 file(s) read, no samples (2 more deleted by --keep or --max-disk)"
        );
    }

    #[test]
    fn options_of_perfs_command_line() {
        let c = "/usr/bin/perf record -p 42 -o /x/perf.data -e cpu-clock -F 999 -g";
        assert_eq!(option(c, &["-p"]), Some("42"));
        assert_eq!(option(c, &["-e"]), Some("cpu-clock"));
        assert_eq!(
            option("perf record --freq=99", &["-F", "--freq"]),
            Some("99")
        );
        assert_eq!(option(c, &["--call-graph"]), None);
    }

    #[test]
    fn the_advice_on_cut_stacks_never_repeats_the_unwinding_used() {
        let dwarf = "/usr/bin/perf record -p 42 -e cpu-clock/freq=999/ -e sched:sched_switch \
                     --switch-events --call-graph dwarf,8192 -k CLOCK_MONOTONIC";
        assert_eq!(unwinding(dwarf).as_deref(), Some("dwarf,8192"));
        let fp = "/usr/bin/perf record -p 42 -e cpu-clock/freq=999/ -e \
                  sched:sched_switch/call-graph=dwarf,stack-size=1024/ --switch-events -d \
                  --call-graph fp -k CLOCK_MONOTONIC";
        assert_eq!(unwinding(fp).as_deref(), Some("fp"));
        assert_eq!(
            unwinding("/usr/bin/perf record -p 42 -e cpu-clock -F 999 -g").as_deref(),
            Some("fp")
        );
        assert_eq!(unwinding("/usr/bin/perf record -p 42 -F 999"), None);
        let advice = |cmd: &str| truncation_advice(unwinding(cmd).as_deref());
        assert!(
            !advice(dwarf).contains("record with DWARF"),
            "{}",
            advice(dwarf)
        );
        assert!(!advice(dwarf).contains("dwarf</code>"), "{}", advice(dwarf));
        assert!(advice(dwarf).contains("--call-graph fp"));
        assert!(advice(fp).contains("--call-graph dwarf"));
        assert!(!advice(fp).contains("--call-graph fp"));
    }
}
