//! A hit's moment in time order (issue 26 §1): one lane per thread with
//! samples in the snapshot, the hit's thread first, each with its state
//! over time (on CPU, runnable, blocked) from perf's switch records; the
//! hit thread's stack chart (time × depth, consecutive samples with the
//! same frame at a depth merged into one box, as the Firefox Profiler's
//! stack chart draws it); and the marks (call start, hit, perf's switch,
//! the flight recorder's ring start).
//!
//! This file holds the data model, the contract between the part that
//! computes it from a snapshot's [`Samples`](super::samples::Samples) and
//! the page that draws it. All times are CLOCK_MONOTONIC ns, the hit's
//! clock (`ktime_ns`, perf's `-k CLOCK_MONOTONIC`).

use serde::Serialize;

/// One hit's timeline: `report --json`'s `timeline`, and the page's data.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timeline {
    /// The span drawn: the snapshot's samples and the marks, ns.
    pub from_ns: u64,
    pub to_ns: u64,
    /// The hit's thread first, then the others by tid.
    pub lanes: Vec<Lane>,
    pub marks: Vec<Mark>,
    /// The hit thread's stack chart; only in the page's data.
    #[serde(skip)]
    pub chart: StackChart,
}

/// One thread's lane.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Lane {
    pub tid: u32,
    /// Samples of the sampling event on this thread in the snapshot.
    pub samples: u64,
    /// Sample times, ns; only in the page's data (the lane's ticks when no
    /// switch records say its state).
    #[serde(skip)]
    pub sample_times: Vec<u64>,
    /// `[start_ns, end_ns]` intervals; `None` (left out of the JSON) when
    /// the run recorded no switch records, so the state can't be known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_cpu: Option<Vec<[u64; 2]>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runnable: Option<Vec<[u64; 2]>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked: Option<Vec<[u64; 2]>>,
}

/// A point in time the timeline marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mark {
    pub kind: MarkKind,
    pub t_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkKind {
    /// A `--slower-than` call's start: `ktime_ns - duration_ns`.
    CallStart,
    /// The hit: `ktime_ns` (a slow call's return).
    Hit,
    /// perf's switch: the snapshot file closed.
    Switch,
    /// The flight recorder's ring begins here, inside the moment.
    RingStart,
}

/// The hit thread's stack chart.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StackChart {
    /// Frame names; boxes refer to them by index.
    pub names: Vec<String>,
    pub boxes: Vec<StackBox>,
}

/// One box of the stack chart: `frame` at `depth` (0 = the outermost
/// frame) from `start_ns` to `end_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StackBox {
    pub depth: u32,
    pub frame: u32,
    pub start_ns: u64,
    pub end_ns: u64,
}
