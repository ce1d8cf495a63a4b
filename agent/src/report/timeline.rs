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
//!
//! [`compute`] makes it; the rules (lanes, states, boxes, marks, span) are
//! in docs/report.md, "The timeline".

use std::collections::HashMap;

use serde::Serialize;

use super::{
    moments::Span,
    offcpu::thread_context_switches,
    samples::{Sample, Samples},
};
use crate::output::index::{IndexedHit, Snapshot};
use crate::perf::offcpu::{Gap, states};

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

/// The sample period when neither perf's command line nor the samples
/// give one, ns (1 ms: about the agent's default 999 Hz).
const DEFAULT_PERIOD_NS: u64 = 1_000_000;

/// One hit's timeline from its snapshot's samples and its index line.
/// `moment` is the hit's moment ([`super::moments::span`]).
pub fn compute(s: &Samples, hit: &IndexedHit, snap: &Snapshot, moment: &Span) -> Timeline {
    let marks = marks(s, hit, snap, moment);
    let times = s.samples.iter().map(|x| x.time_ns);
    let all = times.chain(marks.iter().map(|m| m.t_ns));
    let from_ns = all.clone().min().unwrap_or(hit.ktime_ns);
    let to_ns = all.max().unwrap_or(hit.ktime_ns);
    let known = switches_recorded(s).then(|| file_gaps(s, snap));
    let lanes = lanes(s, hit.tid, from_ns, to_ns, known.as_deref());
    let period = sample_period_ns(s, hit.tid);
    Timeline {
        from_ns,
        to_ns,
        lanes,
        marks,
        chart: stack_chart(s, hit.tid, period),
    }
}

/// The `--json` object of a timeline: its serde fields, plus the hit
/// thread's stack chart as `stack_chart` (`names`, and `boxes` each with
/// `depth`, `frame` (an index in `names`), `start_ns`, `end_ns`).
pub fn json(t: &Timeline) -> serde_json::Value {
    let mut v = serde_json::to_value(t).expect("a timeline serializes");
    v["stack_chart"] = serde_json::to_value(&t.chart).expect("a chart serializes");
    v
}

/// The marks in time order:
/// * `call_start`: a slow call's start, `ktime_ns - duration_ns`;
/// * `hit`: `ktime_ns`;
/// * `switch`: perf's switch, when the agent signalled perf to switch
///   files (the snapshot's first hit + `hit_to_kill_ns`): the file holds
///   what perf's rings held then. Without `hit_to_kill_ns`, the file's last
///   sample;
/// * `ring_start`: in a flight-recorder run (perf's `--overwrite`), where
///   the file begins, only if that lies inside the moment: the index's
///   `records_from_ns` (from there on every ring shows the target) when
///   the run recorded it, else the file's first sample.
fn marks(s: &Samples, hit: &IndexedHit, snap: &Snapshot, moment: &Span) -> Vec<Mark> {
    let mark = |kind, t_ns| Mark { kind, t_ns };
    let mut v = Vec::new();
    if let Some(d) = hit.duration_ns {
        v.push(mark(MarkKind::CallStart, hit.ktime_ns.saturating_sub(d)));
    }
    v.push(mark(MarkKind::Hit, hit.ktime_ns));
    let first_hit = snap.hits.first().map_or(hit.ktime_ns, |h| h.ktime_ns);
    let last_sample = s.samples.iter().map(|x| x.time_ns).max();
    let switch = snap.hit_to_kill_ns.map(|k| first_hit + k).or(last_sample);
    if let Some(t) = switch {
        v.push(mark(MarkKind::Switch, t));
    }
    if flight_recorder(s) {
        let ring = snap.records_from_ns.filter(|&t| t != u64::MAX);
        let first_sample = s.samples.iter().map(|x| x.time_ns).min();
        let inside = |t: &u64| (moment.start_ns..=moment.end_ns).contains(t);
        if let Some(t) = ring.or(first_sample).filter(inside) {
            v.push(mark(MarkKind::RingStart, t));
        }
    }
    v.sort_by_key(|m| m.t_ns);
    v
}

/// perf's command line names `--overwrite`: a flight-recorder run.
fn flight_recorder(s: &Samples) -> bool {
    s.cmdline
        .as_deref()
        .is_some_and(|c| c.split_whitespace().any(|w| w == "--overwrite"))
}

