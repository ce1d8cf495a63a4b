//! The latency part's last row (issue 28 §3): a hit that arrives 30 ms
//! after another hit whose snapshot is large, with DWARF stacks and the
//! off-CPU breakdown on. The first hit's snapshot is indexed (parsed for
//! spans and off-CPU records, its objects kept by build-id, the disk budget
//! checked) by the recorder's index thread; the driver thread must not wait
//! for that, so the second hit's hit → `kill()` should be what any hit's
//! is (the rows above it, in the same run).
//!
//! `target_bench pairs N BURN 30 push`: N pairs, the first call of each
//! after BURN ms of CPU (DWARF: ~8.4 KB a sample at 999 Hz, so ~55 MB for
//! 6.5 s), the second 30 ms of CPU later.

use std::{collections::HashSet, fs, time::Duration};

use mt_agent_tests::*;
use serde_json::{Value, json};

use crate::{RenameWatch, failure, mark_failed, pcts};

/// The row's setup name.
const SETUP: &str = "mt-agent 30 ms after a large snapshot (DWARF, off-CPU)";

/// The first snapshot of a pair must be at least this large (bytes) for
/// the row to be what it says.
const LARGE: u64 = 50 << 20;

/// Stamps printed with `prefix` by the target.
fn stamps(t: &Target, prefix: &str) -> Vec<u64> {
    t.proc
        .stdout()
        .iter()
        .filter_map(|l| l.strip_prefix(prefix).and_then(|v| v.parse().ok()))
        .collect()
}

/// Runs the case: 10 pairs, 6.5 s apart (2 pairs of 1.5 s with `quick`,
/// whose first snapshots are too small to count: the row is marked so).
pub fn run(quick: bool) -> Value {
    let (pairs, burn_ms) = if quick { (2, 1500) } else { (10, 6500) };
    let bin = target_path("target_bench");
    let mut t = Target::start(
        &bin,
        &[
            "pairs",
            &pairs.to_string(),
            &burn_ms.to_string(),
            "30",
            "push",
        ],
    );
    let pid = t.pid().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    fs::create_dir(&out).unwrap();
    let o = out.display().to_string();
    let mut a = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger_push",
        "--cooldown",
        "0",
        "--always-armed",
        "--call-graph",
        "dwarf",
        "--off-cpu",
        "--output",
        &o,
    ]);
    a.wait_armed();
    let watch = RenameWatch::start(&out);
    t.go();
    t.wait(Duration::from_secs(30 + pairs as u64 * 10));
    let (first, second) = (stamps(&t, "first "), stamps(&t, "stamp "));
    let run = a.finish(FINISH);
    let renames = watch.take();
    let first: HashSet<u64> = first.into_iter().collect();
    let (mut kill_us, mut rename_ms, mut big, mut failed) = (vec![], vec![], vec![], vec![]);
    for v in read_index(&out.join("snapshots.jsonl"))
        .iter()
        .filter(|v| v["kind"] == "hit")
    {
        let stamp = v["hits"][0]["args"][0].as_u64().unwrap_or(0);
        if first.contains(&stamp) {
            big.push(v["bytes"].as_u64().unwrap_or(0));
            continue;
        }
        match v["hit_to_kill_ns"].as_u64() {
            Some(ns) => kill_us.push(ns as f64 / 1e3),
            None => failed.push(format!("{} has no hit_to_kill_ns", v["file"])),
        }
        match renames
            .iter()
            .find(|(_, n)| Some(n.as_str()) == v["file"].as_str())
        {
            Some((t, _)) => rename_ms.push((*t as f64 - stamp as f64) / 1e6),
            None => failed.push(format!("no rename seen for {}", v["file"])),
        }
    }
    let smallest = big.iter().min().copied().unwrap_or(0);
    eprintln!(
        "bench: latency {SETUP}: {} second hits, first snapshots {big:?} bytes",
        kill_us.len()
    );
    let mut v = json!({
        "setup": SETUP,
        "stamps": second.len(),
        "rename_ms": pcts(rename_ms),
        "hit_to_kill_us": pcts(kill_us),
        "first_snapshot_bytes_min": smallest,
    });
    failed.extend(failure(&run));
    if second.len() != pairs || big.len() != pairs {
        failed.push(format!(
            "{} second calls and {} first snapshots for {pairs} pairs",
            second.len(),
            big.len()
        ));
    }
    if smallest < LARGE {
        let why = format!("the smallest first snapshot was {smallest} bytes, under {LARGE}");
        if quick {
            v["no_figure"] = json!(why);
        } else {
            failed.push(why);
        }
    }
    for why in failed {
        mark_failed(&mut v, format!("latency {SETUP}: {why}"));
    }
    v
}
