//! What the agent prints: one line per event, as text or (with `--json`) as
//! newline-delimited JSON on stdout, each line flushed.
//!
//! JSON events have an `"event"` field: `armed`, `hit_accepted`, `snapshot`,
//! `target_started`, `target_finished` (for `exe` triggers), `warning`,
//! `summary`, `error`. Their fields are part of mt-agent's interface
//! (GUIDE.md, "JSON events").

use std::{
    io::{self, Write},
    path::PathBuf,
    sync::Mutex,
};

use serde::Serialize;
use serde_json::json;

use crate::{
    error::Failure,
    output::{
        counters::CounterValues,
        index::{IndexedHit, Snapshot},
    },
    perf::offcpu::OffCpu,
    symbols::insn::CostHint,
};

/// Sent once both perf and the probe are ready.
#[derive(Debug, Clone, Serialize)]
pub struct Armed {
    /// Traced process (absent for `--exe`, whose processes come and go).
    pub pid: Option<i32>,
    /// perf's pid (absent for `--exe`).
    pub perf_pid: Option<i32>,
    /// `--exe`: the executable traced in every process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exe: Option<PathBuf>,
    /// Trigger index (with --config, several triggers share one agent).
    pub trigger: u32,
    /// Sampled event and frequency (Hz).
    pub event: String,
    pub freq: u32,
    /// Trigger function (demangled) and the object it is in.
    pub symbol: String,
    pub object: PathBuf,
    /// File offset of the entry uprobe.
    pub attach_offset: u64,
    /// Number of uprobes attached (entry, plus returns for --slower-than).
    pub uprobes: usize,
    /// `--slower-than`: how the returns are seen, `uretprobe` or `ret`
    /// (uprobes on each `ret` instruction).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub returns: Option<&'static str>,
    /// Why not by a uretprobe, when by uprobes on `ret`s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub returns_why: Option<String>,
    /// What a hit costs, from the probed instruction.
    pub cost: Option<CostHint>,
    /// Output directory.
    pub output: PathBuf,
    /// From the agent's start to armed, ms.
    pub time_to_armed_ms: f64,
    /// From spawning perf to its first acked `ping`, ms.
    pub perf_ready_ms: f64,
    /// What perf reads as `/proc/kallsyms`: `copy` (the agent's small copy,
    /// perf/kallsyms.rs) or `proc` (the real file).
    pub perf_kallsyms: &'static str,
    /// `continuous` or `flight-recorder`.
    pub recording: &'static str,
    /// Flight recorder: bytes of each of perf's rings (one per CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flight_ring_bytes: Option<u64>,
    /// How perf unwinds stacks (`mode`: `fp`, `dwarf,SIZE` or
    /// `pass-through`) and why.
    pub unwinding: crate::perf::unwind::Unwinding,
    /// perf also records the target threads' context switches, with a stack
    /// at each switch-out: the off-CPU breakdown.
    pub off_cpu: bool,
    /// The trigger's object is a Go binary: the off-CPU breakdown describes
    /// OS threads, not goroutines.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub go: bool,
}

impl Armed {
    /// How perf keeps samples, in words.
    fn recording_words(&self) -> String {
        let how = match self.flight_ring_bytes {
            Some(b) => format!("in a flight recorder of {} KiB per CPU", b / 1024),
            None => "continuously".into(),
        };
        if self.off_cpu && self.go {
            format!(
                "{how}, with its context switches for the off-CPU breakdown (of OS threads: \
                 a Go target's goroutines move between them, docs/off-cpu.md)"
            )
        } else if self.off_cpu {
            format!("{how}, with its context switches for the off-CPU breakdown")
        } else {
            how
        }
    }
}

/// One completed snapshot, as printed: the traced process, the snapshot's
/// number, then the snapshot's fields (as in the index).
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotEvent<'a> {
    /// The traced process it belongs to.
    pub pid: i32,
    /// Number of this snapshot (hit and tail counted together), from 1.
    pub n: u64,
    #[serde(flatten)]
    pub snapshot: &'a Snapshot,
}

