//! `cargo xtask demo`: the main job on a bundled workload. Builds in
//! release mode, starts `demo_workload` (a pretend server whose
//! `handle_request` is the trigger, and one request in a few is slow: a rare
//! code path that burns CPU, or a wait for a lock another thread holds),
//! runs mt-agent on it with `--slower-than` until 5 snapshots exist, then
//! prints each snapshot's file, its slow call, and the top 5 symbols of
//! `perf report`, writes the run's report (`mt-agent report`), prints the
//! page's path, and last one line on what the slowest call did (computed
//! from `mt-agent report --json`).

mod slowest;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::{
    setup::setup,
    util::{cargo, is_root, privileged, run, show, target_dir},
};

/// The trigger, and the least duration of a call that makes a snapshot:
/// the workload's fast requests take 4-8 ms of CPU, its slow ones 40 ms
/// more, or a wait of up to 120 ms (tests/tests/demo.rs traces it the same
/// way). The cooldown keeps a second of the thread's fast calls in each
/// snapshot, for the moment to be compared with.
const TRIGGER: &str = "handle_request";
const SLOWER_THAN: &str = "25ms";
const COOLDOWN: &str = "1s";

/// Kills the workload when the demo ends, however it ends.
struct Workload(std::process::Child);

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn demo() -> anyhow::Result<()> {
    setup(false)?;
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "mt-agent",
        "-p",
        "mt-agent-tests",
        "--bin",
        "mt-agent",
        "--bin",
        "demo_workload",
    ]))?;
    let release = target_dir().join("release");
    let out = capture(&release)?;
    print_snapshots(&out)?;
    report(&release.join("mt-agent"), &out)
}

/// Starts the workload, traces it until 5 snapshots exist, and hands the
/// output directory to the user; returns it.
fn capture(release: &Path) -> anyhow::Result<PathBuf> {
    let mut child = Command::new(release.join("demo_workload"))
        .arg("120")
        .stdout(Stdio::piped())
        .spawn()
        .context("starting demo_workload")?;
    let mut ready = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut ready)?;
    let workload = Workload(child);
    let pid = workload.0.id().to_string();
    eprintln!(
        "xtask: demo_workload is pid {pid}: it calls {TRIGGER}(id, bytes) every 30-90 ms; \
         large payloads take a slow path, and a compactor thread holds the cache's lock \
         for 120 ms about once a second"
    );

    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let out = target_dir().join("demo").join(format!("run-{stamp}"));
    std::fs::create_dir_all(out.parent().unwrap())?;
    let mut agent = privileged(release.join("mt-agent"), &[]);
    agent
        .args(["--pid", &pid, "--symbol", TRIGGER])
        .args(["--slower-than", SLOWER_THAN, "--cooldown", COOLDOWN])
        .args(["--max-snapshots", "5"])
        .arg("--output")
        .arg(&out);
    run(&mut agent)?;
    drop(workload);
    if !is_root() {
        // The snapshots are the user's to read: hand the directory over.
        // SAFETY: getuid/getgid have no preconditions.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        run(privileged("chown", &[])
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(&out))?;
    }
    Ok(out)
}

/// For each snapshot of the index: its file, its slow call, and the top 5
/// symbols of `perf report`.
fn print_snapshots(out: &Path) -> anyhow::Result<()> {
    let index = out.join("snapshots.jsonl");
    let text = std::fs::read_to_string(&index).context("reading the index")?;
    println!();
    println!("Snapshots in {}:", out.display());
    for line in text.lines() {
        let v: Value = serde_json::from_str(line)?;
        if v["kind"] != "hit" {
            continue;
        }
        let file = v["file"].as_str().unwrap_or_default();
        println!();
        println!("{file} ({} bytes)", v["bytes"]);
        println!("  trigger: {}", call(&v));
        let report = output_of(
            Command::new("perf")
                .args(["report", "--stdio", "--no-children", "-g", "none"])
                .args(["--fields", "overhead,sym", "-i"])
                .arg(out.join(file)),
        )
        .context("perf report")?;
        println!("  top symbols (perf report --stdio --no-children --fields overhead,sym):");
        for l in report
            .lines()
            .filter(|l| {
                l.trim_start()
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_digit())
                    && l.contains('%')
            })
            .take(5)
        {
            println!("    {}", l.trim());
        }
    }
    Ok(())
}

/// The snapshot's first hit: its call, how long it took and where
/// (the index's `duration_ns` and off-CPU breakdown), and perf's signal.
fn call(v: &Value) -> String {
    let h = &v["hits"][0];
    let ms = |k: &str| h[k].as_u64().unwrap_or(0) as f64 / 1e6;
    let merged = match v["hits"].as_array().map_or(0, Vec::len) {
        n if n > 1 => format!(" ({} more merged)", n - 1),
        _ => String::new(),
    };
    format!(
        "hit {} in tid {}: {TRIGGER}(id={}, bytes={}) took {:.1} ms (on CPU {:.1}, runnable {:.1}, \
         blocked {:.1}); perf signalled {} us after the hit{merged}",
        h["seq"],
        h["tid"],
        h["args"][0],
        h["args"][1],
        ms("duration_ns"),
        ms("on_cpu_ns"),
        ms("runnable_ns"),
        ms("blocked_ns"),
        v["hit_to_kill_ns"].as_u64().unwrap_or(0) / 1000,
    )
}

/// Writes the run's report (`mt-agent report OUT --json`, as the user who
/// owns OUT now), prints where it is and how long it took, and last what
/// the slowest call did.
fn report(agent: &Path, out: &Path) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let json = output_of(Command::new(agent).arg("report").arg(out).arg("--json"))
        .context("mt-agent report")?;
    let secs = t0.elapsed().as_secs_f64();
    let objects: Vec<Value> = json
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("reading mt-agent report --json")?;
    // One object per hit, and one for the run as a whole.
    let hits: Vec<Value> = objects
        .into_iter()
        .filter(|v| v["event"] == "hit")
        .collect();
    let page = hits
        .first()
        .and_then(|h| h["report"].as_str())
        .context("mt-agent report --json named no page")?;
    println!();
    println!("Report (written in {secs:.2} s): open file://{page}");
    println!(
        "{}",
        slowest::line(&hits, TRIGGER).unwrap_or_else(|| "slowest call: none recorded".into())
    );
    Ok(())
}

/// Runs a command and returns its stdout.
fn output_of(c: &mut Command) -> anyhow::Result<String> {
    let out = c
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| show(c))?;
    if !out.status.success() {
        bail!("`{}` failed ({})", show(c), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
