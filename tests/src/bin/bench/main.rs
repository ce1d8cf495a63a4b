//! The benchmark harness behind `cargo xtask bench`: mt-agent side by side
//! with the floor (an empty uprobe program, attached here through aya),
//! perf's own trigger (`perf probe` + `--switch-output-event`) and
//! magic-trace's mechanism (a hardware breakpoint), on the same target in
//! one run. Prints Markdown tables and writes every raw figure as JSON.
//!
//! `bench [--quick] [--out FILE] [--only PART] [--kinds push,nop5,step]
//! [--setups floor,mt-agent,...]`. Needs root. MT_AGENT_BIN names the agent.
//! `bench --markdown BENCHMARKS.md` (no root) generates the page's tables
//! again from the run files committed in docs/bench/ (`mt_agent_tests::bench_md`).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use aya::{
    Ebpf,
    programs::{UProbe, uprobe::UProbeScope},
};
use mt_agent_tests::*;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use serde_json::{Value, json};

mod after_big;
mod big_binary;
mod context_switches;
mod large_run;
mod report;
mod snapshot_cost;
mod stack_need;
mod stack_targets;
mod upload;

/// How much of everything to run.
#[derive(Clone, Copy)]
struct Plan {
    quick: bool,
    /// Calls per repetition for emulated/nop5 and for single-stepped triggers.
    n_fast: u64,
    n_step: u64,
    reps: usize,
    stamps: u64,
    storm_s: u64,
    armed_runs: usize,
    /// Seconds a busy target runs with no hit, per recording mode.
    wait_s: u64,
}

/// Which rows and columns of the overhead part to run (`--kinds`,
/// `--setups`, comma-separated; all when absent). "none" always runs: the
/// overhead is counted above it.
#[derive(Clone, Default)]
struct Select {
    kinds: Option<Vec<String>>,
    setups: Option<Vec<String>>,
}

impl Select {
    fn from_args(args: &[String]) -> Select {
        let list = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .map(|v| v.split(',').map(str::to_string).collect::<Vec<_>>())
        };
        Select {
            kinds: list("--kinds"),
            setups: list("--setups"),
        }
    }

    fn kind(&self, short: &str) -> bool {
        self.kinds
            .as_ref()
            .is_none_or(|k| k.iter().any(|x| x == short))
    }

    fn setup(&self, setup: &str) -> bool {
        setup == "none"
            || self
                .setups
                .as_ref()
                .is_none_or(|s| s.iter().any(|x| x == setup))
    }
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                n_fast: 200_000,
                n_step: 5_000,
                reps: 1,
                stamps: 8,
                storm_s: 1,
                armed_runs: 2,
                wait_s: 10,
            }
        } else {
            Plan {
                quick,
                n_fast: 2_000_000,
                n_step: 100_000,
                reps: 5,
                stamps: 50,
                storm_s: 10,
                armed_runs: 5,
                wait_s: 60,
            }
        }
    }
}

const FUNCS: [(&str, &str, &str); 3] = [
    ("push", "trigger_push", "push rbp (emulated)"),
    ("nop5", "trigger_nop5", "nop5 (optimized)"),
    ("step", "trigger_step", "mov rip-relative (single-stepped)"),
];

const SETUPS: [&str; 9] = [
    "none",
    "floor",
    "mt-agent",
    "mt-agent conditions",
    "mt-agent slower-than",
    "mt-agent slower-than ret-probes",
    "mt-agent slower-than uretprobe",
    "perf-event",
    "hw-breakpoint",
];

