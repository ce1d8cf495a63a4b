//! Faults: whatever happens, the agent exits with its documented
//! code and one line, the index is valid and lists every completed snapshot,
//! no perf process or program of ours is left, and the target lives on
//! (unless the case kills it). Privileged.
//!
//! Each case prints `FAULT <case>: exit <code> in <ms> ms` (the time from the
//! fault to the agent's exit); run with `--nocapture` to see them.

use std::{
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use mt_agent_tests::*;

fn report(case: &str, run: &Run, since: Instant) {
    eprintln!(
        "FAULT {case}: exit {:?} in {} ms",
        run.code,
        since.elapsed().as_millis()
    );
}

fn error_line(run: &Run) -> String {
    let errors: Vec<&String> = run
        .stderr
        .iter()
        .filter(|l| l.starts_with("mt-agent: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "expected one error line\n{}", run.output());
    errors[0].clone()
}

/// Starts a target and an armed agent on it; the target has had its go.
fn armed(target_args: &[&str], agent_args: &[&str]) -> (Target, Agent) {
    let mut t = Target::start(&target_path("target"), target_args);
    let pid = t.pid().to_string();
    let mut args = vec!["--pid", pid.as_str()];
    args.extend_from_slice(agent_args);
    let mut agent = Agent::start(&args);
    agent.wait_armed();
    t.go();
    (t, agent)
}

#[test]
fn perf_killed_mid_run_is_exit_4_and_keeps_the_snapshots() {
    let (t, agent) = armed(&["calls", "100", "100"], &["--symbol", "trigger"]);
    wait_snapshots(&agent, 2);
    let perf = agent.perf_pid.expect("perf pid");
    let at = Instant::now();
    // SAFETY: plain kill(2) of the perf the agent started.
    unsafe { libc::kill(perf, libc::SIGKILL) };
    let run = agent.finish(FINISH);
    report("perf SIGKILL", &run, at);
    assert_eq!(run.code, Some(4), "{}", run.output());
    assert!(
        error_line(&run).contains("perf ended unexpectedly (signal 9"),
        "{}",
        run.output()
    );
    assert!(run.entries("hit").len() >= 2);
    run.assert_index_consistent();
    assert!(alive(t.pid()));
}

#[test]
fn perf_rejecting_its_event_is_exit_2_and_leaves_no_output() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let at = Instant::now();
    let run = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--event",
        "no-such-event",
    ])
    .finish(FINISH);
    report("perf bad --event", &run, at);
    assert_eq!(run.code, Some(2), "{}", run.output());
    assert!(
        error_line(&run).contains("perf rejected its arguments"),
        "{}",
        run.output()
    );
    assert!(
        run.stderr
            .iter()
            .any(|l| l.contains("perf: ") && l.contains("no-such-event")),
        "{}",
        run.output()
    );
    assert!(
        !run.out.exists(),
        "an unused output directory was left\n{}",
        run.output()
    );
    assert!(alive(t.pid()));
}

#[test]
fn a_killed_target_ends_the_run_cleanly() {
    let (t, agent) = armed(&["calls", "100", "100"], &["--symbol", "trigger"]);
    wait_snapshots(&agent, 2);
    let at = Instant::now();
    t.proc.signal(libc::SIGKILL);
    let run = agent.finish(FINISH);
    report("target SIGKILL", &run, at);
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert!(
        run.stdout.iter().any(|l| l.contains("the target exited")),
        "{}",
        run.output()
    );
    run.assert_index_consistent();
}

#[test]
fn sigint_sigterm_and_sighup_are_clean_ends() {
    for (sig, name) in [
        (libc::SIGINT, "SIGINT"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGHUP, "SIGHUP"),
    ] {
        let (t, agent) = armed(&["calls", "100", "100"], &["--symbol", "trigger"]);
        wait_snapshots(&agent, 1);
        let at = Instant::now();
        agent.proc.signal(sig);
        let run = agent.finish(FINISH);
        report(&format!("agent {name}"), &run, at);
        assert_eq!(run.code, Some(0), "{name}\n{}", run.output());
        assert!(
            run.stdout
                .iter()
                .any(|l| l.contains(&format!("{name} received"))),
            "{}",
            run.output()
        );
        assert_eq!(run.index.last().unwrap()["kind"], "tail");
        run.assert_index_consistent();
        assert!(alive(t.pid()));
    }
}

