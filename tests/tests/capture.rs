//! The main job, end to end: a uprobe hit on `trigger` rotates perf's
//! output, repeatedly, without stopping the target. Privileged.

use std::time::Duration;

use mt_agent_tests::*;

#[test]
fn five_hits_give_five_snapshots_and_a_tail() {
    let mut t = Target::start(&target_path("target"), &["calls", "5", "300"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&["--pid", &pid, "--symbol", "trigger", "--max-snapshots", "5"]);
    agent.wait_armed();
    let watcher = Watcher::start(t.pid());
    t.go();
    let run = agent.finish(FINISH);
    let (tracers, states) = watcher.stop();
    assert_eq!(run.code, Some(0), "{}", run.output());

    let hits = run.entries("hit");
    assert_eq!(hits.len(), 5, "{}", run.output());
    for (i, h) in hits.iter().enumerate() {
        let first = &h["hits"][0];
        assert_eq!(first["args"][0], i as u64, "hit {i}: {h}");
        assert_eq!(first["seq"], i as u64 + 1);
        assert_eq!(first["merged"], false);
        assert_eq!(first["tgid"].as_i64(), Some(t.pid() as i64));
        assert!(h["hit_to_kill_ns"].as_u64().is_some());
    }
    let tails = run.entries("tail");
    assert_eq!(tails.len(), 1, "{}", run.output());
    assert_eq!(run.index.last().unwrap()["kind"], "tail");
    run.assert_index_consistent();

    // Every snapshot has samples of the target.
    for e in hits.iter().chain(&tails) {
        let file = run.out.join(e["file"].as_str().unwrap());
        let script = perf_script(&file);
        assert!(
            script.lines().any(|l| l.trim_start().starts_with(&pid)),
            "no samples of pid {pid} in {}:\n{}",
            file.display(),
            script.lines().take(5).collect::<Vec<_>>().join("\n")
        );
    }
    // Never stopped, never traced.
    assert_eq!(
        tracers,
        ["0".to_string()].into_iter().collect(),
        "TracerPid seen: {tracers:?}"
    );
    assert!(
        !states.contains("T") && !states.contains("t"),
        "target states seen: {states:?}"
    );
    t.wait(Duration::from_secs(10));
}

#[test]
fn cooldown_drops_in_the_kernel_and_counts_add_up() {
    // 10,000 calls in a tight loop, 100 us of spinning between them (~1 s).
    let mut t = Target::start(&target_path("target"), &["loop", "10000", "100"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--cooldown",
        "200ms",
        // Every call seen: the probe stays in during cooldowns.
        "--always-armed",
        "--json",
    ]);
    agent.wait_armed();
    t.go();
    t.wait(Duration::from_secs(30));
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let s = run.summary().expect("summary event");
    let c = &s["counters"];
    let seen = c["seen"].as_u64().unwrap();
    let accepted = c["accepted"].as_u64().unwrap();
    let dropped = c["dropped"]["cooldown"].as_u64().unwrap();
    assert_eq!(seen, 10_000, "{s}");
    assert_eq!(seen, dropped + accepted, "{s}");
    assert_eq!(c["lost"], 0);
    let hit_snapshots = s["stats"]["hit_snapshots"].as_u64().unwrap();
    let merged = s["stats"]["merged"].as_u64().unwrap();
    assert_eq!(accepted, hit_snapshots + merged, "{s}");
    // The target spins at least 10,000 x 100 us = 1 s, however slow the
    // machine, so a 200 ms cooldown opens at least 5 times; 2 is a loose
    // floor. The cooldown's upper bound is checked below on the kernel's
    // clock, not against how long the test took.
    assert!(
        accepted >= 2,
        "expected several accepted hits over 1 s: {s}"
    );
    assert!(hit_snapshots >= 1, "{s}");
    assert_eq!(run.entries("hit").len() as u64, hit_snapshots);
    // The cooldown itself, on the kernel's clock: one calling thread, so
    // accepted hits are at least 200 ms apart.
    let mut times: Vec<u64> = run
        .hits()
        .iter()
        .map(|h| h["ktime_ns"].as_u64().unwrap())
        .collect();
    times.sort_unstable();
    assert_eq!(times.len() as u64, accepted, "{s}");
    for w in times.windows(2) {
        assert!(
            w[1] - w[0] >= 200_000_000,
            "accepted {} ns apart: {s}",
            w[1] - w[0]
        );
    }
    run.assert_index_consistent();
}

#[test]
fn ctrl_c_on_the_process_group_is_a_clean_end() {
    let mut t = Target::start(&target_path("target"), &["calls", "100", "200"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&["--pid", &pid, "--symbol", "trigger", "--json"]);
    agent.wait_armed();
    t.go();
    // Let a few snapshots happen, then press Ctrl-C.
    agent
        .proc
        .wait_line(Duration::from_secs(10), |l| {
            l.contains("\"event\":\"snapshot\"")
        })
        .expect("a snapshot before Ctrl-C");
    agent.proc.signal_group(libc::SIGINT);
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert_eq!(
        run.index.last().unwrap()["kind"],
        "tail",
        "{}",
        run.output()
    );
    let s = run.summary().unwrap();
    assert_eq!(
        s["perf_exit"], "exit status 0",
        "perf did not exit cleanly: {s}"
    );
    assert!(s["end"].as_str().unwrap().contains("SIGINT"), "{s}");
    run.assert_index_consistent();
    // The target was not touched: it runs on (a zombie would have died, a
    // stopped target would be alive but gain no CPU time). It burns CPU
    // between calls; 10 s is loose for 2 loaded cores.
    assert!(alive(t.pid()), "{:?}", status_field(t.pid(), "State"));
    assert!(
        runs_on(t.pid(), Duration::from_secs(10)),
        "the target does not run on after the agent's end: {:?}",
        status_field(t.pid(), "State")
    );
}

#[test]
fn target_exit_ends_the_run_with_a_tail() {
    let mut t = Target::start(&target_path("target"), &["calls", "3", "200"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&["--pid", &pid, "--symbol", "trigger", "--json"]);
    agent.wait_armed();
    t.go();
    t.wait(Duration::from_secs(10));
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert_eq!(run.entries("hit").len(), 3, "{}", run.output());
    assert_eq!(
        run.index.last().unwrap()["kind"],
        "tail",
        "{}",
        run.output()
    );
    assert!(
        run.summary().unwrap()["end"]
            .as_str()
            .unwrap()
            .contains("target exited")
    );
    run.assert_index_consistent();
}

#[test]
fn json_events_are_one_object_per_line() {
    let mut t = Target::start(&target_path("target"), &["calls", "3", "300"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--max-snapshots",
        "3",
        "--json",
    ]);
    agent.wait_armed();
    t.go();
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let events: Vec<serde_json::Value> = run
        .stdout
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().expect("event field"))
        .collect();
    for k in &kinds {
        assert!(
            [
                "armed",
                "hit_accepted",
                "disarmed",
                "rearmed",
                "snapshot",
                "warning",
                "summary",
                "error"
            ]
            .contains(k),
            "unknown event {k}"
        );
    }
    assert_eq!(kinds.first(), Some(&"armed"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"summary"), "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| **k == "hit_accepted").count(),
        3,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "snapshot").count(),
        4,
        "{kinds:?}"
    );
    let armed = &events[0];
    for f in [
        "pid",
        "perf_pid",
        "event",
        "freq",
        "symbol",
        "object",
        "attach_offset",
        "uprobes",
        "output",
        "time_to_armed_ms",
    ] {
        assert!(!armed[f].is_null(), "armed lacks {f}: {armed}");
    }
    let summary = events.last().unwrap();
    for f in [
        "end",
        "exit_code",
        "counters",
        "stats",
        "perf_cpu_s",
        "perf_exit",
        "agent_peak_rss_kib",
        "duration_s",
        "output",
        "disarm",
    ] {
        assert!(!summary[f].is_null(), "summary lacks {f}: {summary}");
    }
    let snap = events.iter().find(|e| e["event"] == "snapshot").unwrap();
    for f in ["n", "kind", "file", "bytes", "hits", "hit_to_kill_ns"] {
        assert!(!snap[f].is_null(), "snapshot lacks {f}: {snap}");
    }
}

/// The mark (PASS, INFO, FAIL) of `mt-agent check`'s line about `what`.
fn check_mark<'a>(text: &'a str, what: &str) -> &'a str {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.get(4..).is_some_and(|r| r.trim_start().starts_with(what)))
        .filter(|l| {
            l.get(4..)
                .is_some_and(|r| !r.trim_start()[what.len()..].starts_with('_'))
        })
        .collect();
    assert_eq!(lines.len(), 1, "one line for {what}:\n{text}");
    &lines[0][..4]
}

