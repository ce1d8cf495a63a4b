//! `mt-agent report --pprof`: the pprof profiles of a snapshot (which
//! samples each holds, their labels, the time it spans) and the run's
//! moments merged into one (docs/pprof.md). Pure but for [`source`], which
//! reads `run.json`.

use super::{
    moments::Span,
    pprof::{Builder, Profile, Tag},
    samples::{Sample, Samples},
    wall_clock,
};
use crate::output::{
    index::{IndexedHit, Snapshot},
    run_file,
    runs::RunDir,
};

/// A snapshot's profiles.
#[derive(Debug)]
pub struct Profiles {
    /// Every sample of the file.
    pub all: Profile,
    /// Each hit's moment, in the order of the hits given.
    pub moments: Vec<Profile>,
}

/// What the profiles say of where their samples come from.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub snapshot: &'a Snapshot,
    /// The trigger's function (`run.json`), when known.
    pub trigger: Option<&'a str>,
    /// The sampling period, ns: 1e9 / the sampling frequency.
    pub period_ns: Option<u64>,
}

/// The trigger (from the nearest `run.json`) and sampling period of an
/// index directory's snapshots: the trigger's `freq`, or else the `-F N`
/// or `freq=N` of perf's command line.
pub fn source(run: &RunDir, cmdline: Option<&str>) -> (Option<String>, Option<u64>) {
    let t = run_file::trigger_of(&run.out, run);
    let freq = t
        .as_ref()
        .map(|t| u64::from(t.freq))
        .filter(|&f| f > 0)
        .or_else(|| cmdline.and_then(freq_of));
    (t.map(|t| t.symbol), freq.map(|f| 1_000_000_000 / f))
}

/// The sampling frequency (Hz) perf's command line names: `-F 999`,
/// `--freq=999`, `--freq 999`, or an event's `/freq=999/`.
fn freq_of(cmd: &str) -> Option<u64> {
    let mut words = cmd.split_whitespace();
    while let Some(w) = words.next() {
        let value = match w {
            "-F" | "--freq" => words.next(),
            _ => w
                .strip_prefix("--freq=")
                .or_else(|| w.split_once("freq=").map(|(_, v)| v)),
        };
        let digits = value.map(|v| v.split(|c: char| !c.is_ascii_digit()).next().unwrap_or(""));
        if let Some(f) = digits.and_then(|d| d.parse().ok()).filter(|&f: &u64| f > 0) {
            return Some(f);
        }
    }
    None
}

/// A sample's frames, leaf first, as (function, object file).
fn frames<'s>(s: &'s Samples, x: &Sample) -> impl Iterator<Item = (&'s str, &'s str)> {
    s.stack(x).iter().map(|&i| s.name(i)).zip(s.objects(x))
}

/// The profiles of one snapshot's samples, for its hits and their moments.
pub fn of_snapshot(s: &Samples, src: &Source, hits: &[(&IndexedHit, Span)]) -> Profiles {
    Profiles {
        all: all(s, src, hits),
        moments: hits.iter().map(|(h, sp)| moment(s, src, h, sp)).collect(),
    }
}

/// A hit's moment: its thread's samples in the span, each labelled `hit`,
/// `tid`, `trigger` and, for a slow call, `duration_ns`; the profile spans
/// the moment on the wall clock.
fn moment(s: &Samples, src: &Source, h: &IndexedHit, sp: &Span) -> Profile {
    let mut b = Builder::new(src.period_ns);
    b.comment(&format!(
        "mt-agent: the moment of hit {} (thread {}) in {}",
        h.seq, h.tid, src.snapshot.file
    ));
    let mut tags = vec![
        Tag::Num("hit", h.seq as i64, ""),
        Tag::Num("tid", i64::from(h.tid), ""),
    ];
    if let Some(t) = src.trigger {
        tags.push(Tag::Str("trigger", t));
    }
    if let Some(d) = h.duration_ns {
        tags.push(Tag::Num("duration_ns", d as i64, "nanoseconds"));
    }
    for x in s.samples.iter().filter(|x| sp.contains(x)) {
        b.add(frames(s, x), &tags);
    }
    let start = wall_clock::wall_ns(src.snapshot, sp.start_ns).unwrap_or(0);
    b.finish(start, (sp.end_ns - sp.start_ns) as i64)
}

/// Every sample of the file, labelled `tid`, and `hit` for each hit whose
/// moment holds it; the profile spans the samples (or is the first hit's
/// instant when there are none).
fn all(s: &Samples, src: &Source, hits: &[(&IndexedHit, Span)]) -> Profile {
    let mut b = Builder::new(src.period_ns);
    b.comment(&format!("mt-agent: every sample of {}", src.snapshot.file));
    let mut tags = Vec::new();
    for x in &s.samples {
        tags.clear();
        tags.push(Tag::Num("tid", i64::from(x.tid), ""));
        for (h, _) in hits.iter().filter(|(_, sp)| sp.contains(x)) {
            tags.push(Tag::Num("hit", h.seq as i64, ""));
        }
        b.add(frames(s, x), &tags);
    }
    let lo = s.samples.iter().map(|x| x.time_ns).min();
    let hi = s.samples.iter().map(|x| x.time_ns).max();
    let (lo, hi) = match (lo, hi, hits.first()) {
        (Some(lo), Some(hi), _) => (lo, hi),
        (_, _, Some((h, _))) => (h.ktime_ns, h.ktime_ns),
        _ => return b.finish(0, 0),
    };
    let start = wall_clock::wall_ns(src.snapshot, lo).unwrap_or(0);
    b.finish(start, (hi - lo) as i64)
}