#[test]
fn a_killed_agent_leaves_no_program_and_perf_finishes() {
    let (t, mut agent) = armed(&["calls", "100", "100"], &["--symbol", "trigger"]);
    wait_snapshots(&agent, 2);
    let perf = agent.perf_pid.expect("perf pid");
    let at = Instant::now();
    agent.proc.signal(libc::SIGKILL);
    let status = agent.proc.wait(Duration::from_secs(5)).expect("agent dies");
    assert_eq!(status.code(), None);
    // The kernel drops the probe with our fds: unloaded within 1 s.
    assert_no_programs_loaded("after SIGKILL of the agent");
    let unloaded = at.elapsed();
    // perf got its death signal (SIGTERM) and finishes its last file.
    let end = Instant::now() + Duration::from_secs(10);
    while alive(perf) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!alive(perf), "perf {perf} lives on after the agent died");
    eprintln!(
        "FAULT agent SIGKILL: programs gone in {} ms, perf gone in {} ms",
        unloaded.as_millis(),
        at.elapsed().as_millis()
    );
    // Everything listed exists; at most the last file and perf.data are unlisted.
    let index = read_index(&agent.out.join("snapshots.jsonl"));
    let listed: Vec<String> = index
        .iter()
        .map(|v| v["file"].as_str().unwrap().to_string())
        .collect();
    for f in &listed {
        assert!(agent.out.join(f).is_file(), "{f} listed but missing");
    }
    let unlisted: Vec<String> = perf_files(&agent.out)
        .into_iter()
        .filter(|f| !listed.contains(f))
        .collect();
    assert!(unlisted.len() <= 1, "unlisted: {unlisted:?}");
    assert!(alive(t.pid()));
    // The next run in the same output directory is refused.
    let out = agent.out.display().to_string();
    let pid = t.pid().to_string();
    let again =
        Agent::start(&["--pid", &pid, "--symbol", "trigger", "--output", &out]).finish(FINISH);
    assert_eq!(again.code, Some(2), "{}", again.output());
    assert!(error_line(&again).contains("not empty"));
}

#[test]
fn a_full_disk_is_exit_4_and_keeps_the_completed_snapshots() {
    let fs_ = Tmpfs::new("size=1m");
    let out = fs_.0.path().join("out").display().to_string();
    let mut t = Target::start(&target_path("target"), &["storm", "30"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--cooldown",
        "10ms",
        "-F",
        "4999",
        "--output",
        &out,
    ]);
    agent.wait_armed();
    let at = Instant::now();
    t.go();
    let run = agent.finish(FINISH);
    report("disk full", &run, at);
    assert_eq!(run.code, Some(4), "{}", run.output());
    assert!(
        error_line(&run).contains("file system is full"),
        "{}",
        run.output()
    );
    let index = read_index(&fs_.0.path().join("out/snapshots.jsonl"));
    assert!(
        !index.is_empty(),
        "snapshots completed before the disk filled are kept"
    );
    for v in &index {
        assert!(
            fs_.0
                .path()
                .join("out")
                .join(v["file"].as_str().unwrap())
                .is_file()
        );
    }
    // Every completed file on disk is listed. The one exception is the
    // newest: if the full disk also refused its index line, the agent says
    // so (exit 4) and cannot list it.
    let listed: Vec<&str> = index.iter().filter_map(|v| v["file"].as_str()).collect();
    let on_disk = perf_files(&fs_.0.path().join("out"));
    let unlisted: Vec<&String> = on_disk
        .iter()
        .filter(|f| !listed.contains(&f.as_str()))
        .collect();
    eprintln!(
        "FAULT disk full: {} files on disk, {} unlisted",
        on_disk.len(),
        unlisted.len()
    );
    assert!(
        unlisted.is_empty() || (unlisted.len() == 1 && Some(unlisted[0]) == on_disk.iter().max()),
        "unlisted files {unlisted:?}\n{}",
        run.output()
    );
    // perf's own words follow the one-line explanation.
    assert!(run.output().contains("perf: "), "{}", run.output());
    assert!(alive(t.pid()));
}

