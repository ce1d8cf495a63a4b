//! JIT code: a Node.js process's JavaScript functions are named in the
//! report after the process is gone, from the perf map the run kept
//! (docs/jit-maps.md), and in the fleet report from the store the run
//! uploaded to (a real SeaweedFS, docs/upload.md "JIT files"). Privileged
//! (the capture, the namespaces).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use mt_agent_tests::{store::SeaweedFs, *};
use serde_json::Value;

/// The JS function the target spends its time in.
const JS_FUNCTION: &str = "buildReport";

fn node() -> PathBuf {
    let found = ["/usr/bin/node", "/usr/bin/nodejs"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file());
    found.expect("node is missing: install Debian's nodejs (cargo xtask setup --with-test-deps)")
}

/// How node names its JIT code for perf.
#[derive(Clone, Copy)]
enum Names {
    /// `--perf-basic-prof`: the perf map, `/tmp/perf-<pid>.map`.
    PerfMap,
    /// `--perf-prof`: a jitdump file, `jit-<pid>.dump` in its directory.
    Jitdump,
}

/// `tests/targets/jit.js` under node, as in a container: a pid namespace
/// of its own (node is pid 1 there, so it writes `/tmp/perf-1.map` or
/// `jit-1.dump`) and a mount namespace whose /tmp is a tmpfs of its own,
/// which goes when node exits; its directory is `/tmp/app` in that tmpfs.
/// The script is given with `-e`: the repository may be under the /tmp it
/// no longer sees.
fn start_node(dir: &Path, names: Names) -> Target {
    let script = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/targets/jit.js"))
        .expect("tests/targets/jit.js");
    let flag = match names {
        Names::PerfMap => "--perf-basic-prof",
        Names::Jitdump => "--perf-prof",
    };
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount", "--kill-child", "sh", "-c"])
        // Inlining would fold buildReport into its caller.
        .arg(r#"mount -t tmpfs mt-agent-test /tmp && mkdir /tmp/app && cd /tmp/app && exec "$0" "$2" --no-turbo-inlining --logfile=/dev/null -e "$1" 2"#)
        .arg(node())
        .arg(script)
        .arg(flag)
        .current_dir(dir);
    Target::start_cmd(cmd)
}

/// The host pid of the node process: unshare's one child.
fn node_pid(unshare: i32) -> i32 {
    let children = fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
        .expect("unshare's children");
    let pids: Vec<i32> = children
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 1, "unshare's children: {pids:?}");
    pids[0]
}

fn report(out: &Path) -> Output {
    Command::new(agent_bin())
        .arg("report")
        .arg(out)
        .arg("--json")
        .output()
        .expect("run mt-agent report")
}

/// Frames of the whole snapshots (every hit's `all` folded file) that name
/// the JS function, and all the frames the report names from a perf map
/// (V8 names them `JS:...`, `Builtin:...`).
fn js_frames(out: &Path, o: &Output) -> (u64, u64) {
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "report: {text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (mut named, mut js) = (0, 0);
    let mut files: Vec<String> = Vec::new();
    for l in text.lines() {
        let h: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
        if let Some(f) = h["all"]["folded"].as_str()
            && !files.contains(&f.to_string())
        {
            files.push(f.to_string());
        }
    }
    assert!(!files.is_empty(), "no hit with a folded file: {text}");
    for f in files {
        for (stack, n) in read_folded(&out.join(f)) {
            if stack.iter().any(|s| s.contains(JS_FUNCTION)) {
                named += n;
            }
            if stack.iter().any(|s| s.starts_with("JS:")) {
                js += n;
            }
        }
    }
    (named, js)
}

/// A whole capture of `tests/targets/jit.js` (under [`start_node`], in
/// `dir`) by an agent with `extra` arguments and environment `env`, to
/// node's exit: the run (its exit code unchecked) and node's host pid.
/// `at_armed` runs once the agent is armed, before node starts its work.
fn capture(
    dir: &Path,
    extra: &[&str],
    env: Vec<(String, String)>,
    at_armed: impl FnOnce(),
) -> (Run, i32) {
    capture_named(dir, Names::PerfMap, extra, env, at_armed)
}

