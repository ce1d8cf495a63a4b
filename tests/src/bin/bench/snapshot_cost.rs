//! The bench's `snapshot` part: what a snapshot costs perf, and how long it
//! takes to complete (docs/perf-kallsyms.md). Setups: continuous and flight
//! recorder, each with perf reading the agent's small copy of
//! `/proc/kallsyms` (the default) and, as the anchor, the real file
//! (`MT_AGENT_PERF_KALLSYMS=proc`, what every run did before the copy), run
//! in turn round by round.
//!
//! Each setup runs `target calls N 100` (N hits 100 ms apart, `--cooldown
//! 0`) and `target calls 0 100` (no hit): perf's CPU per snapshot is the
//! difference of the two runs' `perf_cpu_s` over the hit snapshots, so
//! perf's start-up and end are not counted. From the N-hit run: each
//! snapshot's `kill_to_dump_ns` (SIGUSR2 to perf's `Dump` line) and the
//! time to armed.

use std::time::Duration;

use mt_agent_tests::*;
use serde_json::{Value, json};

/// (name, recording option, perf reads the copy).
const SETUPS: [(&str, &str, bool); 4] = [
    ("continuous, copy", "--continuous", true),
    ("continuous, /proc/kallsyms", "--continuous", false),
    ("flight recorder, copy", "--flight-recorder", true),
    (
        "flight recorder, /proc/kallsyms",
        "--flight-recorder",
        false,
    ),
];

/// What one capture gave: perf's CPU (s), hit snapshots, each snapshot's
/// SIGUSR2 → `Dump` (ms), time to armed (ms), and whether it ended well.
struct Capture {
    perf_cpu_s: Option<f64>,
    snapshots: usize,
    kill_to_dump_ms: Vec<f64>,
    armed_ms: Option<f64>,
    ok: bool,
}

fn capture_once(hits: usize, recording: &str, copy: bool) -> Capture {
    let n = hits.to_string();
    let mut t = Target::start(&target_path("target"), &["calls", &n, "100"]);
    let pid = t.pid().to_string();
    let args = [
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--cooldown",
        "0",
        "--json",
        recording,
    ];
    let mut a = Agent::start_with(&args, |c| {
        if !copy {
            c.env("MT_AGENT_PERF_KALLSYMS", "proc");
        }
    });
    a.wait_armed();
    let armed_ms = armed_event(&a.proc.stdout()).and_then(|v| v["time_to_armed_ms"].as_f64());
    t.go();
    let status = t.wait(Duration::from_secs(60));
    let run = a.finish(FINISH);
    let entries = run.entries("hit");
    let s = run.summary().unwrap_or(Value::Null);
    Capture {
        perf_cpu_s: s["perf_cpu_s"].as_f64(),
        snapshots: entries.len(),
        kill_to_dump_ms: entries
            .iter()
            .filter_map(|e| e["kill_to_dump_ns"].as_f64())
            .map(|ns| ns / 1e6)
            .collect(),
        armed_ms,
        ok: status.success() && run.code == Some(0),
    }
}

/// One round of one setup: perf's CPU per snapshot (ms) and the N-hit run.
fn round(hits: usize, recording: &str, copy: bool) -> (Option<f64>, Capture) {
    let idle = capture_once(0, recording, copy);
    let busy = capture_once(hits, recording, copy);
    let per = match (idle.perf_cpu_s, busy.perf_cpu_s, idle.ok && busy.ok) {
        (Some(i), Some(b), true) if busy.snapshots > 0 => {
            Some((b - i).max(0.0) * 1e3 / busy.snapshots as f64)
        }
        _ => None,
    };
    (per, busy)
}

fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s.get(s.len() / 2).copied()
}

/// Runs the part: `rounds` rounds of every setup, `hits` hits a capture.
pub fn run(quick: bool) -> Value {
    let (rounds, hits) = if quick { (1, 5) } else { (3, 20) };
    let mut rows: Vec<Value> = SETUPS
        .iter()
        .map(|(name, ..)| json!({"setup": name, "per_snapshot_ms": [], "kill_to_dump_ms": [], "armed_ms": [], "snapshots": [], "failed_runs": 0}))
        .collect();
    for _ in 0..rounds {
        for (row, (_, recording, copy)) in rows.iter_mut().zip(SETUPS) {
            let (per, c) = round(hits, recording, copy);
            let push = |row: &mut Value, key: &str, v: Value| {
                row[key].as_array_mut().unwrap().push(v);
            };
            match per {
                Some(p) => push(row, "per_snapshot_ms", json!(p)),
                None => row["failed_runs"] = json!(row["failed_runs"].as_u64().unwrap_or(0) + 1),
            }
            for k in c.kill_to_dump_ms {
                push(row, "kill_to_dump_ms", json!(k));
            }
            if let Some(a) = c.armed_ms {
                push(row, "armed_ms", json!(a));
            }
            push(row, "snapshots", json!(c.snapshots));
        }
    }
    for row in &mut rows {
        for key in ["per_snapshot_ms", "kill_to_dump_ms", "armed_ms"] {
            let v: Vec<f64> = row[key]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_f64)
                .collect();
            row[format!("{key}_p50")] = json!(median(&v));
        }
    }
    eprintln!("bench: snapshot cost {rows:?}");
    json!({"hits": hits, "rounds": rounds, "rows": rows})
}