/// The end of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Why the run ended.
    pub end: String,
    /// The exit code the agent ends with.
    pub exit_code: i32,
    /// Kernel counters.
    pub counters: CounterValues,
    /// Userspace counts: delivered, merged, snapshots.
    pub stats: Stats,
    /// `--slower-than` calls entered but not returned when the run ended.
    pub open_calls: u64,
    /// perf's CPU time, seconds, and how it exited.
    pub perf_cpu_s: Option<f64>,
    pub perf_exit: Option<String>,
    /// Agent's peak RSS (VmHWM), KiB.
    pub agent_peak_rss_kib: Option<u64>,
    /// Agent's CPU time (user + system, all threads), seconds.
    pub agent_cpu_s: f64,
    /// Run time, seconds.
    pub duration_s: f64,
    pub output: PathBuf,
    /// `--exe` and `--config`: each recorder (one per traced process).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub recorders: Vec<crate::output::events::RecorderSummary>,
    /// Hits from processes that had no recorder.
    pub unrecorded_hits: u64,
    /// Hits from processes whose perf was not recording yet: with `--exe`,
    /// calls right after a new process's exec (GUIDE.md, "`exe` triggers").
    pub hits_before_recording: u64,
    /// Processes of an `--exe` beyond `--max-targets`, not recorded.
    pub extra_processes: u64,
    /// Probes detached during cooldowns (GUIDE.md, "Disarming during a
    /// cooldown").
    pub disarm: crate::output::events::DisarmSummary,
}

/// Counts kept by the state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Stats {
    /// Hits delivered through the ring buffer.
    pub delivered: u64,
    /// Hits merged into a snapshot another hit caused (or into the tail).
    pub merged: u64,
    /// Snapshots closed by a hit.
    pub hit_snapshots: u64,
    /// Snapshots perf closed as it stopped.
    pub tail_snapshots: u64,
    /// Hits whose snapshot perf never wrote (perf died).
    pub unsnapshotted: u64,
}

impl Stats {
    /// Adds another recorder's counts (for a summary over several).
    pub fn add(&mut self, other: &Stats) {
        self.delivered += other.delivered;
        self.merged += other.merged;
        self.hit_snapshots += other.hit_snapshots;
        self.tail_snapshots += other.tail_snapshots;
        self.unsnapshotted += other.unsnapshotted;
    }
}

/// One recorder in the summary.
#[derive(Debug, Clone, Serialize)]
pub struct RecorderSummary {
    pub trigger: u32,
    pub pid: i32,
    pub output: PathBuf,
    pub end: String,
    pub hit_snapshots: u64,
    pub tail_snapshots: u64,
    pub perf_exit: Option<String>,
}

/// Disarming over a run, for the summary (JSON field `disarm`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct DisarmSummary {
    /// How the probes are taken out and put back: `uprobe_events` (tracefs
    /// uprobe events, milliseconds) or `uprobe_pmu` (aya's links, ~0.1 s
    /// per detach); None when no trigger disarms.
    pub probes: Option<&'static str>,
    /// Disarm cycles, over triggers.
    pub cycles: u64,
    /// Accepted hits after which the probes stayed in (the cooldown was
    /// shorter than a detach and an attach), over triggers.
    pub kept_armed: u64,
    /// Time the probes were detached, seconds, summed over triggers.
    pub disarmed_s: f64,
    /// How late the re-arm was against the cooldown's end, µs (p50, p99).
    pub rearm_late_us_p50: Option<f64>,
    pub rearm_late_us_p99: Option<f64>,
    /// How early the re-arm was against the cooldown's end, µs (p50,
    /// p99): calls then trap and the kernel's cooldown drops them.
    pub rearm_early_us_p50: Option<f64>,
    pub rearm_early_us_p99: Option<f64>,
    /// Re-arms after a warm-up that took the kernel's grace period ahead
    /// of time (disarm/rcu_warmup.rs), over triggers.
    pub warmed_arms: u64,
    /// Time to detach one uprobe (arming thread), µs (p50, p99).
    pub detach_us_p50: Option<f64>,
    pub detach_us_p99: Option<f64>,
    /// Time to attach a trigger's uprobes again (arming thread), µs.
    pub attach_us_p50: Option<f64>,
    pub attach_us_p99: Option<f64>,
}

