//! Harness for mt-agent's end-to-end tests: real target processes, the real
//! `mt-agent` binary, real perf and real uprobes.
//!
//! * [`preflight`] fails (never skips) when something the tests need is
//!   missing: root, perf, the uprobe PMU, BTF, the agent binary.
//! * [`Proc`] kills its process group on drop, so nothing outlives a test,
//!   even one that fails.
//! * [`Agent::finish`] checks that no program of ours is still loaded
//!   (enumerating the kernel's programs, not trusting our bookkeeping) and
//!   that no perf process the run started is alive.

use std::{
    collections::HashSet,
    fs,
    io::{BufRead, BufReader, Write},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex, Once, OnceLock},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

pub use tempfile::TempDir;

pub mod bench_md;
pub mod cdp;
pub mod store;

/// Our eBPF program names as the kernel lists them.
pub const PROGRAM_NAMES: [&str; 7] = [
    "mt_entry",
    "mt_return",
    "mt_uretprobe",
    "mt_exec",
    "mt_fork",
    "mt_exit",
    "mt_floor",
];

/// Checks, once per test binary, that the machine can run the tests.
/// Panics with what is missing.
pub fn preflight() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mut missing = Vec::new();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            missing.push("root: run the privileged tests as root (`cargo xtask test` uses sudo)".to_string());
        }
        if !Path::new("/sys/bus/event_source/devices/uprobe").exists() {
            missing.push("the uprobe PMU (/sys/bus/event_source/devices/uprobe): kernel without CONFIG_UPROBE_EVENTS".into());
        }
        if !Path::new("/sys/kernel/btf/vmlinux").exists() {
            missing.push("BTF (/sys/kernel/btf/vmlinux): kernel without CONFIG_DEBUG_INFO_BTF".into());
        }
        if perf_bin().is_none() {
            missing.push("perf: install linux-perf (cargo xtask setup)".into());
        }
        if !agent_bin().is_file() {
            missing.push(format!(
                "the mt-agent binary at {} (build it, or set MT_AGENT_BIN)",
                agent_bin().display()
            ));
        }
        assert!(missing.is_empty(), "cannot run the end-to-end tests; missing:\n  {}", missing.join("\n  "));
    });
}

/// The perf binary, if there is one.
pub fn perf_bin() -> Option<PathBuf> {
    ["/usr/bin/perf", "/usr/sbin/perf", "/usr/local/bin/perf"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// The mt-agent binary: `MT_AGENT_BIN`, else `target/debug/mt-agent` next to
/// this test binary.
pub fn agent_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("MT_AGENT_BIN") {
        return PathBuf::from(p);
    }
    // A binary of this crate sits next to mt-agent (target/debug/bench); a
    // test binary one level down (target/debug/deps/<test>).
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("exe dir");
    if dir.join("mt-agent").is_file() {
        return dir.join("mt-agent");
    }
    dir.parent()
        .map(|d| d.join("mt-agent"))
        .expect("target dir")
}

/// A program built by build.rs (C and C++ targets, libtrig.so).
pub fn target_path(name: &str) -> PathBuf {
    PathBuf::from(env!("MT_TEST_TARGETS")).join(name)
}

/// A Rust binary of this crate (`rust_target`).
pub fn rust_bin(name: &str) -> PathBuf {
    agent_bin().parent().expect("target dir").join(name)
}

/// A child process whose output is collected line by line. Its process
/// group is killed (SIGKILL) on drop.
pub struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    status: Option<ExitStatus>,
    readers: Vec<thread::JoinHandle<()>>,
}

fn collect(
    r: impl std::io::Read + Send + 'static,
    into: Arc<Mutex<Vec<String>>>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            match line {
                Ok(l) => into.lock().unwrap().push(l),
                Err(_) => break,
            }
        }
    })
}

