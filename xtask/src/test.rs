//! `cargo xtask test`: setup, then every test. Unit tests run in parallel
//! as the invoking user; the kernel-filter tests (mt-agent's ignored unit
//! tests) and the end-to-end tests (mt-agent-tests) need root and look at
//! system-wide state (loaded programs, perf processes), so they run one at a
//! time, through `sudo` when we are not root. Last come the release
//! tests: the release is built twice, each time into its own clean target
//! directory, to check that it is reproducible and works on a bare system.
//! Those two builds run in the background from the start of the unit tests,
//! with the idle CPU scheduling class, so that they take only the CPU the
//! tests leave (the end-to-end tests mostly wait on their targets).

use std::{
    fs::File,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Instant,
};

use anyhow::Context as _;

use crate::{
    dist::tarball_path,
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
    let release = if skip_release {
        None
    } else {
        Some(ReleaseBuilds::start(&target_dir().join("dist-check"), t0)?)
    };
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
    let tarballs = release.expect("started unless skipped").wait(t0)?;
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

/// The two clean release builds of the reproducibility check
/// (`cargo xtask release-builds`), running in the background in a process
/// group of their own, scheduled `SCHED_IDLE` (and idle I/O priority):
/// they run on CPU time no test wants. Killed with their group if the
/// suite stops first.
struct ReleaseBuilds {
    child: Option<Child>,
    dir: PathBuf,
    log: PathBuf,
}

impl ReleaseBuilds {
    fn start(dir: &Path, t0: Instant) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let log = dir.join("builds.log");
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg("release-builds")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0);
        // SAFETY: only async-signal-safe system calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let param = libc::sched_param { sched_priority: 0 };
                if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // IOPRIO_WHO_PROCESS, this process, IOPRIO_CLASS_IDLE (3 << 13):
                // where the I/O scheduler has classes; ignored elsewhere.
                libc::syscall(libc::SYS_ioprio_set, 1, 0, 3 << 13);
                Ok(())
            });
        }
        let child = cmd.spawn().context("starting the release builds")?;
        eprintln!(
            "xtask: the two release builds run in the background from {:.0} s (log: {})",
            t0.elapsed().as_secs_f64(),
            log.display()
        );
        Ok(Self {
            child: Some(child),
            dir: dir.to_path_buf(),
            log,
        })
    }

    /// Waits for both builds; returns the two tarballs.
    fn wait(mut self, t0: Instant) -> anyhow::Result<Vec<PathBuf>> {
        let status = self.child.take().expect("waited once").wait()?;
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        if !status.success() {
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
            anyhow::bail!(
                "the release builds failed ({status}); their log: {}",
                self.log.display()
            );
        }
        for line in log.lines().filter(|l| l.contains("release build")) {
            eprintln!("{line}");
        }
        eprintln!(
            "xtask: release builds waited for at {:.0} s",
            t0.elapsed().as_secs_f64()
        );
        Ok(["a", "b"]
            .iter()
            .map(|side| tarball_path(&self.dir.join(side).join("out")))
            .collect())
    }
}

impl Drop for ReleaseBuilds {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the group the child leads.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
        }
    }
}

/// `cargo xtask release-builds DIR`: the release built twice, into
/// `DIR/a` and `DIR/b`, each from a clean target directory.
pub fn release_builds(dir: &Path) -> anyhow::Result<()> {
    let t0 = Instant::now();
    for side in ["a", "b"] {
        let side_dir = dir.join(side);
        if side_dir.exists() {
            // A clean target directory each time.
            run(Command::new("rm").arg("-rf").arg(&side_dir))?;
        }
        crate::dist::dist(Some(&side_dir.join("target")), Some(&side_dir.join("out")))?;
        eprintln!(
            "xtask: release build {side} done after {:.0} s",
            t0.elapsed().as_secs_f64()
        );
    }
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
