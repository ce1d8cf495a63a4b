//! `cargo xtask bench [--quick]`: builds in release mode and runs the bench
//! harness (`tests/src/bin/bench.rs`) as root. It prints Markdown tables and
//! writes every raw figure to `target/bench/latest.json`.

use crate::{
    setup::setup,
    util::{cargo, privileged, run, target_dir},
};

pub fn bench(quick: bool) -> anyhow::Result<()> {
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
    let release = target_dir().join("release");
    let out = target_dir().join("bench").join("latest.json");
    let agent = release.join("mt-agent");
    let mut cmd = privileged(
        release.join("bench"),
        &[("MT_AGENT_BIN", agent.as_os_str())],
    );
    cmd.arg("--out").arg(&out);
    if quick {
        cmd.arg("--quick");
    }
    run(&mut cmd)
}