/// [`capture`], with node naming its code as `names` says.
fn capture_named(
    dir: &Path,
    names: Names,
    extra: &[&str],
    env: Vec<(String, String)>,
    at_armed: impl FnOnce(),
) -> (Run, i32) {
    preflight();
    let mut t = start_node(dir, names);
    let pid = node_pid(t.pid());
    assert_eq!(
        status_field(pid, "NSpid")
            .as_deref()
            .map(|s| s.split_whitespace().last()),
        Some(Some("1"))
    );
    // The trigger: libc's gethostname, which the script calls once, after
    // its work (tests/targets/jit.js), so the one hit snapshot holds the
    // whole run. `--object libc` spares the debug build's reading of the
    // 100 MB node binary's symbols (issue 30 §2).
    let pid_s = pid.to_string();
    let mut args = vec![
        "--pid",
        &pid_s,
        "--json",
        "--object",
        "libc",
        "--symbol",
        "gethostname",
        "-v",
    ];
    args.extend(extra);
    let mut agent = Agent::start_with(&args, |c| {
        c.envs(env);
    });
    if let Some(i) = extra.iter().position(|a| *a == "--output") {
        agent.out = PathBuf::from(extra[i + 1]);
    }
    let t0 = std::time::Instant::now();
    agent.wait_armed();
    eprintln!("armed after {:?}", t0.elapsed());
    at_armed();
    t.go();
    let run = agent.finish(Duration::from_secs(60));
    eprintln!("run ended after {:?}", t0.elapsed());
    t.wait(Duration::from_secs(30));
    assert!(!alive(pid), "node still runs");
    assert!(!run.entries("hit").is_empty(), "{}", run.output());
    (run, pid)
}

#[test]
fn javascript_frames_are_named_after_the_process_is_gone_and_elsewhere() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, pid) = capture(tmp.path(), &[], Vec::new(), || {});
    assert_eq!(run.code, Some(0), "{}", run.output());
    // What was kept: one growing copy, and a length for each snapshot.
    let kept = fs::read(run.out.join(".jit").join(format!("perf-{pid}.map"))).unwrap();
    let lines = fs::read_to_string(run.out.join(".jit/kept.jsonl")).unwrap();
    let snapshots = run.entries("hit").len() + run.entries("tail").len();
    assert_eq!(
        lines.lines().count(),
        snapshots,
        "{lines}\n{}",
        run.output()
    );
    assert!(String::from_utf8_lossy(&kept).contains(JS_FUNCTION));
    eprintln!(
        "kept {} bytes of perf map for {snapshots} snapshots",
        kept.len()
    );

    // perf alone finds no map: node's /tmp is gone, the host's has none.
    let hit = run.entries("hit")[0]["file"].as_str().unwrap().to_string();
    let plain = perf_script(&run.out.join(&hit));
    assert!(!plain.contains(JS_FUNCTION), "perf found a map of its own");

    let t0 = std::time::Instant::now();
    let (named, js) = js_frames(&run.out, &report(&run.out));
    eprintln!("reported in {:?}", t0.elapsed());
    eprintln!("after the exit: {named} samples under {JS_FUNCTION}, {js} with JS frames");
    assert!(named > 0, "no {JS_FUNCTION} in the report; {js} JS samples");

    // OUT moved to another path: the same names.
    let moved = tmp.path().join("elsewhere");
    fs::rename(&run.out, &moved).unwrap();
    fs::remove_dir_all(moved.join("report")).ok();
    let (named2, js2) = js_frames(&moved, &report(&moved));
    eprintln!("moved: {named2} samples under {JS_FUNCTION}, {js2} with JS frames");
    assert_eq!((named2, js2), (named, js));
}