impl Proc {
    /// Spawns `cmd` in its own process group with piped stdio.
    pub fn spawn(mut cmd: Command) -> Proc {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            collect(child.stdout.take().unwrap(), stdout.clone()),
            collect(child.stderr.take().unwrap(), stderr.clone()),
        ];
        Proc {
            stdin: child.stdin.take(),
            child,
            stdout,
            stderr,
            status: None,
            readers,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Lines printed on stdout so far.
    pub fn stdout(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    /// Lines printed on stderr so far.
    pub fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for a stdout line that satisfies `pred`.
    pub fn wait_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<String> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(l) = self.stdout().into_iter().find(|l| pred(l)) {
                return Some(l);
            }
            if Instant::now() > end || self.try_status().is_some() {
                // One last look: the line may have come with the exit.
                thread::sleep(Duration::from_millis(50));
                return self.stdout().into_iter().find(|l| pred(l));
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until `n` stdout lines satisfy `pred`; false if the child
    /// exits or `timeout` passes first.
    pub fn wait_lines(&mut self, timeout: Duration, n: usize, pred: impl Fn(&str) -> bool) -> bool {
        let end = Instant::now() + timeout;
        loop {
            if self.stdout().iter().filter(|l| pred(l)).count() >= n {
                return true;
            }
            if Instant::now() > end || self.try_status().is_some() {
                thread::sleep(Duration::from_millis(50));
                return self.stdout().iter().filter(|l| pred(l)).count() >= n;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Writes a line to the child's stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}").expect("write to child stdin");
        stdin.flush().unwrap();
    }

    /// Closes the child's stdin.
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Exit status if the child has exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// Waits for the child to exit; None on timeout.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(s) = self.try_status() {
                for r in self.readers.drain(..) {
                    let _ = r.join();
                }
                return Some(s);
            }
            thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Sends a signal to the child.
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2).
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Sends a signal to the child's process group, as a terminal does.
    pub fn signal_group(&self, sig: i32) {
        // SAFETY: plain kill(2) on the group we created.
        unsafe { libc::kill(-self.pid(), sig) };
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.try_status().is_none() {
            self.signal_group(libc::SIGKILL);
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A traced program: started, then waiting for its go line.
pub struct Target {
    pub proc: Proc,
}

impl Target {
    /// Starts `bin args` and waits for its `ready` line.
    pub fn start(bin: &Path, args: &[&str]) -> Target {
        let mut cmd = Command::new(bin);
        cmd.args(args);
        Self::start_cmd(cmd)
    }

    /// Starts a prepared command and waits for its `ready` line.
    pub fn start_cmd(cmd: Command) -> Target {
        let mut proc = Proc::spawn(cmd);
        if proc
            .wait_line(Duration::from_secs(10), |l| l.starts_with("ready"))
            .is_none()
        {
            panic!("target did not get ready; stderr: {:?}", proc.stderr());
        }
        Target { proc }
    }

    pub fn pid(&self) -> i32 {
        self.proc.pid()
    }

    /// The go signal: the target starts its scenario.
    pub fn go(&mut self) {
        self.proc.send("go");
    }

    /// Waits for the target to exit (panics after `timeout`).
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        self.proc
            .wait(timeout)
            .unwrap_or_else(|| panic!("target {} did not exit within {timeout:?}", self.pid()))
    }
}

/// A running mt-agent.
pub struct Agent {
    pub proc: Proc,
    /// The output directory (inside `tmp`).
    pub out: PathBuf,
    pub tmp: TempDir,
    pub perf_pid: Option<i32>,
}

/// What a finished run left.
#[derive(Debug)]
pub struct Run {
    /// Exit code (None if killed by a signal).
    pub code: Option<i32>,
    pub stdout: Vec<String>,
    pub stderr: Vec<String>,
    /// snapshots.jsonl, parsed (empty if absent).
    pub index: Vec<Value>,
    pub out: PathBuf,
    pub perf_pid: Option<i32>,
    /// Kept so the output directory lives as long as the Run.
    pub tmp: TempDir,
}

impl Run {
    /// Index lines of a kind (`hit`, `tail`, `deleted`).
    pub fn entries(&self, kind: &str) -> Vec<&Value> {
        self.index.iter().filter(|v| v["kind"] == kind).collect()
    }

    /// The JSON `summary` event, when the run used --json.
    pub fn summary(&self) -> Option<Value> {
        self.stdout
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["event"] == "summary")
    }

    /// All hits of all `hit` and `tail` entries, in order.
    pub fn hits(&self) -> Vec<&Value> {
        self.index
            .iter()
            .filter(|v| v["kind"] == "hit" || v["kind"] == "tail")
            .flat_map(|v| v["hits"].as_array().into_iter().flatten())
            .collect()
    }

    /// Everything the agent printed, for assertion messages.
    pub fn output(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code,
            self.stdout.join("\n"),
            self.stderr.join("\n")
        )
    }

    /// Checks the index against the directory: every listed file exists
    /// unless a later line says it was deleted, and every completed
    /// `perf.data.<ts>` is listed.
    pub fn assert_index_consistent(&self) {
        let mut listed: HashSet<String> = HashSet::new();
        for v in &self.index {
            let f = v["file"].as_str().unwrap().to_string();
            if v["kind"] == "deleted" {
                listed.remove(&f);
            } else {
                listed.insert(f);
            }
        }
        for f in &listed {
            assert!(
                self.out.join(f).is_file(),
                "indexed file {f} is missing\n{}",
                self.output()
            );
        }
        for f in perf_files(&self.out) {
            assert!(
                listed.contains(&f),
                "{f} is not in the index\n{}",
                self.output()
            );
        }
    }
}

/// The completed `perf.data.<ts>` files in a directory.
pub fn perf_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("perf.data."))
        .collect();
    v.sort();
    v
}

/// Reads an index file.
pub fn read_index(path: &Path) -> Vec<Value> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad index line {l:?}: {e}")))
        .collect()
}

