//! From a snapshot's samples to a hit's moment: which samples, folded
//! stacks, the functions that differ, and how many stacks are truncated.

use std::collections::HashMap;

use serde::Serialize;

use super::{
    graft,
    samples::{Sample, Samples},
};
use crate::output::index::IndexedHit;

/// The time span of a hit's moment on its thread.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Span {
    pub tid: u32,
    /// CLOCK_MONOTONIC, ns; inclusive.
    pub start_ns: u64,
    pub end_ns: u64,
    /// True for a `--slower-than` hit: the span is exactly the call.
    pub call: bool,
}

/// A hit's moment: for a `--slower-than` hit, the call itself
/// (`ktime_ns - duration_ns` to `ktime_ns`); else the `window_ns` before it.
pub fn span(hit: &IndexedHit, window_ns: u64) -> Span {
    let (len, call) = match hit.duration_ns {
        Some(d) => (d, true),
        None => (window_ns, false),
    };
    Span {
        tid: hit.tid,
        start_ns: hit.ktime_ns.saturating_sub(len),
        end_ns: hit.ktime_ns,
        call,
    }
}

impl Span {
    pub fn contains(&self, s: &Sample) -> bool {
        s.tid == self.tid && s.time_ns >= self.start_ns && s.time_ns <= self.end_ns
    }
}

/// Folded stacks: `root;...;leaf` → count, sorted (inferno wants sorted
/// lines).
pub type Folded = Vec<(String, u64)>;

/// Folds the samples `keep` selects.
pub fn fold(s: &Samples, keep: impl Fn(&Sample) -> bool) -> Folded {
    let mut counts: HashMap<&[u32], u64> = HashMap::new();
    for sample in s.samples.iter().filter(|x| keep(x)) {
        *counts.entry(s.stack(sample)).or_default() += 1;
    }
    let mut out: Folded = counts
        .into_iter()
        .map(|(stack, n)| (folded_line(s, stack), n))
        .collect();
    sort_merged(&mut out);
    out
}

/// A call chain (leaf first, frame ids of `s`) as a folded line, root
/// first.
fn folded_line(s: &Samples, stack: &[u32]) -> String {
    let mut line = String::new();
    for (i, &f) in stack.iter().rev().enumerate() {
        if i > 0 {
            line.push(';');
        }
        line.push_str(s.name(f));
    }
    if line.is_empty() {
        line.push_str("[no stack]");
    }
    line
}

/// One thread's samples in one snapshot, split by the moments of every
/// hit on that thread: the run view's input (issue 26, "the run as a
/// whole"). Unlike a hit's `rest`, `outside` leaves out the samples of
/// every moment, not only the hit's own; each sample is in one part.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadParts {
    pub tid: u32,
    /// Samples inside at least one moment (each counted once).
    pub inside: Folded,
    /// Samples outside every moment.
    pub outside: Folded,
}

/// Splits the samples of the threads that `spans` name: for each such
/// thread with samples in `s`, those inside any of its spans and those
/// outside all of them. `spans` may hold moments of hits in other snapshots
/// (a moment that began before this snapshot did); spans that end before
/// the first sample or begin after the last are skipped first. Sorted by
/// tid.
pub fn split_by_moments(s: &Samples, spans: &[Span]) -> Vec<ThreadParts> {
    let lo = s.samples.iter().map(|x| x.time_ns).min().unwrap_or(0);
    let hi = s.samples.iter().map(|x| x.time_ns).max().unwrap_or(0);
    let mut by_tid: HashMap<u32, Vec<&Span>> = HashMap::new();
    for sp in spans {
        let list = by_tid.entry(sp.tid).or_default();
        if sp.end_ns >= lo && sp.start_ns <= hi {
            list.push(sp);
        }
    }
    let mut counts: HashMap<(u32, bool, &[u32]), u64> = HashMap::new();
    for x in &s.samples {
        let Some(list) = by_tid.get(&x.tid) else {
            continue;
        };
        let inside = list.iter().any(|sp| sp.contains(x));
        *counts.entry((x.tid, inside, s.stack(x))).or_default() += 1;
    }
    let mut parts: HashMap<u32, ThreadParts> = HashMap::new();
    for ((tid, inside, stack), n) in counts {
        let p = parts.entry(tid).or_insert_with(|| ThreadParts {
            tid,
            ..ThreadParts::default()
        });
        let to = if inside {
            &mut p.inside
        } else {
            &mut p.outside
        };
        to.push((folded_line(s, stack), n));
    }
    let mut parts: Vec<ThreadParts> = parts.into_values().collect();
    for p in &mut parts {
        sort_merged(&mut p.inside);
        sort_merged(&mut p.outside);
    }
    parts.sort_by_key(|p| p.tid);
    parts
}

/// Sorts folded lines and adds up the weights of equal lines (two call
/// chains can fold to the same line, `;` in a name).
pub fn sort_merged(out: &mut Folded) {
    out.sort_unstable();
    out.dedup_by(|b, a| {
        if a.0 == b.0 {
            a.1 += b.1;
            true
        } else {
            false
        }
    });
}