/// Prints events.
pub struct Printer {
    json: bool,
    verbose: bool,
    out: Mutex<()>,
    /// stdout's reader went away (EPIPE): nothing more is written there.
    stdout_gone: std::sync::atomic::AtomicBool,
    /// Wakes [`Printer::stdout_closed`] once, at the first EPIPE.
    gone: tokio::sync::Notify,
}

impl Printer {
    pub fn new(json: bool, verbose: bool) -> Self {
        Self {
            json,
            verbose,
            out: Mutex::new(()),
            stdout_gone: Default::default(),
            gone: tokio::sync::Notify::new(),
        }
    }

    /// Writes one line to stdout. When the reader has gone (EPIPE: `| head`),
    /// stops writing there and wakes [`Printer::stdout_closed`], which the
    /// run takes as a request to end cleanly, like SIGTERM. (Rust ignores
    /// SIGPIPE, so the write fails instead of killing the agent while perf
    /// and the probes are live.)
    fn print(&self, line: &str) {
        use std::sync::atomic::Ordering;
        let _guard = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if self.stdout_gone.load(Ordering::Relaxed) {
            return;
        }
        let mut out = io::stdout().lock();
        let r = writeln!(out, "{line}").and_then(|()| out.flush());
        if let Err(e) = r
            && e.kind() == io::ErrorKind::BrokenPipe
            && !self.stdout_gone.swap(true, Ordering::Relaxed)
        {
            // notify_one keeps a permit if nobody waits yet.
            self.gone.notify_one();
        }
    }

    /// Completes once a write to stdout has failed with EPIPE.
    pub async fn stdout_closed(&self) {
        self.gone.notified().await;
    }

    fn print_json(&self, value: serde_json::Value) {
        self.print(&value.to_string());
    }

    fn event<T: Serialize>(&self, name: &str, body: &T) {
        let mut v = serde_json::to_value(body).unwrap_or_else(|_| json!({}));
        if let Some(obj) = v.as_object_mut() {
            obj.insert("event".into(), json!(name));
        }
        self.print_json(v);
    }

    /// `armed`.
    pub fn armed(&self, a: &Armed) {
        if self.json {
            return self.event("armed", a);
        }
        let cost = a
            .cost
            .as_ref()
            .map(|c| format!("; a hit costs {}", c.describe()))
            .unwrap_or_default();
        let probes = format!(
            "{} uprobe{} on {} in {}{cost}; stacks: {} ({})",
            a.uprobes,
            if a.uprobes == 1 { "" } else { "s" },
            a.symbol,
            a.object.display(),
            a.unwinding.mode,
            a.unwinding.reason
        );
        match (a.pid, a.perf_pid, &a.exe) {
            (Some(pid), Some(perf_pid), _) => self.print(&format!(
                "armed in {:.0} ms (perf ready in {:.0} ms): perf (pid {perf_pid}) records pid {pid} \
                 with {} at {} Hz {}; {probes}; writing to {}",
                a.time_to_armed_ms,
                a.perf_ready_ms,
                a.event,
                a.freq,
                a.recording_words(),
                a.output.display()
            )),
            (_, _, exe) => self.print(&format!(
                "armed in {:.0} ms: {probes}, for every process running {}; one perf per process \
                 ({} at {} Hz {}) writing to {}/<pid>",
                a.time_to_armed_ms,
                exe.as_deref().unwrap_or(&a.object).display(),
                a.event,
                a.freq,
                a.recording_words(),
                a.output.display()
            )),
        }
    }

