//! JIT code: a Node.js process's JavaScript functions are named in the
//! report after the process is gone, from the perf map the run kept
//! (docs/jit-maps.md). Privileged (the capture, the namespaces).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use mt_agent_tests::*;
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

/// `tests/targets/jit.js` under `node --perf-basic-prof`, as in a
/// container: a pid namespace of its own (node is pid 1 there, so it writes
/// `/tmp/perf-1.map`) and a mount namespace whose /tmp is a tmpfs of its
/// own, which goes when node exits. The script is given with `-e`: the
/// repository may be under the /tmp it no longer sees.
fn start_node(dir: &Path) -> Target {
    let script = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/targets/jit.js"))
        .expect("tests/targets/jit.js");
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount", "--kill-child", "sh", "-c"])
        // Inlining would fold buildReport into its caller.
        .arg(r#"mount -t tmpfs mt-agent-test /tmp && exec "$0" --perf-basic-prof --no-turbo-inlining --logfile=/dev/null -e "$1" 2"#)
        .arg(node())
        .arg(script)
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

#[test]
fn javascript_frames_are_named_after_the_process_is_gone_and_elsewhere() {
    preflight();
    let tmp = tempfile::tempdir().unwrap();
    let mut t = start_node(tmp.path());
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
    let mut agent = Agent::start(&[
        "--pid",
        &pid_s,
        "--json",
        "--object",
        "libc",
        "--symbol",
        "gethostname",
        "-v",
    ]);
    let t0 = std::time::Instant::now();
    agent.wait_armed();
    eprintln!("armed after {:?}", t0.elapsed());
    t.go();
    let run = agent.finish(Duration::from_secs(60));
    eprintln!("run ended after {:?}", t0.elapsed());
    assert_eq!(run.code, Some(0), "{}", run.output());
    t.wait(Duration::from_secs(30));
    assert!(!alive(pid), "node still runs");
    assert!(!run.entries("hit").is_empty(), "{}", run.output());
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

    let (named, js) = js_frames(&run.out, &report(&run.out));
    eprintln!("reported after {:?}", t0.elapsed());
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
