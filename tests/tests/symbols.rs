//! Finding the trigger wherever users have it: threads, shared libraries,
//! C++ and Rust names, stripped binaries, separate debug info, dlopen,
//! refusals, fork and exec, and the `symbols` listing. Privileged.

use std::{
    fs,
    process::Command,
    time::{Duration, Instant},
};

use mt_agent_tests::*;
use serde_json::Value;

/// Runs the agent on an idle target and expects a refusal with exit code 2.
fn refusal(pid: i32, args: &[&str]) -> Run {
    let pid = pid.to_string();
    let mut full = vec!["--pid", pid.as_str()];
    full.extend_from_slice(args);
    let run = Agent::start(&full).finish(Duration::from_secs(30));
    assert_eq!(run.code, Some(2), "{}", run.output());
    assert!(!run.out.exists(), "output left behind\n{}", run.output());
    run
}

fn stderr_has(run: &Run, needle: &str) {
    assert!(
        run.stderr.iter().any(|l| l.contains(needle)),
        "expected {needle:?}\n{}",
        run.output()
    );
}

#[test]
fn hits_in_every_thread_count() {
    let mut t = Target::start(&target_path("target"), &["threads", "8", "250"]);
    let run = capture(&mut t, &["--symbol", "trigger"]);
    let tids: std::collections::HashSet<i64> = run
        .hits()
        .iter()
        .map(|h| h["tid"].as_i64().unwrap())
        .collect();
    assert_eq!(tids.len(), 8, "tids seen: {tids:?}\n{}", run.output());
    assert!(
        !tids.contains(&(t.pid() as i64)),
        "the main thread never calls the trigger"
    );
}

#[test]
fn a_library_probe_stays_on_its_process() {
    // Both map the same libtrig.so; only the untraced one calls lib_trigger.
    let traced = Target::start(&target_path("libuser"), &["wait"]);
    let mut other = Target::start(&target_path("libuser"), &["calls", "5", "100"]);
    let pid = traced.pid().to_string();
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "lib_trigger",
        "--duration",
        "2s",
        "--json",
    ]);
    agent.wait_armed();
    other.go();
    other.wait(Duration::from_secs(10));
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let s = run.summary().unwrap();
    assert_eq!(s["counters"]["seen"], 0, "{s}");
    assert!(run.entries("hit").is_empty());
    // The armed line names the library, not the executable.
    let armed = run
        .stdout
        .iter()
        .find(|l| l.contains("\"event\":\"armed\""))
        .unwrap();
    assert!(armed.contains("libtrig.so"), "{armed}");
}

#[test]
fn cpp_names_match_demangled() {
    // With or without parameters, the name triggers: arg0 is `this`, arg1 is x.
    for name in ["ns::Worker::handle(int)", "ns::Worker::handle"] {
        let mut t = Target::start(&target_path("worker"), &["calls", "3", "300"]);
        let run = capture(&mut t, &["--symbol", name, "--max-snapshots", "3"]);
        let xs: Vec<u64> = run
            .entries("hit")
            .iter()
            .map(|h| h["hits"][0]["args"][1].as_u64().unwrap())
            .collect();
        assert_eq!(xs, [0, 1, 2], "{name}: {}", run.output());
    }
}

#[test]
fn rust_names_match_demangled() {
    let mut t = Target::start(&rust_bin("rust_target"), &["3", "300"]);
    let run = capture(
        &mut t,
        &[
            "--symbol",
            "rust_target::module::handler",
            "--max-snapshots",
            "3",
        ],
    );
    let args: Vec<u64> = run
        .entries("hit")
        .iter()
        .map(|h| h["hits"][0]["args"][0].as_u64().unwrap())
        .collect();
    assert_eq!(args, [0, 1, 2], "{}", run.output());
}

#[test]
fn stripped_pie_uses_dynsym() {
    let mut t = Target::start(&target_path("target_pie_stripped"), &["calls", "2", "300"]);
    let run = capture(&mut t, &["--symbol", "trigger"]);
    assert_eq!(run.entries("hit").len(), 2, "{}", run.output());
    // A name only .symtab would have: says the object is stripped.
    let idle = Target::start(&target_path("target_pie_stripped"), &["wait"]);
    let run = refusal(
        idle.pid(),
        &["--symbol", "burn_ms", "--object", "target_pie_stripped"],
    );
    stderr_has(
        &run,
        "is stripped (no .symtab) and no debug info was found; looked in:",
    );
}

