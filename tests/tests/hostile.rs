//! A hostile or broken target must not hang the agent, reach outside its
//! container through it, or crash it. Privileged.
//!
//! The target runs in its own root (chroot), mount namespace and pid
//! namespace (`unshare --mount --pid --fork`): a static, stripped build of
//! target.c whose `trigger` is static, so that only separate debug info
//! names it. The agent looks for that debug info at
//! `/usr/lib/debug/.build-id/xx/yyyy.debug` under the target's root, where
//! each case puts something else: a FIFO, an absolute symlink to a file that
//! exists only on the host, a relative symlink that stays inside the root,
//! a symlink to a device. Every agent run is bounded by a timeout, so a hang
//! fails the test.

use std::{
    fs,
    io::Read as _,
    os::unix::{fs::symlink, process::ExitStatusExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use mt_agent_tests::*;

/// How long one agent run may take before the test fails: resolution of
/// this small target takes well under a second; the rest is slack for a
/// loaded 2-core machine.
const RUN_LIMIT: Duration = Duration::from_secs(30);

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A container root with the static, stripped target in `bin/`, and its
/// debug file kept aside.
struct Container {
    dir: TempDir,
    build_id: String,
}

impl Container {
    fn new() -> Container {
        let dir = tempfile::Builder::new()
            .prefix("mt-agent-hostile-")
            .tempdir()
            .unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("bin")).unwrap();
        let exe = root.join("bin/target");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("targets/target.c");
        run_ok(
            Command::new("gcc")
                .args([
                    "-static",
                    "-O2",
                    "-g",
                    "-fno-omit-frame-pointer",
                    "-pthread",
                ])
                .args(["-DSTATIC_TRIGGER", "-Wl,--build-id=sha1", "-o"])
                .arg(&exe)
                .arg(&src),
        );
        let debug = dir.path().join("target.debug");
        run_ok(
            Command::new("objcopy")
                .arg("--only-keep-debug")
                .arg(&exe)
                .arg(&debug),
        );
        run_ok(Command::new("objcopy").arg("--strip-all").arg(&exe));
        let notes = run_ok(Command::new("readelf").arg("-n").arg(&exe));
        let build_id = notes
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: "))
            .expect("the target has a build-id")
            .trim()
            .to_string();
        let c = Container { dir, build_id };
        fs::create_dir_all(c.debug_path().parent().unwrap()).unwrap();
        c
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// The debug file, outside the root (only the host has it).
    fn host_debug(&self) -> PathBuf {
        self.dir.path().join("target.debug")
    }

    /// Where the agent looks for the debug file, inside the root.
    fn debug_rel(&self) -> String {
        format!(
            "usr/lib/debug/.build-id/{}/{}.debug",
            &self.build_id[..2],
            &self.build_id[2..]
        )
    }

    fn debug_path(&self) -> PathBuf {
        self.root().join(self.debug_rel())
    }

    /// Starts the target in its own mount and pid namespaces, chrooted into
    /// the root; returns the guard and the target's pid as the host sees it.
    fn start(&self, mode: &[&str]) -> (Target, i32) {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--pid", "--fork", "chroot"])
            .arg(self.root())
            .arg("/bin/target")
            .args(mode);
        let t = Target::start_cmd(cmd);
        // The target printed `ready 1` (its pid inside); unshare's child
        // is the target (chroot execs it).
        let unshare = t.pid();
        let children =
            fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap();
        let pid: i32 = children
            .split_whitespace()
            .next()
            .expect("unshare has a child")
            .parse()
            .unwrap();
        let ns = |p: i32| fs::read_link(format!("/proc/{p}/ns/pid")).unwrap();
        assert_ne!(ns(pid), ns(std::process::id() as i32), "own pid namespace");
        let mnt = |p: i32| fs::read_link(format!("/proc/{p}/ns/mnt")).unwrap();
        assert_ne!(
            mnt(pid),
            mnt(std::process::id() as i32),
            "own mount namespace"
        );
        (t, pid)
    }
}

/// Runs `mt-agent --pid PID --symbol trigger -v ARGS`, bounded by
/// RUN_LIMIT; returns the run and how long it took.
fn agent(pid: i32, extra: &[&str]) -> (Run, Duration) {
    let pid = pid.to_string();
    let mut args = vec!["--pid", pid.as_str(), "--symbol", "trigger", "-v"];
    args.extend_from_slice(extra);
    let started = Instant::now();
    let run = Agent::start(&args).finish(RUN_LIMIT);
    let took = started.elapsed();
    eprintln!("agent exit {:?} after {took:?}", run.code);
    (run, took)
}

fn stderr_has(run: &Run, needle: &str) {
    assert!(
        run.stderr.iter().any(|l| l.contains(needle)),
        "expected {needle:?} on stderr\n{}",
        run.output()
    );
}

/// The skip line the `-v` log gives for the debug path.
fn skip_line<'a>(run: &'a Run, c: &Container) -> Option<&'a String> {
    run.stderr
        .iter()
        .find(|l| l.contains("skipping") && l.contains(&c.debug_rel()))
}

