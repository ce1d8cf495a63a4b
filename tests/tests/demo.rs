//! The demo's workload (tests/src/bin/demo_workload.rs), traced as `cargo
//! xtask demo` traces it (`--symbol handle_request --slower-than 25ms`; the
//! demo adds `--cooldown 1s`, left at its default here for more hits):
//! each slow call's moment names its reason. A large payload's call spends
//! its CPU in `parse_slow_path`; a small one's call is slow because it
//! waited for the cache's lock, and its blocked stack names
//! `wait_for_lock`, while the snapshot shows the compactor that held the
//! lock. Real workload, real agent, real perf. Privileged.

use std::{path::Path, process::Command};

use mt_agent_tests::*;
use serde_json::Value;

/// The workload's payload size from which a request takes the slow path.
const LARGE: u64 = 100_000;
const MS: u64 = 1_000_000;

/// The hits of `mt-agent report OUT --json` (one object per hit, then the
/// run's own object, left out here).
fn report_hits(out: &Path) -> Vec<Value> {
    let o = Command::new(agent_bin())
        .arg("report")
        .arg(out)
        .arg("--json")
        .output()
        .expect("mt-agent report");
    assert!(
        o.status.success(),
        "mt-agent report --json: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .filter(|v: &Value| v["event"] == "hit")
        .collect()
}

/// The stacks of one of a hit's folded files (`moment` or `all`).
fn folded(out: &Path, h: &Value, which: &str) -> Vec<(Vec<String>, u64)> {
    let rel = h[which]["folded"]
        .as_str()
        .unwrap_or_else(|| panic!("no {which} folded file: {h}"));
    read_folded(&out.join(rel))
}

/// Share of the samples with `name` anywhere on the stack.
fn share_under(stacks: &[(Vec<String>, u64)], name: &str) -> f64 {
    let total: u64 = stacks.iter().map(|(_, n)| n).sum();
    let under: u64 = stacks
        .iter()
        .filter(|(s, _)| s.iter().any(|f| f == name))
        .map(|(_, n)| n)
        .sum();
    under as f64 / total.max(1) as f64
}

/// The moment's inclusive share of `name`, from the report's `top`.
fn top_share(h: &Value, name: &str) -> Option<f64> {
    h["moment"]["top"]
        .as_array()?
        .iter()
        .find(|f| f["name"] == name)?["inclusive"]
        .as_f64()
}

/// A large payload's slow call: most of its on-CPU samples are under
/// `parse_slow_path` (40 ms of the thread's CPU time in a call of 44-48 ms
/// of CPU, so about 85%; the bound is loose for stacks perf could not
/// unwind).
fn check_slow_path(h: &Value) {
    let share = top_share(h, "demo_workload::parse_slow_path").unwrap_or(0.0);
    assert!(
        share >= 0.5,
        "hit {} took the slow path, but its moment's top has parse_slow_path at {share:.2}: {}",
        h["seq"],
        h["moment"]["top"]
    );
}

/// A small payload's call that blocked (20 ms or more: the call itself
/// never sleeps but for the lock): its heaviest blocked stack names
/// `wait_for_lock`, its moment never `parse_slow_path`, and the snapshot
/// holds the compactor's `compact_cache`, which held the lock.
fn check_lock_wait(out: &Path, h: &Value) {
    let moment = folded(out, h, "moment");
    assert_eq!(
        share_under(&moment, "demo_workload::parse_slow_path"),
        0.0,
        "hit {} (a small payload) has parse_slow_path in its moment",
        h["seq"]
    );
    let heaviest = &h["off_cpu"]["blocked_stacks"][0];
    let frames: Vec<&str> = heaviest["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        frames.contains(&"demo_workload::wait_for_lock"),
        "hit {} blocked {} ms, but its heaviest blocked stack is not in wait_for_lock: {heaviest}",
        h["seq"],
        h["blocked_ns"].as_u64().unwrap_or(0) / MS
    );
    let all = folded(out, h, "all");
    assert!(
        share_under(&all, "demo_workload::compact_cache") > 0.0,
        "hit {} waited for the lock, but its snapshot has no compact_cache",
        h["seq"]
    );
}

#[test]
fn the_slow_calls_moments_name_the_slow_path_or_the_lock() {
    let mut t = Target::start(
        &rust_bin("demo_workload"),
        &["60", "--requests", "100", "--wait-for-go"],
    );
    let run = capture(
        &mut t,
        &["--symbol", "handle_request", "--slower-than", "25ms"],
    );
    let hits = report_hits(&run.out);
    assert_eq!(hits.len(), run.hits().len(), "{}", run.output());
    let (mut slow_path, mut lock_waits) = (0, 0);
    for h in &hits {
        eprintln!(
            "hit {}: bytes {}, {} ms: on CPU {} ms, runnable {} ms, blocked {} ms, unknown {} ms",
            h["seq"],
            h["args"][1],
            h["duration_ns"].as_u64().unwrap_or(0) / MS,
            h["on_cpu_ns"].as_u64().unwrap_or(0) / MS,
            h["runnable_ns"].as_u64().unwrap_or(0) / MS,
            h["blocked_ns"].as_u64().unwrap_or(0) / MS,
            h["unknown_ns"].as_u64().unwrap_or(0) / MS,
        );
        // A call that began before its snapshot file is partly unknown: its
        // moment does not hold the whole call.
        if h["unknown_ns"].as_u64() != Some(0) {
            continue;
        }
        if h["args"][1].as_u64().unwrap() >= LARGE {
            check_slow_path(h);
            slow_path += 1;
        } else if h["blocked_ns"].as_u64().unwrap() >= 20 * MS {
            check_lock_wait(&run.out, h);
            lock_waits += 1;
        }
        // Any other small call was slow for the machine's reasons
        // (runnable: waiting for a CPU), not the workload's.
    }
    // 100 requests: about 20 large payloads, and about 7 compactions, each
    // in the way of a request or two (fewer hits are kept: the default
    // 100 ms cooldown drops a slow call that ends too soon after another).
    assert!(
        slow_path >= 1 && lock_waits >= 1,
        "{slow_path} slow-path calls and {lock_waits} lock waits among {} hits\n{}",
        hits.len(),
        run.output()
    );
}