/// The run recorded perf's switch records (`--switch-events`), so the
/// threads' states can be known.
fn switches_recorded(s: &Samples) -> bool {
    !s.context_switches.is_empty()
        || s.cmdline
            .as_deref()
            .is_some_and(|c| c.split_whitespace().any(|w| w == "--switch-events"))
}

/// The stretches the file does not show: its index line's
/// ([`Snapshot::gaps`]: before `records_from_ns`, where perf lost records;
/// before the file's first record when the line has no `records_from_ns`),
/// and after its last record.
fn file_gaps(s: &Samples, snap: &Snapshot) -> Vec<Gap> {
    let times = s
        .samples
        .iter()
        .chain(s.sched_switch_samples.iter().map(|x| &x.sample))
        .map(|x| x.time_ns)
        .chain(s.context_switches.iter().map(|c| c.time_ns));
    let (first, last) = (times.clone().min(), times.max());
    let mut gaps = snap.gaps();
    if snap.records_from_ns.is_none() {
        gaps.extend(first.map(|t| [0, t]));
    }
    gaps.extend(last.map(|t| [t, u64::MAX]));
    gaps
}

/// One lane per thread with samples, the hit's thread first (even with
/// none), then by tid; states over `[from_ns, to_ns]` when `gaps` is given
/// (the run recorded switch records).
fn lanes(s: &Samples, hit_tid: u32, from_ns: u64, to_ns: u64, gaps: Option<&[Gap]>) -> Vec<Lane> {
    let mut times: HashMap<u32, Vec<u64>> = HashMap::new();
    times.entry(hit_tid).or_default();
    for x in &s.samples {
        times.entry(x.tid).or_default().push(x.time_ns);
    }
    let mut lanes: Vec<Lane> = times
        .into_iter()
        .map(|(tid, mut sample_times)| {
            sample_times.sort_unstable();
            let mut lane = Lane {
                tid,
                samples: sample_times.len() as u64,
                sample_times,
                ..Lane::default()
            };
            if let Some(gaps) = gaps {
                let st = states(
                    &thread_context_switches(&s.context_switches, tid),
                    gaps,
                    from_ns,
                    to_ns,
                );
                (lane.on_cpu, lane.runnable, lane.blocked) =
                    (Some(st.on_cpu), Some(st.runnable), Some(st.blocked));
            }
            lane
        })
        .collect();
    lanes.sort_by_key(|l| (l.tid != hit_tid, l.tid));
    lanes
}

/// The sampling period, ns: from the frequency on perf's command line
/// (`-F N`, `-FN`, `--freq=N`, `freq=N` in an event); else the median gap
/// between the thread's consecutive samples; else 1 ms.
fn sample_period_ns(s: &Samples, tid: u32) -> u64 {
    let hz = s.cmdline.as_deref().and_then(frequency);
    if let Some(hz) = hz.filter(|&f| f > 0) {
        return 1_000_000_000 / hz;
    }
    let mut t: Vec<u64> = s
        .samples
        .iter()
        .filter(|x| x.tid == tid)
        .map(|x| x.time_ns)
        .collect();
    t.sort_unstable();
    let mut gaps: Vec<u64> = t
        .windows(2)
        .map(|w| w[1] - w[0])
        .filter(|&g| g > 0)
        .collect();
    gaps.sort_unstable();
    gaps.get(gaps.len() / 2)
        .copied()
        .unwrap_or(DEFAULT_PERIOD_NS)
}

/// The sampling frequency a perf command line asks for, Hz.
fn frequency(cmdline: &str) -> Option<u64> {
    let mut words = cmdline.split_whitespace();
    while let Some(w) = words.next() {
        let value = match w {
            "-F" | "--freq" => words.next(),
            _ => w
                .strip_prefix("--freq=")
                .or_else(|| w.strip_prefix("-F").filter(|v| !v.is_empty()))
                .or_else(|| w.split_once("freq=").map(|(_, v)| v)),
        };
        let digits = value.map(|v| v.split(|c: char| !c.is_ascii_digit()).next().unwrap_or(""));
        if let Some(hz) = digits.and_then(|d| d.parse().ok()) {
            return Some(hz);
        }
    }
    None
}

