//! `--upload`: a real agent, real perf and uprobes, uploading to a real
//! SeaweedFS on loopback (tests/src/store.rs). Issue 27's cases 1-4 and 6;
//! the fleet report's are in fleet_report.rs.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use mt_agent_tests::{
    Agent, Run, Target, agent_bin, perf_files,
    store::{self, Identity, SeaweedFs},
    target_path,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// JSON events named `name` a run printed.
fn events(run: &Run, name: &str) -> Vec<Value> {
    run.stdout
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == name)
        .collect()
}

fn upload_summary(run: &Run) -> Value {
    events(run, "upload_summary")
        .pop()
        .unwrap_or_else(|| panic!("no upload_summary\n{}", run.output()))
}

/// Starts the agent on `pid` with --upload as `id`, output in `out` if given.
fn start_agent(
    s: &SeaweedFs,
    id: &Identity,
    pid: i32,
    host: &str,
    out: Option<&Path>,
    extra: &[&str],
) -> Agent {
    let url = s.url("prod");
    let pid = pid.to_string();
    let mut args = vec![
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--json",
        "--upload",
        &url,
        "--upload-host",
        host,
    ];
    let out_s = out.map(|o| o.display().to_string());
    if let Some(o) = &out_s {
        args.extend(["--output", o]);
    }
    args.extend(extra);
    let env = s.env(id);
    let mut a = Agent::start_with(&args, |c| {
        c.envs(env);
    });
    a.wait_armed();
    a
}

/// A whole capture: `bin calls N GAP_MS` traced by an agent uploading as
/// `id` for `host`, to its end.
fn capture(
    s: &SeaweedFs,
    id: &Identity,
    bin: &str,
    calls: (u32, u32),
    host: &str,
    extra: &[&str],
) -> Run {
    let (n, gap) = (calls.0.to_string(), calls.1.to_string());
    let mut t = Target::start(&target_path(bin), &["calls", &n, &gap]);
    let a = start_agent(s, id, t.pid(), host, None, extra);
    t.go();
    a.finish(Duration::from_secs(60))
}

/// A `target calls N GAP_MS` that has been told to go.
fn target(n: u32, gap_ms: u32) -> Target {
    Target::start(
        &target_path("target"),
        &["calls", &n.to_string(), &gap_ms.to_string()],
    )
}

/// The store key of a file of run `out` uploaded as `host`.
fn run_key(host: &str, out: &Path, rel: &str) -> String {
    let run = out.file_name().unwrap().to_string_lossy();
    if rel.is_empty() {
        format!("prod/{host}/{run}")
    } else {
        format!("prod/{host}/{run}/{rel}")
    }
}

/// Every file of a finished run that the store must hold, with its SHA-256:
/// snapshots, index lines, run.json and the build-id objects.
fn expected_objects(run_out: &Path, host: &str) -> BTreeMap<String, String> {
    let mut want = BTreeMap::new();
    // The snapshots the index lists (perf may have completed one more that
    // an agent killed with SIGKILL never indexed: no report reads it).
    let listed = mt_agent_tests::read_index(&run_out.join("snapshots.jsonl"));
    let files: BTreeSet<String> = listed
        .iter()
        .filter(|l| l["kind"] != "deleted")
        .map(|l| l["file"].as_str().unwrap().to_string())
        .collect();
    for f in perf_files(run_out)
        .into_iter()
        .filter(|f| files.contains(f))
    {
        want.insert(
            run_key(host, run_out, &f),
            sha(&std::fs::read(run_out.join(&f)).unwrap()),
        );
    }
    let index = std::fs::read_to_string(run_out.join("snapshots.jsonl")).unwrap();
    for (i, line) in index.split_inclusive('\n').enumerate() {
        let key = run_key(host, run_out, &format!("index/{:08}.json", i + 1));
        want.insert(key, sha(line.as_bytes()));
    }
    want.insert(
        run_key(host, run_out, "run.json"),
        sha(&std::fs::read(run_out.join("run.json")).unwrap()),
    );
    for (elf, id) in debug_objects(&run_out.join(".debug")) {
        want.insert(
            format!("prod/.debug/{id}/elf"),
            sha(&std::fs::read(elf).unwrap()),
        );
    }
    want
}

/// `ROOT/<path>/<id>/elf` files of a build-id cache, with their ids.
fn debug_objects(root: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.file_name().unwrap() == ".build-id" {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else if p.file_name().unwrap() == "elf" {
                let id = p
                    .parent()
                    .unwrap()
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push((p, id));
            }
        }
    }
    out
}