#[test]
fn javascript_frames_are_named_from_the_kept_jitdump_after_the_process_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let (run, pid) = capture_named(tmp.path(), Names::Jitdump, &[], Vec::new(), || {});
    assert_eq!(run.code, Some(0), "{}", run.output());
    let lines = fs::read_to_string(run.out.join(".jit/kept.jsonl")).unwrap();
    let dump = format!("jit-{pid}.dump");
    let dumps: Vec<Value> = lines
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|l| l["file"] == dump.as_str())
        .collect();
    assert!(
        !dumps.is_empty(),
        "no jitdump kept: {lines}\n{}",
        run.output()
    );
    assert!(
        dumps.iter().all(|l| l["origin"] == "/tmp/app/jit-1.dump"),
        "{lines}"
    );
    let kept = fs::metadata(run.out.join(".jit").join(&dump))
        .unwrap()
        .len();
    eprintln!("kept {kept} bytes of jitdump for {} snapshots", dumps.len());

    // perf alone can't: the dump's path, in node's /tmp, is gone, and its
    // name has node's own pid. perf inject then fails or names nothing.
    let hit = run.entries("hit")[0]["file"].as_str().unwrap().to_string();
    let injected = tmp.path().join("plain.data");
    let plain = Command::new(perf_bin().expect("perf"))
        .args(["--buildid-dir"])
        .arg(tmp.path().join("plain-cache"))
        .args(["inject", "--jit", "-i"])
        .arg(run.out.join(&hit))
        .arg("-o")
        .arg(&injected)
        .output()
        .unwrap();
    let named_by_perf = || {
        // --no-inline: perf 6.1 asks addr2line about every frame in the
        // 100 MB node binary otherwise, for minutes (docs/jit-maps.md).
        let o = Command::new(perf_bin().expect("perf"))
            .args(["script", "--no-inline", "-F", "ip,sym", "-i"])
            .arg(&injected)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).contains(JS_FUNCTION)
    };
    assert!(
        !plain.status.success() || !named_by_perf(),
        "perf inject found the dump"
    );

    let t0 = std::time::Instant::now();
    let o = report(&run.out);
    eprintln!("reported in {:?}", t0.elapsed());
    let (named, js) = js_frames(&run.out, &o);
    eprintln!("after the exit: {named} samples under {JS_FUNCTION}, {js} with JS frames");
    assert!(named > 0, "no {JS_FUNCTION} in the report; {js} JS samples");
    let first: Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(first["file_jitdump_error"], Value::Null, "{first}");
    assert!(first["file_jitdumps"].as_u64() >= Some(1), "{first}");
    // The report read perf's command line, not perf inject's.
    let html = fs::read_to_string(run.out.join("report.html")).expect("the page");
    assert!(!html.contains("perf inject"), "the page names perf inject");

    // A copy of OUT elsewhere, the original gone: the same names, and
    // nothing left in the temporary directory.
    let moved = tmp.path().join("elsewhere");
    fs::rename(&run.out, &moved).unwrap();
    fs::remove_dir_all(moved.join("report")).ok();
    let (named2, js2) = js_frames(&moved, &report(&moved));
    assert_eq!((named2, js2), (named, js));
    let left: Vec<_> = fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("mt-agent-jitdump-")
        })
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The largest length `kept.jsonl` names for each kept copy, bytes.
fn longest_kept(kept_jsonl: &str) -> std::collections::BTreeMap<String, u64> {
    let mut longest = std::collections::BTreeMap::new();
    for l in kept_jsonl.lines() {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"));
        let n = longest
            .entry(v["file"].as_str().unwrap().to_string())
            .or_insert(0);
        *n = (*n).max(v["bytes"].as_u64().unwrap());
    }
    longest
}

/// The `upload_summary` event of a run.
fn upload_summary(run: &Run) -> Value {
    let summary = run
        .stdout
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "upload_summary");
    summary.unwrap_or_else(|| panic!("no upload_summary\n{}", run.output()))
}

