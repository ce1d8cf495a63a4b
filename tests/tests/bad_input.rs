//! Bad input gets one clear line, its documented exit code, and leaves
//! nothing behind: no output directory, no perf process, no loaded program.
//! Privileged.

use std::{fs, time::Duration};

use mt_agent_tests::*;
use serde_json::Value;

/// Runs the agent to completion (it must not arm) and checks it left nothing.
fn refused(args: &[&str]) -> Run {
    let agent = Agent::start(args);
    let run = agent.finish(Duration::from_secs(30));
    assert!(
        !run.out.exists(),
        "output directory was left behind\n{}",
        run.output()
    );
    run
}

fn assert_one_error_line(run: &Run, code: i32, needle: &str) {
    assert_eq!(run.code, Some(code), "{}", run.output());
    let errors: Vec<&String> = run
        .stderr
        .iter()
        .filter(|l| l.starts_with("mt-agent: error:"))
        .collect();
    assert_eq!(errors.len(), 1, "{}", run.output());
    assert!(
        errors[0].contains(needle),
        "expected {needle:?}\n{}",
        run.output()
    );
}

#[test]
fn unknown_pid() {
    let run = refused(&["--pid", "999999", "--symbol", "trigger"]);
    assert_one_error_line(&run, 2, "no process with pid 999999");
}

#[test]
fn unknown_symbol_lists_similar_names() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let run = refused(&["--pid", &pid, "--symbol", "triger"]);
    assert_one_error_line(&run, 2, "no function triger");
    // The close name leads, before the not-mapped-yet hint.
    assert_one_error_line(
        &run,
        2,
        "; did you mean trigger? If not, it is not mapped (yet)",
    );
    assert!(
        run.stderr.iter().any(|l| l.contains("similar: trigger")),
        "{}",
        run.output()
    );
    let similar = run.stderr.iter().filter(|l| l.contains("similar:")).count();
    assert_eq!(similar, 5, "{}", run.output());
}

#[test]
fn missing_or_unusable_perf() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let run = refused(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--perf",
        "/nonexistent/perf",
    ]);
    assert_one_error_line(&run, 3, "perf binary /nonexistent/perf");
    let run = refused(&["--pid", &pid, "--symbol", "trigger", "--perf", "/bin/true"]);
    assert_one_error_line(&run, 3, "does not look like perf");
}

#[test]
fn output_directory_that_cannot_be_created() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let ro = Tmpfs::new("ro,size=1m");
    let out = ro.0.path().join("out");
    let out_s = out.display().to_string();
    let agent = Agent::start(&["--pid", &pid, "--symbol", "trigger", "--output", &out_s]);
    let run = agent.finish(Duration::from_secs(30));
    assert_one_error_line(&run, 2, "cannot create output directory");
    assert!(!out.exists());
    assert_no_perf_for(&out, &run.output());
}

#[test]
fn an_output_directory_that_is_not_empty_is_refused() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("perf.data.1"), "x").unwrap();
    let d = dir.path().display().to_string();
    let run = Agent::start(&["--pid", &pid, "--symbol", "trigger", "--output", &d])
        .finish(Duration::from_secs(30));
    assert_one_error_line(&run, 2, "not empty");
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        1,
        "something was added"
    );
}

#[test]
fn missing_privileges_name_what_is_needed() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let nobody = AsNobody::new();
    let out = nobody.out();
    let out_arg = out.display().to_string();
    let cmd = nobody.command(
        &[],
        &["--pid", &pid, "--symbol", "trigger", "--output", &out_arg],
    );
    let mut p = Proc::spawn(cmd);
    let status = p.wait(Duration::from_secs(30)).expect("agent exits");
    let stderr = p.stderr().join("\n");
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("missing privileges") && stderr.contains("CAP_SYS_ADMIN"),
        "the refusal should name what is missing: {stderr}"
    );
    assert!(!out.exists(), "nothing may be created");
    assert_no_perf_for(&out, &stderr);
    assert_no_programs_loaded(&stderr);
}

#[test]
fn perf_options_that_break_the_agent_are_refused() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let run = refused(&["--pid", &pid, "--symbol", "trigger", "--", "-q"]);
    assert_one_error_line(&run, 2, "perf option `-q` is not allowed");
}

#[test]
fn slower_than_with_an_offset_is_refused() {
    // trigger_push is `push rbp; pop rbp; ret`: +1 is an instruction
    // boundary, but past the push, so no return could match the entry.
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let run = refused(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger_push",
        "--offset",
        "1",
        "--slower-than",
        "1ms",
    ]);
    assert_one_error_line(&run, 2, "--slower-than times a call from its entry");
}

