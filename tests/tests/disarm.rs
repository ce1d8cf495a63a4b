//! Disarming: while a `--pid` trigger's cooldown runs, its uprobes are out
//! of the target's code, and they are back once it ends. The code is read
//! from /proc/PID/mem and compared with the executable's file: a uprobe is
//! an int3 (0xCC) written over the first byte of its instruction.
//! Privileged.

use std::{
    fs,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    time::Duration,
};

use mt_agent_tests::*;
use serde_json::Value;

const EVENT: Duration = Duration::from_secs(30);

/// The `armed` event's trigger object and the number of uprobes.
fn armed_event(agent: &Agent) -> Value {
    agent
        .proc
        .stdout()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "armed")
        .expect("armed event")
}

/// The bytes of `object`'s executable mapping in `pid` that differ from
/// the file: (file offset, byte in memory).
fn code_changes(pid: i32, object: &Path) -> Vec<(u64, u8)> {
    let want = fs::canonicalize(object).unwrap();
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let file = fs::File::open(&want).unwrap();
    let file_len = file.metadata().unwrap().len();
    let mem = fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut changes = Vec::new();
    let mut found = false;
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || fs::canonicalize(f[5]).ok() != Some(want.clone()) {
            continue;
        }
        found = true;
        let (start, end) = f[0].split_once('-').unwrap();
        let start = u64::from_str_radix(start, 16).unwrap();
        let end = u64::from_str_radix(end, 16).unwrap();
        let off = u64::from_str_radix(f[2], 16).unwrap();
        let len = (end - start).min(file_len.saturating_sub(off)) as usize;
        let mut in_file = vec![0u8; len];
        let mut in_mem = vec![0u8; len];
        file.read_exact_at(&mut in_file, off).unwrap();
        mem.read_exact_at(&mut in_mem, start).unwrap();
        for (i, (a, b)) in in_file.iter().zip(&in_mem).enumerate() {
            if a != b {
                changes.push((off + i as u64, *b));
            }
        }
    }
    assert!(
        found,
        "no executable mapping of {} in {pid}",
        want.display()
    );
    changes
}

/// Every change is an int3, `n` of them, one at `entry`.
fn assert_probed(changes: &[(u64, u8)], n: usize, entry: u64, when: &str) {
    assert_eq!(changes.len(), n, "{when}: {changes:x?}");
    assert!(
        changes.iter().all(|(_, b)| *b == 0xCC),
        "{when}: {changes:x?}"
    );
    assert!(
        changes.iter().any(|(o, _)| *o == entry),
        "{when}: {changes:x?}"
    );
}

fn wait_event(agent: &mut Agent, name: &str) {
    let tag = format!("\"event\":\"{name}\"");
    assert!(
        agent.proc.wait_line(EVENT, |l| l.contains(&tag)).is_some(),
        "no {name} event; exit {:?}\nstdout: {:?}\nstderr: {:?}",
        agent.proc.try_status(),
        agent.proc.stdout(),
        agent.proc.stderr()
    );
}

struct Armed {
    object: PathBuf,
    entry: u64,
    /// Breakpoints the probes write into the code.
    uprobes: usize,
}

fn armed_info(agent: &Agent) -> Armed {
    let a = armed_event(agent);
    Armed {
        object: PathBuf::from(a["object"].as_str().unwrap()),
        entry: a["attach_offset"].as_u64().unwrap(),
        // A uretprobe shares the entry's breakpoint: one `int3` fewer.
        uprobes: a["uprobes"].as_u64().unwrap() as usize - usize::from(a["returns"] == "uretprobe"),
    }
}