#[test]
fn separate_debug_info_through_debuglink() {
    let mut t = Target::start(&target_path("target_debuglink"), &["calls", "2", "300"]);
    let run = capture(&mut t, &["--symbol", "trigger"]);
    assert_eq!(run.entries("hit").len(), 2, "{}", run.output());
    assert!(
        run.stdout
            .iter()
            .any(|l| l.contains("separate debug info") && l.contains("target_debuglink.debug")),
        "{}",
        run.output()
    );
}

#[test]
fn sqlite3_step_in_debians_libsqlite3() {
    for extra in [&[][..], &["--object", "libsqlite3"][..]] {
        let mut cmd = Command::new("/usr/bin/sqlite3");
        cmd.arg(":memory:");
        let mut db = Proc::spawn(cmd);
        // Give the loader a moment to map libsqlite3.
        let end = Instant::now() + Duration::from_secs(5);
        while !fs::read_to_string(format!("/proc/{}/maps", db.pid()))
            .unwrap_or_default()
            .contains("libsqlite3")
        {
            assert!(Instant::now() < end, "sqlite3 did not map libsqlite3");
            std::thread::sleep(Duration::from_millis(20));
        }
        let pid = db.pid().to_string();
        // No cooldown: each statement, sent after the previous snapshot is
        // written, makes a snapshot of its own.
        let mut args = vec![
            "--pid",
            pid.as_str(),
            "--symbol",
            "sqlite3_step",
            "--cooldown",
            "0",
            "--json",
        ];
        args.extend_from_slice(extra);
        let mut agent = Agent::start(&args);
        agent.wait_armed();
        db.send("CREATE TABLE t(x);");
        agent.wait_hit_snapshots(1);
        for i in 0..4 {
            db.send(&format!("INSERT INTO t VALUES({i});"));
            agent.wait_hit_snapshots(i + 2);
        }
        db.send("SELECT count(*) FROM t;");
        db.send(".quit");
        db.close_stdin();
        db.wait(Duration::from_secs(10)).expect("sqlite3 exits");
        let run = agent.finish(FINISH);
        assert_eq!(run.code, Some(0), "{}", run.output());
        assert!(run.entries("hit").len() >= 5, "{extra:?}\n{}", run.output());
        let armed = run
            .stdout
            .iter()
            .find(|l| l.contains("\"event\":\"armed\""))
            .unwrap();
        assert!(armed.contains("libsqlite3.so"), "{armed}");
    }
}

#[test]
fn dlopened_libraries_need_wait_for_symbol() {
    let lib = target_path("libtrig.so").display().to_string();
    // Without --wait-for-symbol: a clear "not mapped yet".
    let idle = Target::start(&target_path("dlopener"), &["dlopen", &lib, "3", "300"]);
    let run = refusal(
        idle.pid(),
        &["--symbol", "lib_trigger", "--object", "libtrig"],
    );
    stderr_has(&run, "libtrig is not mapped by pid");
    stderr_has(&run, "--wait-for-symbol");
    let run = refusal(idle.pid(), &["--symbol", "lib_trigger"]);
    stderr_has(&run, "it is not mapped (yet)");
    stderr_has(&run, "--wait-for-symbol");
    // With it, but the library never comes: the wait runs out.
    let started = std::time::Instant::now();
    let run = refusal(
        idle.pid(),
        &["--symbol", "lib_trigger", "--wait-for-symbol", "1s"],
    );
    stderr_has(&run, "(waited 1s)");
    // A lower bound only, which a slow machine cannot break.
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "gave up before the timeout\n{}",
        run.output()
    );
    drop(idle);

    let mut t = Target::start(&target_path("dlopener"), &["dlopen", &lib, "3", "300"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "lib_trigger",
        "--wait-for-symbol",
        "10s",
        "--json",
    ]);
    // Only once the agent has looked and found nothing does the target
    // load the library, so the run goes through the wait.
    wait_until_sleeping(&mut agent);
    t.go();
    agent.wait_armed();
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert_eq!(run.entries("hit").len(), 3, "{}", run.output());
}

