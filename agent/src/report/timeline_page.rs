//! A hit's timeline on the page (issue 26 §1): the [`Timeline`] and the
//! hit thread's samples as compact JSON in the hit's section, drawn on a
//! `<canvas>` by `timeline.js` when the section opens. The lanes (the
//! thread's state over time, or ticks at its sample times without switch
//! records), the hit thread's stack chart and the marks; zoom (wheel), pan
//! (drag), hover, a range selection (shift-drag, or a drag on the time
//! axis) that redraws a flame graph of the hit thread's samples in that
//! range, and a click on a box that searches the page's graphs for its
//! function.
//!
//! Times in the JSON are ns after the timeline's `from_ns` (integers below
//! 2^53, exact in JavaScript).

use std::{collections::HashMap, fmt::Write as _};

use serde::Serialize;

use super::{
    samples::Samples,
    timeline::{MarkKind, Timeline},
};

/// The timeline's script and style, added to the page once.
pub const SCRIPT: &str = include_str!("timeline.js");
pub const STYLE: &str = include_str!("timeline.css");

/// The hit thread's samples in the snapshot, for the range flame graph:
/// each sample's time and call chain, the chains interned.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ThreadSamples {
    /// Frame names; stacks refer to them by index.
    pub names: Vec<String>,
    /// Distinct call chains, root first.
    pub stacks: Vec<Vec<u32>>,
    /// `(time_ns, stack)` by time; CLOCK_MONOTONIC ns.
    pub samples: Vec<(u64, u32)>,
}

/// The samples of thread `tid` in `s`. A sample without a call chain
/// becomes `[no stack]`, as in the folded files.
pub fn thread_samples(s: &Samples, tid: u32) -> ThreadSamples {
    let mut out = ThreadSamples::default();
    // Frame id (None: no call chain) → name index.
    let mut names: HashMap<Option<u32>, u32> = HashMap::new();
    let mut stacks: HashMap<Vec<u32>, u32> = HashMap::new();
    for x in s.samples.iter().filter(|x| x.tid == tid) {
        let chain = s.stack(x);
        let frames: Vec<Option<u32>> = if chain.is_empty() {
            vec![None]
        } else {
            chain.iter().rev().map(|&f| Some(f)).collect()
        };
        let ids: Vec<u32> = frames
            .into_iter()
            .map(|f| {
                *names.entry(f).or_insert_with(|| {
                    out.names
                        .push(f.map_or("[no stack]", |f| s.name(f)).to_string());
                    out.names.len() as u32 - 1
                })
            })
            .collect();
        let next = out.stacks.len() as u32;
        let id = *stacks.entry(ids.clone()).or_insert_with(|| {
            out.stacks.push(ids);
            next
        });
        out.samples.push((x.time_ns, id));
    }
    out.samples.sort_unstable();
    out
}

/// The page's data of one hit's timeline.
#[derive(Serialize)]
struct Data<'a> {
    /// `from_ns`, as text (beyond JavaScript's exact integers).
    t0: String,
    /// `to_ns - from_ns`.
    span: u64,
    /// The hit's thread.
    tid: u32,
    lanes: Vec<LaneData>,
    /// `[kind, t]`.
    marks: Vec<(&'static str, u64)>,
    /// The stack chart: names, and boxes as flat `depth, frame, start,
    /// end` quadruples.
    names: &'a [String],
    boxes: Vec<u64>,
    /// The samples: names, stacks (root first), and flat `t, stack` pairs.
    sn: &'a [String],
    st: &'a [Vec<u32>],
    ss: Vec<u64>,
}

#[derive(Serialize)]
struct LaneData {
    tid: u32,
    n: u64,
    /// Flat `start, end` pairs; left out when unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    on: Option<Vec<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rq: Option<Vec<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bl: Option<Vec<u64>>,
    /// Sample times, when the state is unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    ticks: Option<Vec<u64>>,
}

pub fn mark_name(k: MarkKind) -> &'static str {
    match k {
        MarkKind::CallStart => "call_start",
        MarkKind::Hit => "hit",
        MarkKind::Switch => "switch",
        MarkKind::RingStart => "ring_start",
    }
}

/// The JSON of one hit's timeline, safe inside a `<script>` element (no
/// `<`).
fn data_json(t: &Timeline, tid: u32, s: &ThreadSamples) -> String {
    let rel = |ns: u64| ns.saturating_sub(t.from_ns);
    let flat = |v: &Option<Vec<[u64; 2]>>| {
        v.as_ref()
            .map(|v| v.iter().flat_map(|[a, b]| [rel(*a), rel(*b)]).collect())
    };
    let lanes = t
        .lanes
        .iter()
        .map(|l| LaneData {
            tid: l.tid,
            n: l.samples,
            on: flat(&l.on_cpu),
            rq: flat(&l.runnable),
            bl: flat(&l.blocked),
            ticks: l
                .on_cpu
                .is_none()
                .then(|| l.sample_times.iter().map(|&x| rel(x)).collect()),
        })
        .collect();
    let data = Data {
        t0: t.from_ns.to_string(),
        span: t.to_ns.saturating_sub(t.from_ns),
        tid,
        lanes,
        marks: t
            .marks
            .iter()
            .map(|m| (mark_name(m.kind), rel(m.t_ns)))
            .collect(),
        names: &t.chart.names,
        boxes: t
            .chart
            .boxes
            .iter()
            .flat_map(|b| {
                [
                    b.depth as u64,
                    b.frame as u64,
                    rel(b.start_ns),
                    rel(b.end_ns),
                ]
            })
            .collect(),
        sn: &s.names,
        st: &s.stacks,
        ss: s
            .samples
            .iter()
            .flat_map(|&(x, k)| [rel(x), k as u64])
            .collect(),
    };
    serde_json::to_string(&data)
        .expect("plain data")
        .replace('<', "\\u003c")
}