/// Armed, disarmed by a hit, armed again after the cooldown: the code
/// holds the probes, then is the file's own, then holds them again.
fn probes_leave_and_come_back(target_args: &[&str], agent_args: &[&str]) -> (Target, Run) {
    let mut t = Target::start(&target_path("target"), target_args);
    let pid = t.pid().to_string();
    let mut args = vec!["--pid", &pid, "--json"];
    args.extend_from_slice(agent_args);
    let mut agent = Agent::start(&args);
    agent.wait_armed();
    let a = armed_info(&agent);
    assert_probed(
        &code_changes(t.pid(), &a.object),
        a.uprobes,
        a.entry,
        "armed",
    );
    t.go();
    // `disarmed` comes once the detach has returned: the code is clean
    // from then until the re-arm, a cooldown (2 s) after the hit.
    wait_event(&mut agent, "disarmed");
    assert_eq!(code_changes(t.pid(), &a.object), vec![], "while disarmed");
    // `rearmed` comes once the attach has returned.
    wait_event(&mut agent, "rearmed");
    assert_probed(
        &code_changes(t.pid(), &a.object),
        a.uprobes,
        a.entry,
        "re-armed",
    );
    agent.proc.signal(libc::SIGINT);
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let d = &run.summary().expect("summary")["disarm"];
    assert!(d["cycles"].as_u64().unwrap() >= 1, "{d}");
    assert!(d["disarmed_s"].as_f64().unwrap() > 0.0, "{d}");
    // The index has the cycle too: started by the time of the hit's line,
    // ended (with its time) by the tail's.
    let hit = run.entries("hit")[0];
    assert_eq!(hit["disarm"]["cycles"], 1, "{hit}");
    let tail = run.entries("tail")[0];
    assert!(tail["disarm"]["cycles"].as_u64().unwrap() >= 1, "{tail}");
    assert!(
        tail["disarm"]["disarmed_ns"].as_u64().unwrap() > 0,
        "{tail}"
    );
    run.assert_index_consistent();
    (t, run)
}

#[test]
fn the_entry_probe_leaves_the_code_during_the_cooldown() {
    // trigger(0) right after go, trigger(1) 20 s later: one cooldown of 2 s
    // in between, with the target alive throughout.
    let (_t, run) = probes_leave_and_come_back(
        &["calls", "2", "20000"],
        &["--symbol", "trigger", "--cooldown", "2s"],
    );
    assert_eq!(run.entries("hit").len(), 1, "{}", run.output());
}

#[test]
fn a_slower_than_trigger_keeps_its_probes_in_during_the_cooldown() {
    // f_slow(10) is slow: a hit at its return; the target then waits. The
    // entry and `ret` probes stay in through the 2 s cooldown, so that a
    // call entering in it is timed (docs/disarming.md).
    let mut t = Target::start(&target_path("target"), &["slowwait", "15"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--json",
        "--symbol",
        "f_slow",
        "--slower-than",
        "25ms",
        "--cooldown",
        "2s",
    ]);
    agent.wait_armed();
    let a = armed_info(&agent);
    t.go();
    wait_event(&mut agent, "hit_accepted");
    // A disarm would have taken the probes out within ms of the hit
    // (docs/disarming.md); look well after that, well inside the cooldown.
    std::thread::sleep(Duration::from_millis(500));
    assert_probed(
        &code_changes(t.pid(), &a.object),
        a.uprobes,
        a.entry,
        "in the cooldown",
    );
    agent.proc.signal(libc::SIGINT);
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert_eq!(run.entries("hit").len(), 1, "{}", run.output());
    let s = run.summary().expect("summary");
    assert_eq!(s["disarm"]["cycles"], 0, "{s}");
    assert!(!run.stdout.iter().any(|l| l.contains("\"disarmed\"")));
}

#[test]
fn always_armed_and_cooldown_zero_never_disarm() {
    for extra in [&["--always-armed"][..], &["--cooldown", "0"][..]] {
        let mut t = Target::start(&target_path("target"), &["loop", "2000", "100"]);
        let pid = t.pid().to_string();
        let mut args = vec!["--pid", &pid, "--symbol", "trigger", "--json"];
        args.extend_from_slice(extra);
        let mut agent = Agent::start(&args);
        agent.wait_armed();
        t.go();
        t.wait(Duration::from_secs(60));
        let run = agent.finish(FINISH);
        assert_eq!(run.code, Some(0), "{extra:?}\n{}", run.output());
        let s = run.summary().expect("summary");
        // Every call is seen: nothing was detached.
        assert_eq!(s["counters"]["seen"], 2000, "{extra:?}: {s}");
        assert_eq!(s["disarm"]["cycles"], 0, "{extra:?}: {s}");
        assert!(!run.stdout.iter().any(|l| l.contains("\"disarmed\"")));
        assert!(
            run.index.iter().all(|e| e.get("disarm").is_none()),
            "{extra:?}: {:?}",
            run.index
        );
    }
}