#[test]
fn an_empty_symbol_name_is_refused() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let run = refused(&["--pid", &pid, "--symbol", ""]);
    assert_one_error_line(&run, 2, "--symbol is empty");
    assert!(
        !run.stderr.iter().any(|l| l.contains("similar:")),
        "no suggestions for an empty name\n{}",
        run.output()
    );
}

#[test]
fn a_frequency_above_the_kernel_limit_is_refused() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let max: u64 = fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .expect("/proc/sys/kernel/perf_event_max_sample_rate")
        .trim()
        .parse()
        .unwrap();
    let over = (max + 1).to_string();
    let run = refused(&["--pid", &pid, "--symbol", "trigger", "--freq", &over]);
    assert_one_error_line(&run, 2, &format!("limit of {max} Hz"));
}

/// A perf that passes the agent's version check (`perf version` prints a
/// version) and then, asked to record, prints its error and exits 1 before
/// it is ready: a fake, in a temporary directory.
fn perf_that_dies_at_start() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let perf = dir.path().join("perf");
    fs::write(
        &perf,
        "#!/bin/sh\n\
         if [ \"$1\" = version ]; then echo 'perf version 6.1.187'; exit 0; fi\n\
         echo 'fake perf: cannot record here' >&2\n\
         exit 1\n",
    )
    .unwrap();
    fs::set_permissions(&perf, fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn a_perf_that_fails_before_recording_gets_the_error_alone() {
    let t = Target::start(&target_path("target"), &["wait"]);
    let pid = t.pid().to_string();
    let fake = perf_that_dies_at_start();
    let perf = fake.path().join("perf").display().to_string();
    let args = ["--pid", &pid, "--symbol", "trigger", "--perf", &perf];
    let run = refused(&args);
    // Past the version check: perf itself started, and its words follow
    // the one error line.
    assert_one_error_line(&run, 4, "perf exited at start");
    assert!(
        run.stderr
            .iter()
            .any(|l| l.trim() == "perf: fake perf: cannot record here"),
        "{}",
        run.output()
    );
    assert!(
        run.stdout.is_empty(),
        "nothing but the error for a run that recorded nothing\n{}",
        run.output()
    );
    let all = format!("{}\n{}", run.stdout.join("\n"), run.stderr.join("\n"));
    assert!(
        !all.contains("summary") && !all.contains("perf used") && !all.contains("armed"),
        "no summary for a run that recorded nothing\n{}",
        run.output()
    );
    // With --json: the error event alone, perf's words in it.
    let run = refused(&[&args[..], &["--json"]].concat());
    assert_eq!(run.code, Some(4), "{}", run.output());
    let events: Vec<Value> = run
        .stdout
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(events.len(), 1, "{}", run.output());
    assert_eq!(events[0]["event"], "error", "{}", run.output());
    assert_eq!(events[0]["exit_code"], 4, "{}", run.output());
    assert_eq!(
        events[0]["detail"][0],
        "perf: fake perf: cannot record here",
        "{}",
        run.output()
    );
}

#[test]
fn a_config_that_is_not_a_regular_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("mt-agent.toml");
    let ok = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo");
    // Before the check, the agent blocked in open() until a writer came.
    let run = refused(&["--config", fifo.to_str().unwrap()]);
    assert_one_error_line(&run, 2, "not a regular file");
}

#[test]
fn a_config_names_each_unknown_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mt-agent.toml");
    let out = dir.path().join("out");
    fs::write(
        &path,
        format!(
            "output = {:?}\ncolour = 1\n[[trigger]]\npid = 1\nsymbol = \"f\"\nflavour = 2\n",
            out.display().to_string()
        ),
    )
    .unwrap();
    let run = refused(&["--config", path.to_str().unwrap()]);
    assert_one_error_line(&run, 2, "`colour`");
    assert_one_error_line(&run, 2, "trigger 0: unknown field `flavour`");
    assert!(!out.exists(), "{}", run.output());
}

#[test]
fn root_without_cap_sys_ptrace_is_told_the_capability() {
    // Another user's process, and root with CAP_SYS_PTRACE dropped from
    // its bounding set (as a container or a service may).
    let mut cmd = std::process::Command::new("setpriv");
    cmd.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]);
    cmd.arg(target_path("target")).arg("wait");
    let t = Target::start_cmd(cmd);
    let pid = t.pid().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut p = Proc::spawn({
        let mut c = std::process::Command::new("setpriv");
        c.args(["--bounding-set=-sys_ptrace", "--"])
            .arg(agent_bin());
        c.args(["--pid", &pid, "--symbol", "trigger", "--output"])
            .arg(&out);
        c
    });
    let status = p.wait(Duration::from_secs(30)).expect("agent exits");
    let stderr = p.stderr().join("\n");
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("runs as root but without CAP_SYS_PTRACE"),
        "{stderr}"
    );
    assert!(!stderr.contains("run as root"), "{stderr}");
    assert!(!out.exists(), "nothing may be created");
}