    /// `target_started` / `target_finished`: a recorder for one process of
    /// an `--exe` trigger.
    pub fn target(
        &self,
        pid: i32,
        trigger: u32,
        state: &str,
        output: &std::path::Path,
        end: Option<&str>,
    ) {
        if self.json {
            let mut v = json!({"event": format!("target_{state}"), "pid": pid, "trigger": trigger, "output": output});
            if let Some(e) = end {
                v["end"] = json!(e);
            }
            return self.print_json(v);
        }
        match end {
            Some(e) => self.print(&format!(
                "pid {pid}: recording {state} ({e}); snapshots in {}",
                output.display()
            )),
            None => self.print(&format!(
                "pid {pid}: recording {state}, into {}",
                output.display()
            )),
        }
    }

    /// `disarmed`: a trigger's uprobes are detached until about `rearm_ns`
    /// (CLOCK_MONOTONIC), the end of its cooldown. Printed in JSON mode, and
    /// at -v in text mode.
    pub fn disarmed(&self, trigger: u32, rearm_ns: u64) {
        if self.json {
            return self.print_json(
                json!({"event": "disarmed", "trigger": trigger, "rearm_ns": rearm_ns}),
            );
        }
        if self.verbose {
            self.print(&format!(
                "trigger {trigger} disarmed until its cooldown ends"
            ));
        }
    }

    /// `rearmed`: a trigger's uprobes are attached again, `late_ns` after
    /// its cooldown ended. Printed in JSON mode, and at -v in text mode.
    pub fn rearmed(&self, trigger: u32, late_ns: u64) {
        if self.json {
            return self
                .print_json(json!({"event": "rearmed", "trigger": trigger, "late_ns": late_ns}));
        }
        if self.verbose {
            self.print(&format!(
                "trigger {trigger} re-armed {:.0} µs after its cooldown ended",
                late_ns as f64 / 1000.0
            ));
        }
    }

    /// `hit_accepted`: printed in JSON mode, and at -v in text mode.
    pub fn hit(&self, h: &IndexedHit) {
        if self.json {
            return self.event("hit_accepted", h);
        }
        if self.verbose {
            self.print(&format!(
                "hit {}: tid {} cpu {} args {}",
                h.seq,
                h.tid,
                h.cpu,
                args(&h.args)
            ));
        }
    }

    /// `snapshot`.
    pub fn snapshot(&self, e: &SnapshotEvent<'_>) {
        if self.json {
            return self.event("snapshot", e);
        }
        let s = e.snapshot;
        let size = human_bytes(s.bytes);
        match s.kind {
            crate::output::index::SnapshotKind::Hit => {
                let first = &s.hits[0];
                let merged = s.hits.len() as u64 - 1 + s.unlisted_hits;
                let merged = if merged > 0 {
                    format!(" (+{merged} merged)")
                } else {
                    String::new()
                };
                let dur = first
                    .duration_ns
                    .map(|d| format!(", call took {}", human_ns(d)))
                    .unwrap_or_default();
                let kill = s
                    .hit_to_kill_ns
                    .map(|k| format!(", signalled {} after the hit", human_ns(k)))
                    .unwrap_or_default();
                let off = first.off_cpu.map(breakdown_text).unwrap_or_default();
                self.print(&format!(
                    "snapshot {}: {} ({size}): hit {} in tid {}, args {}{dur}{off}{kill}{merged}",
                    e.n,
                    s.file,
                    first.seq,
                    first.tid,
                    args(&first.args)
                ));
            }
            crate::output::index::SnapshotKind::Tail => {
                let n = s.hits.len() as u64 + s.unlisted_hits;
                let hits = if n == 0 {
                    String::new()
                } else {
                    format!(", {n} late hit(s) merged")
                };
                self.print(&format!("tail {}: {} ({size}){hits}", e.n, s.file));
            }
        }
    }

    /// An event of a later stage: `body` as the JSON event `name`, or
    /// `text` as a line on stdout.
    pub fn line<T: Serialize>(&self, name: &str, body: &T, text: &str) {
        if self.json {
            return self.event(name, body);
        }
        self.print(text);
    }

    /// `warning`: text goes to stderr, JSON to stdout.
    pub fn warning(&self, message: &str) {
        if self.json {
            return self.print_json(json!({"event": "warning", "message": message}));
        }
        eprintln!("mt-agent: warning: {message}");
    }