/// `storm 3` (trigger as fast as one thread can, for 3 s) under the agent
/// with `args`: the summary, after checking that every accepted hit has
/// its snapshot, that each accepted hit but maybe the last disarmed the
/// trigger, and that the probes came and went as tracefs uprobe events.
fn tight_loop(args: &[&str]) -> (u64, Value) {
    let mut t = Target::start(&target_path("target"), &["storm", "3"]);
    let pid = t.pid().to_string();
    let mut all = vec!["--pid", &pid, "--symbol", "trigger", "--json"];
    all.extend_from_slice(args);
    let mut agent = Agent::start(&all);
    agent.wait_armed();
    // As root, the arming thread runs 5 nice steps above the agent
    // (docs/disarming.md).
    assert_eq!(armer_nice(agent.proc.pid()), Some(-5));
    t.go();
    t.wait(Duration::from_secs(60));
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let s = run.summary().expect("summary");
    let accepted = s["counters"]["accepted"].as_u64().unwrap();
    // Every accepted hit has its snapshot.
    let snapshots = s["stats"]["hit_snapshots"].as_u64().unwrap();
    let merged = s["stats"]["merged"].as_u64().unwrap();
    assert_eq!(accepted, snapshots + merged, "{s}");
    assert_eq!(run.hits().len() as u64, accepted, "{s}");
    assert!(
        s["disarm"]["cycles"].as_u64().unwrap() >= accepted - 1,
        "{s}"
    );
    // As root with tracefs, the fast way (docs/disarming.md), each re-arm
    // after a warm-up that took the kernel's grace period ahead of it.
    assert_eq!(s["disarm"]["probes"], "uprobe_events", "{s}");
    let rearms = s["disarm"]["cycles"].as_u64().unwrap() - u64::from(accepted > 0);
    assert!(
        s["disarm"]["warmed_arms"].as_u64().unwrap() >= rearms.min(1),
        "{s}"
    );
    run.assert_index_consistent();
    (accepted, s)
}

/// The nice value of the agent's arming thread (`mt-armer`), if it has one.
fn armer_nice(pid: i32) -> Option<i64> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
        .find(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "mt-armer")
        })
        .and_then(|e| nice_in(&e.path().join("stat")))
}

/// The nice value (field 19) of a `stat` file.
fn nice_in(stat: &Path) -> Option<i64> {
    stat_field(stat, 19)?.parse().ok()
}

#[test]
fn an_agent_niced_down_keeps_its_arming_thread_below_normal_priority() {
    // An operator's `nice -n 10 mt-agent`: the arming thread goes 5 steps
    // above the agent, to 5, not to -5 above every other process.
    use std::os::unix::process::CommandExt;
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start_with(&["--pid", &pid, "--symbol", "trigger", "--json"], |c| {
        // SAFETY: setpriority is async-signal-safe; pid 0 is the child.
        unsafe {
            c.pre_exec(|| {
                libc::setpriority(libc::PRIO_PROCESS, 0, 10);
                Ok(())
            });
        }
    });
    agent.wait_armed();
    let own = nice_in(Path::new(&format!("/proc/{}/stat", agent.proc.pid())));
    let armer = armer_nice(agent.proc.pid());
    agent.proc.signal(libc::SIGINT);
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert_eq!((own, armer), (Some(10), Some(5)));
}

#[test]
fn a_tight_loop_loses_no_hit_that_could_be_accepted() {
    let (accepted, s) = tight_loop(&["--cooldown", "200ms"]);
    // 3 s / 200 ms = 15 cooldowns. A re-arm later than the cooldown's end
    // loses that much of the next one; the attach is asked for ahead of
    // the end, so that is rare. Within one, as the issue asks; on a
    // machine so loaded that an attach (about 15 ms here) is late by more
    // than a whole cooldown, this would fail and say so.
    assert!(
        (14..=16).contains(&accepted),
        "{accepted} accepted hits in 3 s with a 200 ms cooldown: {s}"
    );
}