/// The symbol is not found (exit 2), naming the debug path as searched,
/// and the agent never claims to have used separate debug info.
fn assert_not_found(run: &Run, c: &Container) {
    assert_eq!(run.code, Some(2), "{}", run.output());
    stderr_has(run, "no debug info was found");
    stderr_has(run, &c.debug_rel());
    assert!(
        !run.output().contains("separate debug info"),
        "{}",
        run.output()
    );
}

#[test]
fn a_fifo_at_the_debug_path_is_skipped_without_blocking() {
    let c = Container::new();
    nix::unistd::mkfifo(
        &c.debug_path(),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let (_t, pid) = c.start(&["wait"]);
    let (run, _) = agent(pid, &[]);
    assert_not_found(&run, &c);
    let line = skip_line(&run, &c).unwrap_or_else(|| panic!("no skip line\n{}", run.output()));
    assert!(line.contains("is a FIFO, not a regular file"), "{line}");
}

#[test]
fn an_absolute_symlink_to_a_host_file_is_not_followed() {
    let c = Container::new();
    // The link's target exists on the host, not in the container.
    assert!(c.host_debug().is_file());
    assert!(
        !c.root()
            .join(c.host_debug().strip_prefix("/").unwrap())
            .exists()
    );
    symlink(c.host_debug(), c.debug_path()).unwrap();
    let (_t, pid) = c.start(&["wait"]);
    let (run, _) = agent(pid, &[]);
    assert_not_found(&run, &c);
    let line = skip_line(&run, &c).unwrap_or_else(|| panic!("no skip line\n{}", run.output()));
    assert!(line.contains("does not exist"), "{line}");
}

#[test]
fn a_relative_symlink_inside_the_root_is_followed() {
    let c = Container::new();
    let dir = c.root().join("usr/lib/debug/files");
    fs::create_dir_all(&dir).unwrap();
    fs::copy(c.host_debug(), dir.join("target.debug")).unwrap();
    symlink("../../files/target.debug", c.debug_path()).unwrap();
    let (mut t, pid) = c.start(&["calls", "3", "300"]);
    let pid_s = pid.to_string();
    let started = Instant::now();
    let mut a = Agent::start(&[
        "--pid",
        &pid_s,
        "--symbol",
        "trigger",
        "--max-snapshots",
        "1",
        "--json",
    ]);
    a.wait_armed();
    t.go();
    let run = a.finish(FINISH);
    eprintln!("agent exit {:?} after {:?}", run.code, started.elapsed());
    assert_eq!(run.code, Some(0), "{}", run.output());
    // The symbol came from that debug file, and the probe fired in the
    // target: the debug file's address was right.
    assert!(
        run.stdout
            .iter()
            .any(|l| l.contains("separate debug info") && l.contains(&c.debug_rel())),
        "{}",
        run.output()
    );
    assert!(!run.hits().is_empty(), "{}", run.output());
    assert_eq!(run.hits()[0]["tgid"], pid, "{}", run.output());
}

#[test]
fn a_symlink_to_a_device_is_skipped() {
    let c = Container::new();
    // The container has its own /dev/zero, a real device node.
    fs::create_dir_all(c.root().join("dev")).unwrap();
    nix::sys::stat::mknod(
        &c.root().join("dev/zero"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 5),
    )
    .unwrap();
    symlink("/dev/zero", c.debug_path()).unwrap();
    let (_t, pid) = c.start(&["wait"]);
    let (run, _) = agent(pid, &[]);
    assert_not_found(&run, &c);
    let line = skip_line(&run, &c).unwrap_or_else(|| panic!("no skip line\n{}", run.output()));
    assert!(line.contains("is a character device"), "{line}");
}

#[test]
fn a_2_gib_debug_file_is_skipped_by_the_size_budget() {
    let c = Container::new();
    // The real debug file, grown to 2 GiB (sparse: no disk used).
    fs::copy(c.host_debug(), c.debug_path()).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(c.debug_path())
        .unwrap()
        .set_len(2 << 30)
        .unwrap();
    let (_t, pid) = c.start(&["wait"]);
    let (run, _) = agent(pid, &[]);
    assert_not_found(&run, &c);
    // One line, naming the file, the size and the budget.
    let line = run
        .stderr
        .iter()
        .find(|l| l.contains("size budget"))
        .unwrap_or_else(|| panic!("no size-budget line\n{}", run.output()));
    assert!(line.contains(&c.debug_rel()), "{line}");
    assert!(
        line.contains("is 2048 MiB, over the 1024 MiB size budget; skipped"),
        "{line}"
    );
}

#[test]
fn past_the_time_budget_resolution_stops_with_one_line() {
    let c = Container::new();
    let (_t, pid) = c.start(&["wait"]);
    let pid_s = pid.to_string();
    let run = Agent::start_with(&["--pid", &pid_s, "--symbol", "trigger"], |cmd| {
        cmd.env("MT_AGENT_SYMBOLS_SECONDS", "0");
    })
    .finish(RUN_LIMIT);
    assert_eq!(run.code, Some(4), "{}", run.output());
    assert_eq!(run.stderr.len(), 1, "{}", run.output());
    let want = format!("symbol resolution passed its 0 s time budget while reading /proc/{pid}/");
    stderr_has(&run, &want);
}

/// `mt-agent symbols` on a process with libc mapped: more than a pipe's
/// 64 KiB of output, so a reader that stops early makes it meet EPIPE.
fn symbols_cmd(pid: i32) -> Command {
    let mut c = Command::new(agent_bin());
    c.args(["symbols", "--pid", &pid.to_string()]);
    c
}

#[test]
fn symbols_piped_into_head_stops_quietly() {
    preflight();
    let t = Target::start(&target_path("target"), &["wait"]);
    let all = symbols_cmd(t.pid()).output().unwrap();
    assert!(all.status.success(), "{all:?}");
    assert!(all.stdout.len() > 1 << 16, "{} bytes", all.stdout.len());
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr");
    let script = format!(
        "'{}' symbols --pid {} 2>'{}' | head -1; echo \"${{PIPESTATUS[0]}} ${{PIPESTATUS[1]}}\"",
        agent_bin().display(),
        t.pid(),
        err.display()
    );
    let started = Instant::now();
    let out = Command::new("timeout")
        .args(["30", "bash", "-c", &script])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}after {:?}", started.elapsed());
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("ADDRESS"), "{text}");
    // 141 = 128 + SIGPIPE: ended by the kernel, quietly, like `cat`.
    assert_eq!(lines[1], "141 0", "{text}");
    assert_eq!(fs::read_to_string(&err).unwrap(), "", "stderr");
}

