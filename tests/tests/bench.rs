//! The bench harness must not rot: `bench --quick` runs every part (overhead
//! for each setup and first instruction, latency, storm, time to armed,
//! waiting, stacks, stack need, report, switch, snapshot, large) and
//! writes its tables and JSON. No timing is asserted here; the figures live
//! in `cargo xtask bench`. Privileged.

use std::process::Command;

use mt_agent_tests::*;
use serde_json::Value;

#[test]
fn bench_quick_runs_every_part() {
    preflight();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("latest.json");
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("--quick")
        .arg("--out")
        .arg(&json)
        .env("MT_AGENT_BIN", agent_bin())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench --quick failed:\n{stdout}\n{stderr}"
    );
    eprintln!(
        "{stdout}\nbench --quick took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    for heading in [
        "Per-hit overhead",
        "What conditions add",
        "Trigger → snapshot latency",
        "Storm",
        "Time to armed",
        "Waiting: a busy 2-thread target",
        "Stacks: frame pointers vs DWARF",
        "How much stack a DWARF sample needs",
        "Report: `mt-agent report` against the anchor pipeline",
        "Context switches: ns per context switch",
        "What a snapshot costs",
        "Large run:",
    ] {
        assert!(stdout.contains(heading), "no {heading} table:\n{stdout}");
    }
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for row in r["snapshot"]["rows"].as_array().expect("snapshot rows") {
        assert_eq!(row["failed_runs"], 0, "snapshot row {row}");
        assert!(
            row["per_snapshot_ms_p50"]
                .as_f64()
                .is_some_and(f64::is_finite),
            "snapshot row without perf's CPU per snapshot: {row}"
        );
    }
    // Every program's samples were found in the file and measured: a
    // layout the parser does not know would find none.
    for row in r["stack_need"]["rows"].as_array().expect("stack-need rows") {
        assert!(row["failed"].is_null(), "stack-need row {row}");
        let samples = row["samples"].as_u64().unwrap();
        assert!(samples > 0, "stack-need row {row}");
        // A sample whose copy failed (size 0) has no stack part: few.
        let stack = row["stack_samples"].as_u64().unwrap();
        assert!(stack * 100 >= samples * 95, "{row}");
        assert!(row["bytes_for_99_percent"].is_u64(), "{row}");
    }
    let overhead = r["overhead"].as_array().unwrap();
    assert_eq!(overhead.len(), 3, "three first-instruction kinds");
    for (i, row) in overhead.iter().enumerate() {
        // --quick runs the two condition setups on the first kind only.
        let conditions = i == 0;
        let mut setups = vec!["none", "floor", "mt-agent", "perf-event", "hw-breakpoint"];
        if conditions {
            setups.extend(["mt-agent conditions", "mt-agent slower-than"]);
        }
        for setup in setups.iter().copied() {
            assert!(
                row[setup]["median"].as_f64().is_some_and(f64::is_finite),
                "{setup}: {row}"
            );
        }
        // The probes really fired: every call was counted.
        for setup in setups
            .iter()
            .copied()
            .filter(|s| !matches!(*s, "none" | "floor"))
        {
            assert_eq!(row[setup]["hits"], row[setup]["calls"], "{setup}: {row}");
        }
        assert!(
            row["mt-agent"]["program_ns_per_run"].as_f64().is_some(),
            "{row}"
        );
    }
    let rep = &r["report"];
    assert!(rep["files"].as_u64().unwrap() >= 3, "{rep}");
    assert!(rep["bytes"].as_u64().unwrap() >= 10 << 20, "{rep}");
    assert!(rep["ratio"].as_f64().is_some_and(f64::is_finite), "{rep}");
    for l in r["latency"].as_array().unwrap() {
        // perf's own trigger (the anchor) can miss switches: its row then
        // says so instead of pairing stamps with the wrong renames. Every
        // mt-agent row must have figures.
        if l["setup"] == "perf-event" && l["no_figure"].is_string() {
            continue;
        }
        assert!(l["rename_ms"]["n"].as_u64().unwrap() > 0, "{l}");
    }
    // The hit 30 ms after a large snapshot: every second call of a pair
    // has its hit → kill(), and the first snapshots were written.
    let after = r["latency"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| {
            l["setup"]
                .as_str()
                .is_some_and(|s| s.contains("after a large snapshot"))
        })
        .expect("the latency part's after-a-large-snapshot row");
    assert!(after["failed"].is_null(), "{after}");
    assert_eq!(after["hit_to_kill_us"]["n"], after["stamps"], "{after}");
    assert!(
        after["first_snapshot_bytes_min"].as_u64().unwrap() > 1 << 20,
        "{after}"
    );
    let storm = r["storm"].as_array().unwrap();
    for setup in [
        "mt-agent always-armed",
        "mt-agent disarming 100ms",
        "mt-agent disarming 200ms",
    ] {
        let agent = storm.iter().find(|s| s["setup"] == setup).unwrap();
        assert_eq!(
            agent["seen"], agent["accounted"],
            "every hit accounted: {agent}"
        );
    }
    // With a 200 ms cooldown (longer than a detach and an attach here), the
    // uprobe was out of the code at least once.
    let disarming = storm
        .iter()
        .find(|s| s["setup"] == "mt-agent disarming 200ms")
        .unwrap();
    assert!(
        disarming["disarm"]["cycles"].as_u64().unwrap() >= 1,
        "{disarming}"
    );
    assert!(r["time_to_armed"]["median"].as_f64().is_some());
    // Both recording modes were measured, each with a figure for the disk.
    let waiting = r["waiting"].as_array().unwrap();
    assert_eq!(waiting.len(), 2, "{waiting:?}");
    for w in waiting {
        assert!(w["out_bytes_while_waiting"].as_u64().is_some(), "{w}");
    }
    // The storm's calls per second are over the duration the target measured.
    for row in r["storm"].as_array().unwrap() {
        let (calls, secs) = (
            row["calls"].as_f64().unwrap(),
            row["storm_s"].as_f64().unwrap(),
        );
        assert!(secs > 0.0, "{row}");
        // Equal but for float rounding (the harness divides in another order).
        let per_s = row["calls_per_s"].as_f64().unwrap();
        assert!((per_s - calls / secs).abs() <= 1e-9 * per_s.abs(), "{row}");
    }
    let stacks = r["stacks"].as_array().unwrap();
    assert_eq!(
        stacks.len(),
        5,
        "fp, dwarf,4096, dwarf,8192, dwarf,16384, auto"
    );
    for row in stacks {
        assert!(row["samples"].as_u64().unwrap() > 0, "{row}");
        assert!(row["bytes_per_sample"].as_f64().unwrap() > 0.0, "{row}");
    }
    // Every switch setup ran and the ping-pong printed its figure.
    let switch = r["switch"]["rows"].as_array().unwrap();
    assert_eq!(switch.len(), 6, "{switch:?}");
    for row in switch {
        assert!(
            row["ns_per_switch"].as_f64().is_some_and(f64::is_finite),
            "{row}"
        );
    }
    // The large run was reported, its anchor ran on the same files, and
    // Chromium opened the page (no figure is checked against its goal).
    let large = &r["large"];
    assert!(large["snapshots"].as_u64().unwrap() >= 1, "{large}");
    assert!(
        large["files"].as_u64() >= large["snapshots"].as_u64(),
        "{large}"
    );
    assert!(large["page_bytes"].as_u64().unwrap() > 0, "{large}");
    for k in ["ratio", "open_s"] {
        assert!(
            large[k].as_f64().is_some_and(f64::is_finite),
            "{k}: {large}"
        );
    }
    // Nothing left behind.
    assert_no_programs_loaded("after the bench");
    let events = uprobe_events();
    assert!(events.trim().is_empty(), "uprobe events left: {events}");
}