#[test]
fn slower_than_durations_stay_true_through_cooldowns() {
    // 40 calls of 20 ms, every tenth 60 ms, with calls in flight at each
    // hit. A return must never be matched with another call's entry (when
    // the probes went out for the cooldown, 20 ms calls were reported as
    // ~100 ms ones).
    let mut t = Target::start(&target_path("target"), &["slowmix", "40"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "f_mix",
        "--slower-than",
        "40ms",
        "--cooldown",
        "100ms",
        "--json",
    ]);
    agent.wait_armed();
    t.go();
    t.wait(Duration::from_secs(60));
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let hits: Vec<(u64, u64)> = run
        .hits()
        .iter()
        .map(|h| {
            (
                h["args"][0].as_u64().unwrap(),
                h["duration_ns"].as_u64().unwrap(),
            )
        })
        .collect();
    // Calls 9, 19, 29, 39; the 100 ms cooldown never covers the next one.
    // Exact, because no 20 ms call reaches the 40 ms threshold: that needs
    // its nanosleep to wake 20 ms late, and the 60 ms calls here woke
    // 0.13-0.16 ms late (durations 60.127-60.156 ms in two runs on 2
    // loaded cores): a woken sleeper waits a scheduler slice (3 ms) or
    // so, not 20. A spurious hit would fail here, and say so.
    let args: Vec<u64> = hits.iter().map(|h| h.0).collect();
    assert_eq!(args, vec![9, 19, 29, 39], "{hits:?}\n{}", run.output());
    // 60 ms of sleep: the lower bound is the sleep, the upper one is loose
    // (a preempted call on a loaded machine), far below the ~100 ms+ of a
    // mismatched entry.
    for (arg, ns) in &hits {
        assert!(
            (60_000_000..90_000_000).contains(ns),
            "call {arg} took {ns} ns by the hit: {hits:?}"
        );
    }
    let s = run.summary().expect("summary");
    assert_eq!(s["disarm"]["cycles"], 0, "{s}");
}

#[test]
fn max_rate_disarms_for_its_interval() {
    // --max-rate 2/s: after a hit no call is accepted for 500 ms, longer
    // than the cooldown, so the trigger stays out that long: 3 s / 500 ms.
    let (accepted, s) = tight_loop(&["--cooldown", "100ms", "--max-rate", "2/s"]);
    assert!(
        (5..=7).contains(&accepted),
        "{accepted} accepted hits in 3 s at --max-rate 2/s: {s}"
    );
    // Out for most of each 500 ms, not only for the 100 ms cooldown.
    let cycles = s["disarm"]["cycles"].as_f64().unwrap();
    let out = s["disarm"]["disarmed_s"].as_f64().unwrap();
    assert!(out / cycles > 0.3, "{out} s out over {cycles} cycles: {s}");
    // The rate's counter: the kernel tries the rate before the cooldown
    // (agent-ebpf's filter order), and its 500 ms interval covers the
    // 100 ms cooldown, so every call it saw and did not accept was dropped
    // for the rate (1677 and 2826 of them in two runs: calls made between
    // an early re-arm and the interval's end), none for anything else.
    let c = &s["counters"];
    let n = |v: &Value| v.as_u64().unwrap();
    let dropped = c["dropped"].as_object().unwrap();
    assert_eq!(
        n(&dropped["rate"]),
        n(&c["seen"]) - n(&c["accepted"]),
        "{s}"
    );
    for (reason, count) in dropped {
        assert!(
            reason == "rate" || n(count) == 0,
            "dropped for {reason}: {s}"
        );
    }
}

/// A target calling `trigger` twice, 20 s apart, and an armed agent on it
/// with `--cooldown COOLDOWN --json`, after its event `event`.
fn agent_on_calls(cooldown: &str, event: &str) -> (Target, Agent, Armed) {
    let mut t = Target::start(&target_path("target"), &["calls", "2", "20000"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--cooldown",
        cooldown,
        "--json",
    ]);
    agent.wait_armed();
    let a = armed_info(&agent);
    t.go();
    wait_event(&mut agent, event);
    (t, agent, a)
}