#[test]
fn read_only_output_and_planted_symlinks_are_refused() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let ro = Tmpfs::new("ro,size=1m");
    let out = ro.0.path().join("out").display().to_string();
    let at = Instant::now();
    let run =
        Agent::start(&["--pid", &pid, "--symbol", "trigger", "--output", &out]).finish(FINISH);
    report("read-only output", &run, at);
    assert_eq!(run.code, Some(2), "{}", run.output());
    assert!(error_line(&run).contains("cannot create output directory"));

    // A symlink planted as the output directory, pointing at a directory
    // the agent would accept (empty, ours, mode 0700), is refused by name
    // and never followed: nothing is written through it.
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    fs::create_dir(&victim).unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o700)).unwrap();
    let link = dir.path().join("out");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let o = link.display().to_string();
    // --duration: were the link followed, the run would end by itself.
    let run = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--output",
        &o,
        "--duration",
        "2s",
    ])
    .finish(FINISH);
    report("planted output symlink", &run, at);
    assert_eq!(run.code, Some(2), "{}", run.output());
    let line = error_line(&run);
    assert!(
        line.contains(&o) && line.contains("not a directory"),
        "the refusal does not name the link {o}: {line}"
    );
    assert_eq!(
        fs::read_dir(&victim).unwrap().count(),
        0,
        "written through the link"
    );
    assert!(alive(t.pid()));
}

#[test]
fn two_agents_on_one_target_each_get_every_snapshot() {
    let mut t = Target::start(&target_path("target"), &["calls", "5", "300"]);
    let pid = t.pid().to_string();
    let mut a = Agent::start(&["--pid", &pid, "--symbol", "trigger", "--json"]);
    let mut b = Agent::start(&["--pid", &pid, "--symbol", "trigger", "--json"]);
    a.wait_armed();
    b.wait_armed();
    assert_ne!(a.perf_pid, b.perf_pid, "each agent has its own perf");
    t.go();
    t.wait(Duration::from_secs(20));
    let ra = a.finish_checked(FINISH, false);
    let rb = b.finish(FINISH);
    for run in [&ra, &rb] {
        assert_eq!(run.code, Some(0), "{}", run.output());
        assert_eq!(run.entries("hit").len(), 5, "{}", run.output());
        run.assert_index_consistent();
    }
    eprintln!("FAULT two agents: both exit 0 with 5 hit snapshots each");
}

#[test]
fn ring_buffer_overflow_is_counted_exactly() {
    let (mut t, agent) = armed(
        &["storm", "2"],
        &[
            "--symbol",
            "trigger",
            "--cooldown",
            "0",
            "--ring-bytes",
            "4096",
            "--debug-reader-delay",
            "1s",
            "--json",
        ],
    );
    t.wait(Duration::from_secs(30));
    let at = Instant::now();
    let run = agent.finish(FINISH);
    report("ring-buffer overflow", &run, at);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let s = run.summary().unwrap();
    let c = &s["counters"];
    let n = |v: &serde_json::Value| v.as_u64().unwrap();
    let dropped: u64 = c["dropped"].as_object().unwrap().values().map(n).sum();
    assert!(n(&c["lost"]) > 0, "no records were lost: {s}");
    assert_eq!(n(&c["seen"]), dropped + n(&c["accepted"]), "{s}");
    assert_eq!(
        n(&c["accepted"]),
        n(&s["stats"]["delivered"]) + n(&c["lost"]),
        "{s}"
    );
    eprintln!(
        "FAULT ring-buffer overflow: seen {} accepted {} delivered {} lost {}",
        c["seen"], c["accepted"], s["stats"]["delivered"], c["lost"]
    );
    run.assert_index_consistent();
}