#[test]
fn refusals_explain_themselves() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let run = refusal(t.pid(), &["--symbol", "trigger_data"]);
    stderr_has(&run, "is a data symbol, not a function");
    // trigger_step starts with a 7-byte `mov`: offset 3 is inside it.
    let run = refusal(t.pid(), &["--symbol", "trigger_step", "--offset", "3"]);
    stderr_has(&run, "not an instruction boundary");
    let run = refusal(t.pid(), &["--symbol", "fclone"]);
    stderr_has(&run, "has no body of its own");
    stderr_has(&run, "fclone.constprop.0");

    let u = Target::start(&target_path("libuser"), &["common"]);
    let run = refusal(u.pid(), &["--symbol", "common_name"]);
    stderr_has(&run, "matches 2 functions");
    stderr_has(&run, "libtrig.so");
    stderr_has(&run, "libuser");
    stderr_has(&run, "--object");
    // Overloads in one object: their full names tell them apart.
    let w = Target::start(&target_path("worker"), &["calls", "0", "0"]);
    let run = refusal(w.pid(), &["--symbol", "work"]);
    stderr_has(&run, "matches 2 functions in");
    stderr_has(&run, "--symbol 'work(double)'");
    stderr_has(&run, "--symbol 'work(int)'");
    assert!(
        !run.stderr.iter().any(|l| l.contains("--object PATH")),
        "{}",
        run.output()
    );
    let run = refusal(u.pid(), &["--symbol", "lib_pick"]);
    stderr_has(&run, "IFUNC");
    stderr_has(&run, "lib_pick_fast");
    stderr_has(&run, "lib_pick_generic");
}

#[test]
fn an_offset_on_a_boundary_is_accepted() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    // trigger_step: 7-byte mov, then ret at offset 7.
    let mut a = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger_step",
        "--offset",
        "7",
        "--duration",
        "300ms",
    ]);
    a.wait_armed();
    let run = a.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert!(
        run.stdout.iter().any(|l| l.contains("trigger_step+0x7")),
        "{}",
        run.output()
    );
}

#[test]
fn forked_children_do_not_trigger_with_no_follow_forks() {
    // (Following forks, the default, is tested in fleet.rs.)
    let mut t = Target::start(&target_path("target"), &["fork"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--no-follow-forks",
        "--json",
    ]);
    agent.wait_armed();
    t.go();
    t.wait(Duration::from_secs(10));
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert_eq!(
        run.summary().unwrap()["counters"]["seen"],
        0,
        "{}",
        run.output()
    );
}