/// The timeline's part of a hit's section: its heading, the data and a
/// place for the canvas, which `timeline.js` fills when the section opens.
pub fn section(h: &mut String, t: &Timeline, tid: u32, s: &ThreadSamples) {
    h.push_str(
        "<h4>The snapshot in time order</h4><div class=\"tl\">\
         <script type=\"application/json\" class=\"tl-data\">",
    );
    h.push_str(&data_json(t, tid, s));
    let _ = write!(
        h,
        "</script></div><p class=\"note tl-help\">One lane per thread, thread {tid} (the hit's) \
         first: <span class=\"oc-on tl-key\"></span>on CPU <span class=\"oc-rq tl-key\"></span>runnable \
         <span class=\"oc-bl tl-key\"></span>blocked (ticks: its samples, when the run recorded \
         no switch records), then thread {tid}'s stacks over time. Wheel: zoom; drag: pan; \
         shift-drag or a drag on the time axis: a flame graph of that range below; click a box: \
         search the graphs for its function.</p>"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::timeline::{Lane, Mark, StackBox, StackChart};

    /// A timeline as the computation makes it: two threads, one with
    /// switch records, marks and a two-level chart.
    pub fn sample_timeline() -> Timeline {
        Timeline {
            from_ns: 1_000_000_000_000,
            to_ns: 1_000_100_000_000,
            lanes: vec![
                Lane {
                    tid: 7,
                    samples: 3,
                    sample_times: vec![1_000_010_000_000],
                    on_cpu: Some(vec![[1_000_000_000_000, 1_000_020_000_000]]),
                    runnable: Some(vec![]),
                    blocked: Some(vec![[1_000_020_000_000, 1_000_100_000_000]]),
                },
                Lane {
                    tid: 8,
                    samples: 2,
                    sample_times: vec![1_000_001_000_000, 1_000_002_000_000],
                    ..Lane::default()
                },
            ],
            marks: vec![
                Mark {
                    kind: MarkKind::CallStart,
                    t_ns: 1_000_000_000_000,
                },
                Mark {
                    kind: MarkKind::Hit,
                    t_ns: 1_000_090_000_000,
                },
            ],
            chart: StackChart {
                names: vec!["main".into(), "<slow>".into()],
                boxes: vec![
                    StackBox {
                        depth: 0,
                        frame: 0,
                        start_ns: 1_000_000_000_000,
                        end_ns: 1_000_020_000_000,
                    },
                    StackBox {
                        depth: 1,
                        frame: 1,
                        start_ns: 1_000_000_000_000,
                        end_ns: 1_000_010_000_000,
                    },
                ],
            },
        }
    }

    #[test]
    fn the_data_is_relative_compact_and_safe_in_a_script() {
        let s = ThreadSamples {
            names: vec!["main".into(), "f".into()],
            stacks: vec![vec![0, 1]],
            samples: vec![(1_000_010_000_000, 0)],
        };
        let j = data_json(&sample_timeline(), 7, &s);
        assert!(!j.contains('<'), "{j}");
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["t0"], "1000000000000");
        assert_eq!(v["span"], 100_000_000);
        assert_eq!(v["names"][1], "<slow>");
        assert_eq!(
            v["boxes"],
            serde_json::json!([0, 0, 0, 20_000_000, 1, 1, 0, 10_000_000])
        );
        assert_eq!(
            v["marks"],
            serde_json::json!([["call_start", 0], ["hit", 90_000_000]])
        );
        // The thread with switch records has its states, not ticks; the
        // other its ticks only.
        let l = &v["lanes"];
        assert_eq!(l[0]["on"], serde_json::json!([0, 20_000_000]));
        assert_eq!(l[0]["bl"], serde_json::json!([20_000_000, 100_000_000]));
        assert!(l[0].get("ticks").is_none(), "{j}");
        assert!(l[1].get("on").is_none(), "{j}");
        assert_eq!(l[1]["ticks"], serde_json::json!([1_000_000, 2_000_000]));
        assert_eq!(v["ss"], serde_json::json!([10_000_000, 0]));
        assert_eq!(v["st"], serde_json::json!([[0, 1]]));
        let mut h = String::new();
        section(&mut h, &sample_timeline(), 7, &s);
        assert!(h.contains("class=\"tl-data\""), "{h}");
        assert!(!h.contains("<slow>"), "{h}");
    }

    #[test]
    fn a_threads_samples_are_interned_and_in_time_order() {
        let text = "  7 0.000003000:\n\tff leaf (x)\n\tfe main (x)\n\n\
                      8 0.000002500:\n\tff other (x)\n\n\
                      7 0.000001000:\n\tff leaf (x)\n\tfe main (x)\n\n\
                      7 0.000002000:\n\tfe main (x)\n\n";
        let parsed = crate::report::samples::parse(text.as_bytes()).unwrap();
        let t = thread_samples(&parsed, 7);
        assert_eq!(t.names, ["main", "leaf"]);
        assert_eq!(t.stacks, [vec![0, 1], vec![0]]);
        assert_eq!(t.samples, [(1_000, 0), (2_000, 1), (3_000, 0)]);
        assert!(thread_samples(&parsed, 9).samples.is_empty());
    }
}