/// A pipe whose reader is already gone: the first write meets EPIPE.
fn closed_pipe() -> Stdio {
    let (r, w) = nix::unistd::pipe().unwrap();
    drop(r);
    Stdio::from(w)
}

/// Kills the process group of a child spawned outside [`Proc`] on drop.
struct Group(std::process::Child);

impl Drop for Group {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            // SAFETY: kill(2) on the process group the child leads.
            unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
            let _ = self.0.wait();
        }
    }
}

/// Runs `cmd` in its own process group with stdout into a closed pipe,
/// bounded by RUN_LIMIT (the group is killed and the test fails past it);
/// returns its status, its stderr and how long it took.
fn run_into_closed_pipe(mut cmd: Command) -> (std::process::ExitStatus, String, Duration) {
    use std::os::unix::process::CommandExt as _;
    let started = Instant::now();
    let mut g = Group(
        cmd.stdin(Stdio::null())
            .stdout(closed_pipe())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    let mut stderr = g.0.stderr.take().unwrap();
    // stderr is read on a thread: a child left holding it must not block us.
    let reader = std::thread::spawn(move || {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        err
    });
    let status = loop {
        if let Some(s) = g.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < RUN_LIMIT,
            "{cmd:?} still running after {RUN_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = started.elapsed();
    let err = reader.join().unwrap();
    eprintln!("{status:?} after {took:?}");
    (status, err, took)
}

#[test]
fn symbols_into_a_closed_pipe_ends_by_sigpipe_without_a_word() {
    preflight();
    let t = Target::start(&target_path("target"), &["wait"]);
    let (status, err, _) = run_into_closed_pipe(symbols_cmd(t.pid()));
    assert_eq!(status.signal(), Some(libc::SIGPIPE), "{status:?} {err}");
    assert_eq!(err, "");
}

#[test]
fn a_run_whose_stdout_goes_away_ends_cleanly() {
    preflight();
    let t = Target::start(&target_path("target"), &["wait"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // --duration 60s is the fallback; the closed stdout must end it first.
    let mut cmd = Command::new(agent_bin());
    cmd.args(["--pid", &t.pid().to_string(), "--symbol", "trigger"])
        .args(["--json", "--duration", "60s", "--output"])
        .arg(&out);
    let (status, err, took) = run_into_closed_pipe(cmd);
    assert_eq!(status.code(), Some(0), "{status:?} stderr {err}");
    assert_eq!(err, "");
    // Loose: well below the 60 s of --duration, which would end it otherwise.
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert_no_programs_loaded(&err);
    assert_no_perf_for(&out, &err);
}
