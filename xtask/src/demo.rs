//! `cargo xtask demo`: the main job on a bundled workload. Builds in
//! release mode, starts `demo_workload` (a pretend server whose
//! `handle_request` is the trigger), runs mt-agent on it until 5 snapshots
//! exist, then prints each snapshot's file, its trigger, and the top 5
//! symbols of `perf report`, and last writes the run's report
//! (`mt-agent report`) and prints the page's path.

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::{
    setup::setup,
    util::{cargo, is_root, privileged, run, show, target_dir},
};

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
        "xtask: demo_workload is pid {pid}: it calls handle_request(id, bytes) every 0.3-0.9 s"
    );

    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let out = target_dir().join("demo").join(format!("run-{stamp}"));
    std::fs::create_dir_all(out.parent().unwrap())?;
    let mut agent = privileged(release.join("mt-agent"), &[]);
    agent
        .args([
            "--pid",
            &pid,
            "--symbol",
            "handle_request",
            "--max-snapshots",
            "5",
            "--output",
        ])
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
        let h = &v["hits"][0];
        println!();
        println!("{file} ({} bytes)", v["bytes"]);
        println!(
            "  trigger: hit {} in tid {}: handle_request(id={}, bytes={}); perf signalled {} us after the hit{}",
            h["seq"],
            h["tid"],
            h["args"][0],
            h["args"][1],
            v["hit_to_kill_ns"].as_u64().unwrap_or(0) / 1000,
            match v["hits"].as_array().map_or(0, Vec::len) {
                n if n > 1 => format!(" ({} more merged)", n - 1),
                _ => String::new(),
            }
        );
        let report = output_of(
            Command::new("perf")
                .args([
                    "report",
                    "--stdio",
                    "--no-children",
                    "-g",
                    "none",
                    "--fields",
                    "overhead,sym",
                    "-i",
                ])
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
    report(&release.join("mt-agent"), &out)
}

/// Writes the run's report (`mt-agent report OUT`, as the user who owns
/// OUT now) and prints where it is and how long it took.
fn report(agent: &std::path::Path, out: &std::path::Path) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let page = output_of(Command::new(agent).arg("report").arg(out)).context("mt-agent report")?;
    println!();
    println!(
        "Report (written in {:.2} s): open file://{}",
        t0.elapsed().as_secs_f64(),
        page.trim()
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