/// Asserts the store holds every object of `want`, byte for byte.
fn assert_stored(s: &SeaweedFs, want: &BTreeMap<String, String>, context: &str) {
    let listed: BTreeSet<String> = s.list("prod/").into_iter().map(|(k, _)| k).collect();
    for (key, sum) in want {
        assert!(listed.contains(key), "{key} is not in the store\n{context}");
        assert_eq!(
            &sha(&s.get(key)),
            sum,
            "{key} differs from the local file\n{context}"
        );
    }
}

#[test]
fn every_snapshot_index_line_run_file_and_object_is_uploaded_byte_for_byte() {
    let s = SeaweedFs::start();
    let run = capture(&s, &store::WRITER, "target", (4, 300), "host-a", &[]);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let want = expected_objects(&run.out, "host-a");
    assert!(
        want.keys().any(|k| k.contains("/.debug/")),
        "no build-id object: {want:?}"
    );
    assert_stored(&s, &want, &run.output());
    let sum = upload_summary(&run);
    let snapshots = perf_files(&run.out).len() as u64;
    assert_eq!(sum["snapshots"], snapshots, "{sum}");
    assert_eq!(sum["pending"], 0, "{sum}");
    assert_eq!(
        events(&run, "upload").len() as u64,
        snapshots,
        "{}",
        run.output()
    );
    // The clock pair names the run, for the fleet report's --since.
    let clock: Value =
        serde_json::from_slice(&s.get(&run_key("host-a", &run.out, "clock.json"))).unwrap();
    assert_eq!(clock["host"], "host-a");
    assert!(clock["realtime_ns"].as_u64().unwrap() > 1_700_000_000_000_000_000);
}

/// `hit_to_kill_ns` of each hit snapshot event, in order, with its time.
fn hit_latencies(run: &Run) -> Vec<u64> {
    events(run, "snapshot")
        .iter()
        .filter(|e| e["kind"] == "hit")
        .map(|e| e["hit_to_kill_ns"].as_u64().unwrap())
        .collect()
}

#[test]
fn an_outage_delays_uploads_but_loses_none_and_hits_keep_their_latency() {
    let mut s = SeaweedFs::start();
    let mut t = target(40, 400);
    let mut a = start_agent(&s, &store::WRITER, t.pid(), "host-a", None, &[]);
    t.go();
    a.wait_hit_snapshots(4);
    let before = Instant::now();
    s.stop();
    std::thread::sleep(Duration::from_secs(10));
    let stopped_for = before.elapsed();
    s.restart();
    let run = a.finish(Duration::from_secs(120));
    assert_eq!(run.code, Some(0), "{}", run.output());
    let want = expected_objects(&run.out, "host-a");
    assert_stored(&s, &want, &run.output());
    let sum = upload_summary(&run);
    assert_eq!(sum["pending"], 0, "{sum}");
    assert!(
        sum["retries"].as_u64().unwrap() > 0,
        "no retry during a {stopped_for:?} outage: {sum}"
    );
    // Exactly once: one upload event per snapshot, none twice.
    let files: Vec<String> = events(&run, "upload")
        .iter()
        .map(|e| e["file"].as_str().unwrap().to_string())
        .collect();
    let unique: BTreeSet<&String> = files.iter().collect();
    assert_eq!(
        files.len(),
        unique.len(),
        "a snapshot was uploaded twice: {files:?}"
    );
    assert_eq!(unique.len(), perf_files(&run.out).len(), "{}", run.output());
    let warned = run
        .stdout
        .iter()
        .any(|l| l.contains("the store cannot be reached"));
    assert!(warned, "the outage was not said\n{}", run.output());
    // The hit path never waits on the network: the outage's hits are
    // signalled as fast as the first ones. A loose bound (20 ms, against
    // ~0.1-8 ms measured on this 2-core VM) so a loaded machine does not fail it.
    let lat = hit_latencies(&run);
    let worst = lat.iter().max().unwrap();
    assert!(*worst < 20_000_000, "a hit waited {worst} ns: {lat:?}");
    eprintln!("outage of {stopped_for:?}: hit_to_kill_ns {lat:?}; upload {sum}");
}