    /// Detail at -v (text only).
    pub fn verbose(&self, message: &str) {
        if self.verbose && !self.json {
            eprintln!("mt-agent: {message}");
        }
    }

    /// `summary`.
    pub fn summary(&self, s: &Summary) {
        if self.json {
            return self.event("summary", s);
        }
        let c = &s.counters;
        let dropped = c.dropped.total();
        let why = if dropped > 0 {
            format!(" ({})", c.dropped.describe())
        } else {
            String::new()
        };
        let open = if s.open_calls > 0 {
            format!(", {} calls still open", s.open_calls)
        } else {
            String::new()
        };
        self.print(&format!(
            "summary: seen {}, dropped {dropped}{why}, accepted {}, merged {}, lost {}{open}; \
             snapshots: {} hit + {} tail in {}",
            c.seen,
            c.accepted,
            s.stats.merged,
            c.lost,
            s.stats.hit_snapshots,
            s.stats.tail_snapshots,
            s.output.display()
        ));
        let perf = match (&s.perf_exit, s.perf_cpu_s) {
            (Some(e), Some(cpu)) => format!("; perf used {cpu:.2} s CPU and ended with {e}"),
            (Some(e), None) => format!("; perf ended with {e}"),
            // Several recorders: their perfs' CPU time, summed.
            (None, Some(cpu)) => format!(
                "; {} perf process(es) used {cpu:.2} s CPU",
                s.recorders.len()
            ),
            (None, None) => String::new(),
        };
        let mut unrecorded = String::new();
        if s.unrecorded_hits > 0 {
            unrecorded += &format!(
                "; {} hits came from processes with no recorder",
                s.unrecorded_hits
            );
        }
        if s.hits_before_recording > 0 {
            unrecorded += &format!(
                "; {} hits came before their process's perf was recording (it starts at the exec)",
                s.hits_before_recording
            );
        }
        if s.extra_processes > 0 {
            unrecorded += &format!(
                "; {} matching processes not recorded (--max-targets)",
                s.extra_processes
            );
        }
        let unsnap = if s.stats.unsnapshotted > 0 {
            format!(
                "; {} hits got no snapshot (perf ended first)",
                s.stats.unsnapshotted
            )
        } else {
            String::new()
        };
        self.disarm_lines(&s.disarm);
        self.print(&format!(
            "ended: {} after {:.1} s{perf}{unsnap}{unrecorded}",
            s.end, s.duration_s
        ));
    }

    /// The summary's lines on disarming, when there was any.
    fn disarm_lines(&self, d: &crate::output::events::DisarmSummary) {
        if d.cycles > 0 {
            let late = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
            self.print(&format!(
                "disarmed: {} times, {:.2} s in all; re-armed late by {}/{} µs (p50/p99)",
                d.cycles,
                d.disarmed_s,
                late(d.rearm_late_us_p50),
                late(d.rearm_late_us_p99)
            ));
        }
        if d.kept_armed > 0 {
            self.print(&format!(
                "kept armed after {} hits: a detach and an attach take longer than \
                     what was left of the cooldown",
                d.kept_armed
            ));
        }
    }

    /// `error`: one line (plus detail lines) on stderr, or a JSON event.
    pub fn error(&self, f: &Failure) {
        if self.json {
            return self.print_json(json!({
                "event": "error",
                "message": f.message,
                "detail": f.detail,
                "exit_code": f.code as i32,
            }));
        }
        eprintln!("mt-agent: error: {}", f.message);
        for d in &f.detail {
            eprintln!("  {d}");
        }
    }
}