/// Whether perf counts hardware cycles here (`perf stat -e cycles`).
fn hardware_cycles_count() -> bool {
    let out = std::process::Command::new(perf_bin().unwrap())
        .args(["stat", "-x", ",", "-e", "cycles", "--", "true"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    let line = text
        .lines()
        .find(|l| l.contains(",cycles"))
        .unwrap_or_else(|| panic!("no cycles line from perf stat:\n{text}"));
    !line.starts_with('<')
}

/// Whether `perf list` shows the Intel PT PMU.
fn perf_lists_intel_pt() -> bool {
    let out = std::process::Command::new(perf_bin().unwrap())
        .args(["list", "pmu"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).contains("intel_pt//")
}

#[test]
fn check_passes_here_and_fails_on_a_fake_perf() {
    preflight();
    let ok = std::process::Command::new(agent_bin())
        .arg("check")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&ok.stdout);
    assert_eq!(ok.status.code(), Some(0), "{text}");
    for what in [
        "kernel",
        "BTF",
        "privileges",
        "BPF",
        "uprobe PMU",
        "perf",
        "perf_event_paranoid",
        "lockdown",
        "free space",
    ] {
        assert_eq!(check_mark(&text, what), "PASS", "{what}:\n{text}");
    }
    // What mt-agent does without: PASS when this machine has it, INFO when
    // not, each as perf itself finds it.
    let hardware = hardware_cycles_count();
    assert_eq!(
        check_mark(&text, "hardware PMU"),
        if hardware { "PASS" } else { "INFO" },
        "perf stat counts cycles: {hardware}\n{text}"
    );
    let intel_pt = perf_lists_intel_pt();
    assert_eq!(
        check_mark(&text, "Intel PT"),
        if intel_pt { "PASS" } else { "INFO" },
        "perf list shows intel_pt: {intel_pt}\n{text}"
    );
    // perf_event_paranoid (2 and above limit perf) fails without
    // CAP_PERFMON or CAP_SYS_ADMIN: `nobody` with no capability.
    let paranoid: i32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let nobody = AsNobody::new();
    let out = nobody.command(&[], &["check"]).output().unwrap();
    let unprivileged = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{unprivileged}");
    assert_eq!(
        check_mark(&unprivileged, "perf_event_paranoid"),
        if paranoid >= 2 { "FAIL" } else { "PASS" },
        "perf_event_paranoid is {paranoid}:\n{unprivileged}"
    );
    let bad = std::process::Command::new(agent_bin())
        .args(["check", "--perf", "/bin/true"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&bad.stdout);
    assert_eq!(bad.status.code(), Some(3), "{text}");
    let perf = text
        .lines()
        .position(|l| l.starts_with("FAIL  perf"))
        .unwrap_or_else(|| panic!("no FAIL perf line:\n{text}"));
    assert!(
        text.lines().nth(perf + 1).unwrap_or("").contains("fix:"),
        "a FAIL without a fix:\n{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("FAIL")).count(),
        1,
        "only perf fails:\n{text}"
    );
    assert_no_programs_loaded("after check");
}

#[test]
fn verbose_forwards_the_ebpf_log() {
    let mut t = Target::start(&target_path("target"), &["calls", "2", "300"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&["--pid", &pid, "--symbol", "trigger", "-v"]);
    agent.wait_armed();
    t.go();
    t.wait(Duration::from_secs(10));
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let logged = run
        .stderr
        .iter()
        .filter(|l| l.contains("mt-agent: hit accepted, trigger 0"))
        .count();
    assert_eq!(
        logged,
        2,
        "aya-log records from the eBPF program\n{}",
        run.output()
    );
}

/// Scheduling policies (field 41 of /proc/PID/task/TID/stat) of every
/// thread of `pid`.
fn thread_policies(pid: i32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| stat_field(&e.ok()?.path().join("stat"), 41)?.parse().ok())
        .collect()
}

#[test]
fn rt_priority_raises_the_reader_and_not_perf() {
    let mut t = Target::start(&target_path("target"), &["calls", "2", "200"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--rt-priority",
        "10",
        "--max-snapshots",
        "2",
        "--json",
    ]);
    agent.wait_armed();
    let perf = agent.perf_pid.expect("perf pid in the armed line");
    let ours = thread_policies(agent.proc.pid());
    let perfs = thread_policies(perf);
    t.go();
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert!(
        ours.contains(&(libc::SCHED_FIFO as u32)),
        "no agent thread under SCHED_FIFO: {ours:?}"
    );
    // Not real-time: perf runs under SCHED_BATCH, whatever the reader's
    // policy (its wake-ups must not preempt the driver: docs/disarming.md).
    assert!(
        !perfs.is_empty() && perfs.iter().all(|p| *p == libc::SCHED_BATCH as u32),
        "perf is not under SCHED_BATCH (3), or inherited a real-time policy: {perfs:?}"
    );
    assert_eq!(run.entries("hit").len(), 2, "{}", run.output());
}