#[test]
fn an_agent_killed_mid_upload_is_resumed_by_the_next_without_sending_twice() {
    let s = SeaweedFs::start();
    let root = tempfile::tempdir().unwrap();
    let first_out = root.path().join("run-1");
    let mut t = target(60, 50);
    let mut a = start_agent(&s, &store::WRITER, t.pid(), "host-a", Some(&first_out), &[]);
    let before = s.requests();
    t.go();
    // Killed while snapshots are being uploaded.
    assert!(
        a.proc.wait_lines(Duration::from_secs(30), 3, |l| l
            .contains("\"event\":\"upload\"")),
        "no uploads\n{:?}",
        a.proc.stdout()
    );
    a.proc.signal(libc::SIGKILL);
    let killed = a
        .proc
        .wait(Duration::from_secs(10))
        .expect("the agent died");
    assert!(killed.code().is_none());
    t.wait(Duration::from_secs(30));
    let journaled = std::fs::read_to_string(first_out.join(".upload/confirmed.jsonl"))
        .unwrap()
        .lines()
        .count();
    // The next agent, on another run in the same output root, sends the rest.
    let mut t2 = target(1, 10);
    let second_out = root.path().join("run-2");
    let b = start_agent(
        &s,
        &store::WRITER,
        t2.pid(),
        "host-a",
        Some(&second_out),
        &[],
    );
    t2.go();
    let run = b.finish(Duration::from_secs(60));
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert_eq!(upload_summary(&run)["resumed_runs"], 1, "{}", run.output());
    let puts = s.requests().since(&before);
    // Every snapshot and index line of the killed run is in the store,
    // byte for byte (its run.json was never written: it was killed).
    let mut want = expected_objects_without_run_file(&first_out, "host-a");
    want.extend(expected_objects(&second_out, "host-a"));
    assert_stored(&s, &want, &run.output());
    // No key was sent twice: PUTs = distinct keys written (+ the two
    // agents' check objects, + at most one send cut by the kill).
    let keys = s.list("prod/").len() as u64;
    let sent = puts.of("PUT");
    assert!(
        sent <= keys + 2 + 1,
        "{sent} PUTs for {keys} keys ({journaled} journaled before the kill): {puts:?}"
    );
    assert!(std::path::Path::new(&first_out.join(".upload/done")).exists());
}

fn expected_objects_without_run_file(out: &Path, host: &str) -> BTreeMap<String, String> {
    std::fs::write(out.join("run.json"), b"").unwrap();
    let mut want = expected_objects(out, host);
    want.remove(&run_key(host, out, "run.json"));
    std::fs::remove_file(out.join("run.json")).unwrap();
    want
}

#[test]
fn a_credential_that_stops_working_mid_run_is_said_once_and_uploads_resume_when_it_works() {
    let mut s = SeaweedFs::start();
    let mut t = target(30, 400);
    let mut a = start_agent(&s, &store::WRITER, t.pid(), "host-a", None, &[]);
    t.go();
    a.wait_hit_snapshots(3);
    // The writer's key is no longer known: as an expired or revoked key.
    s.restart_with_identities(&[store::ADMIN, store::READER]);
    // Longer than the longest backoff (8 s), so a retry meets the refusal.
    std::thread::sleep(Duration::from_secs(10));
    s.restart_with_identities(&[store::ADMIN, store::READER, store::WRITER]);
    let run = a.finish(Duration::from_secs(120));
    assert_eq!(run.code, Some(0), "{}", run.output());
    let refused: Vec<Value> = events(&run, "warning")
        .into_iter()
        .filter(|w| w["message"].as_str().unwrap().contains("credentials"))
        .collect();
    assert_eq!(
        refused.len(),
        1,
        "said once, not per retry\n{}",
        run.output()
    );
    assert_stored(&s, &expected_objects(&run.out, "host-a"), &run.output());
    assert_eq!(upload_summary(&run)["pending"], 0);
}

#[test]
fn two_hosts_share_one_copy_of_the_binary_both_map() {
    let s = SeaweedFs::start();
    let run_a = capture(&s, &store::WRITER, "target", (2, 100), "host-a", &[]);
    // Another binary (libc shared with the first) on another host.
    let run_b = capture(&s, &store::WRITER, "target_bench", (2, 100), "host-b", &[]);
    for run in [&run_a, &run_b] {
        assert_eq!(run.code, Some(0), "{}", run.output());
    }
    let ids = |r: &Run| -> BTreeSet<String> {
        debug_objects(&r.out.join(".debug"))
            .into_iter()
            .map(|(_, id)| id)
            .collect()
    };
    let shared: Vec<String> = ids(&run_a).intersection(&ids(&run_b)).cloned().collect();
    assert!(!shared.is_empty(), "the two runs share no object");
    assert_eq!(
        upload_summary(&run_b)["shared"],
        shared.len(),
        "{}",
        run_b.output()
    );
    let debug_keys: Vec<String> = s.list("prod/.debug/").into_iter().map(|(k, _)| k).collect();
    let all: BTreeSet<String> = ids(&run_a)
        .union(&ids(&run_b))
        .map(|id| format!("prod/.debug/{id}/elf"))
        .collect();
    assert_eq!(debug_keys.iter().cloned().collect::<BTreeSet<_>>(), all);
    assert_stored(&s, &expected_objects(&run_a.out, "host-a"), &run_a.output());
    assert_stored(&s, &expected_objects(&run_b.out, "host-b"), &run_b.output());
}

