//! The bench's `bigbinary` part: attaching to a big binary (issue 30, §2),
//! Debian's node (`/usr/bin/node`, ~100 MB, not stripped), idle in
//! `node -e 'setInterval(()=>{},1000)'` (docs/symbol-lookup.md).
//!
//! Setups, run in turn round by round:
//! * `mt-agent capture`: `--pid N --symbol FUNC --slower-than 5ms`, its time
//!   to armed (the `armed` event's `time_to_armed_ms`, with perf's own
//!   start-up, `perf_ready_ms`, beside it) and its peak RSS at armed
//!   (`VmHWM` of the agent; perf is another process);
//! * `mt-agent symbols`: `symbols --pid N PATTERN`, wall time and peak RSS
//!   (its `VmHWM` at its exit: [`wait_peak`]);
//! * the anchor, `perf probe -x node --add EVENT=uv_run` (then `perf probe
//!   -d`): what perf takes to find a function in the same file. Not the same
//!   function: perf 6.1 refuses `Heap::CollectGarbage` by any name ("Failed
//!   to find debug information for address"), since node's debug info
//!   covers only its libuv (`uv_run` is libuv's). The part records whether
//!   perf probe takes FUNC's mangled name (`perf_probe_takes_func`).
//!
//! Its table is `bench_md`'s `bigbinary` part.

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use mt_agent_tests::*;
use serde_json::{Value, json};

/// The binary and the function (mangled for perf probe, which takes a
/// symbol-table name; demangled for mt-agent, as a user types it).
const NODE: &str = "/usr/bin/node";
const FUNC: &str = "v8::internal::Heap::CollectGarbage(v8::internal::AllocationSpace, \
                    v8::internal::GarbageCollectionReason, v8::GCCallbackFlags)";
const MANGLED: &str = "_ZN2v88internal4Heap14CollectGarbageENS0_15AllocationSpaceENS0_\
                       23GarbageCollectionReasonENS_15GCCallbackFlagsE";
const PATTERN: &str = "Heap::CollectGarbage(v8";
const EVENT: &str = "mt_bench_gc";
/// The anchor's function: one node's debug info covers.
const ANCHOR_FUNC: &str = "uv_run";

const SETUPS: [&str; 3] = [
    "mt-agent capture",
    "mt-agent symbols",
    "perf probe --add uv_run",
];

/// One measurement: ms, peak RSS (KiB), perf's start-up (ms, capture only).
type Figures = (f64, u64, Option<f64>);

/// Waits for `child`: whether it exited 0, and its peak RSS (KiB), the
/// `VmHWM` of its own memory read when it stops at its exit under
/// `PTRACE_O_TRACEEXIT` (ptrace(2): the stop comes before its memory is
/// released). Not `wait4`'s `ru_maxrss`: at exec the kernel keeps the old
/// memory's high-water mark in it (`exec_mmap()`, fs/exec.c), and that
/// memory is the bench's own or its copy, so a bench that once grew large
/// (the stack-need recordings) made every child read as large.
fn wait_peak(child: Child) -> (bool, Option<u64>) {
    let pid = child.id() as i32;
    // SAFETY: ptrace and waitpid on our own child, not yet waited for.
    unsafe {
        libc::ptrace(libc::PTRACE_SEIZE, pid, 0, libc::PTRACE_O_TRACEEXIT);
    }
    let exit_stop = libc::SIGTRAP | (libc::PTRACE_EVENT_EXIT << 8);
    let mut peak = None;
    loop {
        let mut status = 0;
        // SAFETY: as above.
        if unsafe { libc::waitpid(pid, &mut status, libc::__WALL) } != pid {
            return (false, peak);
        }
        if libc::WIFEXITED(status) {
            return (libc::WEXITSTATUS(status) == 0, peak);
        }
        if !libc::WIFSTOPPED(status) {
            return (false, peak);
        }
        let signal = if status >> 8 == exit_stop {
            peak = vm_hwm(pid);
            0
        } else if status >> 16 != 0 {
            // Another ptrace event or a group-stop: nothing to deliver.
            0
        } else {
            libc::WSTOPSIG(status)
        };
        // SAFETY: the tracee is stopped.
        unsafe {
            libc::ptrace(libc::PTRACE_CONT, pid, 0, signal);
        }
    }
}

/// Runs a command to its end: wall ms and peak RSS, or why it failed.
fn timed(cmd: &mut Command) -> Result<Figures, String> {
    let t0 = Instant::now();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    let (ok, rss) = wait_peak(child);
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    match (ok, rss) {
        (true, Some(rss)) => Ok((ms, rss, None)),
        (true, None) => Err(format!("{cmd:?}: no VmHWM at its exit")),
        _ => Err(format!("{cmd:?} failed")),
    }
}