fn args(a: &[u64]) -> String {
    let parts: Vec<String> = a
        .iter()
        .map(|v| {
            if *v < 10 {
                v.to_string()
            } else {
                format!("{v:#x}")
            }
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

/// `153 µs`, `1.2 ms`, `850 ns`.
pub fn human_ns(ns: u64) -> String {
    match ns {
        n if n >= 1_000_000_000 => format!("{:.2} s", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1} ms", n as f64 / 1e6),
        n if n >= 1_000 => format!("{} µs", n / 1_000),
        n => format!("{n} ns"),
    }
}

/// `5.3 KiB`, `1.2 MiB`.
pub fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// ` (on CPU 20.1 ms, runnable 0 ns, blocked 100.2 ms)`: a hit's off-CPU
/// breakdown for the text output, with `, unknown 155.0 ms (not in the
/// snapshot file)` when part of the window is not shown by the file.
fn breakdown_text(o: OffCpu) -> String {
    let b = o.breakdown;
    let unknown = if b.unknown_ns > 0 {
        format!(
            ", unknown {} (not in the snapshot file)",
            human_ns(b.unknown_ns)
        )
    } else {
        String::new()
    };
    format!(
        " (on CPU {}, runnable {}, blocked {}{unknown})",
        human_ns(b.on_cpu_ns),
        human_ns(b.runnable_ns),
        human_ns(b.blocked_ns)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_event_is_the_snapshot_record_with_its_process_and_number() {
        let snapshot = Snapshot {
            kind: crate::output::index::SnapshotKind::Tail,
            file: "perf.data.1".into(),
            bytes: 812,
            hits: vec![],
            hit_to_kill_ns: None,
            kill_to_dump_ns: None,
            unlisted_hits: 0,
            span: None,
            records_from_ns: None,
            lost_records: 0,
            lost_ns: Vec::new(),
        };
        let event = SnapshotEvent {
            pid: 42,
            n: 3,
            snapshot: &snapshot,
        };
        assert_eq!(
            serde_json::to_string(&event).unwrap(),
            r#"{"pid":42,"n":3,"kind":"tail","file":"perf.data.1","bytes":812,"hits":[]}"#
        );
    }

    #[test]
    fn the_text_breakdown_says_what_the_file_does_not_show() {
        use crate::perf::offcpu::Breakdown;
        let mut o = OffCpu {
            off_cpu_from_ns: 0,
            breakdown: Breakdown {
                on_cpu_ns: 140_000_000,
                runnable_ns: 5_000_000,
                blocked_ns: 0,
                unknown_ns: 0,
            },
            reaches_start: false,
        };
        assert_eq!(
            breakdown_text(o),
            " (on CPU 140.0 ms, runnable 5.0 ms, blocked 0 ns)"
        );
        o.breakdown.unknown_ns = 155_000_000;
        assert_eq!(
            breakdown_text(o),
            " (on CPU 140.0 ms, runnable 5.0 ms, blocked 0 ns, unknown 155.0 ms (not in the \
             snapshot file))"
        );
    }

    #[test]
    fn the_armed_line_says_a_go_targets_breakdown_is_of_threads() {
        let mut a = Armed {
            pid: Some(1),
            perf_pid: Some(2),
            exe: None,
            trigger: 0,
            event: "cpu-clock".into(),
            freq: 999,
            symbol: "main.handler".into(),
            object: "/srv/app".into(),
            attach_offset: 0,
            uprobes: 2,
            returns: None,
            returns_why: None,
            cost: None,
            output: "/out".into(),
            time_to_armed_ms: 0.0,
            perf_ready_ms: 0.0,
            perf_kallsyms: "copy",
            recording: "continuous",
            flight_ring_bytes: None,
            unwinding: crate::perf::unwind::Unwinding {
                mode: "fp".into(),
                reason: "test".into(),
                measure_copy: false,
                copy_measured: None,
            },
            off_cpu: true,
            go: false,
        };
        assert!(!a.recording_words().contains("goroutine"));
        a.go = true;
        assert!(
            a.recording_words()
                .contains("of OS threads: a Go target's goroutines")
        );
        assert!(serde_json::to_string(&a).unwrap().contains(r#""go":true"#));
        a.off_cpu = false;
        assert!(!a.recording_words().contains("goroutine"));
    }

    #[test]
    fn human_units() {
        assert_eq!(human_ns(153_000), "153 µs");
        assert_eq!(human_ns(1_200_000), "1.2 ms");
        assert_eq!(human_bytes(5416), "5.3 KiB");
    }
}
