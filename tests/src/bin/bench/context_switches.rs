//! The bench's `switch` part: what the off-CPU breakdown costs per context
//! switch. `offcpu pingpong S` (tests/targets/offcpu.c) passes a byte between
//! two threads pinned to one CPU for S seconds (5 s, 2 s with `--quick`) and
//! prints ns per switch (each hand-off is one switch). Setups, interleaved
//! round by round in one run:
//!
//! - **no agent**;
//! - **traced, breakdown off**: mt-agent on the ping-pong process,
//!   `--slower-than 1s` on `pp_trigger` (called once every 65536 round trips,
//!   never that slow) with `--no-off-cpu`;
//! - **traced, breakdown on**: the same with the breakdown (the default for
//!   `--slower-than`): perf records a `sched:sched_switch` sample with its
//!   call chain and `PERF_RECORD_SWITCH` records for each switch;
//! - **traced, breakdown on, flight recorder**: the same with
//!   `--flight-recorder` (perf keeps the records in its rings instead of
//!   writing them);
//! - **not traced**: the ping-pong process runs untraced while mt-agent, with
//!   the breakdown on, traces another process (a sleeping `offcpu wait`);
//!   and the same with the breakdown off, to tell what the breakdown's
//!   events cost other processes from what a perf of another process does.

use std::time::Duration;

use mt_agent_tests::*;
use serde_json::{Value, json};

/// The setups, in the order they run in each round: (name, agent options;
/// None for no agent).
const SETUPS: [(&str, Option<&[&str]>); 6] = [
    ("no agent", None),
    ("traced, breakdown off", Some(&["--no-off-cpu"])),
    ("traced, breakdown on", Some(&[])),
    (
        "traced, breakdown on, flight recorder",
        Some(&["--flight-recorder"]),
    ),
    (
        "not traced, agent with the breakdown on elsewhere",
        Some(&[]),
    ),
    (
        "not traced, agent with the breakdown off elsewhere",
        Some(&["--no-off-cpu"]),
    ),
];

/// The figure the ping-pong printed: `ns_per_switch X`.
fn ns_per_switch(t: &Target) -> Option<f64> {
    t.proc
        .stdout()
        .iter()
        .find_map(|l| l.strip_prefix("ns_per_switch "))
        .and_then(|v| v.trim().parse().ok())
}

/// Runs the ping-pong to its end; returns ns per switch.
fn pingpong(t: &mut Target, seconds: u64) -> f64 {
    t.go();
    let status = t.wait(Duration::from_secs(seconds + 60));
    assert!(
        status.success(),
        "offcpu pingpong failed: {status}, {:?}",
        t.proc.stderr()
    );
    ns_per_switch(t).unwrap_or_else(|| panic!("no ns_per_switch: {:?}", t.proc.stdout()))
}

/// `mt-agent --pid PID --symbol pp_trigger --slower-than 1s EXTRA --json`, armed.
fn agent_on(pid: i32, extra: &[&str]) -> Agent {
    let pid = pid.to_string();
    let mut args = vec![
        "--pid",
        &pid,
        "--symbol",
        "pp_trigger",
        "--slower-than",
        "1s",
        "--json",
    ];
    args.extend_from_slice(extra);
    let mut a = Agent::start(&args);
    a.wait_armed();
    a
}

/// One run of one setup: ns per switch, and perf's CPU time and the bytes
/// OUT held at the end when an agent ran.
fn one(setup: &str, extra: Option<&[&str]>, seconds: u64) -> Value {
    let offcpu = target_path("offcpu");
    let s = seconds.to_string();
    let mut t = Target::start(&offcpu, &["pingpong", &s]);
    let (ns, run) = match extra {
        None => (pingpong(&mut t, seconds), None),
        Some(extra) if setup.starts_with("not traced") => {
            let other = Target::start(&offcpu, &["wait"]);
            let a = agent_on(other.pid(), extra);
            let ns = pingpong(&mut t, seconds);
            a.proc.signal(libc::SIGINT);
            (ns, Some(a.finish(FINISH)))
        }
        Some(extra) => {
            let a = agent_on(t.pid(), extra);
            let ns = pingpong(&mut t, seconds);
            (ns, Some(a.finish(FINISH)))
        }
    };
    let summary = run.as_ref().and_then(Run::summary).unwrap_or(Value::Null);
    let mut v = json!({
        "setup": setup,
        "ns_per_switch": ns,
        "perf_cpu_s": summary["perf_cpu_s"],
        "out_bytes": run.as_ref().map(|r| super::dir_bytes(&r.out)),
    });
    if let Some(why) = run.as_ref().and_then(super::failure) {
        super::mark_failed(&mut v, format!("switch {setup}: {why}"));
    }
    eprintln!("bench: switch {v}");
    v
}

/// Runs the part; returns its figures: per setup, the median over rounds
/// and the ratio to no agent.
pub fn run(quick: bool) -> Value {
    let (seconds, rounds) = if quick { (2, 1) } else { (5, 3) };
    let mut raw: Vec<Vec<Value>> = vec![Vec::new(); SETUPS.len()];
    for _ in 0..rounds {
        for (i, (name, extra)) in SETUPS.iter().enumerate() {
            raw[i].push(one(name, *extra, seconds));
        }
    }
    let med = |runs: &[Value], key: &str| {
        super::median(
            &runs
                .iter()
                .filter_map(|r| r[key].as_f64())
                .collect::<Vec<_>>(),
        )
    };
    let none = med(&raw[0], "ns_per_switch");
    let rows: Vec<Value> = SETUPS
        .iter()
        .zip(&raw)
        .map(|((name, _), runs)| {
            let ns = med(runs, "ns_per_switch");
            let failures: Vec<&str> = runs.iter().filter_map(|r| r["failed"].as_str()).collect();
            let mut row = json!({
                "setup": name,
                "ns_per_switch": ns,
                "above_none_ns": ns - none,
                "ratio": ns / none,
                "perf_cpu_s": med(runs, "perf_cpu_s"),
                "out_bytes": med(runs, "out_bytes"),
                "runs": runs,
            });
            if !failures.is_empty() {
                row["failed"] = json!(failures.join("; "));
            }
            row
        })
        .collect();
    json!({"seconds": seconds, "rounds": rounds, "rows": rows})
}