/// Total samples of folded stacks.
pub fn total(f: &Folded) -> u64 {
    f.iter().map(|(_, n)| n).sum()
}

/// The text of a folded file: `root;...;leaf count` lines.
pub fn folded_text(f: &Folded) -> String {
    let mut s = String::new();
    for (line, n) in f {
        s.push_str(line);
        s.push(' ');
        s.push_str(&n.to_string());
        s.push('\n');
    }
    s
}

/// A function's share of samples.
#[derive(Debug, Clone, Serialize)]
pub struct Share {
    pub name: String,
    /// Fraction of the samples with the function anywhere on the stack.
    pub inclusive: f64,
    /// Fraction of the samples with the function as the leaf.
    #[serde(rename = "self")]
    pub self_: f64,
}

/// Functions by inclusive share, the largest first (at most `n`).
pub fn shares(f: &Folded, n: usize) -> Vec<Share> {
    let total = total(f).max(1) as f64;
    let mut incl: HashMap<&str, u64> = HashMap::new();
    let mut leaf: HashMap<&str, u64> = HashMap::new();
    for (line, c) in f {
        let frames: Vec<&str> = line.split(';').collect();
        let mut seen: Vec<&str> = Vec::new();
        for fr in &frames {
            if !seen.contains(fr) {
                seen.push(fr);
                *incl.entry(fr).or_default() += c;
            }
        }
        if let Some(l) = frames.last() {
            *leaf.entry(l).or_default() += c;
        }
    }
    let mut v: Vec<Share> = incl
        .into_iter()
        .map(|(name, c)| Share {
            name: name.to_string(),
            inclusive: c as f64 / total,
            self_: *leaf.get(name).unwrap_or(&0) as f64 / total,
        })
        .collect();
    v.sort_by(|a, b| {
        b.inclusive
            .total_cmp(&a.inclusive)
            .then(b.self_.total_cmp(&a.self_))
            .then(a.name.cmp(&b.name))
    });
    v.truncate(n);
    v
}

/// How a function's share of self time differs between the moment and the
/// rest of the thread.
#[derive(Debug, Clone, Serialize)]
pub struct Delta {
    pub name: String,
    /// Share of the moment's samples with the function as the leaf.
    pub moment_self: f64,
    /// The same share in the rest of the thread's samples.
    pub rest_self: f64,
    /// `moment_self - rest_self`.
    pub delta: f64,
}

/// Functions by how much more self time they have in the moment than in
/// the rest of the thread, the largest first (at most `n`): what the
/// differential flame graph shows in red.
pub fn deltas(moment: &Folded, rest: &Folded, n: usize) -> Vec<Delta> {
    let leaf_shares = |f: &Folded| {
        let total = total(f).max(1) as f64;
        let mut m: HashMap<String, f64> = HashMap::new();
        for (line, c) in f {
            let leaf = line.rsplit(';').next().unwrap_or(line);
            *m.entry(leaf.to_string()).or_default() += *c as f64 / total;
        }
        m
    };
    let (m, r) = (leaf_shares(moment), leaf_shares(rest));
    let mut names: Vec<&String> = m.keys().chain(r.keys()).collect();
    names.sort();
    names.dedup();
    let mut v: Vec<Delta> = names
        .into_iter()
        .map(|name| {
            let ms = m.get(name).copied().unwrap_or(0.0);
            let rs = r.get(name).copied().unwrap_or(0.0);
            Delta {
                name: name.clone(),
                moment_self: ms,
                rest_self: rs,
                delta: ms - rs,
            }
        })
        .collect();
    v.sort_by(|a, b| b.delta.total_cmp(&a.delta).then(a.name.cmp(&b.name)));
    v.truncate(n);
    v
}

/// Differential lines for inferno: `stack rest moment`, the rest scaled to
/// the moment's total so that colours show shares, not sample counts.
pub fn differential(moment: &Folded, rest: &Folded) -> Vec<String> {
    let (tm, tr) = (total(moment) as f64, total(rest) as f64);
    let scale = if tr > 0.0 { tm / tr } else { 0.0 };
    let mut both: HashMap<&str, (u64, u64)> = HashMap::new();
    for (l, c) in rest {
        both.entry(l).or_default().0 = (*c as f64 * scale).round() as u64;
    }
    for (l, c) in moment {
        both.entry(l).or_default().1 = *c;
    }
    let mut lines: Vec<String> = both
        .into_iter()
        .map(|(l, (r, m))| format!("{l} {r} {m}"))
        .collect();
    lines.sort_unstable();
    lines
}