/// What the two condition setups add to the mt-agent command line. Every
/// hit passes the thread and argument tests (arg0 is the loop index) and
/// `--every` rejects it, so the whole in-kernel filter runs on each call;
/// `--slower-than` adds a duration never reached and the probes that see the
/// returns: the agent's choice with its defaults (the off-CPU breakdown
/// on; a uretprobe where it proves it safe, docs/uprobe-cost.md), forced
/// uprobes on each `ret` (`--probe-rets`), or a forced uretprobe
/// (`--use-uretprobe`).
fn condition_args(setup: &str, tid: i32) -> Vec<String> {
    let slower = |extra: &[&str]| {
        let mut v: Vec<String> = vec!["--slower-than".into(), "10s".into()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    match setup {
        "mt-agent conditions" => vec![
            "--tid".into(),
            tid.to_string(),
            "--when".into(),
            "arg0 != 0xffffffffffff".into(),
            "--when".into(),
            "sarg0 >= 0".into(),
            "--every".into(),
            "1000000000".into(),
        ],
        "mt-agent slower-than" => slower(&[]),
        "mt-agent slower-than ret-probes" => slower(&["--probe-rets"]),
        "mt-agent slower-than uretprobe" => slower(&["--use-uretprobe"]),
        _ => Vec::new(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, page] = &args[..]
        && flag == "--markdown"
    {
        markdown(Path::new(page));
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    preflight();
    let mut plan = Plan::new(quick);
    // `--stamps N`: more latency samples (p99 of 50 is their maximum).
    if let Some(n) = args
        .iter()
        .position(|a| a == "--stamps")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
    {
        plan.stamps = n;
    }
    let started = Instant::now();
    let _tracefs = Tracefs::ensure();
    let object = ebpf_object();
    eprintln!(
        "bench: agent {}, eBPF object {}",
        agent_bin().display(),
        object.display()
    );

    // `--only overhead|latency|storm|armed|waiting|stacks|stackneed|report|switch|snapshot|large|upload|bigbinary`
    // runs one part; a comma-separated list runs several.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let part = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|p| p == name))
    };
    let overhead = if part("overhead") {
        overhead(&plan, &object, &Select::from_args(&args))
    } else {
        Value::Array(Vec::new())
    };
    let latency = if part("latency") {
        latency(&plan)
    } else {
        Value::Array(Vec::new())
    };
    let storm = if part("storm") {
        storm(&plan, &object)
    } else {
        Value::Array(Vec::new())
    };
    let armed = if part("armed") {
        time_to_armed(&plan)
    } else {
        Value::Null
    };
    let waiting = if part("waiting") {
        waiting(&plan)
    } else {
        Value::Array(Vec::new())
    };
    let stacks = if part("stacks") {
        stacks(&plan)
    } else {
        Value::Array(Vec::new())
    };
    let stack_need = if part("stackneed") {
        stack_need::run(plan.quick)
    } else {
        Value::Null
    };
    let report_part = if part("report") {
        report::run(plan.quick)
    } else {
        Value::Null
    };
    let switch = if part("switch") {
        context_switches::run(plan.quick)
    } else {
        Value::Null
    };
    let snapshot = if part("snapshot") {
        snapshot_cost::run(plan.quick)
    } else {
        Value::Null
    };
    let large = if part("large") {
        large_run::run(plan.quick)
    } else {
        Value::Null
    };
    let upload = if part("upload") {
        upload::run(plan.quick)
    } else {
        Value::Null
    };
    let big = if part("bigbinary") {
        big_binary::run(plan.quick)
    } else {
        Value::Null
    };

    let report = json!({
        "date": utc("+%Y-%m-%d"),
        "time_utc": utc("+%H:%M"),
        "quick": plan.quick,
        "only": only,
        "machine": machine(),
        "build": build(),
        "kernel": fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "perf": Command::new(perf_bin().unwrap()).arg("version").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default(),
        "agent": agent_bin(),
        "overhead": overhead,
        "latency": latency,
        "storm": storm,
        "time_to_armed": armed,
        "waiting": waiting,
        "stacks": stacks,
        "stack_need": stack_need,
        "report": report_part,
        "switch": switch,
        "snapshot": snapshot,
        "large": large,
        "upload": upload,
        "bigbinary": big,
        "seconds": started.elapsed().as_secs_f64(),
    });
    println!("{}", bench_md::tables(&report));
    if let Some(out) = out {
        if let Some(d) = out.parent() {
            let _ = fs::create_dir_all(d);
        }
        fs::write(&out, serde_json::to_string_pretty(&report).unwrap()).expect("write the JSON");
        eprintln!("bench: raw figures in {}", out.display());
    }
    eprintln!("bench: done in {:.0} s", started.elapsed().as_secs_f64());
    let failed = failures_in(&report);
    if !failed.is_empty() {
        eprintln!(
            "bench: {} rows failed and print no figure:\n  {}",
            failed.len(),
            failed.join("\n  ")
        );
        std::process::exit(1);
    }
}

/// Every `failed` mark in the report, wherever its row is.
fn failures_in(v: &Value) -> Vec<String> {
    match v {
        Value::Object(m) => m
            .iter()
            .flat_map(|(k, v)| match (k.as_str(), v.as_str()) {
                ("failed", Some(why)) => vec![why.to_string()],
                _ => failures_in(v),
            })
            .collect(),
        Value::Array(a) => a.iter().flat_map(failures_in).collect(),
        _ => Vec::new(),
    }
}

/// `date -u FORMAT`.
fn utc(format: &str) -> String {
    let out = Command::new("date").arg("-u").arg(format).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The machine the run is on, for BENCHMARKS.md's header: CPUs, model and
/// memory from /proc, and whether perf has a hardware PMU (a `cpu` event
/// source in sysfs; without one perf samples `cpu-clock`).
fn machine() -> Value {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map(|(_, m)| m.trim().to_string());
    let mem_kib = fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("MemTotal:")?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<u64>()
                .ok()
        });
    json!({
        "cpus": thread::available_parallelism().map(|n| n.get()).ok(),
        "cpu_model": model,
        "memory_kib": mem_kib,
        "pmu": Path::new("/sys/bus/event_source/devices/cpu").exists()
            || Path::new("/sys/bus/event_source/devices/cpu_core").exists(),
    })
}

/// How the agent was built: the profile from the bench's own path
/// (`target/release/bench`), the commit and rustc as `cargo xtask bench`
/// passes them (MT_BENCH_COMMIT, MT_BENCH_RUSTC).
fn build() -> Value {
    let exe = std::env::current_exe().unwrap_or_default();
    let profile = exe
        .parent()
        .and_then(|d| d.file_name())
        .and_then(|n| n.to_str())
        .map(str::to_string);
    json!({
        "profile": profile,
        "commit": std::env::var("MT_BENCH_COMMIT").ok(),
        "rustc": std::env::var("MT_BENCH_RUSTC").ok(),
    })
}

/// `bench --markdown PAGE`: the bench's parts in PAGE (BENCHMARKS.md)
/// generated again from the run files their markers name (paths relative
/// to PAGE's directory); rewrites PAGE if they changed. Exit 1 on a bad
/// marker or run file.
fn markdown(page: &Path) {
    let dir = page.parent().unwrap_or(Path::new("."));
    let text = fs::read_to_string(page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    let load = |file: &str| {
        let t = fs::read_to_string(dir.join(file)).map_err(|e| format!("{file}: {e}"))?;
        serde_json::from_str(&t).map_err(|e| format!("{file}: {e}"))
    };
    match bench_md::regenerate(&text, load) {
        Ok(new) if new == text => eprintln!("bench: {} is up to date", page.display()),
        Ok(new) => {
            fs::write(page, new).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
            eprintln!("bench: {}'s tables generated again", page.display());
        }
        Err(e) => {
            eprintln!("bench: {}: {e}", page.display());
            std::process::exit(1);
        }
    }
}

/// The bench's own eBPF object (the floor program), from the agent's build
/// directory, where agent/build.rs puts it beside the object the agent
/// embeds.
fn ebpf_object() -> PathBuf {
    if let Some(p) = std::env::var_os("MT_AGENT_BENCH_EBPF_OBJECT") {
        return PathBuf::from(p);
    }
    let build = agent_bin().parent().unwrap().join("build");
    fs::read_dir(&build)
        .expect("the agent's build directory")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("mt-agent-"))
        .map(|e| e.path().join("out/mt-agent-bench-ebpf"))
        .filter(|p| p.is_file())
        .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
        .expect("mt-agent-bench-ebpf in the agent's build directory (build mt-agent first)")
}

/// Mounts tracefs for `perf probe` if it is not mounted; unmounts on drop.
struct Tracefs(bool);

impl Tracefs {
    fn ensure() -> Tracefs {
        if Path::new("/sys/kernel/tracing/uprobe_events").exists() {
            return Tracefs(false);
        }
        let ok = Command::new("mount")
            .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "cannot mount tracefs at /sys/kernel/tracing (perf probe needs it)"
        );
        Tracefs(true)
    }
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        if self.0 {
            let _ = Command::new("umount").arg("/sys/kernel/tracing").status();
        }
    }
}