impl Agent {
    /// Starts `mt-agent ARGS --output <tmp>/out` (no --output is added if
    /// ARGS has one).
    pub fn start(args: &[&str]) -> Agent {
        Self::start_with(args, |_| {})
    }

    /// Like [`Agent::start`], with a hook to adjust the command.
    pub fn start_with(args: &[&str], adjust: impl FnOnce(&mut Command)) -> Agent {
        preflight();
        let tmp = tempfile::Builder::new()
            .prefix("mt-agent-test-")
            .tempdir()
            .unwrap();
        let out = tmp.path().join("out");
        let mut cmd = Command::new(agent_bin());
        cmd.args(args);
        // A --config run takes its output from the file.
        if !args
            .iter()
            .any(|a| *a == "--output" || *a == "-o" || *a == "--config")
        {
            cmd.arg("--output").arg(&out);
        }
        adjust(&mut cmd);
        Agent {
            proc: Proc::spawn(cmd),
            out,
            tmp,
            perf_pid: None,
        }
    }

    /// Waits for `armed`; panics with the agent's output if it never comes.
    pub fn wait_armed(&mut self) {
        let line = self.proc.wait_line(Duration::from_secs(30), |l| {
            l.starts_with("armed") || l.contains("\"event\":\"armed\"")
        });
        let Some(line) = line else {
            panic!(
                "agent did not arm; exit {:?}\nstdout: {:?}\nstderr: {:?}",
                self.proc.try_status(),
                self.proc.stdout(),
                self.proc.stderr()
            );
        };
        self.perf_pid = parse_perf_pid(&line);
    }

    /// Waits for the `n`th `hit` snapshot event (`--json`); panics with the
    /// agent's output if it does not come within 30 s.
    pub fn wait_hit_snapshots(&mut self, n: usize) {
        let done = self.proc.wait_lines(Duration::from_secs(30), n, |l| {
            l.contains("\"event\":\"snapshot\"") && l.contains("\"kind\":\"hit\"")
        });
        assert!(
            done,
            "no {n} hit snapshots; exit {:?}\nstdout: {:?}\nstderr: {:?}",
            self.proc.try_status(),
            self.proc.stdout(),
            self.proc.stderr()
        );
    }

