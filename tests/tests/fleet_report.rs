//! The fleet report (issue 27, case 5): two hosts' runs, uploaded by the
//! real agent (`--upload`) to a real SeaweedFS on loopback, reported with
//! `mt-agent report s3://… --output DIR`:
//!
//! * on a fresh DIR, the same hits, moments, folded stacks and counts as
//!   the local reports of the two runs;
//! * `--host` and `--slower-than` select what they say, and fetch only
//!   the snapshots they keep;
//! * a second report into the same DIR makes no GET (the server's own
//!   request counter), only LISTs;
//! * bad input: no --output, wrong credentials, a missing bucket: one line
//!   and the documented exit code.
//!
//! Privileged (the captures).

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Output},
    time::Instant,
};

use mt_agent_tests::{store::SeaweedFs, *};
use serde_json::Value;

/// The store's prefix for these runs.
const PREFIX: &str = "prod";

/// One uploaded run of `target slowmix 20` (f_mix: 60 ms when i % 10 == 9,
/// else 20 ms) with --slower-than 15 ms: every call is a hit, two of them
/// slow. Returns the finished run.
fn uploaded_run(store: &SeaweedFs, host: &str) -> Run {
    let mut t = Target::start(&target_path("target"), &["slowmix", "20"]);
    let pid = t.pid().to_string();
    let url = store.url(PREFIX);
    let args = [
        "--pid",
        &pid,
        "--json",
        "--symbol",
        "f_mix",
        "--slower-than",
        "15ms",
        "--cooldown",
        "0",
        "--upload",
        &url,
        "--upload-host",
        host,
    ];
    let mut agent = Agent::start_with(&args, |c| {
        c.envs(store.admin_env());
    });
    agent.wait_armed();
    t.go();
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert!(!run.entries("hit").is_empty(), "{}", run.output());
    run
}

/// `mt-agent report ARGS` with `store`'s read-only identity.
fn report(store: &SeaweedFs, args: &[&str]) -> Output {
    Command::new(agent_bin())
        .arg("report")
        .args(args)
        .envs(store.reader_env())
        .output()
        .expect("mt-agent report")
}