/// The stack chart of thread `tid`'s samples, in time order. Each sample
/// stands for the time from it to the next sample, when that comes within
/// two periods (the thread ran meanwhile); else for one period (the thread
/// left the CPU: its lane says how long). Two consecutive samples of that
/// kind continue a box at depth `d` (0 = the outermost frame) when their
/// stacks have the same frames at depths `0..=d`; a box ends where its
/// last sample's time ends. Boxes are listed as they end, deepest first.
fn stack_chart(s: &Samples, tid: u32, period_ns: u64) -> StackChart {
    let mut v: Vec<&Sample> = s.samples.iter().filter(|x| x.tid == tid).collect();
    v.sort_by_key(|x| x.time_ns);
    let mut chart = StackChart::default();
    let mut ids: HashMap<u32, u32> = HashMap::new();
    // The open boxes, outermost first: (frame id in `s`, start ns).
    let mut open: Vec<(u32, u64)> = Vec::new();
    let mut open_end = 0;
    for (i, x) in v.iter().enumerate() {
        let root_first = s.stack(x).iter().rev().copied();
        let keep = if open_end == x.time_ns {
            root_first
                .clone()
                .zip(&open)
                .take_while(|(f, o)| *f == o.0)
                .count()
        } else {
            0
        };
        close(&mut chart, &mut ids, s, &mut open, keep, open_end);
        open.extend(root_first.skip(keep).map(|f| (f, x.time_ns)));
        open_end = match v.get(i + 1) {
            Some(n) if n.time_ns - x.time_ns <= 2 * period_ns => n.time_ns,
            _ => x.time_ns + period_ns,
        };
    }
    close(&mut chart, &mut ids, s, &mut open, 0, open_end);
    chart
}