#[test]
fn thread_churn_does_not_hang() {
    // 1000 threads created and joined, `trigger` called after every 100th
    // (10 calls, ~100 ms apart); --cooldown 0 so each is a hit.
    let (mut t, agent) = armed(
        &["churn", "1000"],
        &["--symbol", "trigger", "--cooldown", "0", "--json"],
    );
    let at = Instant::now();
    t.wait(Duration::from_secs(60));
    let run = agent.finish(FINISH);
    report("thread churn", &run, at);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let s = run.summary().unwrap();
    // Every call was a hit, and every hit is in the index.
    let c = &s["counters"];
    assert_eq!(c["seen"], 10, "{s}");
    assert_eq!(c["accepted"], 10, "{s}");
    assert_eq!(run.hits().len(), 10, "{}", run.output());
    assert_eq!(s["stats"]["delivered"], 10, "{s}");
    let cpu = s["perf_cpu_s"]
        .as_f64()
        .expect("the summary shows perf's CPU time");
    let wall = s["duration_s"].as_f64().unwrap();
    let spin_warning = run
        .stdout
        .iter()
        .any(|l| l.contains("\"warning\"") && l.contains("of a core"));
    eprintln!(
        "FAULT thread churn: perf used {cpu:.2} s CPU over {wall:.1} s; spin warning: {spin_warning}"
    );
    // perf's own work here (1000 threads' events and 10 switches) took
    // 0.46 s of a 1.86 s run on 2 loaded cores: 25% of a core, and under
    // load the run only grows longer. A perf spinning after thread exits,
    // as perf 6.1 can (docs/perf-switch-output.md), uses a whole core for
    // the rest of the run, and the agent warns at 90% over 2 s. The bound
    // is loose: 90% of a core over the run.
    assert!(
        cpu < 0.9 * wall,
        "perf used {cpu:.2} s CPU in a {wall:.2} s run: spinning?\n{}",
        run.output()
    );
    assert!(!spin_warning, "{}", run.output());
    run.assert_index_consistent();
}

#[test]
fn pids_that_are_not_targets_are_refused() {
    preflight();
    // A kernel thread.
    let run = Agent::start(&["--pid", "2", "--symbol", "trigger"]).finish(FINISH);
    assert_eq!(run.code, Some(2), "{}", run.output());
    assert!(error_line(&run).contains("kernel thread"));
    // A zombie: a child we do not reap.
    let child = Command::new("true").spawn().unwrap();
    let zpid = child.id() as i32;
    let end = Instant::now() + Duration::from_secs(5);
    while !status_field(zpid, "State").is_some_and(|s| s.starts_with('Z')) {
        assert!(Instant::now() < end, "no zombie");
        std::thread::sleep(Duration::from_millis(10));
    }
    let z = zpid.to_string();
    let run = Agent::start(&["--pid", &z, "--symbol", "trigger"]).finish(FINISH);
    assert_eq!(run.code, Some(2), "{}", run.output());
    assert!(error_line(&run).contains("zombie"), "{}", run.output());
    drop(child);
    // The agent's own pid: `exec` keeps the shell's pid.
    let tmp = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(format!(
        "exec {} --pid $$ --symbol trigger --output {}/out",
        agent_bin().display(),
        tmp.path().display()
    ));
    let mut p = Proc::spawn(cmd);
    let status = p.wait(Duration::from_secs(10)).unwrap();
    assert_eq!(status.code(), Some(2), "{:?}", p.stderr());
    assert!(
        p.stderr().iter().any(|l| l.contains("own pid")),
        "{:?}",
        p.stderr()
    );
    eprintln!("FAULT kernel thread / zombie / own pid: exit 2 each");
}