    /// Waits for the agent to exit, then checks that nothing is left
    /// behind: no program of ours loaded, no perf process of this run.
    pub fn finish(self, timeout: Duration) -> Run {
        self.finish_checked(timeout, true)
    }

    /// Like [`Agent::finish`]; `check_programs: false` when another agent
    /// runs at the same time.
    pub fn finish_checked(mut self, timeout: Duration, check_programs: bool) -> Run {
        let status = self.proc.wait(timeout);
        let Some(status) = status else {
            panic!(
                "agent did not exit within {timeout:?}\nstdout: {:?}\nstderr: {:?}",
                self.proc.stdout(),
                self.proc.stderr()
            );
        };
        let run = Run {
            code: status.code(),
            stdout: self.proc.stdout(),
            stderr: self.proc.stderr(),
            index: read_index(&self.out.join("snapshots.jsonl")),
            out: self.out.clone(),
            perf_pid: self.perf_pid,
            tmp: self.tmp,
        };
        if check_programs {
            assert_no_programs_loaded(&run.output());
            // The agent waits for its mt-agent-detach children unless the
            // kernel holds them up (then it warns).
            let left = processes_named("mt-agent-detach");
            assert!(
                left.is_empty(),
                "mt-agent-detach left: {left:?}\n{}",
                run.output()
            );
        }
        assert_no_perf_for(&run.out, &run.output());
        run
    }
}

fn parse_perf_pid(armed: &str) -> Option<i32> {
    if let Ok(v) = serde_json::from_str::<Value>(armed) {
        return v["perf_pid"].as_i64().map(|p| p as i32);
    }
    let rest = armed.split("perf (pid ").nth(1)?;
    rest.split(')').next()?.parse().ok()
}

/// Names of loaded BPF programs that are ours, from the kernel's list.
pub fn our_loaded_programs() -> Vec<String> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|p| p.name_as_str().map(str::to_string))
        .filter(|n| PROGRAM_NAMES.contains(&n.as_str()))
        .collect()
}

/// How long the kernel may take to release a dead agent's programs: 10 s,
/// as the other waits for the kernel's cleanup in these tests. A program
/// goes once its last link and fd are released, and the last close of a
/// uprobe waits for RCU Tasks Trace and SRCU grace periods
/// (docs/disarming.md, "Detaching off the agent's exit"), which a loaded
/// 2-core machine can hold up for seconds; 10 s still fails a real leak.
pub const PROGRAMS_RELEASED_WITHIN: Duration = Duration::from_secs(10);

/// Panics if a program of ours is still loaded after waiting up to
/// [`PROGRAMS_RELEASED_WITHIN`] for the kernel to release it.
pub fn assert_no_programs_loaded(context: &str) {
    let end = Instant::now() + PROGRAMS_RELEASED_WITHIN;
    loop {
        let left = our_loaded_programs();
        if left.is_empty() {
            return;
        }
        if Instant::now() > end {
            panic!(
                "programs still loaded {PROGRAMS_RELEASED_WITHIN:?} after the run: {left:?}\n{context}"
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Field `n` (1-based, proc(5)) of a `/proc/.../stat` file, read after
/// the parenthesised comm, which may hold spaces: 19 is the nice value, 41
/// the scheduling policy.
pub fn stat_field(stat: &Path, n: usize) -> Option<String> {
    let stat = fs::read_to_string(stat).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    // `rest` starts at field 3.
    rest.split_whitespace().nth(n - 3).map(str::to_string)
}

/// Processes whose name (`/proc/PID/comm`) is `comm`.
pub fn processes_named(comm: &str) -> Vec<i32> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == comm)
        })
        .collect()
}