/// Stacks that do not reach a thread's start (no frame that
/// `graft::is_start` names, nor Rust's `std::rt::lang_start`: the unwinding
/// stopped early), and all stacks. A frame
/// past the start (libc's caller of `main`, often nameless) does not count
/// against a stack.
pub fn truncated(f: &Folded) -> (u64, u64) {
    let mut cut = 0;
    for (line, c) in f {
        let reaches = line
            .split(';')
            .any(|fr| graft::is_start(fr) || fr.starts_with("std::rt::lang_start"));
        if !reaches {
            cut += c;
        }
    }
    (cut, total(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folded(v: &[(&str, u64)]) -> Folded {
        v.iter().map(|(s, n)| (s.to_string(), *n)).collect()
    }

    #[test]
    fn spans_follow_the_hit() {
        let mut h = IndexedHit {
            seq: 1,
            tgid: 1,
            tid: 7,
            cpu: 0,
            ktime_ns: 5_000,
            args: [0; agent_common::NARGS],
            duration_ns: Some(1_000),
            retval: None,
            merged: false,
            ..IndexedHit::default()
        };
        let s = span(&h, 3_000);
        assert_eq!((s.start_ns, s.end_ns, s.call), (4_000, 5_000, true));
        h.duration_ns = None;
        let s = span(&h, 3_000);
        assert_eq!((s.start_ns, s.call), (2_000, false));
        let parsed = crate::report::samples::parse(
            "  7 0.000002000:\n\tff f (x)\n\n  8 0.000002500:\n\tff f (x)\n\n".as_bytes(),
        )
        .unwrap();
        assert!(s.contains(&parsed.samples[0]));
        assert!(!s.contains(&parsed.samples[1]));
    }

    /// Samples of `perf script` text: (tid, time in µs, leaf function);
    /// every stack is `main;<leaf>`.
    fn samples(v: &[(u32, u64, &str)]) -> Samples {
        let mut text = String::new();
        for (tid, us, leaf) in v {
            text.push_str(&format!(
                "  {tid} 0.{us:06}000:\n\t1 {leaf} (x)\n\t2 main (x)\n\n"
            ));
        }
        crate::report::samples::parse(text.as_bytes()).unwrap()
    }

    fn sp(tid: u32, start_us: u64, end_us: u64) -> Span {
        Span {
            tid,
            start_ns: start_us * 1000,
            end_ns: end_us * 1000,
            call: true,
        }
    }

    #[test]
    fn every_sample_of_a_thread_is_inside_a_moment_or_outside_all() {
        let s = samples(&[
            (7, 1, "early"),  // in a moment of an earlier snapshot's hit
            (7, 10, "a"),     // hit A's moment only
            (7, 25, "both"),  // A's and B's moments overlap: counted once
            (7, 40, "b"),     // B's moment only
            (7, 60, "idle"),  // outside both
            (8, 25, "other"), // another thread, no hit: left out
            (9, 500, "late"), // tid 9's hit is in another snapshot
        ]);
        let spans = [sp(7, 0, 2), sp(7, 5, 30), sp(7, 20, 45), sp(9, 900, 950)];
        let parts = split_by_moments(&s, &spans);
        assert_eq!(parts.len(), 2, "{parts:?}");
        let t7 = &parts[0];
        assert_eq!(t7.tid, 7);
        assert_eq!(
            t7.inside,
            folded(&[
                ("main;a", 1),
                ("main;b", 1),
                ("main;both", 1),
                ("main;early", 1)
            ])
        );
        assert_eq!(t7.outside, folded(&[("main;idle", 1)]));
        // A hit's own `rest` (same thread, outside its moment) holds B's
        // moment: summing the hits' rests would count "both" and "b" as
        // the rest of the thread.
        let a = sp(7, 5, 30);
        let rest_a = fold(&s, |x| x.tid == 7 && !a.contains(x));
        assert!(rest_a.iter().any(|(l, _)| l == "main;b"), "{rest_a:?}");
        let t9 = &parts[1];
        assert_eq!((t9.tid, total(&t9.inside)), (9, 0));
        assert_eq!(t9.outside, folded(&[("main;late", 1)]));
    }

    #[test]
    fn shares_deltas_and_truncation() {
        let m = folded(&[("main;trigger;slow_part", 9), ("main;trigger", 1)]);
        let r = folded(&[("main;loop;fast", 20)]);
        let s = shares(&m, 10);
        assert_eq!((s[0].name.as_str(), s[0].inclusive), ("trigger", 1.0));
        let slow = s.iter().find(|x| x.name == "slow_part").unwrap();
        assert!((slow.inclusive - 0.9).abs() < 1e-9);
        let d = deltas(&m, &r, 10);
        assert_eq!(d[0].name, "slow_part");
        assert_eq!(d.last().unwrap().name, "fast");
        let diff = differential(&m, &r);
        assert!(
            diff.contains(&"main;loop;fast 10 0".to_string()),
            "{diff:?}"
        );
        let t = folded(&[("[libc.so.6];main;a", 3), ("a;b", 5), ("start_thread;x", 2)]);
        assert_eq!(truncated(&t), (5, 10));
    }
}
