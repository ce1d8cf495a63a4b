//! What a fleet report selects, without any I/O: the store's listing read
//! back into runs ([`catalog`]), the filters (`--trigger`, `--since`,
//! `--until`, `--slower-than`) on a run's index lines, the index a
//! mirrored directory gets ([`compose`]), and its `.jit/` ([`plan_jit`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use serde::Deserialize;

use crate::output::{
    index::{Deleted, IndexLine, SnapshotLine},
    jit_kept::KeptLine,
    run_file::Trigger,
};
use crate::upload::keys::{self, Key, RunKey};

/// A run's clock pair, `clock.json` (docs/upload.md, "`clock.json`").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Clock {
    /// CLOCK_REALTIME when the run began uploading, ns since the epoch.
    pub realtime_ns: u64,
    /// CLOCK_MONOTONIC read with it, ns.
    pub monotonic_ns: u64,
}

impl Clock {
    /// The wall-clock time (ns since the epoch) of a CLOCK_MONOTONIC time
    /// of the run, such as a hit's `ktime_ns`.
    pub fn wall_ns(&self, ktime_ns: u64) -> i128 {
        self.realtime_ns as i128 + ktime_ns as i128 - self.monotonic_ns as i128
    }
}

/// One index directory of a run (`REL`) as listed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedDir {
    /// Index line numbers (from 1) in the store.
    pub lines: BTreeSet<u64>,
    /// Snapshot files in the store, with their size in bytes.
    pub snapshots: BTreeMap<String, u64>,
    /// Snapshots whose lines of `.jit/kept.jsonl` are in the store.
    pub jit_lines: BTreeSet<String>,
    /// Chunks of each kept JIT copy in the store: start → end, bytes.
    pub jit_chunks: BTreeMap<String, BTreeMap<u64, u64>>,
}

/// One run, `PREFIX/HOST/RUN/`, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedRun {
    pub key: RunKey,
    pub clock: bool,
    pub run_file: bool,
    /// By `REL` ("" for the run's own directory).
    pub dirs: BTreeMap<String, ListedDir>,
    /// Ids of the run's `objects/<id>.json`.
    pub objects: BTreeSet<String>,
}

/// The store's listing, by run.
#[derive(Debug, Default)]
pub struct Listing {
    /// By (host, run).
    pub runs: BTreeMap<(String, String), ListedRun>,
    /// Listed keys of no known shape (someone else's objects).
    pub unknown: usize,
}

/// Reads listed `(key, bytes)` back into runs.
pub fn catalog(prefix: &str, listed: impl IntoIterator<Item = (String, u64)>) -> Listing {
    let mut l = Listing::default();
    for (key, bytes) in listed {
        let Some(k) = keys::parse(prefix, &key) else {
            l.unknown += 1;
            continue;
        };
        match k {
            Key::Clock { run } => entry(&mut l, &run).clock = true,
            Key::RunFile { run } => entry(&mut l, &run).run_file = true,
            Key::Snapshot { run, rel, file } => {
                let d = entry(&mut l, &run).dirs.entry(rel).or_default();
                d.snapshots.insert(file, bytes);
            }
            Key::IndexLine { run, rel, line } => {
                entry(&mut l, &run)
                    .dirs
                    .entry(rel)
                    .or_default()
                    .lines
                    .insert(line);
            }
            Key::ObjectRef { run, id } => {
                entry(&mut l, &run).objects.insert(id);
            }
            Key::JitLines { run, rel, snapshot } => {
                let d = entry(&mut l, &run).dirs.entry(rel).or_default();
                d.jit_lines.insert(snapshot);
            }
            Key::JitChunk {
                run,
                rel,
                file,
                start,
                end,
            } => {
                let d = entry(&mut l, &run).dirs.entry(rel).or_default();
                d.jit_chunks.entry(file).or_default().insert(start, end);
            }
            Key::DebugObject { .. } => {}
        }
    }
    l
}

fn entry<'a>(l: &'a mut Listing, r: &RunKey) -> &'a mut ListedRun {
    l.runs
        .entry((r.host.clone(), r.run.clone()))
        .or_insert_with(|| ListedRun {
            key: r.clone(),
            clock: false,
            run_file: false,
            dirs: BTreeMap::new(),
            objects: BTreeSet::new(),
        })
}