#[test]
fn exec_ends_the_run_cleanly() {
    let mut t = Target::start(&target_path("target"), &["exec", "/bin/sleep", "30"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&["--pid", &pid, "--symbol", "trigger", "--json"]);
    agent.wait_armed();
    t.go();
    // trigger(0), 0.2 + 0.3 s of CPU, then exec of `sleep 30`.
    let went = Instant::now();
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    // Loose on purpose: the run must end at the exec, not when the exec'd
    // `sleep 30` exits; 20 s leaves a busy machine plenty of room.
    assert!(
        went.elapsed() < Duration::from_secs(20),
        "took {:?}: the run ended with the exec'd image, not at the exec",
        went.elapsed()
    );
    assert_eq!(
        run.index.last().unwrap()["kind"],
        "tail",
        "{}",
        run.output()
    );
    assert!(
        run.stdout.iter().any(|l| l.contains("exec'd a new image")),
        "{}",
        run.output()
    );
    assert_eq!(run.entries("hit").len(), 1, "{}", run.output());
}

fn symbols(pid: i32, pattern: &str, json: bool) -> (i32, String) {
    let mut cmd = Command::new(agent_bin());
    cmd.args(["symbols", "--pid", &pid.to_string(), pattern]);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn symbols_lists_functions_with_their_cost() {
    preflight();
    let c = Target::start(&target_path("target"), &["wait"]);
    let (code, text) = symbols(c.pid(), "trigger_", false);
    assert_eq!(code, 0, "{text}");
    let line = |name: &str| {
        text.lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
            .to_string()
    };
    assert!(
        line("trigger_push").contains("push rbp: emulated"),
        "{text}"
    );
    assert!(line("trigger_nop5").contains("optimized (nop5)"), "{text}");
    assert!(line("trigger_step").contains("single-stepped"), "{text}");

    let (code, json) = symbols(c.pid(), "trigger_push", true);
    assert_eq!(code, 0);
    let rows: Vec<Value> = serde_json::from_str(&json).unwrap();
    let row = rows
        .iter()
        .find(|r| r["mangled"] == "trigger_push")
        .expect("trigger_push row");
    assert_eq!(row["cost"]["cost"], "emulated");
    assert_eq!(row["size"], 3);
    assert!(row["object"].as_str().unwrap().ends_with("/target"));
    assert!(
        row["address"].as_u64().unwrap() > row["elf_address"].as_u64().unwrap(),
        "PIE: runtime address is relocated"
    );

    let cpp = Target::start(&target_path("worker"), &["calls", "1", "1"]);
    let (_, text) = symbols(cpp.pid(), "handle", false);
    let l = text
        .lines()
        .find(|l| l.contains("ns::Worker::handle(int)"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        l.contains("_ZN2ns6Worker6handleEi") && l.contains("/hit"),
        "{l}"
    );

    let rs = Target::start(&rust_bin("rust_target"), &["1", "1"]);
    let (_, text) = symbols(rs.pid(), "module::handler", false);
    let l = text
        .lines()
        .find(|l| l.contains("rust_target::module::handler"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(l.contains("/hit"), "{l}");
}

#[test]
fn an_address_must_fall_on_an_instruction_boundary() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let out = Command::new(agent_bin())
        .args(["symbols", "--pid", &pid, "trigger_step", "--json"])
        .output()
        .unwrap();
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let addr = rows
        .iter()
        .find(|r| r["mangled"] == "trigger_step")
        .unwrap()["address"]
        .as_u64()
        .unwrap();
    // Inside the 7-byte `mov`: refused.
    let run = refusal(t.pid(), &["--address", &format!("{:#x}", addr + 3)]);
    stderr_has(&run, "not an instruction boundary");
    // The `ret` after it: accepted, and named.
    let mut a = Agent::start(&[
        "--pid",
        &pid,
        "--address",
        &format!("{:#x}", addr + 7),
        "--duration",
        "300ms",
    ]);
    a.wait_armed();
    let run = a.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert!(
        run.stdout.iter().any(|l| l.contains("trigger_step+0x7")),
        "{}",
        run.output()
    );
    // Outside any mapping: refused.
    let run = refusal(t.pid(), &["--address", "0x10"]);
    stderr_has(&run, "not in any file mapped by pid");
}

#[test]
fn a_replaced_executable_is_probed_through_the_running_file() {
    // Run a copy, then replace the file on disk: its mapping says (deleted).
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("replaced-target");
    fs::copy(target_path("target"), &bin).unwrap();
    let mut t = Target::start(&bin, &["calls", "2", "300"]);
    let fresh = dir.path().join("new");
    fs::write(&fresh, b"not the running program").unwrap();
    fs::rename(&fresh, &bin).unwrap();
    assert!(
        fs::read_to_string(format!("/proc/{}/maps", t.pid()))
            .unwrap()
            .contains("(deleted)")
    );
    let run = capture(&mut t, &["--symbol", "trigger"]);
    assert_eq!(run.entries("hit").len(), 2, "{}", run.output());
    assert!(
        run.stdout
            .iter()
            .any(|l| l.contains("differs from the running file")),
        "the agent should say the file on disk differs\n{}",
        run.output()
    );
}

#[test]
fn a_versioned_name_picks_that_version() {
    let u = Target::start(&target_path("libuser"), &["common"]);
    let pid = u.pid().to_string();
    let mut offsets = Vec::new();
    let mut symbols_armed = Vec::new();
    for version in ["versioned@V1", "versioned@@V2", "versioned"] {
        let mut a = Agent::start(&["--pid", &pid, "--symbol", version, "--json"]);
        a.wait_armed();
        let armed = a
            .proc
            .stdout()
            .into_iter()
            .find(|l| l.contains("\"event\":\"armed\""))
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&armed).unwrap();
        assert!(
            v["object"].as_str().unwrap_or("").contains("libtrig.so"),
            "{version}: {v}"
        );
        offsets.push(v["attach_offset"].clone());
        symbols_armed.push(v["symbol"].as_str().unwrap_or("").to_string());
        a.proc.signal(libc::SIGINT);
        let run = a.finish(Duration::from_secs(30));
        assert_eq!(run.code, Some(0), "{version}: {}", run.output());
    }
    // Two versions, two functions; a plain name is the default version (@@).
    assert_ne!(offsets[0], offsets[1], "{offsets:?}");
    assert_eq!(offsets[2], offsets[1], "{offsets:?}");
    // The armed event names the version picked, also for a plain name.
    assert_eq!(
        symbols_armed,
        ["versioned@V1", "versioned@@V2", "versioned@@V2"]
    );
    // `symbols` lists both versions for a plain pattern.
    let (code, out) = symbols(u.pid(), "versioned", false);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("versioned@V1") && out.contains("versioned@@V2"),
        "{out}"
    );
    // The wrong separator is answered with the versions there are.
    let run = refusal(u.pid(), &["--symbol", "versioned@V2"]);
    stderr_has(&run, "versioned@@V2");
}

#[test]
fn an_instruction_the_kernel_cannot_probe_is_refused_before_anything_starts() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let run = refusal(t.pid(), &["--symbol", "trigger_int3"]);
    stderr_has(&run, "`int3`");
    stderr_has(&run, "--offset 1");
    assert_no_perf_for(&run.out, "int3 refusal");
    let run = refusal(t.pid(), &["--symbol", "trigger_lock"]);
    stderr_has(&run, "lock");
    // The next instruction (`ret`) can be probed.
    let pid = t.pid().to_string();
    let run = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger_int3",
        "--offset",
        "1",
        "--duration",
        "1s",
    ])
    .finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
}