/// `VmHWM` of `pid`, KiB.
fn vm_hwm(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

fn capture(pid: i32) -> Result<Figures, String> {
    let pid = pid.to_string();
    let args = [
        "--pid",
        &pid,
        "--symbol",
        FUNC,
        "--slower-than",
        "5ms",
        "--json",
    ];
    let mut a = Agent::start(&args);
    a.wait_armed();
    let rss = vm_hwm(a.proc.pid());
    let armed = armed_event(&a.proc.stdout()).unwrap_or(Value::Null);
    a.proc.signal(libc::SIGINT);
    let run = a.finish(FINISH);
    if let Some(why) = super::failure(&run) {
        return Err(why);
    }
    match (armed["time_to_armed_ms"].as_f64(), rss) {
        (Some(ms), Some(rss)) => Ok((ms, rss, armed["perf_ready_ms"].as_f64())),
        _ => Err("no time_to_armed_ms or VmHWM".into()),
    }
}

fn perf_probe(func: &str) -> Result<Figures, String> {
    let perf = perf_bin().ok_or("no perf")?;
    let add = format!("{EVENT}={func}");
    let r = timed(Command::new(&perf).args(["probe", "-x", NODE, "--add", &add]));
    let _ = Command::new(&perf)
        .args(["probe", "-d", &format!("probe_node:{EVENT}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    r
}

fn measure(setup: &str, pid: i32) -> Result<Figures, String> {
    match setup {
        "mt-agent capture" => capture(pid),
        "mt-agent symbols" => {
            timed(Command::new(agent_bin()).args(["symbols", "--pid", &pid.to_string(), PATTERN]))
        }
        _ => perf_probe(ANCHOR_FUNC),
    }
}

fn median_of(v: &Value) -> Value {
    let mut s: Vec<f64> = v
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    s.sort_by(f64::total_cmp);
    json!(s.get(s.len() / 2))
}

/// Runs the part; returns its figures.
pub fn run(quick: bool) -> Value {
    let Ok(meta) = std::fs::metadata(NODE) else {
        return json!({"no_figure": format!("{NODE} is not installed"), "rows": []});
    };
    let rounds = if quick { 1 } else { 3 };
    let mut node = Command::new(NODE)
        .args(["-e", "setInterval(()=>{},1000)"])
        .stdout(Stdio::null())
        .spawn()
        .expect("start node");
    // Node maps its libraries at once; give it its first second anyway.
    std::thread::sleep(Duration::from_secs(1));
    let pid = node.id() as i32;
    let mut rows: Vec<Value> = SETUPS
        .iter()
        .map(
            |s| json!({"setup": s, "ms": [], "rss_kib": [], "perf_ready_ms": [], "failed_runs": 0}),
        )
        .collect();
    for _ in 0..rounds {
        for (row, setup) in rows.iter_mut().zip(SETUPS) {
            match measure(setup, pid) {
                Ok((ms, rss, ready)) => {
                    row["ms"].as_array_mut().unwrap().push(json!(ms));
                    row["rss_kib"].as_array_mut().unwrap().push(json!(rss));
                    if let Some(r) = ready {
                        row["perf_ready_ms"].as_array_mut().unwrap().push(json!(r));
                    }
                }
                Err(why) => {
                    eprintln!("bench: big binary, {setup}: {why}");
                    row["failed_runs"] = json!(row["failed_runs"].as_u64().unwrap_or(0) + 1);
                }
            }
        }
    }
    let takes_func = perf_probe(MANGLED).is_ok();
    let _ = node.kill();
    let _ = node.wait();
    for row in &mut rows {
        for key in ["ms", "rss_kib", "perf_ready_ms"] {
            row[format!("{key}_p50")] = median_of(&row[key]);
        }
    }
    eprintln!("bench: big binary {rows:?}");
    let mut v = json!({
        "binary": NODE,
        "binary_bytes": meta.len(),
        "function": FUNC,
        "pattern": PATTERN,
        "anchor_function": ANCHOR_FUNC,
        "perf_probe_takes_func": takes_func,
        "rounds": rounds,
        "rows": rows,
    });
    for (setup, row) in SETUPS.iter().zip(rows_failed(&v)) {
        if row > 0 {
            super::mark_failed(&mut v, format!("big binary: {setup}: {row} failed runs"));
        }
    }
    v
}

/// Failed runs of each row.
fn rows_failed(v: &Value) -> Vec<u64> {
    v["rows"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|r| r["failed_runs"].as_u64().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default()
}
