//! The run-level types: why a recorder (or the whole run) ended, how a
//! recorder ended, and how the run ended. The driver, the recorder and the
//! output all use them; this module uses none of those.

use std::{path::PathBuf, time::Duration};

use crate::{
    error::Failure,
    output::{
        counters::CounterValues,
        events::{RecorderSummary, Stats},
    },
};

/// Why a recorder (or the whole run) ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndReason {
    /// `--max-snapshots` reached.
    MaxSnapshots,
    /// `--duration` passed.
    Duration,
    /// SIGINT, SIGTERM or SIGHUP.
    Signal(&'static str),
    /// The target exited.
    TargetExited,
    /// The target exec'd a new image; the probe no longer fires.
    Exec,
    /// perf ended on its own (a failure).
    PerfEnded,
    /// The output file system is full (a failure).
    DiskFull,
    /// Some other failure.
    Failed,
}

impl EndReason {
    /// Text for the summary.
    pub fn describe(&self) -> String {
        match self {
            EndReason::MaxSnapshots => "--max-snapshots reached".into(),
            EndReason::Duration => "--duration passed".into(),
            EndReason::Signal(s) => format!("{s} received"),
            EndReason::TargetExited => "the target exited".into(),
            EndReason::Exec => "the target exec'd a new image".into(),
            EndReason::PerfEnded => "perf ended unexpectedly".into(),
            EndReason::DiskFull => "the output file system is full".into(),
            EndReason::Failed => "a failure".into(),
        }
    }
}

/// How a recorder ended.
#[derive(Debug, Clone)]
pub struct RecorderOutcome {
    pub trigger: u32,
    pub tgid: i32,
    pub dir: PathBuf,
    pub reason: EndReason,
    pub failure: Option<Failure>,
    pub stats: Stats,
    pub perf_exit: Option<String>,
    pub perf_cpu: Option<Duration>,
}

/// How a run ended.
#[derive(Debug)]
pub struct Outcome {
    pub reason: EndReason,
    /// Set when the run failed (exit code 3 or 4).
    pub failure: Option<Failure>,
    /// Kernel counters, summed over triggers.
    pub counters: CounterValues,
    /// State-machine counts, summed over recorders.
    pub stats: Stats,
    pub open_calls: u64,
    /// perf's end and CPU time: of the single recorder, or summed.
    pub perf_exit: Option<String>,
    pub perf_cpu: Option<Duration>,
    pub recorders: Vec<RecorderSummary>,
    /// Hits from processes that had no recorder.
    pub unrecorded_hits: u64,
    /// Hits from processes whose perf was not recording yet.
    pub hits_before_recording: u64,
    /// Matching processes beyond `--max-targets`.
    pub extra_processes: u64,
    /// Detaching probes during cooldowns.
    pub disarm: crate::output::events::DisarmSummary,
}

impl Outcome {
    /// A run that failed before any recorder ran.
    pub fn failed(failure: Failure) -> Self {
        Self {
            reason: EndReason::Failed,
            failure: Some(failure),
            counters: crate::output::counters::CounterValues::default(),
            stats: crate::output::events::Stats::default(),
            open_calls: 0,
            perf_exit: None,
            perf_cpu: None,
            recorders: Vec::new(),
            unrecorded_hits: 0,
            hits_before_recording: 0,
            extra_processes: 0,
            disarm: Default::default(),
        }
    }
}

impl From<&RecorderOutcome> for RecorderSummary {
    fn from(o: &RecorderOutcome) -> Self {
        Self {
            trigger: o.trigger,
            pid: o.tgid,
            output: o.dir.clone(),
            end: o.reason.describe(),
            hit_snapshots: o.stats.hit_snapshots,
            tail_snapshots: o.stats.tail_snapshots,
            perf_exit: o.perf_exit.clone(),
        }
    }
}