#[test]
fn an_ifunc_is_probed_at_the_implementation_the_process_uses() {
    // memcpy@@GLIBC_2.14 is an IFUNC; memcpy@GLIBC_2.2.5 a compatibility
    // function that programs built today never call.
    let mut t = Target::start(&target_path("ifunc"), &["bound", "20", "10"]);
    // --always-armed: every call is seen (no disarming after a hit).
    let run = capture(
        &mut t,
        &[
            "--symbol",
            "memcpy",
            "--object",
            "libc.so.6",
            "--always-armed",
        ],
    );
    let s = run.summary().unwrap();
    let seen = s["counters"]["seen"].as_u64().unwrap();
    assert!(seen >= 20, "20 memcpy calls, {seen} seen\n{}", run.output());
    let warning = run
        .stdout
        .iter()
        .find(|l| l.contains("\"event\":\"warning\"") && l.contains("IFUNC"))
        .unwrap_or_else(|| panic!("no IFUNC note\n{}", run.output()));
    assert!(warning.contains("GOT of"), "{warning}");
    let armed = run
        .stdout
        .iter()
        .find(|l| l.contains("\"event\":\"armed\""))
        .unwrap();
    let armed: Value = serde_json::from_str(armed).unwrap();
    let symbol = armed["symbol"].as_str().unwrap();
    assert_ne!(symbol, "memcpy", "the resolver is not what runs: {armed}");
    assert!(!symbol.contains("GLIBC_2.2.5"), "{armed}");
}

#[test]
fn an_ifunc_whose_implementation_cannot_be_told_is_refused() {
    // lib_pick is an IFUNC in libtrig.so that nothing imports or calls:
    // no GOT slot of the process says which implementation it would use.
    let u = Target::start(&target_path("libuser"), &["common"]);
    let run = refusal(u.pid(), &["--symbol", "lib_pick"]);
    stderr_has(&run, "is a GNU indirect function (IFUNC)");
    stderr_has(&run, "no module of the process has bound it yet");
    stderr_has(&run, "lib_pick_fast");
    // With --exe there is no process to read a GOT from.
    let t = Target::start(&target_path("ifunc"), &["unbound"]);
    let maps = fs::read_to_string(format!("/proc/{}/maps", t.pid())).unwrap();
    let libc = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libc.so.6"))
        .expect("libc.so.6 mapped")
        .to_string();
    let exe = target_path("ifunc").display().to_string();
    let run = Agent::start(&["--exe", &exe, "--symbol", "memcpy", "--object", &libc])
        .finish(Duration::from_secs(30));
    assert_eq!(run.code, Some(2), "{}", run.output());
    stderr_has(&run, "no process to read it from (--exe)");
    stderr_has(&run, "__memcpy_");
}

