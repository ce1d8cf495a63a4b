//! `cargo xtask test`: setup, then every test. Unit tests run in parallel
//! as the invoking user; the kernel-filter tests (mt-agent's ignored unit
//! tests) and the end-to-end tests (mt-agent-tests) need root and look at
//! system-wide state (loaded programs, perf processes), so they run one at a
//! time, through `sudo` when we are not root. Last come the release
//! tests: the release is built twice, each time into its own clean target
//! directory, to check that it is reproducible and works on a bare system.

use std::{path::Path, process::Command, time::Instant};

use crate::{
    dist::dist,
    setup::setup,
    util::{TestCounts, cargo, is_root, privileged_runner, run, run_tests, target_dir},
};

/// The end-to-end test files, in the order they run; `dist` needs the
/// release builds.
const E2E: &[&str] = &[
    "bad_input",
    "capture",
    "symbols",
    "conditions",
    "faults",
    "disarm",
    "fleet",
    "upload",
    "fleet_report",
    "recording",
    "unwind",
    "report",
    "offcpu",
    "hostile",
    "jit",
    "demo",
    "bench",
];

/// Runs the suite. `filter` is passed to the end-to-end test harness.
pub fn test(filter: &[String], skip_setup: bool, skip_release: bool) -> anyhow::Result<()> {
    let t0 = Instant::now();
    if !skip_setup {
        setup(true)?;
    }
    // Everything the end-to-end tests run: the agent and the Rust targets.
    run(cargo().args([
        "build",
        "-p",
        "mt-agent",
        "-p",
        "mt-agent-tests",
        "--bins",
        "--tests",
    ]))?;
    // Unprivileged unit tests.
    run(cargo().args([
        "test",
        "-p",
        "mt-agent",
        "-p",
        "mt-agent-fuzz",
        "-p",
        "agent-common",
        "-p",
        "xtask",
    ]))?;
    // The tests' own library: the DevTools client's pure parts (cdp.rs).
    run(cargo().args(["test", "-p", "mt-agent-tests", "--lib"]))?;
    // Kernel-filter tests (agent/tests/kernel.rs): marked #[ignore]
    // because they load the eBPF programs and attach uprobes to the test
    // binary itself. As root, one at a time; without the privileges they
    // fail and say so.
    let mut kernel = cargo();
    kernel.args(["test", "-p", "mt-agent", "--test", "kernel"]);
    if !is_root() {
        kernel.arg("--config").arg(privileged_runner(&[]));
    }
    kernel.args(["--", "--ignored", "--test-threads=1"]);
    run(&mut kernel)?;
    // Privileged end-to-end tests, one at a time.
    let agent = target_dir().join("debug").join("mt-agent");
    let e2e = |tests: &[&str], extra: &[(&str, &Path)]| -> anyhow::Result<TestCounts> {
        let mut env: Vec<(&str, &std::ffi::OsStr)> = vec![("MT_AGENT_BIN", agent.as_os_str())];
        env.extend(extra.iter().map(|(k, v)| (*k, v.as_os_str())));
        let mut c = cargo();
        c.args(["test", "-p", "mt-agent-tests"]);
        for t in tests {
            c.args(["--test", t]);
        }
        if is_root() {
            c.envs(env.iter().map(|(k, v)| (*k, *v)));
        } else {
            // The test binaries run as root through sudo, with these variables.
            c.arg("--config").arg(privileged_runner(&env));
        }
        c.arg("--").arg("--test-threads=1").args(filter);
        run_tests(&mut c)
    };
    let mut ran = e2e(E2E, &[])?;
    if !filter.is_empty() && ran.passed == 0 {
        anyhow::bail!("no end-to-end test matches {filter:?}");
    }
    eprintln!(
        "xtask: {} end-to-end tests passed after {:.0} s",
        ran.passed,
        t0.elapsed().as_secs_f64()
    );
    if skip_release {
        eprintln!("xtask: --skip-release: the release tests (tests/tests/dist.rs) were not run");
        eprintln!("xtask: {}", ran_line(filter, ran));
        return Ok(());
    }
    let check = target_dir().join("dist-check");
    let mut tarballs = Vec::new();
    for side in ["a", "b"] {
        let dir = check.join(side);
        if dir.exists() {
            // A clean target directory each time.
            run(Command::new("rm").arg("-rf").arg(&dir))?;
        }
        tarballs.push(dist(Some(&dir.join("target")), Some(&dir.join("out")))?);
        eprintln!(
            "xtask: release build {side} done after {:.0} s",
            t0.elapsed().as_secs_f64()
        );
    }
    let dist_ran = e2e(
        &["dist"],
        &[
            ("MT_AGENT_DIST_A", &tarballs[0]),
            ("MT_AGENT_DIST_B", &tarballs[1]),
        ],
    )?;
    ran.passed += dist_ran.passed;
    ran.filtered_out += dist_ran.filtered_out;
    eprintln!(
        "xtask: {} in {:.0} s",
        ran_line(filter, ran),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The last line: how many end-to-end tests ran, and, with a filter, how
/// many it left out (the unit and kernel-filter stages always run whole).
fn ran_line(filter: &[String], ran: TestCounts) -> String {
    if filter.is_empty() {
        format!("all tests passed ({} end-to-end)", ran.passed)
    } else {
        format!(
            "{} end-to-end tests matching {filter:?} passed; {} were left out by the filter",
            ran.passed, ran.filtered_out
        )
    }
}