/// Waits up to `within` until no program of ours is loaded and no
/// `mt-agent-detach` child (which makes the last close of an agent's
/// uprobes) is left; panics otherwise.
pub fn assert_nothing_left_within(within: Duration, context: &str) {
    let end = Instant::now() + within;
    loop {
        let programs = our_loaded_programs();
        let detachers = processes_named("mt-agent-detach");
        if programs.is_empty() && detachers.is_empty() {
            return;
        }
        if Instant::now() > end {
            panic!(
                "after {within:?}: programs still loaded {programs:?}, mt-agent-detach {detachers:?}\n{context}"
            );
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Processes whose command line mentions `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
        if cmd.contains(needle) && pid as u32 != std::process::id() {
            out.push((pid, cmd));
        }
    }
    out
}

/// Panics if a perf process that writes into `out` is still alive.
pub fn assert_no_perf_for(out: &Path, context: &str) {
    let needle = out.display().to_string();
    let end = Instant::now() + Duration::from_secs(2);
    loop {
        let left: Vec<_> = processes_mentioning(&needle)
            .into_iter()
            .filter(|(_, c)| c.contains("perf") && c.contains("record"))
            .collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() > end {
            panic!("perf still running after the run: {left:?}\n{context}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// `/proc/PID/status` field.
pub fn status_field(pid: i32, key: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|r| r.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    })
}

/// The kernel's list of uprobe events, `/sys/kernel/tracing/uprobe_events`.
/// Panics when it cannot be read: a check that nothing is left there must
/// not pass on a machine without tracefs.
pub fn uprobe_events() -> String {
    const PATH: &str = "/sys/kernel/tracing/uprobe_events";
    fs::read_to_string(PATH).unwrap_or_else(|e| {
        panic!("cannot read {PATH}: {e}; mount tracefs there (mount -t tracefs nodev /sys/kernel/tracing)")
    })
}

/// Whether a process exists and is not a zombie (`State: Z`, which has
/// exited but not been reaped).
pub fn alive(pid: i32) -> bool {
    status_field(pid, "State").is_some_and(|s| !s.starts_with('Z'))
}

/// Whether `pid`, a process that burns CPU, still runs: its CPU time
/// (utime + stime, /proc/PID/stat fields 14 and 15, in clock ticks) grows
/// within `within`, and it is no zombie. A stopped process (`T`) is alive
/// but fails this. Give a loose `within`: on 2 loaded cores a runnable
/// process can wait for a CPU, but not for seconds.
pub fn runs_on(pid: i32, within: Duration) -> bool {
    let stat = PathBuf::from(format!("/proc/{pid}/stat"));
    let cpu = || -> Option<u64> {
        let ticks = |n| stat_field(&stat, n)?.parse::<u64>().ok();
        Some(ticks(14)? + ticks(15)?)
    };
    let Some(start) = cpu() else {
        return false;
    };
    let end = Instant::now() + within;
    while Instant::now() < end && alive(pid) {
        thread::sleep(Duration::from_millis(50));
        if cpu().is_some_and(|c| c > start) {
            return alive(pid);
        }
    }
    false
}

/// Samples a process's TracerPid and state every 10 ms until stopped;
/// returns what it saw (tracer pids, states).
pub struct Watcher {
    stop: Arc<Mutex<bool>>,
    handle: Option<thread::JoinHandle<(HashSet<String>, HashSet<String>)>>,
}

impl Watcher {
    pub fn start(pid: i32) -> Watcher {
        let stop = Arc::new(Mutex::new(false));
        let s = stop.clone();
        let handle = thread::spawn(move || {
            let mut tracers = HashSet::new();
            let mut states = HashSet::new();
            while !*s.lock().unwrap() {
                if let Some(t) = status_field(pid, "TracerPid") {
                    tracers.insert(t);
                }
                if let Some(st) = status_field(pid, "State") {
                    states.insert(st.chars().next().unwrap_or('?').to_string());
                }
                thread::sleep(Duration::from_millis(10));
            }
            (tracers, states)
        });
        Watcher {
            stop,
            handle: Some(handle),
        }
    }

    /// Stops sampling; returns (TracerPid values, state letters) seen.
    pub fn stop(mut self) -> (HashSet<String>, HashSet<String>) {
        *self.stop.lock().unwrap() = true;
        self.handle.take().unwrap().join().unwrap()
    }
}

/// Runs `perf script -i FILE` and returns its output; panics if perf fails.
pub fn perf_script(file: &Path) -> String {
    let out = Command::new(perf_bin().expect("perf"))
        .args(["script", "-F", "pid,tid,time,ip,sym", "--ns", "-i"])
        .arg(file)
        .output()
        .expect("perf script");
    assert!(
        out.status.success(),
        "perf script -i {}: {}\n{}",
        file.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One sample from `perf script`: its thread, time and call stack.
#[derive(Debug, Clone)]
pub struct Sample {
    pub pid: i32,
    pub tid: i32,
    /// Sample time, ns (CLOCK_MONOTONIC: mt-agent records with -k).
    pub time_ns: u64,
    /// Symbols, innermost first.
    pub frames: Vec<String>,
}

/// Runs `perf --buildid-dir DEBUG_DIR script -i FILE` (the objects kept by
/// build-id in the run's `OUT/.debug`) and returns its output; panics if
/// perf fails.
pub fn perf_script_cached(file: &Path, debug_dir: &Path) -> String {
    let out = Command::new(perf_bin().expect("perf"))
        .arg("--buildid-dir")
        .arg(debug_dir)
        .args(["script", "-F", "pid,tid,time,ip,sym", "--ns", "-i"])
        .arg(file)
        .output()
        .expect("perf script");
    assert!(
        out.status.success(),
        "perf --buildid-dir {} script -i {}: {}",
        debug_dir.display(),
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The samples of a snapshot file, with their call stacks.
pub fn perf_samples(file: &Path) -> Vec<Sample> {
    parse_samples(&perf_script(file))
}

/// Parses `perf script -F pid,tid,time,ip,sym --ns` output into samples.
pub fn parse_samples(text: &str) -> Vec<Sample> {
    let mut out: Vec<Sample> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with('\t') {
            // Header: " PID/TID  SECONDS.NANOS: [ip sym]"
            let mut words = line.split_whitespace();
            let Some((pid, tid)) = words.next().and_then(|w| w.split_once('/')) else {
                continue;
            };
            let Some(time) = words
                .next()
                .and_then(|w| w.strip_suffix(':'))
                .and_then(|t| t.parse::<f64>().ok())
            else {
                continue;
            };
            let frames = words.skip(1).take(1).map(str::to_string).collect();
            out.push(Sample {
                pid: pid.parse().unwrap_or(0),
                tid: tid.parse().unwrap_or(0),
                time_ns: (time * 1e9) as u64,
                frames,
            });
        } else if let Some(last) = out.last_mut() {
            // Stack line: "\t  ip sym+off (dso)"
            if let Some(sym) = line.split_whitespace().nth(1) {
                last.frames
                    .push(sym.split('+').next().unwrap_or(sym).to_string());
            }
        }
    }
    out
}

/// How long a test waits, by default, for an agent to exit once it should:
/// 60 s, loose on purpose (a run on a loaded 2-core machine ends in a few
/// seconds; the bound only keeps a hung agent from hanging the suite).
pub const FINISH: Duration = Duration::from_secs(60);

/// Runs the agent (`--json`) on `t` until `t` exits: waits for `armed`,
/// gives `t` the go signal, and expects a clean end (exit 0) with a
/// consistent index.
pub fn capture(t: &mut Target, args: &[&str]) -> Run {
    let pid = t.pid().to_string();
    let mut full = vec!["--pid", pid.as_str(), "--json"];
    full.extend_from_slice(args);
    let mut agent = Agent::start(&full);
    agent.wait_armed();
    t.go();
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    run.assert_index_consistent();
    run
}

/// A tmpfs mounted on a temporary directory, unmounted on drop.
pub struct Tmpfs(pub TempDir);

impl Tmpfs {
    /// Mounts a tmpfs with mount options `opts` (`size=1m`, `ro,size=1m`).
    pub fn new(opts: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "mt-agent-test"])
            .arg(dir.path())
            .status()
            .expect("mount")
            .success();
        assert!(ok, "mount -t tmpfs -o {opts} failed");
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// A copy of the agent that the user `nobody` can execute, and a work
/// directory it can write in; both are removed on drop.
pub struct AsNobody {
    _bin_dir: TempDir,
    bin: PathBuf,
    work: TempDir,
}

impl AsNobody {
    pub fn new() -> AsNobody {
        use std::os::unix::fs::PermissionsExt;
        let bin_dir = tempfile::tempdir().unwrap();
        fs::set_permissions(bin_dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let bin = bin_dir.path().join("mt-agent");
        fs::copy(agent_bin(), &bin).unwrap();
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
        let work = tempfile::tempdir().unwrap();
        fs::set_permissions(work.path(), fs::Permissions::from_mode(0o777)).unwrap();
        AsNobody {
            _bin_dir: bin_dir,
            bin,
            work,
        }
    }

    /// An output directory (not created) inside the work directory.
    pub fn out(&self) -> PathBuf {
        self.work.path().join("out")
    }

    /// `setpriv` running the copy as `nobody:nogroup` with `args`. `caps`
    /// (such as `["sys_admin", "sys_ptrace"]`) become inheritable and
    /// ambient, so perf gets them too; with none, every capability is gone.
    pub fn command(&self, caps: &[&str], args: &[&str]) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"]);
        let plus: Vec<String> = caps.iter().map(|c| format!("+{c}")).collect();
        if plus.is_empty() {
            cmd.arg("--inh-caps=-all");
        } else {
            cmd.arg(format!("--inh-caps=-all,{}", plus.join(",")));
            cmd.arg(format!("--ambient-caps={}", plus.join(",")));
        }
        cmd.arg("--").arg(&self.bin).args(args);
        cmd
    }
}

impl Default for AsNobody {
    fn default() -> Self {
        Self::new()
    }
}

/// A folded-stacks file: (frames root first, weight) per
/// `root;...;leaf weight` line.
pub fn read_folded(path: &Path) -> Vec<(Vec<String>, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let (stack, n) = l.rsplit_once(' ').expect("`stack weight`");
            (
                stack.split(';').map(str::to_string).collect(),
                n.parse().unwrap_or_else(|_| panic!("weight in {l:?}")),
            )
        })
        .collect()
}

/// Waits (up to 30 s) until the agent's index lists `n` snapshots.
pub fn wait_snapshots(agent: &Agent, n: usize) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while read_index(&agent.out.join("snapshots.jsonl")).len() < n {
        assert!(
            std::time::Instant::now() < end,
            "no {n} snapshots: {:?}",
            agent.proc.stdout()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The Go target, built once per test binary.
pub fn go_target() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets/go");
        let dir = std::env::temp_dir().join("mt-agent-test-go");
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("gotarget");
        let out = Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg("main.go")
            .current_dir(&src)
            .env("GOCACHE", dir.join("cache"))
            .env("GOPATH", dir.join("gopath"))
            .env("GO111MODULE", "off")
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "go is missing ({e}): install golang-go (cargo xtask setup --with-test-deps)"
                )
            });
        assert!(
            out.status.success(),
            "go build failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    })
    .clone()
}

/// Runs `mt-agent report OUT ARGS...` and fails on a non-zero exit with
/// its stderr; returns what it printed.
pub fn report_ok(out: &Path, args: &[&str]) -> std::process::Output {
    let o = Command::new(agent_bin())
        .arg("report")
        .arg(out)
        .args(args)
        .output()
        .expect("mt-agent report");
    assert!(
        o.status.success(),
        "mt-agent report: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Runs `mt-agent report OUT` ([`report_ok`]) and returns the page
/// (`OUT/report.html`).
pub fn report_page(out: &Path) -> String {
    report_ok(out, &[]);
    fs::read_to_string(out.join("report.html")).expect("report page")
}

/// The `armed` event of a `--json` run's stdout.
pub fn armed_event(stdout: &[String]) -> Option<Value> {
    stdout
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "armed")
}
