//! Finding targets without a pid: `--exe` (one recorder per process of an
//! executable, including processes started later) and `--config` (several
//! triggers in one agent). Privileged.

use std::{
    fs,
    time::{Duration, Instant},
};

use mt_agent_tests::*;
use serde_json::Value;

fn events(p: &Proc) -> Vec<Value> {
    p.stdout()
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits for a JSON event satisfying `pred`.
fn wait_event(agent: &mut Agent, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(e) = events(&agent.proc).into_iter().find(|e| pred(e)) {
            return e;
        }
        assert!(
            Instant::now() < end && agent.proc.try_status().is_none(),
            "no {what}; stdout {:?}\nstderr {:?}",
            agent.proc.stdout(),
            agent.proc.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn started(pid: i32) -> impl Fn(&Value) -> bool {
    move |e| e["event"] == "target_started" && e["pid"] == pid
}

#[test]
fn exe_records_every_process_of_an_executable() {
    let bin = target_path("target");
    let exe = bin.display().to_string();
    // Two processes before the agent starts...
    let mut p1 = Target::start(&bin, &["calls", "3", "300"]);
    let mut p2 = Target::start(&bin, &["calls", "3", "300"]);
    let mut agent = Agent::start(&[
        "--exe",
        &exe,
        "--symbol",
        "trigger",
        "--max-targets",
        "3",
        "--json",
    ]);
    agent.wait_armed();
    wait_event(&mut agent, "recorder for p1", started(p1.pid()));
    wait_event(&mut agent, "recorder for p2", started(p2.pid()));
    // ...one after it is armed (found through the exec tracepoint)...
    let mut p3 = Target::start(&bin, &["calls", "3", "300"]);
    wait_event(&mut agent, "recorder for p3", started(p3.pid()));
    // ...and a fourth, beyond --max-targets 3.
    let mut p4 = Target::start(&bin, &["calls", "2", "200"]);
    wait_event(&mut agent, "the extra process report", |e| {
        e["event"] == "warning"
            && e["message"]
                .as_str()
                .unwrap_or("")
                .contains(&format!("pid {}", p4.pid()))
    });
    for p in [&mut p1, &mut p2, &mut p3] {
        p.go();
    }
    for p in [&mut p1, &mut p2, &mut p3] {
        p.wait(Duration::from_secs(20));
    }
    // Each recorder is finalized when its process exits.
    for p in [&p1, &p2, &p3] {
        let pid = p.pid();
        wait_event(&mut agent, "recorder finalized", move |e| {
            e["event"] == "target_finished" && e["pid"] == pid
        });
    }
    // The fourth calls the trigger too, alone (no cooldown with the others):
    // its two hits have no recorder, and are counted.
    p4.go();
    p4.wait(Duration::from_secs(20));
    agent.proc.signal(libc::SIGINT);
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let s = run.summary().unwrap();
    assert_eq!(s["extra_processes"], 1, "{s}");
    assert_eq!(s["unrecorded_hits"], 2, "{s}");
    let recorders = s["recorders"].as_array().expect("recorders in the summary");
    assert_eq!(recorders.len(), 3, "{s}");
    for p in [&p1, &p2, &p3] {
        let dir = run.out.join(p.pid().to_string());
        let index = read_index(&dir.join("snapshots.jsonl"));
        let hits: Vec<&Value> = index.iter().filter(|v| v["kind"] == "hit").collect();
        // Every call has its snapshot; with the flight recorder (the default
        // for --exe) a switch takes ~200 ms, so a call can share one (merged).
        assert_eq!(listed_hits(&index), 3, "pid {}: {index:?}", p.pid());
        assert!(hits.iter().all(|h| h["hits"][0]["tgid"] == p.pid()));
        assert_eq!(index.last().unwrap()["kind"], "tail");
        for v in &index {
            assert!(dir.join(v["file"].as_str().unwrap()).is_file());
        }
    }
    assert!(
        !run.out.join(p4.pid().to_string()).exists(),
        "the extra process was recorded"
    );
}

#[test]
fn config_with_two_triggers_on_two_binaries() {
    preflight();
    let mut c = Target::start(&target_path("target"), &["calls", "3", "300"]);
    let mut cpp = Target::start(&target_path("worker"), &["calls", "3", "300"]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mt-agent.toml");
    let out = dir.path().join("runs");
    fs::write(
        &config,
        format!(
            r#"
output = "{out}"
max_targets = 4

[[trigger]]
name = "c"
exe = "{c_exe}"
symbol = "trigger"

[[trigger]]
name = "cpp"
pid = {cpp_pid}
symbol = "ns::Worker::handle(int)"
cooldown = "50ms"
"#,
            out = out.display(),
            c_exe = target_path("target").display(),
            cpp_pid = cpp.pid(),
        ),
    )
    .unwrap();
    let cfg = config.display().to_string();
    let mut agent = Agent::start(&["--config", &cfg, "--json"]);
    // Armed twice: the exe trigger at once, the pid trigger once its perf is ready.
    let end = Instant::now() + Duration::from_secs(20);
    while events(&agent.proc)
        .iter()
        .filter(|e| e["event"] == "armed")
        .count()
        < 2
    {
        assert!(
            Instant::now() < end,
            "{:?} {:?}",
            agent.proc.stdout(),
            agent.proc.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    wait_event(&mut agent, "recorder for the C target", started(c.pid()));
    c.go();
    cpp.go();
    c.wait(Duration::from_secs(20));
    cpp.wait(Duration::from_secs(20));
    agent.proc.signal(libc::SIGTERM);
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    // <output>/<local time>/<trigger name>[/<pid>]
    let runs: Vec<_> = fs::read_dir(&out).unwrap().flatten().collect();
    assert_eq!(runs.len(), 1, "one dated run directory");
    let base = runs[0].path();
    let c_index = read_index(
        &base
            .join("c")
            .join(c.pid().to_string())
            .join("snapshots.jsonl"),
    );
    let cpp_index = read_index(&base.join("cpp").join("snapshots.jsonl"));
    assert_eq!(listed_hits(&c_index), 3, "{c_index:?}");
    assert_eq!(listed_hits(&cpp_index), 3, "{cpp_index:?}");
    // The C++ trigger saw x = 0, 1, 2 in arg1 (arg0 is `this`).
    let xs: Vec<u64> = cpp_index
        .iter()
        .filter(|v| v["kind"] == "hit")
        .flat_map(|v| v["hits"].as_array().cloned().unwrap_or_default())
        .map(|h| h["args"][1].as_u64().unwrap())
        .collect();
    assert_eq!(xs, [0, 1, 2]);
}

#[test]
fn a_bad_config_is_refused_with_a_reason() {
    preflight();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    fs::write(&config, "[[trigger]]\nsymbol = \"f\"\n").unwrap();
    let cfg = config.display().to_string();
    let run = Agent::start(&["--config", &cfg]).finish(FINISH);
    assert_eq!(run.code, Some(2), "{}", run.output());
    assert!(
        run.stderr.iter().any(|l| l.contains("exactly one of exe")),
        "{}",
        run.output()
    );
}

/// Hits listed in an index's hit snapshots, merged ones included.
fn listed_hits(index: &[Value]) -> usize {
    index
        .iter()
        .filter(|v| v["kind"] == "hit")
        .map(|v| v["hits"].as_array().map_or(0, Vec::len))
        .sum()
}

/// Counts, until dropped, the most perf processes recording into `out` at
/// once (sampled every 10 ms from /proc).
struct PerfCounter {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl PerfCounter {
    fn start(out: &std::path::Path) -> PerfCounter {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, needle) = (stop.clone(), out.display().to_string());
        let thread = std::thread::spawn(move || {
            let mut most = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let n = processes_mentioning(&needle)
                    .iter()
                    .filter(|(_, cmd)| cmd.contains(" record "))
                    .count();
                most = most.max(n);
                std::thread::sleep(Duration::from_millis(10));
            }
            most
        });
        PerfCounter {
            stop,
            thread: Some(thread),
        }
    }

    fn most(mut self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

#[test]
fn exe_follows_forked_workers_with_the_masters_perf() {
    // A master forks 3 workers, reaps them, and forks 3 more; each worker
    // calls handle_request at once, then burns 200 ms of CPU.
    let bin = target_path("prefork");
    let exe = bin.display().to_string();
    let mut master = Target::start(&bin, &["3", "2"]);
    let mut agent = Agent::start(&[
        "--exe",
        &exe,
        "--symbol",
        "handle_request",
        "--after",
        "100ms",
        "--json",
    ]);
    agent.wait_armed();
    wait_event(&mut agent, "the master's recorder", started(master.pid()));
    let perfs = PerfCounter::start(&agent.out);
    master.go();
    master.wait(Duration::from_secs(30));
    let most_perfs = perfs.most();
    agent.proc.signal(libc::SIGINT);
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let workers: Vec<i64> = master
        .proc
        .stdout()
        .iter()
        .filter_map(|l| l.strip_prefix("worker ")?.trim().parse().ok())
        .collect();
    assert_eq!(workers.len(), 6, "{:?}", master.proc.stdout());
    // One perf, the master's, recorded the whole tree: no worker got its own.
    assert_eq!(most_perfs, 1, "perf processes at once\n{}", run.output());
    for w in &workers {
        assert!(
            !run.out.join(w.to_string()).exists(),
            "worker {w} got a recorder of its own"
        );
    }
    // Every worker's call is listed in a snapshot of the master's perf, and
    // that snapshot holds samples of that worker.
    let dir = run.out.join(master.pid().to_string());
    let index = read_index(&dir.join("snapshots.jsonl"));
    for w in &workers {
        let entry = index
            .iter()
            .filter(|e| e["kind"] == "hit")
            .find(|e| {
                e["hits"]
                    .as_array()
                    .is_some_and(|hs| hs.iter().any(|h| h["tgid"] == *w))
            })
            .unwrap_or_else(|| panic!("no snapshot lists worker {w}: {index:?}"));
        let file = dir.join(entry["file"].as_str().unwrap());
        let samples = perf_samples(&file);
        assert!(
            samples.iter().any(|s| i64::from(s.pid) == *w),
            "{} holds no sample of worker {w}",
            file.display()
        );
    }
    let s = run.summary().unwrap();
    assert_eq!(s["unrecorded_hits"], 0, "{s}");
}

/// The pids the prefork target printed for its workers.
fn worker_pids(master: &Target) -> Vec<i64> {
    master
        .proc
        .stdout()
        .iter()
        .filter_map(|l| l.strip_prefix("worker ")?.trim().parse().ok())
        .collect()
}

#[test]
fn pid_follows_forked_workers_with_the_targets_perf() {
    // As above, with `--pid MASTER`: the workers, forked after the agent
    // attached, call handle_request; the master never does. The cooldown
    // is one per trigger (the target's perf), so it is off here: each
    // worker's call must be listed.
    let mut master = Target::start(&target_path("prefork"), &["3", "2"]);
    let pid = master.pid().to_string();
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "handle_request",
        "--after",
        "100ms",
        "--cooldown",
        "0",
        "--json",
    ]);
    agent.wait_armed();
    let loaded = our_loaded_programs();
    assert!(
        loaded.iter().any(|n| n == "mt_fork") && loaded.iter().any(|n| n == "mt_exit"),
        "fork following's programs not loaded: {loaded:?}"
    );
    let perfs = PerfCounter::start(&agent.out);
    master.go();
    master.wait(Duration::from_secs(30));
    let most_perfs = perfs.most();
    agent.proc.signal(libc::SIGINT);
    // `finish` also checks that no program of ours is left loaded.
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let workers = worker_pids(&master);
    assert_eq!(workers.len(), 6, "{:?}", master.proc.stdout());
    assert_eq!(most_perfs, 1, "perf processes at once\n{}", run.output());
    let index = read_index(&run.out.join("snapshots.jsonl"));
    for w in &workers {
        let entry = index
            .iter()
            .filter(|e| e["kind"] == "hit")
            .find(|e| {
                e["hits"]
                    .as_array()
                    .is_some_and(|hs| hs.iter().any(|h| h["tgid"] == *w))
            })
            .unwrap_or_else(|| panic!("no snapshot lists worker {w}: {index:?}"));
        let file = run.out.join(entry["file"].as_str().unwrap());
        let samples = perf_samples(&file);
        assert!(
            samples.iter().any(|s| i64::from(s.pid) == *w),
            "{} holds no sample of worker {w}",
            file.display()
        );
    }
    let s = run.summary().unwrap();
    let c = &s["counters"];
    // Only the workers call it, once each; the master's tgid and theirs
    // are the only ones counted.
    assert_eq!(c["seen"], 6, "{s}");
    assert_eq!(c["accepted"], 6, "{s}");
    assert_eq!(s["unrecorded_hits"], 0, "{s}");
}

#[test]
fn pid_with_no_follow_forks_ignores_workers() {
    let mut master = Target::start(&target_path("prefork"), &["3", "1"]);
    let pid = master.pid().to_string();
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "handle_request",
        "--cooldown",
        "0",
        "--no-follow-forks",
        "--json",
    ]);
    agent.wait_armed();
    let loaded = our_loaded_programs();
    assert!(
        !loaded.iter().any(|n| n == "mt_fork" || n == "mt_exit"),
        "fork following's programs loaded without following: {loaded:?}"
    );
    master.go();
    master.wait(Duration::from_secs(30));
    agent.proc.signal(libc::SIGINT);
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert_eq!(worker_pids(&master).len(), 3, "{:?}", master.proc.stdout());
    let s = run.summary().unwrap();
    assert_eq!(s["counters"]["seen"], 0, "{s}");
    assert_eq!(s["counters"]["accepted"], 0, "{s}");
    let index = read_index(&run.out.join("snapshots.jsonl"));
    assert!(
        index.iter().all(|e| e["kind"] != "hit"),
        "a worker's call triggered: {index:?}"
    );
}

#[test]
fn a_killed_agent_following_forks_leaves_no_program() {
    let mut master = Target::start(&target_path("prefork"), &["3", "1"]);
    let pid = master.pid().to_string();
    let mut agent = Agent::start(&["--pid", &pid, "--symbol", "handle_request", "--json"]);
    agent.wait_armed();
    let loaded = our_loaded_programs();
    assert!(
        loaded.iter().any(|n| n == "mt_fork"),
        "mt_fork not loaded: {loaded:?}"
    );
    agent.proc.signal(libc::SIGKILL);
    let status = agent.proc.wait(Duration::from_secs(5)).expect("agent dies");
    assert_eq!(status.code(), None);
    // The kernel drops the tracepoints and uprobes with our fds.
    assert_no_programs_loaded("after SIGKILL of an agent following forks");
    master.go();
    master.wait(Duration::from_secs(30));
}

/// The pid a target printed in its `ready` line (for `bash -c`, its child's).
fn ready_pid(t: &Target) -> i32 {
    t.proc
        .stdout()
        .iter()
        .find_map(|l| l.strip_prefix("ready ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ready line: {:?}", t.proc.stdout()))
}

#[test]
fn exe_names_why_a_new_process_first_call_is_not_recorded() {
    // Each process calls trigger(0) at once after its exec, before its own
    // perf (started at the exec, ready ~0.2 s later) records, then
    // trigger(1) 2.5 s later (loose: perf is ready long before). Started directly, through `sh -c 'exec …'`
    // (the same pid) and through `bash -c '…; true'` (a child of bash).
    let bin = target_path("target");
    let exe = bin.display().to_string();
    let mut agent = Agent::start(&["--exe", &exe, "--symbol", "trigger", "--json"]);
    agent.wait_armed();
    let line = format!("{exe} early 2500");
    let starts: [(&str, Vec<String>); 3] = [
        (exe.as_str(), vec!["early".into(), "2500".into()]),
        ("/bin/sh", vec!["-c".into(), format!("exec {line}")]),
        ("/bin/bash", vec!["-c".into(), format!("{line}; true")]),
    ];
    let mut pids = Vec::new();
    for (prog, args) in &starts {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut t = Target::start(std::path::Path::new(prog), &args);
        let pid = ready_pid(&t);
        t.wait(Duration::from_secs(20));
        wait_event(&mut agent, "recorder finalized", move |e| {
            e["event"] == "target_finished" && e["pid"] == pid
        });
        pids.push(pid);
    }
    agent.proc.signal(libc::SIGINT);
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let s = run.summary().unwrap();
    // trigger(0) of each: counted under its real cause, not as a process
    // with no recorder, and named once in a warning.
    assert_eq!(s["hits_before_recording"], 3, "{s}");
    assert_eq!(s["unrecorded_hits"], 0, "{s}");
    let warned = run
        .stdout
        .iter()
        .any(|l| l.contains("\"warning\"") && l.contains("before its perf was recording"));
    assert!(warned, "{}", run.output());
    // trigger(1) of each is recorded, in its process's own directory.
    for pid in pids {
        let index = read_index(&run.out.join(pid.to_string()).join("snapshots.jsonl"));
        let args: Vec<&Value> = index
            .iter()
            .filter(|v| v["kind"] == "hit")
            .flat_map(|v| v["hits"].as_array().into_iter().flatten())
            .map(|h| &h["args"][0])
            .collect();
        assert_eq!(args, [&Value::from(1)], "pid {pid}: {index:?}");
    }
}