/// The filters on index lines, times resolved (ns since the epoch).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filters {
    pub trigger: Option<String>,
    pub since_ns: Option<i128>,
    pub until_ns: Option<i128>,
    pub slower_than_ns: Option<u64>,
}

impl Filters {
    fn timed(&self) -> bool {
        self.since_ns.is_some() || self.until_ns.is_some()
    }

    fn in_window(&self, lo: i128, hi: i128) -> bool {
        self.since_ns.is_none_or(|s| hi >= s) && self.until_ns.is_none_or(|u| lo <= u)
    }

    /// Whether the index directory `rel` of a run is the trigger's: by
    /// `run.json`'s triggers when the run has written it (the trigger whose
    /// directory is `rel` or its parent, matched by its function or its
    /// directory's name), else by `rel`'s first directory name.
    pub fn trigger_matches(&self, rel: &str, triggers: Option<&[Trigger]>) -> bool {
        let Some(name) = &self.trigger else {
            return true;
        };
        let rel = Path::new(rel);
        let own = triggers.and_then(|ts| {
            ts.iter()
                .find(|t| t.dir == rel || Some(t.dir.as_path()) == rel.parent())
        });
        match own {
            Some(t) => t.symbol == *name || t.dir.file_name().is_some_and(|d| d == name.as_str()),
            None => rel
                .components()
                .next()
                .is_some_and(|c| c.as_os_str() == name.as_str()),
        }
    }

    /// Whether a snapshot line passes: a hit line when one of its hits is
    /// at least `--slower-than` and inside `--since`/`--until`; a tail line
    /// (no hit) when there is no `--slower-than` and its sample span meets
    /// the window. Times need the run's clock: without one, a timed filter
    /// passes nothing.
    pub fn keeps(&self, line: &SnapshotLine, clock: Option<&Clock>) -> bool {
        let s = &line.snapshot;
        let wall = |t: u64| clock.map(|c| c.wall_ns(t));
        if s.hits.is_empty() {
            if self.slower_than_ns.is_some() {
                return false;
            }
            if !self.timed() {
                return true;
            }
            let span = s
                .span
                .and_then(|sp| Some((wall(sp.first_sample_ns)?, wall(sp.last_sample_ns)?)));
            return span.is_some_and(|(lo, hi)| self.in_window(lo, hi));
        }
        s.hits.iter().any(|h| {
            let slow = self
                .slower_than_ns
                .is_none_or(|d| h.duration_ns.is_some_and(|n| n >= d));
            let when = !self.timed() || wall(h.ktime_ns).is_some_and(|t| self.in_window(t, t));
            slow && when
        })
    }
}

/// The index of a mirrored directory and the snapshots it needs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Composed {
    /// Lines of its `snapshots.jsonl`, in line order, without `\n`.
    pub lines: Vec<String>,
    /// Snapshot files to fetch (in the store).
    pub snapshots: Vec<String>,
    /// Snapshot lines kept.
    pub kept: usize,
    /// Lines that were not index lines.
    pub bad: usize,
}

/// Composes a mirrored directory's index from the store's index lines (in
/// line order): the snapshot lines `keep` passes, each as stored. A
/// `deleted` line is dropped (the host deleted its copy after uploading it,
/// `--upload-delete` or `--max-disk`); a kept line whose snapshot is not in
/// the store (`in_store`) is followed by a `deleted` line of its own, so
/// that the report says so.
pub fn compose(
    stored: &[&str],
    keep: impl Fn(&SnapshotLine) -> bool,
    in_store: impl Fn(&str) -> bool,
) -> Composed {
    let mut c = Composed::default();
    for raw in stored {
        let raw = raw.trim_end_matches(['\n', '\r']);
        match IndexLine::parse(raw) {
            Some(IndexLine::Deleted(_)) => {}
            Some(IndexLine::Snapshot(s)) => {
                if !keep(&s) {
                    continue;
                }
                c.kept += 1;
                c.lines.push(raw.to_string());
                let file = &s.snapshot.file;
                if in_store(file) {
                    c.snapshots.push(file.clone());
                } else {
                    let d = serde_json::to_string(&Deleted::new(file)).expect("a deleted line");
                    c.lines.push(d);
                }
            }
            None => c.bad += 1,
        }
    }
    c
}