/// The JSON lines of a report that must succeed.
fn report_json(store: &SeaweedFs, args: &[&str]) -> Vec<Value> {
    let o = report(store, args);
    assert!(
        o.status.success(),
        "report {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn events<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|v| v["event"] == kind).collect()
}

/// What must be the same in two reports of one hit: its numbers, its
/// moment and its stacks (the folded files' text).
fn hit_view(out: &Path, h: &Value) -> Value {
    let folded = |v: &Value| {
        v.as_str()
            .map(|rel| std::fs::read_to_string(out.join(rel)).expect("folded file"))
    };
    serde_json::json!({
        "kind": h["kind"], "status": h["status"], "seq": h["seq"], "tid": h["tid"],
        "ktime_ns": h["ktime_ns"], "duration_ns": h["duration_ns"], "args": h["args"],
        "file_samples": h["file_samples"], "moment": h["moment"]["samples"],
        "moment_span": [h["moment"]["start_ns"], h["moment"]["end_ns"]],
        "moment_top": h["moment"]["top"], "all": h["all"]["samples"], "all_top": h["all"]["top"],
        "rest": h["rest_of_thread_samples"], "diff": h["diff"],
        "moment_folded": folded(&h["moment"]["folded"]),
        "all_folded": folded(&h["all"]["folded"]),
    })
}

/// Hits by (host, file, seq), from a report written in `out`; `host` names
/// a local report's host, a fleet report's come from its `dir`.
fn hits_by_key(out: &Path, lines: &[Value], host: Option<&str>) -> BTreeMap<String, Value> {
    events(lines, "hit")
        .into_iter()
        .map(|h| {
            let dir = h["dir"].as_str().expect("dir");
            let host = host.unwrap_or_else(|| dir.split('/').next().expect("host"));
            let key = format!("{host} {} {}", h["file"].as_str().unwrap(), h["seq"]);
            (key, hit_view(out, h))
        })
        .collect()
}

fn fetch_event(lines: &[Value]) -> Value {
    let f = events(lines, "fetch");
    assert_eq!(f.len(), 1, "{lines:?}");
    f[0].clone()
}

/// The objects a run's build-id cache holds (`<path>/<id>/elf`, links not
/// followed).
fn elf_copies(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let ft = e.file_type().unwrap();
        if ft.is_dir() && e.file_name() != ".build-id" {
            n += elf_copies(&e.path());
        } else if ft.is_file() && e.file_name() == "elf" {
            n += 1;
        }
    }
    n
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn fleet_report_matches_the_local_reports_filters_and_fetches_nothing_twice() {
    let store = SeaweedFs::start();
    let runs = [uploaded_run(&store, "web-1"), uploaded_run(&store, "web-2")];
    let mut local = BTreeMap::new();
    for (run, host) in runs.iter().zip(["web-1", "web-2"]) {
        let o = report_ok(&run.out, &["--json"]);
        let lines: Vec<Value> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        local.extend(hits_by_key(&run.out, &lines, Some(host)));
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fleet");
    let dir_s = dir.to_str().unwrap();
    let url = store.url(PREFIX);

    // A fresh DIR: the same hits as the local reports.
    let before = store.requests();
    let t0 = Instant::now();
    let first = report_json(&store, &[&url, "--output", dir_s, "--json"]);
    let first_s = t0.elapsed().as_secs_f64();
    let served = store.requests().since(&before);
    let fleet = hits_by_key(&dir, &first, None);
    assert_eq!(
        fleet.keys().collect::<Vec<_>>(),
        local.keys().collect::<Vec<_>>()
    );
    for (k, v) in &fleet {
        assert_eq!(v, &local[k], "{k}");
    }
    let f = fetch_event(&first);
    assert_eq!((n(&f["hosts"]), n(&f["runs"])), (2, 2), "{f}");
    assert_eq!(
        n(&f["fetched"]["objects"]),
        served.gets_with_body(),
        "{f} {served:?}"
    );
    assert_eq!(served.heads_and_failed_gets(), 0, "{served:?}");
    // The two hosts map the same binaries: each build-id object is fetched
    // once, and the second run's references to it are answered by the cache.
    assert!(n(&f["cached"]["objects"]) > 0, "{f}");
    let run_obj = events(&first, "run");
    assert_eq!(run_obj.len(), 1, "{first:?}");

    // The same DIR again: LISTs only, the same page.
    let before = store.requests();
    let t0 = Instant::now();
    let second = report_json(&store, &[&url, "--output", dir_s, "--json"]);
    let second_s = t0.elapsed().as_secs_f64();
    let served = store.requests().since(&before);
    assert_eq!(served.of("GET"), 0, "{served:?}");
    assert!(served.of("LIST") >= 1, "{served:?}");
    let f2 = fetch_event(&second);
    assert_eq!(n(&f2["fetched"]["objects"]), 0, "{f2}");
    assert_eq!(
        n(&f2["cached"]["objects"]),
        n(&f["fetched"]["objects"]) + n(&f["cached"]["objects"]),
        "{f2}"
    );
    assert_eq!(hits_by_key(&dir, &second, None), fleet);
    eprintln!(
        "fleet report: first {} objects ({} bytes) fetched in {first_s:.1} s; second {} fetched, \
         {} from the cache, in {second_s:.1} s",
        f["fetched"]["objects"],
        f["fetched"]["bytes"],
        f2["fetched"]["objects"],
        f2["cached"]["objects"]
    );

    // --host and --slower-than: web-2's slow calls only, and only their
    // snapshots fetched.
    let dir2 = tmp.path().join("slow");
    let before = store.requests();
    let slow = report_json(
        &store,
        &[
            &url,
            "-o",
            dir2.to_str().unwrap(),
            "--host",
            "web-2",
            "--slower-than",
            "50ms",
            "--json",
        ],
    );
    let served = store.requests().since(&before);
    let want: Vec<String> = runs[1]
        .entries("hit")
        .iter()
        .filter(|l| {
            l["hits"]
                .as_array()
                .unwrap()
                .iter()
                .any(|h| h["duration_ns"].as_u64().is_some_and(|d| d >= 50_000_000))
        })
        .map(|l| l["file"].as_str().unwrap().to_string())
        .collect();
    assert!(!want.is_empty(), "{}", runs[1].output());
    let mut files: Vec<String> = events(&slow, "hit")
        .iter()
        .map(|h| {
            assert!(h["dir"].as_str().unwrap().starts_with("web-2/"), "{h}");
            h["file"].as_str().unwrap().to_string()
        })
        .collect();
    files.dedup();
    assert_eq!(files, want);
    let fs = fetch_event(&slow);
    assert_eq!(
        (n(&fs["hosts"]), n(&fs["snapshots"])),
        (1, want.len() as u64),
        "{fs}"
    );
    assert_eq!(
        n(&fs["fetched"]["objects"]),
        served.gets_with_body(),
        "{fs}"
    );
    // Fetched: web-2's index lines, clock.json, run.json, its object
    // references and objects (DIR2 has no cache yet), and the slow
    // snapshots; none of web-1's, none of web-2's other snapshots.
    let objects = elf_copies(&runs[1].out.join(".debug"));
    assert!(objects > 0, "{}", runs[1].output());
    assert_eq!(
        n(&fs["fetched"]["objects"]),
        runs[1].index.len() as u64 + 2 + 2 * objects + want.len() as u64,
        "{fs}"
    );

    // Bad input: one line, the documented code.
    let one_line = |o: &Output, code: i32, says: &str| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(says), "{err}");
    };
    one_line(&report(&store, &[&url]), 2, "needs --output DIR");
    let other = format!("s3://no-such-bucket-{}/x", std::process::id());
    let d3 = tmp.path().join("d3");
    one_line(
        &report(&store, &[&other, "-o", d3.to_str().unwrap()]),
        3,
        "bucket does not exist",
    );
    let wrong = Command::new(agent_bin())
        .args(["report", &url, "-o", d3.to_str().unwrap()])
        .envs(store.reader_env())
        .env("AWS_SECRET_ACCESS_KEY", "wrong")
        .output()
        .unwrap();
    one_line(&wrong, 3, "refused the credentials");
}