#[test]
fn upload_delete_keeps_only_what_is_in_flight() {
    let s = SeaweedFs::start();
    let run = capture(
        &s,
        &store::WRITER,
        "target",
        (3, 300),
        "host-a",
        &["--upload-delete"],
    );
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert!(
        perf_files(&run.out).is_empty(),
        "left: {:?}",
        perf_files(&run.out)
    );
    let listed: Vec<String> = run
        .entries("hit")
        .iter()
        .chain(run.entries("tail").iter())
        .map(|e| e["file"].as_str().unwrap().to_string())
        .collect();
    let deleted: BTreeSet<String> = run
        .entries("deleted")
        .iter()
        .map(|e| e["file"].as_str().unwrap().to_string())
        .collect();
    for f in &listed {
        assert!(
            deleted.contains(f),
            "{f} not indexed as deleted\n{}",
            run.output()
        );
        assert!(
            s.head(&run_key("host-a", &run.out, f)).is_some(),
            "{f} not in the store"
        );
    }
    assert_eq!(upload_summary(&run)["deleted"], listed.len());
}

/// `mt-agent check --upload URL` with `env`: (exit code, its upload line).
fn check(env: Vec<(String, String)>, url: &str) -> (Option<i32>, String) {
    let out = std::process::Command::new(agent_bin())
        .args(["check", "--upload", url])
        .env_remove("AWS_ALLOW_HTTP")
        .envs(env)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .skip_while(|l| !l.contains(" upload "))
        .take(2)
        .collect::<Vec<_>>()
        .join("\n");
    (out.status.code(), line)
}

#[test]
fn bad_credentials_buckets_and_plain_http_get_one_clear_line_each() {
    let s = SeaweedFs::start();
    let good = s.url("prod");
    let (code, line) = check(s.env(&store::WRITER), &good);
    assert!(line.starts_with("PASS"), "{line}");
    assert_eq!(code, Some(0));
    let mut wrong = s.env(&store::WRITER);
    wrong.retain(|(k, _)| k != "AWS_SECRET_ACCESS_KEY");
    wrong.push(("AWS_SECRET_ACCESS_KEY".into(), "not-the-secret".into()));
    let cases = [
        (
            wrong,
            good.clone(),
            "SignatureDoesNotMatch",
            "refused the credentials",
        ),
        (
            s.env(&store::WRITER),
            "s3://no-such-bucket/prod".to_string(),
            "NoSuchBucket",
            "bucket does not exist",
        ),
        (
            s.env(&store::READER),
            good.clone(),
            "AccessDenied",
            "may not write",
        ),
        (
            s.env(&store::WRITER)
                .into_iter()
                .filter(|(k, _)| k != "AWS_ALLOW_HTTP")
                .collect(),
            good.clone(),
            "plain HTTP",
            "AWS_ALLOW_HTTP=true",
        ),
    ];
    for (env, url, what, fix) in cases {
        let (code, line) = check(env, &url);
        assert!(
            line.starts_with("FAIL") && line.contains(what) && line.contains(fix),
            "{what}: {line}"
        );
        assert_eq!(code, Some(3), "{what}: {line}");
    }
}

#[test]
fn a_read_only_identity_does_not_stop_capturing_and_ends_with_exit_code_5() {
    let s = SeaweedFs::start();
    // A URL that is no s3:// URL does not stop the capture either.
    let mut t = target(1, 100);
    let pid = t.pid().to_string();
    let args = [
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--json",
        "--upload",
        "moments/prod",
    ];
    let mut bad = Agent::start(&args);
    bad.wait_armed();
    t.go();
    let run = bad.finish(Duration::from_secs(60));
    assert_eq!(run.code, Some(5), "{}", run.output());
    assert_eq!(perf_files(&run.out).len(), 2, "{}", run.output());
    let said = run
        .stdout
        .iter()
        .any(|l| l.contains("bad upload URL") && l.contains("s3://BUCKET"));
    assert!(said, "{}", run.output());
    let run = capture(
        &s,
        &store::READER,
        "target",
        (2, 200),
        "host-a",
        &["--upload-wait", "3s"],
    );
    assert_eq!(run.code, Some(5), "{}", run.output());
    assert_eq!(
        perf_files(&run.out).len(),
        3,
        "the capture went on\n{}",
        run.output()
    );
    let warnings: Vec<Value> = events(&run, "warning")
        .into_iter()
        .filter(|w| w["message"].as_str().unwrap().contains("may not write"))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one line, not one per retry\n{}",
        run.output()
    );
    let sum = upload_summary(&run);
    assert!(
        sum["pending"].as_u64().unwrap() > 0 && sum["failing"] == true,
        "{sum}"
    );
    assert!(s.list("prod/host-a/").is_empty());
}