/// Ends the open boxes at depths `keep..` at `end_ns`, deepest first.
fn close(
    chart: &mut StackChart,
    ids: &mut HashMap<u32, u32>,
    s: &Samples,
    open: &mut Vec<(u32, u64)>,
    keep: usize,
    end_ns: u64,
) {
    while open.len() > keep {
        let (f, start_ns) = open.pop().expect("longer than keep");
        if end_ns <= start_ns {
            continue;
        }
        let frame = *ids.entry(f).or_insert_with(|| {
            chart.names.push(s.name(f).to_string());
            chart.names.len() as u32 - 1
        });
        chart.boxes.push(StackBox {
            depth: open.len() as u32,
            frame,
            start_ns,
            end_ns,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::samples::parse;

    const MS: u64 = 1_000_000;

    fn secs(t: u64) -> String {
        format!("{}.{:09}", t / 1_000_000_000, t % 1_000_000_000)
    }

    /// perf script's text for samples `(tid, ns, stack root first)` and
    /// switch records `(tid, ns, "OUT preempt" | "OUT" | "IN")`.
    fn script(
        cmdline: &str,
        samples: &[(u32, u64, &str)],
        switches: &[(u32, u64, &str)],
    ) -> Samples {
        let mut t = format!("# cmdline : {cmdline}\n");
        for &(tid, ns, stack) in samples {
            t += &format!("{tid} {}: cpu-clock:\n", secs(ns));
            for f in stack.split(';').rev() {
                t += &format!("\tff {f} (/t/x)\n");
            }
            t += "\n";
        }
        for &(tid, ns, what) in switches {
            t += &format!("{tid} {}: PERF_RECORD_SWITCH {what}\n", secs(ns));
        }
        parse(t.as_bytes()).unwrap()
    }

    /// An index line of a hit snapshot, as the report reads it.
    fn snapshot(hits: Vec<IndexedHit>, hit_to_kill_ns: Option<u64>) -> Snapshot {
        let line = serde_json::json!({
            "kind": "hit", "file": "perf.data.1", "hits": hits, "hit_to_kill_ns": hit_to_kill_ns,
        });
        serde_json::from_value(line).unwrap()
    }

    fn hit(tid: u32, ktime_ns: u64, duration_ns: Option<u64>) -> IndexedHit {
        IndexedHit {
            seq: 1,
            tid,
            ktime_ns,
            duration_ns,
            ..IndexedHit::default()
        }
    }

    fn timeline(s: &Samples, h: &IndexedHit, snap: &Snapshot) -> Timeline {
        compute(s, h, snap, &super::super::moments::span(h, 1_000 * MS))
    }

    fn boxes(t: &Timeline) -> Vec<(u32, &str, u64, u64)> {
        let mut v: Vec<_> = t
            .chart
            .boxes
            .iter()
            .map(|b| {
                (
                    b.depth,
                    t.chart.names[b.frame as usize].as_str(),
                    b.start_ns,
                    b.end_ns,
                )
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn consecutive_samples_with_the_same_frames_above_are_one_box() {
        // 1000 Hz: a period of 1 ms. a;b twice, a;c, then d; 10 ms later d
        // again: the thread left the CPU, so the boxes end one period after
        // the sample before the hole.
        let s = script(
            "perf record -F 1000 -p 1",
            &[
                (7, 100 * MS, "main;a;b"),
                (7, 101 * MS, "main;a;b"),
                (7, 102 * MS, "main;a;c"),
                (7, 103 * MS, "main;d"),
                (7, 113 * MS, "main;d"),
                (8, 105 * MS, "other"),
            ],
            &[],
        );
        let h = hit(7, 113 * MS, None);
        let t = timeline(&s, &h, &snapshot(vec![h.clone()], None));
        assert_eq!(
            boxes(&t),
            [
                (0, "main", 100 * MS, 104 * MS),
                (0, "main", 113 * MS, 114 * MS),
                (1, "a", 100 * MS, 103 * MS),
                (1, "d", 103 * MS, 104 * MS),
                (1, "d", 113 * MS, 114 * MS),
                (2, "b", 100 * MS, 102 * MS),
                (2, "c", 102 * MS, 103 * MS),
            ]
        );
        // A box names a frame once; other threads have no chart.
        assert_eq!(t.chart.names.len(), 5);
        assert!(!t.chart.names.contains(&"other".to_string()));
    }

    #[test]
    fn the_period_comes_from_perfs_command_line_or_the_samples() {
        assert_eq!(frequency("perf record -e cpu-clock -F 999 -g"), Some(999));
        assert_eq!(frequency("perf record -F99 -g"), Some(99));
        assert_eq!(frequency("perf record --freq=4000"), Some(4000));
        assert_eq!(
            frequency("perf record -e cpu-clock/freq=999/ -e x"),
            Some(999)
        );
        assert_eq!(frequency("perf record -e cpu-clock -c 10000"), None);
        // No frequency: the median gap of the thread's samples (2 ms).
        let at = [0, 2, 4, 6, 20].map(|m| (3, 1000 * MS + m * MS, "f"));
        let s = script("perf record -c 2000000", &at, &[]);
        assert_eq!(sample_period_ns(&s, 3), 2 * MS);
        assert_eq!(sample_period_ns(&s, 4), DEFAULT_PERIOD_NS);
    }

    #[test]
    fn lanes_put_the_hits_thread_first_and_say_no_state_without_switch_records() {
        let s = script(
            "perf record -F 1000",
            &[
                (9, 10 * MS, "f"),
                (3, 11 * MS, "g"),
                (5, 12 * MS, "h"),
                (5, 13 * MS, "h"),
            ],
            &[],
        );
        let h = hit(5, 20 * MS, None);
        let t = timeline(&s, &h, &snapshot(vec![h.clone()], None));
        let lanes: Vec<(u32, u64)> = t.lanes.iter().map(|l| (l.tid, l.samples)).collect();
        assert_eq!(lanes, [(5, 2), (3, 1), (9, 1)]);
        assert_eq!(t.lanes[0].sample_times, [12 * MS, 13 * MS]);
        assert!(
            t.lanes
                .iter()
                .all(|l| l.on_cpu.is_none() && l.blocked.is_none())
        );
        // The JSON leaves the lists out, and carries no sample times.
        let j = json(&t);
        assert_eq!(j["lanes"][0], serde_json::json!({"tid": 5, "samples": 2}));
        // The hit's thread has a lane even without samples.
        let h = hit(4, 20 * MS, None);
        let t = timeline(&s, &h, &snapshot(vec![h.clone()], None));
        assert_eq!((t.lanes[0].tid, t.lanes[0].samples), (4, 0));
    }

    #[test]
    fn marks_and_the_span_they_extend() {
        let s = script(
            "perf record -F 1000 --overwrite -m 64",
            &[(5, 100 * MS, "f"), (5, 150 * MS, "f")],
            &[],
        );
        // A slow call from 90 to 140 ms, the second hit of its snapshot; the
        // first (at 130 ms) made the agent signal perf 30 ms later.
        let first = hit(6, 130 * MS, None);
        let h = hit(5, 140 * MS, Some(50 * MS));
        let snap = snapshot(vec![first, h.clone()], Some(30 * MS));
        let t = timeline(&s, &h, &snap);
        let kinds: Vec<(MarkKind, u64)> = t.marks.iter().map(|m| (m.kind, m.t_ns)).collect();
        assert_eq!(
            kinds,
            [
                (MarkKind::CallStart, 90 * MS),
                (MarkKind::RingStart, 100 * MS),
                (MarkKind::Hit, 140 * MS),
                (MarkKind::Switch, 160 * MS),
            ]
        );
        assert_eq!((t.from_ns, t.to_ns), (90 * MS, 160 * MS));
        assert_eq!(
            json(&t)["marks"][0],
            serde_json::json!({"kind": "call_start", "t_ns": 90 * MS})
        );
        // The ring begins before the call: no mark. The index's
        // records_from_ns, when there, is where the file begins.
        let mut snap = snapshot(vec![h.clone()], None);
        snap.records_from_ns = Some(80 * MS);
        let t = timeline(&s, &h, &snap);
        assert!(!t.marks.iter().any(|m| m.kind == MarkKind::RingStart));
        // Without hit_to_kill_ns, perf's switch is the file's last sample.
        assert!(t.marks.contains(&Mark {
            kind: MarkKind::Switch,
            t_ns: 150 * MS
        }));
        // A continuous run has no ring.
        let s = script("perf record -F 1000", &[(5, 100 * MS, "f")], &[]);
        let t = timeline(&s, &h, &snapshot(vec![h.clone()], None));
        assert!(!t.marks.iter().any(|m| m.kind == MarkKind::RingStart));
    }

    /// perf 6.1's output for two threads ping-ponging through pipes (see
    /// samples.rs): thread 30139 preempted, blocked, then on CPU in
    /// compute_part, preempted once more.
    const RUN: &str = include_str!("testdata/sched_switch.script");

    #[test]
    fn switch_records_give_the_states_and_the_chart_spans_the_preemption() {
        let s = parse(RUN.as_bytes()).unwrap();
        let base = 13_735_000_000_000;
        let at = |us: u64| base + us * 1000;
        let h = hit(30139, at(897_000), Some(7 * MS));
        let t = timeline(&s, &h, &snapshot(vec![h.clone()], Some(100_000)));
        // From the call's start to the file's last sample.
        assert_eq!(
            (t.from_ns, t.to_ns),
            (base + 890_000_000, base + 897_268_732)
        );
        let lane = &t.lanes[0];
        assert_eq!((lane.tid, lane.samples), (30139, 6));
        // Before the file's first record nothing is known; from it on, the
        // thread ran until it was preempted (its first record a switch out).
        let ns = |v: &[[u64; 2]]| {
            v.iter()
                .map(|i| [i[0] - base, i[1] - base])
                .collect::<Vec<_>>()
        };
        assert_eq!(
            ns(lane.on_cpu.as_ref().unwrap()),
            [
                [890_695_112, 890_726_969],
                [890_800_448, 891_421_650],
                [891_439_546, 896_033_550],
                [896_267_046, 897_268_732],
            ]
        );
        assert_eq!(
            ns(lane.runnable.as_ref().unwrap()),
            [[890_726_969, 890_800_448], [896_033_550, 896_267_046]]
        );
        assert_eq!(
            ns(lane.blocked.as_ref().unwrap()),
            [[891_421_650, 891_439_546]]
        );
        // The other thread has no CPU sample: no lane.
        assert_eq!(t.lanes.len(), 1);
        // All six samples in compute_part, 1.64 ms apart at most around the
        // preemption (under two 999 Hz periods): one box per depth, to one
        // period after the last sample.
        let b = boxes(&t);
        let end = base + 897_268_732 + 1_001_001;
        assert_eq!(b.len(), 5);
        assert_eq!(b[0], (0, "_start", base + 891_638_341, end));
        assert_eq!(b[4], (4, "compute_part", base + 891_638_341, end));
        let j = json(&t);
        assert_eq!(j["lanes"][0]["blocked"][0][1], base + 891_439_546);
        assert_eq!(j["stack_chart"]["names"].as_array().unwrap().len(), 5);
    }
}