/// What the store holds of the `.jit/` of `out` (a `--pid` run uploaded
/// as `prefix/host/<run>`), checked against its `kept.jsonl`: each kept
/// copy once, as chunks that join up to the longest length a snapshot
/// needs, and one line object per snapshot. Returns (chunks, bytes).
fn assert_jit_in_store(store: &SeaweedFs, base: &str, run: &Run) -> (usize, u64) {
    let kept = fs::read_to_string(run.out.join(".jit/kept.jsonl")).unwrap();
    let longest = longest_kept(&kept);
    let dir = format!("{base}/jit/");
    let listed = store.list(&dir);
    let mut chunk_bytes = std::collections::BTreeMap::new();
    let mut line_objects = 0;
    for (key, bytes) in &listed {
        match key.strip_prefix(&dir).unwrap().split_once('/') {
            Some((file, _span)) => *chunk_bytes.entry(file.to_string()).or_insert(0) += bytes,
            None => line_objects += 1,
        }
    }
    assert_eq!(chunk_bytes, longest, "{listed:?}");
    let snapshots = run.entries("hit").len() + run.entries("tail").len();
    assert_eq!(line_objects, snapshots, "{listed:?}");
    (listed.len() - line_objects, longest.values().sum())
}

/// `mt-agent report URL --output DIR --json` with the store's read-only
/// identity, then [`js_frames`] of it; checks that the mirror of `run`
/// (`host/<run>/.jit/`) holds its kept perf map of `pid` up to the longest
/// length its snapshots need. `run`'s OUT must be gone already.
fn fleet_js(
    store: &SeaweedFs,
    url: &str,
    dir: &Path,
    host: &str,
    run: &(Run, i32, Vec<u8>),
) -> (u64, u64) {
    let (run, pid, whole) = run;
    assert!(!run.out.exists());
    let o = Command::new(agent_bin())
        .args(["report", url, "--output"])
        .arg(dir)
        .args(["--json", "--host", host])
        .envs(store.reader_env())
        .output()
        .expect("mt-agent report s3://");
    let frames = js_frames(dir, &o);
    let name = run.out.file_name().unwrap();
    let mirrored = dir.join(host).join(name).join(".jit");
    let longest = longest_kept(&fs::read_to_string(mirrored.join("kept.jsonl")).unwrap());
    let map = kept_name(mirrored.join("kept.jsonl").as_path(), *pid);
    let copy = fs::read(mirrored.join(&map)).unwrap();
    assert_eq!(copy, whole[..longest[&map] as usize]);
    frames
}

/// The one kept file of `pid` that `kept.jsonl` at `index` names: its
/// perf map or its jitdump.
fn kept_name(index: &Path, pid: i32) -> String {
    let names = longest_kept(&fs::read_to_string(index).unwrap());
    let mine: Vec<&String> = names
        .keys()
        .filter(|n| **n == format!("perf-{pid}.map") || **n == format!("jit-{pid}.dump"))
        .collect();
    assert_eq!(mine.len(), 1, "{names:?}");
    mine[0].clone()
}

#[test]
fn javascript_frames_are_named_in_the_report_from_the_store_once_out_is_gone() {
    named_from_the_store(Names::PerfMap);
}

#[test]
fn javascript_frames_of_a_jitdump_are_named_in_the_report_from_the_store() {
    named_from_the_store(Names::Jitdump);
}