/// Why an agent's run does not count: it did not exit 0. The one error line
/// it printed, if any, says why. A row built from such a run is marked
/// `failed` and its figures are not printed.
fn failure(run: &Run) -> Option<String> {
    if run.code == Some(0) {
        return None;
    }
    // The error line, or with --json the error event's message.
    let error = run
        .stderr
        .iter()
        .find(|l| l.starts_with("mt-agent: error:"))
        .cloned()
        .or_else(|| {
            run.stdout.iter().find_map(|l| {
                let v: Value = serde_json::from_str(l).ok()?;
                (v["event"] == "error").then(|| v["message"].as_str().map(str::to_string))?
            })
        })
        .map_or(String::new(), |l| format!(": {l}"));
    Some(format!("mt-agent exited with {:?}{error}", run.code))
}

/// Marks `v` as failed for `why` (a row's first failure is kept, later
/// ones added).
fn mark_failed(v: &mut Value, why: String) {
    eprintln!("bench: FAILED {why}");
    match v["failed"].as_str() {
        Some(first) => v["failed"] = json!(format!("{first}; {why}")),
        None => v["failed"] = json!(why),
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if s.is_empty() {
        return f64::NAN;
    }
    s[s.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn pcts(mut v: Vec<f64>) -> Value {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    json!({"n": v.len(), "p50": percentile(&v, 50.0), "p90": percentile(&v, 90.0), "p99": percentile(&v, 99.0), "max": v.last().copied().unwrap_or(f64::NAN), "raw": v})
}

/// A perf process driven through `--control fifo:ctl,ack`.
struct PerfProc {
    child: Child,
    dir: TempDir,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl PerfProc {
    /// Spawns `perf ARGS --control fifo:CTL,ACK` and waits for its ping ack.
    fn start(args: &[String]) -> PerfProc {
        let dir = tempfile::tempdir().unwrap();
        let ctl = dir.path().join("ctl");
        let ack = dir.path().join("ack");
        for f in [&ctl, &ack] {
            nix::unistd::mkfifo(f, nix::sys::stat::Mode::S_IRWXU).unwrap();
        }
        let mut child = Command::new(perf_bin().unwrap())
            .args(args)
            .arg("--control")
            .arg(format!("fifo:{},{}", ctl.display(), ack.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("perf");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let err = child.stderr.take().unwrap();
        let s2 = stderr.clone();
        thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                s2.lock().unwrap().push(l);
            }
        });
        // Opening a fifo blocks until the other side opens it: do it in
        // threads, with a timeout on the ack.
        let (tx, rx) = std::sync::mpsc::channel();
        let (c2, a2) = (ctl.clone(), ack.clone());
        thread::spawn(move || {
            use std::io::{Read, Write};
            let mut c = fs::OpenOptions::new().write(true).open(&c2).unwrap();
            let mut a = fs::File::open(&a2).unwrap();
            let _ = c.write_all(b"ping\n");
            let mut buf = [0u8; 5];
            let _ = a.read_exact(&mut buf);
            let _ = tx.send(());
            // Keep the fifos open while perf runs.
            thread::sleep(Duration::from_secs(3600));
        });
        if rx.recv_timeout(Duration::from_secs(10)).is_err() {
            eprintln!(
                "bench: perf did not ack ping; stderr {:?}",
                stderr.lock().unwrap()
            );
        }
        PerfProc { child, dir, stderr }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for perf to end (it ends when the target does), or stops it.
    fn finish(mut self) -> (Vec<String>, Option<f64>, TempDir) {
        let end = Instant::now() + Duration::from_secs(15);
        let mut cpu = None;
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            cpu = cpu_seconds(self.pid()).or(cpu);
            if Instant::now() > end {
                // SAFETY: plain kill(2) of our child.
                unsafe { libc::kill(self.pid(), libc::SIGINT) };
                let _ = self.child.wait();
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        thread::sleep(Duration::from_millis(50));
        let lines = self.stderr.lock().unwrap().clone();
        (lines, cpu, self.dir)
    }
}

/// CPU seconds (user + system) from /proc/PID/stat.
fn cpu_seconds(pid: i32) -> Option<f64> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// `perf probe -x BIN FUNC`, deleted on drop.
struct PerfProbe(String);

impl PerfProbe {
    fn add(bin: &Path, func: &str) -> PerfProbe {
        let group = format!("probe_{}", bin.file_name().unwrap().to_string_lossy());
        let event = format!("{group}:{func}");
        let _ = Command::new(perf_bin().unwrap())
            .args(["probe", "-q", "-d", &event])
            .output();
        let out = Command::new(perf_bin().unwrap())
            .args(["probe", "-q", "-x"])
            .arg(bin)
            .arg(func)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "perf probe failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PerfProbe(event)
    }
}

impl Drop for PerfProbe {
    fn drop(&mut self) {
        let _ = Command::new(perf_bin().unwrap())
            .args(["probe", "-q", "-d", &self.0])
            .output();
    }
}

/// The floor: `mt_floor` (returns at once) attached through aya.
struct Floor(#[allow(dead_code)] Ebpf);

impl Floor {
    fn attach(object: &Path, pid: i32, bin: &Path, func: &str) -> Floor {
        let data = fs::read(object).unwrap();
        let mut ebpf = Ebpf::load(&data).expect("load the eBPF object");
        let prog: &mut UProbe = ebpf
            .program_mut("mt_floor")
            .expect("mt_floor")
            .try_into()
            .unwrap();
        prog.load().expect("load mt_floor");
        prog.attach(
            func,
            bin,
            UProbeScope::OneProcess(std::num::NonZeroU32::new(pid as u32).unwrap()),
        )
        .expect("attach mt_floor");
        Floor(ebpf)
    }
}

/// Turns on `kernel.bpf_stats_enabled` (each program's run time and run
/// count) for the bench; restores the old value on drop.
struct BpfStats(String);

impl BpfStats {
    fn enable() -> BpfStats {
        let old =
            fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_else(|_| "0".into());
        let _ = fs::write("/proc/sys/kernel/bpf_stats_enabled", "1");
        BpfStats(old.trim().to_string())
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = fs::write("/proc/sys/kernel/bpf_stats_enabled", &self.0);
    }
}

/// (total run time ns, run count) of the loaded programs named `name`.
fn program_stats(name: &str) -> (u64, u64) {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str() == Some(name))
        .fold((0, 0), |(t, c), p| {
            (t + p.run_time().as_nanos() as u64, c + p.run_count())
        })
}

/// The runtime address of a function in a process, from `mt-agent symbols`.
fn runtime_address(pid: i32, func: &str) -> u64 {
    let out = Command::new(agent_bin())
        .args(["symbols", "--pid", &pid.to_string(), func, "--json"])
        .output()
        .unwrap();
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).expect("symbols --json");
    rows.iter()
        .find(|r| r["mangled"] == func)
        .and_then(|r| r["address"].as_u64())
        .expect("address")
}

/// The record arguments mt-agent gives perf (for the floor; perf-event's
/// runs use them too, with `--switch-output-event`).
fn record_args(pid: i32, dir: &Path) -> Vec<String> {
    vec![
        "record".into(),
        "-p".into(),
        pid.to_string(),
        "--switch-output=signal".into(),
        "-o".into(),
        dir.join("perf.data").display().to_string(),
        "-e".into(),
        "cpu-clock".into(),
        "-F".into(),
        "999".into(),
        "-g".into(),
        "-k".into(),
        "CLOCK_MONOTONIC".into(),
        "--no-bpf-event".into(),
    ]
}

/// One target run under one setup: ns per call for each repetition, and
/// how many probe hits the setup counted (to check it was live).
/// `stats`: measure the program's run time (kernel.bpf_stats_enabled, which
/// itself adds two clock reads per run, so never on while timing calls).
fn bench_run(
    plan: &Plan,
    object: &Path,
    short: &str,
    func: &str,
    setup: &str,
    stats: bool,
) -> BenchRun {
    let bin = target_path("target_bench");
    let n = if short == "step" {
        plan.n_step
    } else {
        plan.n_fast
    };
    let mut t = Target::start(
        &bin,
        &["bench", short, &n.to_string(), &plan.reps.to_string()],
    );
    let pid = t.pid();
    let rec_dir = tempfile::tempdir().unwrap();
    let mut agent = None;
    let mut perf = None;
    let mut _floor = None;
    let mut _probe = None;
    match setup {
        "none" => {}
        "floor" => {
            perf = Some(PerfProc::start(&record_args(pid, rec_dir.path())));
            _floor = Some(Floor::attach(object, pid, &bin, func));
        }
        "mt-agent"
        | "mt-agent conditions"
        | "mt-agent slower-than"
        | "mt-agent slower-than ret-probes"
        | "mt-agent slower-than uretprobe" => {
            let p = pid.to_string();
            // The warm-up call takes the one snapshot; the cooldown keeps
            // perf's file switches out of the timed loops.
            let extra = condition_args(setup, pid);
            // --always-armed: the uprobe stays in for the timed loops (this
            // table is the cost of an armed probe).
            let mut args = vec![
                "--pid",
                &p,
                "--symbol",
                func,
                "--cooldown",
                "60s",
                "--always-armed",
                "--json",
            ];
            args.extend(extra.iter().map(String::as_str));
            let mut a = Agent::start(&args);
            a.wait_armed();
            agent = Some(a);
        }
        "perf-event" => {
            let probe = PerfProbe::add(&bin, func);
            perf = Some(PerfProc::start(&[
                "stat".into(),
                "-x".into(),
                ",".into(),
                "-e".into(),
                probe.0.clone(),
                "-p".into(),
                pid.to_string(),
            ]));
            _probe = Some(probe);
        }
        "hw-breakpoint" => {
            let addr = runtime_address(pid, func);
            perf = Some(PerfProc::start(&[
                "stat".into(),
                "-x".into(),
                ",".into(),
                "-e".into(),
                format!("mem:{addr:#x}:x"),
                "-p".into(),
                pid.to_string(),
            ]));
        }
        _ => unreachable!(),
    }
    t.go();
    // With `stats`, the program's own run time per hit, read before the
    // target exits (it idles 200 ms after its loop) and the probe goes.
    let prog = match setup {
        "floor" => Some("mt_floor"),
        "mt-agent" => Some("mt_entry"),
        _ => None,
    };
    let mut prog_ns = None;
    let mut prog_runs = None;
    let _stats = stats.then(BpfStats::enable);
    if let Some(name) = prog.filter(|_| stats) {
        let want = plan.reps;
        let end = Instant::now() + Duration::from_secs(600);
        while t
            .proc
            .stdout()
            .iter()
            .filter(|l| l.starts_with("ns_per_call"))
            .count()
            < want
            && Instant::now() < end
        {
            thread::sleep(Duration::from_millis(5));
        }
        let (time, count) = program_stats(name);
        prog_ns = (count > 0).then(|| time as f64 / count as f64);
        prog_runs = Some(count);
    }
    let exit = t.wait(Duration::from_secs(600));
    let ns: Vec<f64> = t
        .proc
        .stdout()
        .iter()
        .filter_map(|l| l.strip_prefix("ns_per_call ").and_then(|v| v.parse().ok()))
        .collect();
    let mut hits = None;
    let mut failed = None;
    if let Some(a) = agent {
        let run = a.finish(FINISH);
        failed = failure(&run);
        hits = run.summary().and_then(|s| s["counters"]["seen"].as_u64());
    }
    if let Some(p) = perf {
        let (lines, _, _) = p.finish();
        // perf stat -x, prints "COUNT,,EVENT,..."
        hits = lines
            .iter()
            .find_map(|l| l.split(',').next().and_then(|c| c.trim().parse().ok()))
            .or(hits);
    }
    if ns.len() != plan.reps && failed.is_none() {
        // Its exit and last words say why (a signal, an error line).
        let stderr = t.proc.stderr();
        failed = Some(format!(
            "the target printed {} of {} ns_per_call lines ({exit}; stderr: {:?})",
            ns.len(),
            plan.reps,
            stderr.last().map_or("", String::as_str)
        ));
    }
    BenchRun {
        ns,
        hits,
        prog_ns,
        prog_runs,
        calls: n + 1,
        failed,
    }
}

/// What one [`bench_run`] measured.
struct BenchRun {
    /// ns per call, one per repetition.
    ns: Vec<f64>,
    /// Probe hits the setup counted (the agent's `seen`, perf stat's count).
    hits: Option<u64>,
    /// With `stats`: the program's own run time per run, ns.
    prog_ns: Option<f64>,
    /// With `stats`: how many times the program ran (bpf_stats).
    prog_runs: Option<u64>,
    /// Calls the target made per repetition: the timed ones and a warm-up.
    calls: u64,
    /// Why the run does not count, if it does not.
    failed: Option<String>,
}

fn overhead(plan: &Plan, object: &Path, select: &Select) -> Value {
    let mut rows = Vec::new();
    // One repetition per run, and the setups in turn, round after round: a
    // change of the machine's speed during the part (another VM on the host,
    // another job here) falls on every setup alike, and so does where one
    // process happens to run. The figure of a setup is its median over the
    // rounds.
    let one = Plan { reps: 1, ..*plan };
    for (short, func, what) in FUNCS {
        if !select.kind(short) {
            continue;
        }
        let mut row = json!({"function": func, "first_instruction": what});
        // --quick times the condition setups on the first kind only.
        let setups: Vec<&str> = SETUPS
            .into_iter()
            .filter(|s| select.setup(s))
            .filter(|s| !(plan.quick && s.starts_with("mt-agent ") && short != FUNCS[0].0))
            .collect();
        let mut ns: Vec<Vec<f64>> = vec![Vec::new(); setups.len()];
        let mut hits: Vec<Option<u64>> = vec![None; setups.len()];
        let mut failed: Vec<Vec<String>> = vec![Vec::new(); setups.len()];
        for _ in 0..plan.reps {
            for (i, setup) in setups.iter().enumerate() {
                let b = bench_run(&one, object, short, func, setup, false);
                ns[i].extend(b.ns);
                failed[i].extend(b.failed);
                if let Some(h) = b.hits {
                    hits[i] = Some(hits[i].unwrap_or(0) + h);
                }
            }
        }
        let mut none = f64::NAN;
        for (i, setup) in setups.iter().enumerate() {
            let prog_ns = if *setup == "floor" || *setup == "mt-agent" {
                let quick = Plan {
                    n_fast: plan.n_fast.min(500_000),
                    n_step: plan.n_step.min(20_000),
                    reps: 1,
                    ..*plan
                };
                let b = bench_run(&quick, object, short, func, setup, true);
                failed[i].extend(b.failed);
                // The floor is the ratio's denominator: it must have run
                // on every call (bpf_stats counts each run of a program).
                if b.prog_runs != Some(b.calls) {
                    failed[i].push(format!(
                        "{setup}'s program ran {:?} times for {} calls",
                        b.prog_runs, b.calls
                    ));
                }
                b.prog_ns
            } else {
                None
            };
            let med = median(&ns[i]);
            if *setup == "none" {
                none = med;
            }
            // The timed calls, plus each run's one warm-up call.
            let calls = (if short == "step" {
                plan.n_step
            } else {
                plan.n_fast
            } + 1)
                * plan.reps as u64;
            let hits = hits[i];
            eprintln!(
                "bench: overhead {func:<13} {setup:<14} {med:>10.1} ns/call over {} runs {:?} (hits counted: {hits:?} of {calls}; program {prog_ns:?} ns/run)",
                ns[i].len(),
                ns[i].iter().map(|v| v.round()).collect::<Vec<_>>()
            );
            row[*setup] = json!({"ns_per_call": ns[i], "median": med, "overhead": med - none, "hits": hits, "calls": calls, "program_ns_per_run": prog_ns});
            for why in failed[i].drain(..) {
                mark_failed(&mut row[*setup], format!("{func} {setup}: {why}"));
            }
        }
        let over = |setup: &str| {
            if row[setup]["failed"].is_string() {
                f64::NAN
            } else {
                row[setup]["overhead"].as_f64().unwrap_or(f64::NAN)
            }
        };
        let ours = over("mt-agent");
        let derived = [
            ("mt_agent_over_floor", ours / over("floor")),
            ("mt_agent_over_perf_event", ours / over("perf-event")),
            ("mt_agent_over_hw_breakpoint", ours / over("hw-breakpoint")),
            ("conditions_add_ns", over("mt-agent conditions") - ours),
            ("slower_than_adds_ns", over("mt-agent slower-than") - ours),
            (
                "ret_probes_add_ns",
                over("mt-agent slower-than ret-probes") - ours,
            ),
            (
                "uretprobe_adds_ns",
                over("mt-agent slower-than uretprobe") - ours,
            ),
        ];
        for (key, value) in derived {
            row[key] = json!(value);
        }
        rows.push(row);
    }
    Value::Array(rows)
}

/// Watches a directory for IN_MOVED_TO (perf renaming a snapshot into
/// place), noting CLOCK_MONOTONIC at each event.
struct RenameWatch {
    events: Arc<Mutex<Vec<(u64, String)>>>,
    stop: Arc<Mutex<bool>>,
}

impl RenameWatch {
    fn start(dir: &Path) -> RenameWatch {
        let ino = Inotify::init(InitFlags::IN_CLOEXEC).unwrap();
        ino.add_watch(dir, AddWatchFlags::IN_MOVED_TO).unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(Mutex::new(false));
        let (e2, s2) = (events.clone(), stop.clone());
        thread::spawn(move || {
            while !*s2.lock().unwrap() {
                if let Ok(evs) = ino.read_events() {
                    let t = monotonic_ns();
                    for e in evs {
                        if let Some(name) = e.name {
                            e2.lock()
                                .unwrap()
                                .push((t, name.to_string_lossy().into_owned()));
                        }
                    }
                }
            }
        });
        RenameWatch { events, stop }
    }

    fn take(self) -> Vec<(u64, String)> {
        *self.stop.lock().unwrap() = true;
        self.events.lock().unwrap().clone()
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Trigger → snapshot latency for one setup: (rename − stamp) in ms, and for
/// mt-agent its own hit → kill() from snapshots.jsonl, in µs.
fn latency_run(plan: &Plan, setup: &str) -> Value {
    let bin = target_path("target_bench");
    let func = "trigger_push";
    let mut t = Target::start(&bin, &["stamp", &plan.stamps.to_string(), "100", "push"]);
    let pid = t.pid().to_string();
    let mut agent = None;
    let mut perf = None;
    let mut _probe = None;
    let out_dir = tempfile::tempdir().unwrap();
    let watch;
    if setup.starts_with("mt-agent") {
        let out = out_dir.path().join("out");
        fs::create_dir(&out).unwrap();
        // Text mode: the agent prints nothing between its signal and perf's
        // Dump line, so the harness adds no wakeups while perf switches.
        let mut args = vec![
            "--pid",
            pid.as_str(),
            "--symbol",
            func,
            "--cooldown",
            "50ms",
            // Every stamp is seen: no call falls in a disarmed cooldown.
            "--always-armed",
            "--output",
        ];
        let o = out.display().to_string();
        args.push(&o);
        if setup.contains("rt-priority") {
            args.extend(["--rt-priority", "50"]);
        }

        let mut a = Agent::start(&args);
        a.wait_armed();
        watch = RenameWatch::start(&out);
        agent = Some((a, out));
    } else {
        let probe = PerfProbe::add(&bin, func);
        watch = RenameWatch::start(out_dir.path());
        let mut args = record_args(t.pid(), out_dir.path());
        args[3] = format!("--switch-output-event={}", probe.0);
        perf = Some(PerfProc::start(&args));
        _probe = Some(probe);
    }
    t.go();
    t.wait(Duration::from_secs(120));
    let stamps: Vec<u64> = t
        .proc
        .stdout()
        .iter()
        .filter_map(|l| l.strip_prefix("stamp ").and_then(|v| v.parse().ok()))
        .collect();
    let mut hit_to_kill = Vec::new();
    let mut latencies = Vec::new();
    let mut failed = Vec::new();
    let mut no_figure = None;
    if let Some((a, out)) = agent {
        let run = a.finish(FINISH);
        failed.extend(failure(&run));
        let events = watch.take();
        // Each hit snapshot names its hit: arg0 is the stamp.
        for v in read_index(&out.join("snapshots.jsonl"))
            .iter()
            .filter(|v| v["kind"] == "hit")
        {
            let stamp = v["hits"][0]["args"][0].as_u64().unwrap();
            match events
                .iter()
                .find(|(_, n)| Some(n.as_str()) == v["file"].as_str())
            {
                Some((t, _)) => latencies.push((t - stamp) as f64 / 1e6),
                None => failed.push(format!("no rename seen for {}", v["file"])),
            }
            match v["hit_to_kill_ns"].as_u64() {
                Some(ns) => hit_to_kill.push(ns as f64 / 1e3),
                None => failed.push(format!("{} has no hit_to_kill_ns", v["file"])),
            }
        }
    } else if let Some(p) = perf {
        let _ = p.finish();
        let events = watch.take();
        // perf-event switches on every hit, in order, and the last rename
        // is perf's final file: pairs by order hold only when every stamp
        // has its rename, or one missed switch shifts every later pair.
        if events.len() == stamps.len() + 1 {
            for ((t, _), stamp) in events.iter().zip(&stamps) {
                latencies.push((*t as f64 - *stamp as f64) / 1e6);
            }
        } else {
            // perf missed or merged switches (a loaded machine): no pairing
            // can be trusted. Not a failure of the run, but no figure.
            no_figure = Some(format!(
                "{} renames for {} stamps: perf missed switches, so stamps and renames cannot be paired",
                events.len(),
                stamps.len()
            ));
        }
    }
    eprintln!("bench: latency {setup:<26} {} samples", latencies.len());
    let mut v = json!({"setup": setup, "stamps": stamps.len(), "rename_ms": pcts(latencies)});
    if !hit_to_kill.is_empty() {
        v["hit_to_kill_us"] = pcts(hit_to_kill);
    }
    if stamps.len() as u64 != plan.stamps {
        failed.push(format!(
            "{} of {} stamps printed",
            stamps.len(),
            plan.stamps
        ));
    }
    for why in failed {
        mark_failed(&mut v, format!("latency {setup}: {why}"));
    }
    if let Some(why) = no_figure {
        eprintln!("bench: latency {setup}: no figure: {why}");
        v["no_figure"] = json!(why);
    }
    v
}

fn latency(plan: &Plan) -> Value {
    let mut rows: Vec<Value> = ["mt-agent", "mt-agent --rt-priority 50", "perf-event"]
        .iter()
        .map(|s| latency_run(plan, s))
        .collect();
    rows.push(after_big::run(plan.quick));
    Value::Array(rows)
}

fn storm_run(plan: &Plan, object: &Path, setup: &str) -> Value {
    let bin = target_path("target_bench");
    let func = "trigger_nop5";
    let mut t = Target::start(&bin, &["storm", &plan.storm_s.to_string(), "nop5"]);
    let pid = t.pid().to_string();
    let out_dir = tempfile::tempdir().unwrap();
    let mut v = json!({"setup": setup});
    let mut agent = None;
    let mut perf = None;
    let mut _probe = None;
    let mut _floor = None;
    match setup {
        "none" => {}
        // The least any uprobe costs: perf as the agent runs it, and a
        // program that only returns, always in.
        "floor" => {
            perf = Some(PerfProc::start(&record_args(t.pid(), out_dir.path())));
            _floor = Some(Floor::attach(object, t.pid(), &bin, func));
        }
        "mt-agent always-armed" | "mt-agent disarming 100ms" | "mt-agent disarming 200ms" => {
            let cooldown = if setup.ends_with("200ms") {
                "200ms"
            } else {
                "100ms"
            };
            let mut args = vec![
                "--pid",
                &pid,
                "--symbol",
                func,
                "--cooldown",
                cooldown,
                "--json",
            ];
            if setup.ends_with("always-armed") {
                args.push("--always-armed");
            }
            let mut a = Agent::start(&args);
            a.wait_armed();
            agent = Some(a);
        }
        "perf-event" => {
            let probe = PerfProbe::add(&bin, func);
            let mut args = record_args(t.pid(), out_dir.path());
            args[3] = format!("--switch-output-event={}", probe.0);
            // Bounded so that it cannot fill the disk.
            args.push("--switch-max-files=20".into());
            perf = Some(PerfProc::start(&args));
            _probe = Some(probe);
        }
        _ => unreachable!(),
    }
    t.go();
    // The agent's resident set, sampled mid-storm, and its CPU time over
    // the storm itself (start-up not included).
    let mut rss_kib = Vec::new();
    let cpu0 = agent.as_ref().and_then(|a| cpu_seconds(a.proc.pid()));
    let mut cpu1 = None;
    let t0 = Instant::now();
    let mut storm_wall = None;
    let end = Instant::now() + Duration::from_secs(plan.storm_s + 60);
    while t.proc.try_status().is_none() && Instant::now() < end {
        if storm_wall.is_none() && t.proc.stdout().iter().any(|l| l.starts_with("calls ")) {
            storm_wall = Some(t0.elapsed().as_secs_f64());
            cpu1 = agent.as_ref().and_then(|a| cpu_seconds(a.proc.pid()));
        }
        if let Some(a) = &agent
            && let Some(r) = status_field(a.proc.pid(), "VmRSS").and_then(|r| {
                r.split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
            })
        {
            rss_kib.push(r);
        }
        thread::sleep(Duration::from_millis(20));
    }
    t.wait(Duration::from_secs(60));
    // "calls N in S s": the calls and the storm's duration as the target
    // measured it (CLOCK_MONOTONIC around its loop), not the planned one.
    let measured = t.proc.stdout().iter().find_map(|l| storm_calls(l));
    v["calls"] = json!(measured.map(|m| m.0));
    v["storm_s"] = json!(measured.map(|m| m.1));
    v["calls_per_s"] = json!(measured.map(|(c, secs)| c as f64 / secs));
    if measured.is_none() {
        mark_failed(
            &mut v,
            format!("storm {setup}: the target printed no calls line"),
        );
    }
    if let Some(a) = agent {
        let run = a.finish(FINISH);
        if let Some(why) = failure(&run) {
            mark_failed(&mut v, format!("storm {setup}: {why}"));
        }
        let s = run.summary().unwrap_or(Value::Null);
        let c = &s["counters"];
        let dropped: u64 = c["dropped"]
            .as_object()
            .map(|o| o.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0);
        v["seen"] = c["seen"].clone();
        v["accounted"] = json!(
            dropped + c["accepted"].as_u64().unwrap_or(0) + s["open_calls"].as_u64().unwrap_or(0)
        );
        v["snapshot_files"] = json!(perf_files(&run.out).len());
        v["agent_cpu_s"] = s["agent_cpu_s"].clone();
        if let (Some(a), Some(b), Some(w)) = (cpu0, cpu1, storm_wall) {
            v["agent_storm_cpu_s"] = json!(b - a);
            v["agent_storm_cpu_percent"] = json!(100.0 * (b - a) / w);
        }
        v["agent_peak_rss_kib"] = s["agent_peak_rss_kib"].clone();
        v["agent_rss_kib_during"] = json!(rss_kib.iter().max());
        v["perf_cpu_s"] = s["perf_cpu_s"].clone();
        v["disk_bytes"] = json!(dir_bytes(&run.out));
        let hit_to_kill: Vec<f64> = run
            .entries("hit")
            .iter()
            .filter_map(|e| e["hit_to_kill_ns"].as_u64())
            .map(|ns| ns as f64 / 1e3)
            .collect();
        v["hit_to_kill_us"] = pcts(hit_to_kill);
        v["disarm"] = s["disarm"].clone();
        v["accepted"] = c["accepted"].clone();
    }
    if let Some(p) = perf {
        let (lines, cpu, dir) = p.finish();
        v["snapshot_files_written"] = json!(
            lines
                .iter()
                .filter(|l| l.contains("perf record: Dump"))
                .count()
        );
        v["snapshot_files_kept"] = json!(
            perf_files(dir.path())
                .len()
                .max(perf_files(out_dir.path()).len())
        );
        v["perf_cpu_s"] = json!(cpu);
        v["disk_bytes"] = json!(dir_bytes(out_dir.path()));
        v["perf_messages"] = json!(
            lines
                .iter()
                .filter(|l| !l.contains("perf record: Dump") && !l.contains("dump data"))
                .take(5)
                .collect::<Vec<_>>()
        );
    }
    eprintln!("bench: storm {setup:<10} {v}");
    v
}

/// The target's `calls N in S s` line: (N, S).
fn storm_calls(line: &str) -> Option<(u64, f64)> {
    let mut w = line.strip_prefix("calls ")?.split_whitespace();
    let n = w.next()?.parse().ok()?;
    let secs: f64 = w.nth(1)?.parse().ok()?;
    (secs > 0.0).then_some((n, secs))
}

fn dir_bytes(d: &Path) -> u64 {
    fs::read_dir(d)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// The storm's setups. The target's speed with the probes out most of the
/// time is within a few percent of none's, as is the noise of a shared
/// machine, so none and the disarming setups run in 5 interleaved rounds and
/// each row is its median round; the others run once.
fn storm(plan: &Plan, object: &Path) -> Value {
    const REPEATED: [&str; 3] = [
        "none",
        "mt-agent disarming 100ms",
        "mt-agent disarming 200ms",
    ];
    let rounds = if plan.quick { 1 } else { 5 };
    let mut runs: Vec<(&str, Value)> = Vec::new();
    for _ in 0..rounds {
        for setup in REPEATED {
            runs.push((setup, storm_run(plan, object, setup)));
        }
    }
    let order = [
        "none",
        "floor",
        "mt-agent always-armed",
        "mt-agent disarming 100ms",
        "mt-agent disarming 200ms",
        "perf-event",
    ];
    let mut rows = Vec::new();
    for setup in order {
        if !REPEATED.contains(&setup) {
            rows.push(storm_run(plan, object, setup));
            continue;
        }
        let speed = |v: &Value| v["calls_per_s"].as_f64().unwrap_or(0.0);
        // Each round's speed against none's in the same round: the
        // machine's drift between rounds cancels out.
        let none: Vec<f64> = runs
            .iter()
            .filter(|(s, _)| *s == "none")
            .map(|(_, v)| speed(v))
            .collect();
        let mut mine: Vec<Value> = runs
            .iter()
            .filter(|(s, _)| *s == setup)
            .zip(&none)
            .map(|((_, v), n)| {
                let mut v = v.clone();
                v["ratio_to_none_in_round"] = json!(speed(&v) / n);
                v
            })
            .collect();
        let ratio = |v: &Value| v["ratio_to_none_in_round"].as_f64().unwrap_or(0.0);
        let mut ratios: Vec<f64> = mine.iter().map(ratio).collect();
        ratios.sort_by(f64::total_cmp);
        mine.sort_by(|a, b| speed(a).total_cmp(&speed(b)));
        let mut row = mine[mine.len() / 2].clone();
        // A failed round fails the row: its ratio is no figure.
        let failures: Vec<String> = mine
            .iter()
            .filter_map(|v| v["failed"].as_str().map(str::to_string))
            .collect();
        if !failures.is_empty() && !row["failed"].is_string() {
            mark_failed(&mut row, failures.join("; "));
        }
        row["calls_per_s_rounds"] = json!(mine.iter().map(speed).collect::<Vec<_>>());
        row["ratio_to_none_rounds"] = json!(ratios);
        row["ratio_to_none_median"] = json!(ratios[ratios.len() / 2]);
        rows.push(row);
    }
    Value::Array(rows)
}

fn time_to_armed(plan: &Plan) -> Value {
    let mut ms = Vec::new();
    let mut failed = Vec::new();
    for _ in 0..plan.armed_runs {
        let t = Target::start(&target_path("target_bench"), &["wait"]);
        let pid = t.pid().to_string();
        let mut a = Agent::start(&["--pid", &pid, "--symbol", "trigger_push", "--json"]);
        a.wait_armed();
        let armed = a.proc.stdout().iter().find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v["event"] == "armed")
        });
        if let Some(v) = armed.and_then(|v| v["time_to_armed_ms"].as_f64()) {
            ms.push(v);
        }
        a.proc.signal(libc::SIGINT);
        failed.extend(failure(&a.finish(FINISH)));
    }
    eprintln!("bench: time to armed {ms:?}");
    let mut v = json!({"ms": ms, "median": median(&ms)});
    if ms.len() != plan.armed_runs {
        failed.push(format!(
            "{} of {} runs reported time_to_armed_ms",
            ms.len(),
            plan.armed_runs
        ));
    }
    for why in failed {
        mark_failed(&mut v, format!("time to armed: {why}"));
    }
    v
}

/// A busy 2-thread target that never hits, under each recording mode: what
/// waiting costs in disk, perf CPU and agent CPU and memory.
fn waiting(plan: &Plan) -> Value {
    Value::Array(
        ["--continuous", "--flight-recorder"]
            .iter()
            .map(|mode| waiting_run(plan, mode))
            .collect(),
    )
}

fn waiting_run(plan: &Plan, mode: &str) -> Value {
    let ms = (plan.wait_s * 1000).to_string();
    let mut t = Target::start(&target_path("target"), &["busy", "0", &ms]);
    let pid = t.pid().to_string();
    let mut a = Agent::start(&["--pid", &pid, "--symbol", "trigger", "--json", mode]);
    a.wait_armed();
    let out = a.out.clone();
    t.go();
    let t0 = Instant::now();
    // The most OUT held while the target ran: the tail perf writes as it
    // ends comes after, and is not part of waiting.
    let mut waiting_bytes = 0;
    while t.proc.try_status().is_none() && t0.elapsed() < Duration::from_secs(plan.wait_s + 60) {
        waiting_bytes = waiting_bytes.max(dir_bytes(&out));
        thread::sleep(Duration::from_millis(100));
    }
    let waited_s = t0.elapsed().as_secs_f64();
    t.wait(Duration::from_secs(60));
    let run = a.finish(FINISH);
    let failed = failure(&run);
    let s = run.summary().unwrap_or(Value::Null);
    // perf holds samples in its rings until a wakeup, so the bytes on disk
    // during a short wait understate continuous recording: every sample of
    // the wait is in OUT once the run ends. The flight recorder's tail is
    // the rings' last contents, written once at the end, not per hour.
    let at_end = dir_bytes(&run.out);
    let tail: u64 = run
        .entries("tail")
        .iter()
        .filter_map(|e| e["bytes"].as_u64())
        .sum();
    let for_waiting = if mode == "--flight-recorder" {
        at_end.saturating_sub(tail)
    } else {
        at_end
    };
    let per_hour = |x: f64| x * 3600.0 / waited_s;
    let v = json!({
        "mode": mode.trim_start_matches("--"),
        "waited_s": waited_s,
        "out_bytes_while_waiting": waiting_bytes,
        "out_bytes_at_end": at_end,
        "bytes_per_hour": per_hour(for_waiting as f64),
        "perf_cpu_s_per_hour": s["perf_cpu_s"].as_f64().map(per_hour),
        "agent_cpu_s": s["agent_cpu_s"],
        "agent_peak_rss_kib": s["agent_peak_rss_kib"],
    });
    let mut v = v;
    if let Some(why) = failed {
        mark_failed(&mut v, format!("waiting {mode}: {why}"));
    }
    eprintln!("bench: waiting {v}");
    v
}

/// The flight-recorder ring the stacks table sizes its window with, bytes.
const RING_BYTES: f64 = 16.0 * 1024.0 * 1024.0;

/// One run of the stacks table: the frame-pointer-less target spins four
/// calls below main, then calls the trigger once; mt-agent records it with
/// `--call-graph MODE` at 999 Hz. With `auto`, the target spins from
/// before the agent starts (the agent measures the copy size on it), and
/// for 2 s longer, as long as the measurement may take.
fn stacks_run(plan: &Plan, mode: &str) -> Value {
    let spin_ms = if plan.quick { "500" } else { "5000" };
    let auto = mode == "auto";
    let spin_ms = if auto {
        (spin_ms.parse::<u64>().unwrap() + 2000).to_string()
    } else {
        spin_ms.to_string()
    };
    let mut t = Target::start(&target_path("unwind_nofp"), &["1", &spin_ms]);
    if auto {
        t.go();
    }
    let pid = t.pid().to_string();
    let mut a = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--call-graph",
        mode,
        "--json",
    ]);
    a.wait_armed();
    if !auto {
        t.go();
    }
    t.wait(Duration::from_secs(60));
    let run = a.finish(FINISH);
    let failed = failure(&run);
    let s = run.summary().unwrap_or(Value::Null);
    let (mut samples, mut reach) = (0u64, 0u64);
    for f in perf_files(&run.out) {
        for smp in perf_samples(&run.out.join(f)) {
            samples += 1;
            reach += u64::from(smp.frames.iter().any(|f| f == "main"));
        }
    }
    let bytes = dir_bytes(&run.out);
    let per_sample = bytes as f64 / samples.max(1) as f64;
    let perf_cpu = s["perf_cpu_s"].as_f64();
    let chosen = run
        .stdout
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["event"] == "armed")
        .and_then(|e| e["unwinding"]["mode"].as_str().map(str::to_string));
    let v = json!({
        "mode": mode,
        "chosen": if auto { chosen } else { None },
        "samples": samples,
        "reach_main_percent": 100.0 * reach as f64 / samples.max(1) as f64,
        "snapshot_bytes": bytes,
        "bytes_per_sample": per_sample,
        "perf_cpu_s": perf_cpu,
        // How far back a 16 MiB flight-recorder ring would reach with one
        // busy thread sampled at 999 Hz: derived (16 MiB ÷ bytes per
        // sample ÷ 999 Hz), not measured with a ring.
        "ring_16mib_seconds_derived": RING_BYTES / (per_sample * 999.0),
    });
    let mut v = v;
    if let Some(why) = failed {
        mark_failed(&mut v, format!("stacks {mode}: {why}"));
    }
    eprintln!("bench: stacks {mode:<12} {v}");
    v
}

fn stacks(plan: &Plan) -> Value {
    Value::Array(
        ["fp", "dwarf,4096", "dwarf,8192", "dwarf,16384", "auto"]
            .iter()
            .map(|m| stacks_run(plan, m))
            .collect(),
    )
}