/// Every moment in one profile (`moments.pb.gz`), spanning them all. Its
/// `cpu` values are kept when every moment has them (a moment without a
/// known period has counts only); its period is the first moment's.
pub fn merged<'a>(moments: impl Iterator<Item = &'a Profile> + Clone) -> Profile {
    let has_cpu = |p: &Profile| p.sample_type.len() > 1;
    let period = match moments.clone().next() {
        Some(first) if moments.clone().all(has_cpu) => Some(first.period as u64),
        _ => None,
    };
    let mut b = Builder::new(period);
    b.comment("mt-agent: the moment of every hit");
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    for p in moments {
        b.add_profile(p);
        if p.time_nanos != 0 {
            lo = lo.min(p.time_nanos);
            hi = hi.max(p.time_nanos + p.duration_nanos);
        }
    }
    if lo > hi {
        return b.finish(0, 0);
    }
    b.finish(lo, hi - lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = "  42 10.000000000: \n\t1 slow_part (/t/app)\n\t2 main (/t/app)\n\n  \
                          42 10.050000000: \n\t1 slow_part (/t/app)\n\t2 main (/t/app)\n\n  \
                          43 10.060000000: \n\t3 background_work (/t/app)\n\t4 [unknown] (/lib/libc.so.6)\n\n  \
                          42 10.200000000: \n\t2 main (/t/app)\n\n";

    fn snapshot() -> Snapshot {
        serde_json::from_value(serde_json::json!({
            "kind": "hit", "file": "perf.data.2026120100000007", "hit_to_kill_ns": 0,
            "hits": [{"seq": 5, "tgid": 41, "tid": 42, "cpu": 0, "ktime_ns": 10_070_000_000u64,
                      "args": [0, 0, 0, 0, 0, 0], "duration_ns": 80_000_000u64, "merged": false}],
        }))
        .unwrap()
    }

    /// Labels of a profile's samples, `key=value`, sorted, with their counts.
    fn labelled(p: &Profile) -> Vec<(Vec<String>, i64)> {
        let s = |i: i64| p.string_table[i as usize].as_str();
        let mut v: Vec<(Vec<String>, i64)> = p
            .sample
            .iter()
            .map(|x| {
                let l = x.label.iter().map(|l| match l.str {
                    0 => format!("{}={}", s(l.key), l.num),
                    v => format!("{}={}", s(l.key), s(v)),
                });
                (l.collect(), x.value[0])
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_snapshot_gives_its_moment_and_its_whole() {
        let samples = super::super::samples::parse(SCRIPT.as_bytes()).unwrap();
        let snap = snapshot();
        let h = &snap.hits[0];
        let sp = super::super::moments::span(h, 1_000_000_000);
        let src = Source {
            snapshot: &snap,
            trigger: Some("handle"),
            period_ns: Some(1_001_001),
        };
        let p = of_snapshot(&samples, &src, &[(h, sp)]);
        assert_eq!(p.moments.len(), 1);
        let m = &p.moments[0];
        assert_eq!(
            labelled(m),
            [(
                vec![
                    "hit=5".into(),
                    "tid=42".into(),
                    "trigger=handle".into(),
                    "duration_ns=80000000".into()
                ],
                2
            )]
        );
        // The call, 80 ms before the hit, on the wall clock: the switch is
        // the hit's time (no hit_to_kill_ns).
        let switch = wall_clock::wall_ns(&snap, h.ktime_ns).unwrap();
        assert_eq!(
            (m.time_nanos, m.duration_nanos),
            (switch - 80_000_000, 80_000_000)
        );
        assert_eq!(m.period, 1_001_001);
        assert_eq!(
            labelled(&p.all),
            [
                (vec!["tid=42".into()], 1),
                (vec!["tid=42".into(), "hit=5".into()], 2),
                (vec!["tid=43".into()], 1),
            ]
        );
        assert_eq!(
            (p.all.time_nanos, p.all.duration_nanos),
            (switch - 70_000_000, 200_000_000)
        );
        let names: Vec<&str> = p
            .all
            .function
            .iter()
            .map(|f| p.all.string_table[f.name as usize].as_str())
            .collect();
        assert_eq!(
            names,
            ["slow_part", "main", "background_work", "[libc.so.6]"]
        );
        let files: Vec<&str> = p
            .all
            .mapping
            .iter()
            .map(|m| p.all.string_table[m.filename as usize].as_str())
            .collect();
        assert_eq!(files, ["/t/app", "/lib/libc.so.6"]);
        // Both moments of two runs, spanning both.
        let mut later = m.clone();
        later.time_nanos += 1_000_000_000;
        let all = merged([m, &later].into_iter());
        assert_eq!(labelled(&all), [(labelled(m)[0].0.clone(), 4)]);
        assert_eq!(
            (all.time_nanos, all.duration_nanos),
            (m.time_nanos, 1_080_000_000)
        );
        assert_eq!(all.sample_type.len(), 2);
    }

    #[test]
    fn the_period_comes_from_the_frequency_perf_was_given() {
        assert_eq!(
            freq_of("/usr/bin/perf record -p 42 -e cpu-clock -F 999 -g"),
            Some(999)
        );
        assert_eq!(
            freq_of("perf record -e cpu-clock/freq=499/ -e sched:sched_switch"),
            Some(499)
        );
        assert_eq!(freq_of("perf record --freq=99 -p 1"), Some(99));
        assert_eq!(freq_of("perf record -p 42 -c 10000"), None);
    }
}