/// A capture uploading to a real store, then OUT deleted: the fleet report
/// from the store names the JS frames as the local report did.
fn named_from_the_store(names: Names) {
    let store = SeaweedFs::start();
    let tmp = tempfile::tempdir().unwrap();
    let url = store.url("prod");
    let upload = ["--upload", &url, "--upload-host", "node-1"];
    let (run, pid) = capture_named(tmp.path(), names, &upload, store.admin_env(), || {});
    assert_eq!(run.code, Some(0), "{}", run.output());
    let summary = upload_summary(&run);
    assert_eq!(summary["pending"], 0, "{summary}");
    let name = run.out.file_name().unwrap().to_string_lossy().into_owned();
    let (chunks, bytes) = assert_jit_in_store(&store, &format!("prod/node-1/{name}"), &run);
    assert!(bytes > 0);
    assert_eq!(summary["jit_bytes"].as_u64(), Some(bytes), "{summary}");
    let local = js_frames(&run.out, &report(&run.out));
    let kept = kept_name(&run.out.join(".jit/kept.jsonl"), pid);
    let whole = fs::read(run.out.join(".jit").join(&kept)).unwrap();

    // OUT is gone: only the store holds the run.
    fs::remove_dir_all(&run.out).unwrap();
    let dir = tmp.path().join("fleet");
    let (named, js) = fleet_js(&store, &url, &dir, "node-1", &(run, pid, whole));
    eprintln!(
        "uploaded {bytes} bytes of {kept} in {chunks} chunks; from the store: {named} \
         samples under {JS_FUNCTION}, {js} with JS frames (local report: {local:?})"
    );
    assert!(named > 0, "no {JS_FUNCTION} in the report from the store");
    assert_eq!((named, js), local);
}

/// The store is down for the whole capture: nothing of the run reaches it
/// (exit code 5). The next agent, started beside it once the store is
/// back, resumes the run, `.jit/` included, and the report from the store
/// names the JS frames.
#[test]
fn a_node_run_uploaded_by_the_next_agent_after_an_outage_names_its_javascript_frames() {
    let mut store = SeaweedFs::start();
    let root = tempfile::tempdir().unwrap();
    let url = store.url("prod");
    let first_out = root.path().join("run-1");
    let out_s = first_out.to_str().unwrap();
    let args = [
        "--upload",
        &url,
        "--upload-host",
        "node-1",
        "--upload-wait",
        "1s",
        "--output",
        out_s,
    ];
    let (run, pid) = capture(root.path(), &args, store.admin_env(), || store.stop());
    assert_eq!(run.code, Some(5), "{}", run.output());
    assert!(
        upload_summary(&run)["pending"].as_u64() > Some(0),
        "{}",
        run.output()
    );
    store.restart();
    assert!(store.list("prod/node-1/run-1/").is_empty());

    let mut t = Target::start(&target_path("target"), &["calls", "1", "10"]);
    let (pid2, second_out) = (t.pid().to_string(), root.path().join("run-2"));
    let next = [
        "--pid",
        &pid2,
        "--symbol",
        "trigger",
        "--json",
        "--upload",
        &url,
        "--upload-host",
        "node-1",
        "--output",
        second_out.to_str().unwrap(),
    ];
    let mut b = Agent::start_with(&next, |c| {
        c.envs(store.admin_env());
    });
    b.wait_armed();
    t.go();
    let resumed = b.finish(Duration::from_secs(60));
    assert_eq!(resumed.code, Some(0), "{}", resumed.output());
    assert_eq!(
        upload_summary(&resumed)["resumed_runs"],
        1,
        "{}",
        resumed.output()
    );
    let (chunks, bytes) = assert_jit_in_store(&store, "prod/node-1/run-1", &run);
    assert_eq!(upload_summary(&resumed)["jit_bytes"].as_u64(), Some(bytes));

    let local = js_frames(&run.out, &report(&run.out));
    let whole = fs::read(run.out.join(".jit").join(format!("perf-{pid}.map"))).unwrap();
    fs::remove_dir_all(&run.out).unwrap();
    let dir = root.path().join("fleet");
    let (named, js) = fleet_js(&store, &url, &dir, "node-1", &(run, pid, whole));
    eprintln!(
        "resumed: {bytes} bytes of perf map in {chunks} chunks; from the store: {named} samples \
         under {JS_FUNCTION}, {js} with JS frames (local report: {local:?})"
    );
    assert!(named > 0, "no {JS_FUNCTION} in the report from the store");
    assert_eq!((named, js), local);
}