/// A mirrored directory's `.jit/`: what its selected snapshots kept.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct JitPlan {
    /// Lines of its `.jit/kept.jsonl`, without `\n`, in the order given:
    /// those whose length the store's chunks reach.
    pub lines: Vec<String>,
    /// Per kept copy, the chunks (start, end) to fetch and join, from
    /// offset 0 on without a gap.
    pub files: BTreeMap<String, Vec<(u64, u64)>>,
}

/// Plans a mirrored directory's `.jit/` from the selected snapshots'
/// `jit/<snapshot>.jsonl` (`texts`, in line order) and the directory's
/// listed chunks: each copy is joined from 0 up to the largest length a
/// line names, and a line the chunks do not reach (one missing from the
/// store) is left out, so that every length in the mirror's `kept.jsonl`
/// is there to read.
pub fn plan_jit(texts: &[&str], chunks: &BTreeMap<String, BTreeMap<u64, u64>>) -> JitPlan {
    let lines: Vec<(&str, KeptLine)> = texts
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|raw| Some((raw, KeptLine::parse(raw)?)))
        .collect();
    let mut need: BTreeMap<String, u64> = BTreeMap::new();
    for (_, l) in &lines {
        let n = need.entry(l.file.clone()).or_default();
        *n = (*n).max(l.bytes);
    }
    let mut plan = JitPlan::default();
    let mut covered: BTreeMap<String, u64> = BTreeMap::new();
    for (file, need) in need {
        let (mut at, mut got) = (0, Vec::new());
        while at < need
            && let Some(&end) = chunks.get(&file).and_then(|c| c.get(&at))
        {
            got.push((at, end));
            at = end;
        }
        if !got.is_empty() {
            plan.files.insert(file.clone(), got);
        }
        covered.insert(file, at);
    }
    plan.lines = lines
        .into_iter()
        .filter(|(_, l)| l.bytes <= covered[&l.file])
        .map(|(raw, _)| raw.to_string())
        .collect();
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const P: &str = "moments/prod";

    fn hit(file: &str, ktime_ns: u64, duration_ns: Option<u64>) -> String {
        let d = duration_ns.map_or(String::new(), |d| format!(r#","duration_ns":{d}"#));
        format!(
            r#"{{"kind":"hit","file":"{file}","bytes":10,"hits":[{{"seq":1,"tgid":5,"tid":6,"cpu":0,"ktime_ns":{ktime_ns},"args":[0,0,0,0,0,0]{d},"merged":false}}],"counters":{{}},"merged":0}}"#
        )
    }

    fn tail(file: &str, lo: u64, hi: u64) -> String {
        format!(
            r#"{{"kind":"tail","file":"{file}","bytes":10,"hits":[],"samples":3,"first_sample_ns":{lo},"last_sample_ns":{hi},"counters":{{}},"merged":0}}"#
        )
    }

    fn line(s: &str) -> SnapshotLine<'static> {
        match IndexLine::parse(s) {
            Some(IndexLine::Snapshot(s)) => *s,
            _ => panic!("not a snapshot line: {s}"),
        }
    }

    fn trigger(dir: &str, symbol: &str) -> Trigger {
        Trigger {
            dir: PathBuf::from(dir),
            symbol: symbol.into(),
            object: "/srv/app".into(),
            pid: None,
            exe: None,
            event: "cpu-clock".into(),
            freq: 999,
            go: false,
        }
    }

    #[test]
    fn the_listing_is_read_back_into_runs_and_strangers_are_counted() {
        let r = RunKey {
            prefix: P.into(),
            host: "web-1".into(),
            run: "20261202-093000".into(),
        };
        let listed = [
            (r.clock(), 60),
            (r.index_line("api/4242", 2), 300),
            (r.index_line("api/4242", 1), 300),
            (r.snapshot("api/4242", "perf.data.1"), 5000),
            (r.object_ref("47e8"), 40),
            (keys::debug_object(P, "47e8"), 1 << 20),
            (r.jit_lines("api/4242", "perf.data.1"), 150),
            (r.jit_chunk("api/4242", "perf-5.map", 0, 100), 100),
            (r.jit_chunk("api/4242", "perf-5.map", 100, 130), 30),
            ("moments/prod/notes.txt".to_string(), 1),
            ("moments/prod/web-2/r/clock.json".to_string(), 60),
        ];
        let l = catalog(P, listed);
        assert_eq!(l.unknown, 1);
        assert_eq!(l.runs.len(), 2);
        let run = &l.runs[&("web-1".into(), "20261202-093000".into())];
        assert!(run.clock && !run.run_file);
        let d = &run.dirs["api/4242"];
        assert_eq!(d.lines.iter().copied().collect::<Vec<_>>(), [1, 2]);
        assert_eq!(d.snapshots["perf.data.1"], 5000);
        assert_eq!(d.snapshots.len(), 1);
        assert!(d.jit_lines.contains("perf.data.1"));
        assert_eq!(
            d.jit_chunks["perf-5.map"].iter().collect::<Vec<_>>(),
            [(&0, &100), (&100, &130)]
        );
        assert!(run.objects.contains("47e8"));
        assert!(l.runs[&("web-2".into(), "r".into())].dirs.is_empty());
    }

    #[test]
    fn a_trigger_is_matched_by_its_function_or_its_directory() {
        let by = |name: &str| Filters {
            trigger: Some(name.into()),
            ..Default::default()
        };
        let ts = [trigger("api", "handle_request"), trigger("db", "query")];
        // --config: OUT/<trigger>/<pid>/.
        assert!(by("handle_request").trigger_matches("api/4242", Some(&ts)));
        assert!(by("api").trigger_matches("api/4242", Some(&ts)));
        assert!(by("api").trigger_matches("api", Some(&ts)));
        assert!(!by("query").trigger_matches("api/4242", Some(&ts)));
        assert!(by("query").trigger_matches("db", Some(&ts)));
        // --pid: the run's own directory.
        let pid = [trigger("", "f")];
        assert!(by("f").trigger_matches("", Some(&pid)));
        assert!(!by("g").trigger_matches("", Some(&pid)));
        // No run.json yet: the directory's name only.
        assert!(by("api").trigger_matches("api/4242", None));
        assert!(!by("handle_request").trigger_matches("api/4242", None));
        assert!(!by("f").trigger_matches("", None));
        assert!(Filters::default().trigger_matches("", None));
    }

    #[test]
    fn slower_than_keeps_timed_hits_at_least_that_long() {
        let f = Filters {
            slower_than_ns: Some(1_000),
            ..Default::default()
        };
        assert!(f.keeps(&line(&hit("a", 5, Some(1_000))), None));
        assert!(!f.keeps(&line(&hit("a", 5, Some(999))), None));
        assert!(!f.keeps(&line(&hit("a", 5, None)), None));
        assert!(!f.keeps(&line(&tail("t", 1, 2)), None));
        assert!(Filters::default().keeps(&line(&tail("t", 1, 2)), None));
    }

    #[test]
    fn since_and_until_use_the_runs_clock() {
        // Monotonic 1000 s was wall 1_800_000_000 s.
        let clock = Clock {
            realtime_ns: 1_800_000_000_000_000_000,
            monotonic_ns: 1_000_000_000_000,
        };
        let wall = |s: i128| 1_800_000_000_000_000_000 + s * 1_000_000_000;
        let at = |s: u64| 1_000_000_000_000 + s * 1_000_000_000;
        assert_eq!(clock.wall_ns(at(5)), wall(5));
        let f = Filters {
            since_ns: Some(wall(10)),
            until_ns: Some(wall(20)),
            ..Default::default()
        };
        for (s, want) in [(9, false), (10, true), (15, true), (20, true), (21, false)] {
            assert_eq!(
                f.keeps(&line(&hit("a", at(s), None)), Some(&clock)),
                want,
                "{s}"
            );
        }
        // A tail by its span: kept when the span meets the window.
        assert!(f.keeps(&line(&tail("t", at(1), at(10))), Some(&clock)));
        assert!(f.keeps(&line(&tail("t", at(12), at(13))), Some(&clock)));
        assert!(!f.keeps(&line(&tail("t", at(21), at(30))), Some(&clock)));
        // No clock: a timed filter keeps nothing.
        assert!(!f.keeps(&line(&hit("a", at(15), None)), None));
        // Both filters hold for the same hit.
        let both = Filters {
            slower_than_ns: Some(100),
            ..f.clone()
        };
        assert!(both.keeps(&line(&hit("a", at(15), Some(100))), Some(&clock)));
        assert!(!both.keeps(&line(&hit("a", at(25), Some(100))), Some(&clock)));
    }

    #[test]
    fn the_mirrored_index_keeps_selected_lines_and_says_what_the_store_lacks() {
        let a = hit("perf.data.1", 10, Some(5));
        let b = hit("perf.data.2", 20, Some(50));
        let c = hit("perf.data.3", 30, Some(500));
        let t = tail("perf.data.4", 31, 40);
        let del1 = r#"{"kind":"deleted","file":"perf.data.1"}"#.to_string();
        let del3 = r#"{"kind":"deleted","file":"perf.data.3"}"#.to_string();
        let a_nl = format!("{a}\n");
        let stored: Vec<&str> = vec![&a_nl, &b, &del1, &c, "{\"kind\":\"hi", &del3, &t];
        // 1 and 2 are in the store (1 was deleted on the host after its
        // upload); 3 was deleted before it could be uploaded.
        let in_store = |f: &str| f != "perf.data.3";
        let all = compose(&stored, |_| true, in_store);
        assert_eq!(
            all.lines,
            [a.clone(), b.clone(), c.clone(), del3.clone(), t.clone()]
        );
        assert_eq!(all.snapshots, ["perf.data.1", "perf.data.2", "perf.data.4"]);
        assert_eq!((all.kept, all.bad), (4, 1));
        let slow = Filters {
            slower_than_ns: Some(50),
            ..Default::default()
        };
        let some = compose(&stored, |l| slow.keeps(l, None), in_store);
        assert_eq!(some.lines, [b, c, del3]);
        assert_eq!(some.snapshots, ["perf.data.2"]);
    }

    fn kept(snapshot: &str, file: &str, bytes: u64) -> String {
        format!(
            r#"{{"snapshot":"{snapshot}","pid":5,"kind":"perf_map","file":"{file}","bytes":{bytes},"origin":"/tmp/perf-1.map"}}"#
        )
    }

    #[test]
    fn a_mirrored_jit_copy_is_joined_up_to_the_longest_selected_length() {
        let chunks: BTreeMap<String, BTreeMap<u64, u64>> = [
            (
                "perf-5.map".to_string(),
                [(0, 100), (100, 130), (130, 170), (200, 220)].into(),
            ),
            ("jit-5.dump".to_string(), [(40, 90)].into()),
        ]
        .into();
        let (a, b) = (
            kept("perf.data.1", "perf-5.map", 100),
            kept("perf.data.3", "perf-5.map", 130),
        );
        // Snapshots 1 and 3 selected: 170 and beyond are not fetched.
        let two = format!("{a}\n");
        let three = format!("{b}\nnot json\n");
        let p = plan_jit(&[&two, &three], &chunks);
        assert_eq!(p.lines, [a.clone(), b.clone()]);
        assert_eq!(p.files["perf-5.map"], [(0, 100), (100, 130)]);
        assert_eq!(p.files.len(), 1);
        // A chunk missing from the store (150..200 never arrived): the
        // lengths beyond it are left out, the ones before it kept.
        let c = kept("perf.data.5", "perf-5.map", 220);
        let d = kept("perf.data.5", "jit-5.dump", 90);
        let five = format!("{c}\n{d}\n");
        let p = plan_jit(&[&two, &five], &chunks);
        assert_eq!(p.lines, [a]);
        assert_eq!(p.files["perf-5.map"], [(0, 100), (100, 130), (130, 170)]);
        assert!(!p.files.contains_key("jit-5.dump"));
        assert_eq!(plan_jit(&[], &chunks), JitPlan::default());
    }
}