/// SIGKILLs the agent and waits for it to die.
fn sigkill(agent: &mut Agent) {
    agent.proc.signal(libc::SIGKILL);
    let status = agent.proc.wait(Duration::from_secs(5)).expect("agent dies");
    assert_eq!(status.code(), None);
}

#[test]
fn a_killed_agent_while_disarmed_leaves_no_probe_and_no_program() {
    let (t, mut agent, a) = agent_on_calls("5s", "disarmed");
    sigkill(&mut agent);
    assert_no_programs_loaded("after SIGKILL of a disarmed agent");
    assert_eq!(code_changes(t.pid(), &a.object), vec![], "after SIGKILL");
    assert_no_uprobe_events_of(agent.proc.pid());
}

/// The agent's tracefs uprobe events (group `mt_agent_PID`) are deleted
/// by its reaper once it is gone: polled, since the reaper retries while
/// the dying agent's perf events still hold them.
fn assert_no_uprobe_events_of(agent_pid: i32) {
    let group = format!("mt_agent_{agent_pid}/");
    let listing = uprobe_events;
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while listing().contains(&group) && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !listing().contains(&group),
        "uprobe events left after the agent died:\n{}",
        listing()
    );
    // The reaper exits once it has deleted them (tests run one at a
    // time, so a reaper here is this agent's).
    let reapers = || processes_named("mt-agent-reaper").len();
    while reapers() > 0 && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(reapers(), 0, "the reaper is still running");
}

#[test]
fn a_killed_agent_after_a_rearm_leaves_no_probe_and_no_program() {
    let (t, mut agent, a) = agent_on_calls("1s", "rearmed");
    sigkill(&mut agent);
    // The probes the arming thread attached go with the agent's fds.
    assert_no_programs_loaded("after SIGKILL of a re-armed agent");
    let end = std::time::Instant::now() + Duration::from_secs(10);
    // The kernel closes the fds as the process dies; the unregistering
    // waits for RCU grace periods, so poll (bounded) rather than assert
    // at once.
    let mut changes = code_changes(t.pid(), &a.object);
    while !changes.is_empty() && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        changes = code_changes(t.pid(), &a.object);
    }
    assert_eq!(changes, vec![], "after SIGKILL");
    assert_no_uprobe_events_of(agent.proc.pid());
}

/// Kills strace on drop.
struct Strace(std::process::Child);

impl Drop for Strace {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_held_up_detach_does_not_hold_up_the_agents_end() {
    // The kernel's last close of a uprobe can wait for as long as a CPU's
    // kworker is starved (60 s+ seen here, docs/disarming.md). strace
    // stands in for such a kernel: it holds up every close_range of the
    // agent and of the children it forks (the last closes) for 10 s,
    // longer than the agent waits for them (5 s, then 1 s).
    let (t, agent, a) = agent_on_calls("5s", "disarmed");
    let agent_pid = agent.proc.pid();
    let strace = Strace(
        std::process::Command::new("strace")
            .args(["-f", "-qq", "-e", "trace=close_range"])
            .args(["-e", "inject=close_range:delay_enter=10000000"])
            .args(["-p", &agent_pid.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("strace (cargo xtask setup --with-test-deps installs it)"),
    );
    let traced = || status_field(agent_pid, "TracerPid").is_some_and(|p| p.trim() != "0");
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while !traced() {
        assert!(std::time::Instant::now() < end, "strace did not attach");
        std::thread::sleep(Duration::from_millis(10));
    }
    agent.proc.signal(libc::SIGINT);
    let run = agent.finish_checked(FINISH, false);
    assert_eq!(run.code, Some(0), "{}", run.output());
    // The agent ended while its children still held the probes.
    let held = processes_named("mt-agent-detach");
    assert!(!held.is_empty(), "no child held up\n{}", run.output());
    assert!(
        run.output().contains("mt-agent-detach (pid"),
        "no warning\n{}",
        run.output()
    );
    // Once the closes are let through, nothing is left: programs, the
    // children, the uprobe events (the reaper deletes them), the int3s.
    drop(strace);
    assert_nothing_left_within(Duration::from_secs(30), &run.output());
    assert_no_uprobe_events_of(agent_pid);
    assert_eq!(code_changes(t.pid(), &a.object), vec![], "after the end");
}