#[test]
fn least_privilege_capture_as_nobody() {
    // The copied binary, run as `nobody` with exactly CAP_SYS_ADMIN and
    // CAP_SYS_PTRACE (ambient, so perf gets them too), on a root process.
    let mut t = Target::start(&target_path("target"), &["calls", "3", "300"]);
    let pid = t.pid().to_string();
    let nobody = AsNobody::new();
    let out = nobody.out();
    let out_arg = out.display().to_string();
    let cmd = nobody.command(
        &["sys_admin", "sys_ptrace"],
        &[
            "--pid",
            &pid,
            "--symbol",
            "trigger",
            "--max-snapshots",
            "3",
            "--json",
            "--output",
            &out_arg,
        ],
    );
    let mut p = Proc::spawn(cmd);
    assert!(
        p.wait_line(Duration::from_secs(30), |l| l
            .contains("\"event\":\"armed\""))
            .is_some(),
        "not armed as nobody: {:?}",
        p.stderr()
    );
    t.go();
    let status = p.wait(FINISH).expect("agent exits");
    assert_eq!(status.code(), Some(0), "{:?}\n{:?}", p.stdout(), p.stderr());
    let index = read_index(&out.join("snapshots.jsonl"));
    assert_eq!(
        index.iter().filter(|v| v["kind"] == "hit").count(),
        3,
        "{index:?}"
    );
    // Files belong to nobody and are private: every snapshot and the index.
    let nobody = nix::unistd::User::from_name("nobody")
        .unwrap()
        .expect("a user nobody");
    let files: Vec<String> = index
        .iter()
        .map(|v| v["file"].as_str().unwrap().to_string())
        .chain(["snapshots.jsonl".to_string()])
        .collect();
    for f in &files {
        let meta = fs::metadata(out.join(f)).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid()),
            (nobody.uid.as_raw(), nobody.gid.as_raw()),
            "{f} belongs to uid {} gid {}",
            meta.uid(),
            meta.gid()
        );
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{f}");
    }
    assert_no_programs_loaded("after the nobody run");
    assert_no_perf_for(&out, "after the nobody run");
}

/// The nice value of the agent's arming thread (`mt-armer`), once it runs.
fn armer_nice(agent_pid: i32) -> Option<i32> {
    let tasks = fs::read_dir(format!("/proc/{agent_pid}/task")).ok()?;
    tasks.flatten().find_map(|t| {
        let comm = fs::read_to_string(t.path().join("comm")).ok()?;
        (comm.trim() == "mt-armer")
            .then(|| stat_field(&t.path().join("stat"), 19)?.parse().ok())
            .flatten()
    })
}

/// Runs the copied agent as `nobody` with `caps` on a waiting target until
/// it arms; returns the arming thread's nice value.
fn armer_nice_with(caps: &[&str]) -> i32 {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let nobody = AsNobody::new();
    let out = nobody.out().display().to_string();
    let args = [
        "--pid", &pid, "--symbol", "trigger", "--json", "--output", &out,
    ];
    let mut p = Proc::spawn(nobody.command(caps, &args));
    assert!(
        p.wait_line(Duration::from_secs(30), |l| l
            .contains("\"event\":\"armed\""))
            .is_some(),
        "not armed as nobody with {caps:?}: {:?}",
        p.stderr()
    );
    let nice =
        armer_nice(p.pid()).unwrap_or_else(|| panic!("no mt-armer thread: {:?}", p.stderr()));
    p.signal(libc::SIGINT);
    let status = p.wait(FINISH).expect("agent exits");
    assert_eq!(status.code(), Some(0), "{:?}", p.stderr());
    assert_no_perf_for(Path::new(&out), "after the nobody run");
    nice
}

#[test]
fn the_packaged_capabilities_give_the_arming_thread_its_priority() {
    // The capabilities the shipped unit grants, as systemd would: ambient.
    let unit = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/mt-agent.service"),
    )
    .unwrap();
    let caps: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("AmbientCapabilities="))
        .expect("AmbientCapabilities in the unit")
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_lowercase())
        .collect();
    let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
    let packaged = armer_nice_with(&caps);
    // Without CAP_SYS_NICE the thread stays at the agent's nice (0).
    let without = armer_nice_with(&["sys_admin", "sys_ptrace"]);
    eprintln!("arming thread nice: {packaged} with {caps:?}, {without} without CAP_SYS_NICE");
    assert_eq!(packaged, -5, "with {caps:?}");
    assert_eq!(without, 0);
}