#[test]
fn symbols_marks_ifuncs_and_their_resolvers() {
    let t = Target::start(&target_path("ifunc"), &["unbound"]);
    let (code, out) = symbols(t.pid(), "memcpy", true);
    assert_eq!(code, 0, "{out}");
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
    let kind_of = |name: &str| {
        rows.iter()
            .find(|r| r["mangled"] == name)
            .map(|r| r["kind"].clone())
    };
    assert_eq!(
        kind_of("memcpy@@GLIBC_2.14"),
        Some(Value::from("ifunc")),
        "{out}"
    );
    assert!(
        rows.iter().any(|r| r["kind"] == "ifunc resolver"),
        "no resolver marked\n{out}"
    );
    let (_, table) = symbols(t.pid(), "memcpy", false);
    assert!(table.contains("IFUNC"), "{table}");
}

#[test]
fn an_object_path_not_yet_mapped_sees_every_call_across_dlopen_and_dlclose() {
    // The agent arms before the library is mapped (the target waits for
    // the go signal); the target then dlopens it and calls lib_trigger at
    // once, 3 times 300 ms apart, dlcloses it, and does the same again.
    let lib = target_path("libtrig.so").display().to_string();
    let mut t = Target::start(&target_path("dlopener"), &["cycle", &lib, "2", "3", "300"]);
    let run = capture(
        &mut t,
        &[
            "--symbol",
            "lib_trigger",
            "--object",
            &lib,
            "--wait-for-symbol",
            "5s",
        ],
    );
    let unmapped = t.proc.stdout().iter().filter(|l| *l == "unmapped").count();
    assert_eq!(
        unmapped,
        2,
        "dlclose did not unmap the library: {:?}",
        t.proc.stdout()
    );
    let s = run.summary().unwrap();
    assert_eq!(s["counters"]["seen"], 6, "{s}\n{}", run.output());
    assert_eq!(run.hits().len(), 6, "{}", run.output());
    let note = run
        .stdout
        .iter()
        .find(|l| l.contains("is not mapped by pid"))
        .unwrap_or_else(|| panic!("no note about the unmapped file\n{}", run.output()));
    assert!(note.contains("\"event\":\"warning\""), "{note}");
}

#[test]
fn a_process_younger_than_a_second_gets_time_for_its_loader() {
    // The library is mapped 500 ms after the target starts; the agent,
    // started at once, has no --wait-for-symbol. The agent must look before
    // the library is there (it looks ~100 ms after the target's start here):
    // a loose bound, which only a machine 5 times slower would miss.
    let lib = target_path("libtrig.so").display().to_string();
    let mut t = Target::start(&target_path("dlopener"), &["late", &lib, "500", "5"]);
    let pid = t.pid().to_string();
    // The 5 calls come 100 ms apart, the default cooldown: a re-arm late by
    // a millisecond would lose one (docs/disarming.md), and this test is
    // about the loader, so the probe stays in.
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "lib_trigger",
        "-v",
        "--always-armed",
    ]);
    agent.wait_armed();
    t.go();
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    stderr_has(&run, "waiting up to 1 s for its loader");
    assert_eq!(run.entries("hit").len(), 5, "{}", run.output());
}

/// Waits until a thread of the agent sleeps in `clock_nanosleep` (x86-64
/// syscall 230, from /proc/PID/task/TID/syscall). Before it arms, that is
/// only the `--wait-for-symbol` loop: it has looked for the symbol and not
/// found it.
fn wait_until_sleeping(agent: &mut Agent) {
    let pid = agent.proc.pid();
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let tasks = fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten();
        let sleeping = tasks.flatten().any(|t| {
            fs::read_to_string(t.path().join("syscall")).is_ok_and(|s| s.starts_with("230 "))
        });
        if sleeping {
            return;
        }
        assert!(
            Instant::now() < end && agent.proc.try_status().is_none(),
            "the agent never waited for the symbol: exit {:?}, {:?}",
            agent.proc.try_status(),
            agent.proc.stderr()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
