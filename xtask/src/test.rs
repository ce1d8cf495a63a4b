//! `cargo xtask test`: setup, then every test. Unit tests run in parallel
//! as the invoking user; the end-to-end tests (mt-agent-tests) need root and
//! look at system-wide state (loaded programs, perf processes), so they run
//! one at a time, through `sudo` when we are not root.

use std::time::Instant;

use crate::{
    setup::setup,
    util::{cargo, is_root, run, target_dir},
};

/// Runs the suite. `filter` is passed to the end-to-end test harness.
pub fn test(filter: &[String], skip_setup: bool) -> anyhow::Result<()> {
    let t0 = Instant::now();
    if !skip_setup {
        setup(true)?;
    }
    // Everything the end-to-end tests run: the agent and the Rust targets.
    run(cargo().args(["build", "-p", "mt-agent", "-p", "mt-agent-tests", "--bins"]))?;
    // Unprivileged unit tests.
    run(cargo().args([
        "test",
        "-p",
        "mt-agent",
        "-p",
        "agent-common",
        "-p",
        "xtask",
    ]))?;
    // Privileged end-to-end tests, one at a time.
    let mut e2e = cargo();
    e2e.args(["test", "-p", "mt-agent-tests"]);
    if !is_root() {
        e2e.args([
            "--config",
            "target.x86_64-unknown-linux-gnu.runner='sudo --preserve-env'",
        ]);
    }
    e2e.arg("--").arg("--test-threads=1").args(filter);
    e2e.env("MT_AGENT_BIN", target_dir().join("debug").join("mt-agent"));
    run(&mut e2e)?;
    eprintln!(
        "xtask: all tests passed in {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
