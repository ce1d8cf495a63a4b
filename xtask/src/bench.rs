//! `cargo xtask bench [--quick] [--only PART]`: builds in release mode and runs the bench
//! harness (`tests/src/bin/bench/main.rs`) as root. It prints Markdown tables and
//! writes every raw figure to `target/bench/latest.json`; BENCHMARKS.md's
//! tables are generated from such files committed in docs/bench/ (`cargo
//! xtask docs`). The report part's
//! anchor needs inferno's binaries: installed here when missing.

use crate::{
    setup::setup,
    util::{cargo, privileged, run, target_dir},
};

pub fn bench(quick: bool, only: Option<&str>) -> anyhow::Result<()> {
    setup(true)?;
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "mt-agent",
        "-p",
        "mt-agent-tests",
        "--bins",
    ]))?;
    let inferno_dir = ensure_inferno()?;
    let release = target_dir().join("release");
    let out = target_dir().join("bench").join("latest.json");
    let agent = release.join("mt-agent");
    // For the run's header in BENCHMARKS.md (tests/src/bench_md.rs).
    let commit = output_of("git", &["rev-parse", "--short", "HEAD"]);
    let rustc = output_of("rustc", &["--version"]);
    let mut cmd = privileged(
        release.join("bench"),
        &[
            ("MT_AGENT_BIN", agent.as_os_str()),
            ("INFERNO_BIN_DIR", inferno_dir.as_os_str()),
            ("MT_BENCH_COMMIT", commit.as_ref()),
            ("MT_BENCH_RUSTC", rustc.as_ref()),
        ],
    );
    cmd.arg("--out").arg(&out);
    if quick {
        cmd.arg("--quick");
    }
    if let Some(part) = only {
        cmd.arg("--only").arg(part);
    }
    run(&mut cmd)?;
    eprintln!(
        "xtask: to publish this run, copy {} to docs/bench/, name it in BENCHMARKS.md's \
         markers and run `cargo xtask docs`",
        out.display()
    );
    Ok(())
}

/// A command's first line of output, or "" (the figures do not need it).
fn output_of(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The report part's anchor pipeline runs inferno's binaries
/// (`inferno-collapse-perf`, `inferno-flamegraph`): installed with
/// `cargo install inferno` when missing. Returns the directory they are in.
fn ensure_inferno() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cargo")))
        .unwrap_or_default()
        .join("bin");
    if !dir.join("inferno-flamegraph").is_file() || !dir.join("inferno-collapse-perf").is_file() {
        run(std::process::Command::new("cargo").args([
            "install",
            "inferno",
            "--version",
            "0.12.8",
            "--locked",
        ]))?;
    }
    Ok(dir)
}
