//! Stacks and symbols that stay right: the objects kept by build-id in
//! `OUT/.debug` name the captured code after a deploy replaced or deleted the
//! binary and after OUT was copied; and a target built without frame
//! pointers gets whole stacks with the defaults. Privileged.

use std::{
    collections::HashSet,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use mt_agent_tests::*;
use serde_json::Value;

/// The `armed` JSON event of a run.
fn armed(run: &Run) -> Value {
    run.stdout
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["event"] == "armed")
        .unwrap_or_else(|| panic!("no armed event\n{}", run.output()))
}

/// The snapshot files that hold hits, with the (tid, ktime_ns) of the first
/// hit of each. The target exits right after its last call, so that hit may
/// land in the tail (listed there, merged) rather than in a file of its own.
fn hit_files(run: &Run) -> Vec<(PathBuf, i64, u64)> {
    run.index
        .iter()
        .filter(|e| {
            (e["kind"] == "hit" || e["kind"] == "tail")
                && e["hits"].as_array().is_some_and(|h| !h.is_empty())
        })
        .map(|e| {
            let hit = &e["hits"][0];
            (
                run.out.join(e["file"].as_str().unwrap()),
                hit["tid"].as_i64().unwrap(),
                hit["ktime_ns"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Files named `elf` below `dir`.
fn elf_copies(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(elf_copies(&p));
        } else if p.file_name().is_some_and(|n| n == "elf") {
            out.push(p);
        }
    }
    out
}

/// Checks every hit snapshot: with the kept objects, the old build's names
/// appear and the new build's never do.
fn assert_old_names(files: &[(PathBuf, i64, u64)], debug: &Path, when: &str) {
    for (file, _, _) in files {
        let text = perf_script_cached(file, debug);
        assert!(
            text.contains("old_build_level3") && text.contains("old_build_run"),
            "{when}: {} does not name the captured build's functions:\n{}",
            file.display(),
            text.lines().take(40).collect::<Vec<_>>().join("\n")
        );
        assert!(
            !text.contains("new_build"),
            "{when}: {} names the new build's functions",
            file.display()
        );
    }
}

#[test]
fn a_deploy_does_not_rename_the_captured_functions() {
    let bins = tempfile::tempdir().unwrap();
    let app = bins.path().join("app");
    fs::copy(target_path("unwind_old"), &app).unwrap();
    let mut t = Target::start(&app, &["2", "200"]);
    let run = capture(&mut t, &["--symbol", "trigger"]);
    let files = hit_files(&run);
    assert_eq!(files.len(), 2, "{}", run.output());
    assert_eq!(armed(&run)["unwinding"]["mode"], "fp", "{}", run.output());
    let debug = run.out.join(".debug");
    // Kept once, however many snapshots name it.
    let app_copies = elf_copies(&debug.join(app.strip_prefix("/").unwrap()));
    assert_eq!(app_copies.len(), 1, "{app_copies:?}");
    let kept: u64 = elf_copies(&debug)
        .iter()
        .map(|p| fs::metadata(p).unwrap().len())
        .sum();
    eprintln!("OUT/.debug keeps {kept} bytes of objects");

    // The deploy: the new build written over the old file, in place (same
    // inode, as `cp` does: a hard link to it would change too).
    fs::copy(target_path("unwind_new"), &app).unwrap();
    // Without the kept objects, perf finds a file with another build-id at
    // the path: the captured functions are gone. An empty build-id
    // directory stands for perf's own (~/.debug), where any perf record of
    // the same build on this host (without --no-buildid-cache) would have
    // put a copy.
    let no_cache = tempfile::tempdir().unwrap();
    for (file, _, _) in &files {
        let plain = perf_script_cached(file, no_cache.path());
        // The samples are there; only their names are lost.
        assert!(
            !parse_samples(&plain).is_empty(),
            "{}: no samples without the cache:\n{plain}",
            file.display()
        );
        assert!(
            !plain.contains("old_build_level3"),
            "perf named old functions without the cache: is the test binary not replaced?"
        );
    }
    assert_old_names(&files, &debug, "after the deploy");

    // The binary deleted, OUT copied elsewhere and the original removed.
    fs::remove_file(&app).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let copy = elsewhere.path().join("copied-out");
    let ok = Command::new("cp")
        .arg("-a")
        .arg(&run.out)
        .arg(&copy)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cp -a {} failed", run.out.display());
    fs::remove_dir_all(&run.out).unwrap();
    let moved: Vec<_> = files
        .iter()
        .map(|(f, tid, k)| (copy.join(f.file_name().unwrap()), *tid, *k))
        .collect();
    assert_old_names(&moved, &copy.join(".debug"), "after deleting and copying");
}

/// Of the samples of thread `tid` in the `window_ns` before `ktime_ns`: how
/// many there are, and how many reach `main`.
fn moment_reach(text: &str, tid: i64, ktime_ns: u64, window_ns: u64) -> (usize, usize) {
    let moment: Vec<Sample> = parse_samples(text)
        .into_iter()
        .filter(|s| {
            s.tid as i64 == tid && s.time_ns <= ktime_ns && s.time_ns + window_ns >= ktime_ns
        })
        .collect();
    let reach = moment
        .iter()
        .filter(|s| s.frames.iter().any(|f| f == "main"))
        .count();
    (moment.len(), reach)
}

/// Runs the agent on the frame-pointer-less target and returns, summed over
/// its hits, (samples in the moments, samples that reach main), and the run.
fn capture_nofp(extra: &[&str]) -> ((usize, usize), Run) {
    let mut t = Target::start(&target_path("unwind_nofp"), &["2", "300"]);
    let mut args = vec!["--symbol", "trigger"];
    args.extend_from_slice(extra);
    let run = capture(&mut t, &args);
    let files = hit_files(&run);
    assert_eq!(files.len(), 2, "{}", run.output());
    let debug = run.out.join(".debug");
    let mut total = (0, 0);
    for (file, tid, ktime) in &files {
        // The last 200 ms before the hit: all of it spinning in
        // nofp_level3, four calls below main.
        let (n, reach) = moment_reach(&perf_script_cached(file, &debug), *tid, *ktime, 200_000_000);
        total.0 += n;
        total.1 += reach;
    }
    (total, run)
}

#[test]
fn stacks_reach_main_without_frame_pointers() {
    let ((n, reach), run) = capture_nofp(&[]);
    eprintln!("DWARF: {reach} of {n} samples of the moments reach main");
    let a = armed(&run);
    assert!(
        a["unwinding"]["mode"]
            .as_str()
            .is_some_and(|m| m.starts_with("dwarf,")),
        "the defaults should pick DWARF unwinding: {a}"
    );
    assert!(
        a["unwinding"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no frame pointers") && r.contains("unwind_nofp")),
        "{a}"
    );
    // The target waits for its go signal while the agent starts: no
    // samples to measure its stacks by, so `auto`'s fixed size stays.
    assert_eq!(a["unwinding"]["mode"], "dwarf,4096", "{a}");
    assert!(
        a["unwinding"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("stack copy not measured")),
        "{a}"
    );
    // 2 × 200 ms at 999 Hz: ~400 samples on an idle machine; far fewer
    // still mean something on a loaded one.
    assert!(n >= 20, "only {n} samples in the moments\n{}", run.output());
    assert!(
        reach * 10 >= n * 9,
        "{reach} of {n} samples of the moments reach main"
    );

    // The same capture with frame pointers forced: the stacks break after
    // the leaf, which is what the default avoids.
    let ((n, reach), run) = capture_nofp(&["--call-graph", "fp"]);
    eprintln!("frame pointers: {reach} of {n} samples of the moments reach main");
    assert_eq!(armed(&run)["unwinding"]["mode"], "fp");
    assert!(n >= 20, "only {n} samples in the moments\n{}", run.output());
    assert!(
        reach * 2 < n,
        "{reach} of {n} samples reach main with frame pointers on code without them: the \
         DWARF check above proves nothing"
    );
}

/// On a target that runs while the agent starts, `auto` measures the stack
/// copy its DWARF samples need (report/stack_need.rs) and records with the
/// smallest size that keeps ≥ 99% of them whole: the frame-pointer-less
/// target spins four calls below `main`, which 512 bytes hold (the bench's
/// stack-need table), and its moments' stacks still reach `main`.
#[test]
fn auto_records_with_the_copy_size_measured_on_a_busy_target() {
    // 8 rounds of 400 ms: the target spins from before the agent starts
    // until well after it is armed (~1.5 s).
    let mut t = Target::start(&target_path("unwind_nofp"), &["8", "400"]);
    t.go();
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&["--pid", &pid, "--symbol", "trigger", "--json"]);
    agent.wait_armed();
    t.wait(Duration::from_secs(60));
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let a = armed(&run);
    let m = &a["unwinding"]["copy_measured"];
    let bytes = m["bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no copy measured: {a}"));
    assert_eq!(a["unwinding"]["mode"], format!("dwarf,{bytes}"), "{a}");
    assert!(
        bytes < 4096,
        "a shallow stack should need less than 4096 bytes: {a}"
    );
    assert!(m["samples"].as_u64().is_some_and(|n| n >= 100), "{a}");
    assert!(
        m["whole_percent"].as_f64().is_some_and(|p| p >= 99.0),
        "{a}"
    );
    let debug = run.out.join(".debug");
    let (mut n, mut reach) = (0, 0);
    for (file, tid, ktime) in hit_files(&run) {
        let (k, r) = moment_reach(&perf_script_cached(&file, &debug), tid, ktime, 200_000_000);
        n += k;
        reach += r;
    }
    eprintln!("dwarf,{bytes}: {reach} of {n} samples of the moments reach main");
    assert!(n >= 20, "only {n} samples in the moments\n{}", run.output());
    assert!(
        reach * 10 >= n * 9,
        "{reach} of {n} samples of the moments reach main"
    );
}

/// The code and data sections of `elf` (loaded `PROGBITS`, but the
/// unwinding tables, PLT, GOT and `.interp`): (name, file offset, size).
fn code_and_data(elf: &[u8]) -> Vec<(String, u64, u64)> {
    use object::read::elf::{ElfFile64, SectionHeader as _};
    use object::{Object as _, ObjectSection as _, elf};
    let file = ElfFile64::<object::Endianness>::parse(elf).unwrap();
    let e = file.endian();
    file.sections()
        .filter(|s| {
            let h = s.elf_section_header();
            let name = s.name().unwrap_or_default();
            h.sh_type(e) == elf::SHT_PROGBITS
                && h.sh_flags(e) & u64::from(elf::SHF_ALLOC) != 0
                && ![".eh_frame", ".plt", ".got", ".gcc_except", ".interp"]
                    .iter()
                    .any(|k| name.starts_with(k))
        })
        .filter_map(|s| {
            let (off, size) = s.file_range()?;
            Some((s.name().unwrap_or_default().to_string(), off, size))
        })
        .collect()
}

/// What the cache keeps of each object is enough for DWARF stacks: the
/// binary deleted once it exits, the report unwinds and names them from a
/// copy whose code and data are holes.
#[test]
fn dwarf_stacks_unwind_from_the_kept_tables_once_the_binary_is_gone() {
    let bins = tempfile::tempdir().unwrap();
    let app = bins.path().join("app");
    fs::copy(target_path("unwind_nofp"), &app).unwrap();
    let original = fs::read(&app).unwrap();
    let mut t = Target::start(&app, &["2", "300"]);
    let run = capture(&mut t, &["--symbol", "trigger"]);
    drop(t);
    let files = hit_files(&run);
    assert_eq!(files.len(), 2, "{}", run.output());
    assert!(
        armed(&run)["unwinding"]["mode"]
            .as_str()
            .is_some_and(|m| m.starts_with("dwarf,")),
        "{}",
        run.output()
    );
    let debug = run.out.join(".debug");
    let copies = elf_copies(&debug.join(app.strip_prefix("/").unwrap()));
    assert_eq!(copies.len(), 1, "{copies:?}");
    let kept = fs::read(&copies[0]).unwrap();
    assert_eq!(kept.len(), original.len(), "the copy keeps the layout");
    let left_out = code_and_data(&original);
    assert!(
        left_out.iter().any(|(n, _, _)| n == ".text"),
        "{left_out:?}"
    );
    let mut differ = 0;
    for (i, (a, b)) in original.iter().zip(&kept).enumerate() {
        let i = i as u64;
        let inside = left_out.iter().any(|(_, o, s)| i >= *o && i < o + s);
        if inside {
            assert_eq!(*b, 0, "byte {i:#x} of a left-out section was kept");
        } else if a != b {
            differ += 1;
        }
    }
    assert_eq!(
        differ, 0,
        "bytes outside code and data must be the original's"
    );

    fs::remove_file(&app).unwrap();
    let (mut n, mut reach) = (0, 0);
    for (file, tid, ktime) in &files {
        let text = perf_script_cached(file, &debug);
        let (a, b) = moment_reach(&text, *tid, *ktime, 200_000_000);
        n += a;
        reach += b;
        assert!(
            text.contains("nofp_level3"),
            "{}",
            text.lines().take(30).collect::<Vec<_>>().join("\n")
        );
    }
    eprintln!("{reach} of {n} samples of the moments reach main from the kept copy");
    // As in stacks_reach_main_without_frame_pointers: ~400 samples on an
    // idle machine, fewer on a loaded one.
    assert!(n >= 20, "only {n} samples in the moments\n{}", run.output());
    assert!(reach * 10 >= n * 9, "{reach} of {n} samples reach main");
}

#[test]
fn call_graph_option_and_pass_through_conflict() {
    let t = Target::start(&target_path("unwind_old"), &["1", "10"]);
    let pid = t.pid().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let run = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--output",
        out.to_str().unwrap(),
        "--call-graph",
        "dwarf",
        "--",
        "-g",
    ])
    .finish(Duration::from_secs(30));
    assert_eq!(run.code, Some(2), "{}", run.output());
    assert!(
        run.stderr
            .iter()
            .any(|l| l.contains("--call-graph") && l.contains("keep one")),
        "{}",
        run.output()
    );
    assert!(!out.exists(), "output left behind\n{}", run.output());
}

#[test]
fn a_binary_replaced_while_it_runs_is_warned_about_and_never_renamed() {
    let bins = tempfile::tempdir().unwrap();
    let app = bins.path().join("app");
    fs::copy(target_path("unwind_old"), &app).unwrap();
    // 8 rounds of 300 ms, a hit after each.
    let mut t = Target::start(&app, &["8", "300"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&["--pid", &pid, "--symbol", "trigger", "--json"]);
    agent.wait_armed();
    t.go();
    let first = agent.proc.wait_line(Duration::from_secs(30), |l| {
        l.contains("\"event\":\"snapshot\"")
    });
    assert!(first.is_some(), "no snapshot: {:?}", agent.proc.stderr());
    // The deploy, while the old process runs: a new file at the path.
    fs::remove_file(&app).unwrap();
    fs::copy(target_path("unwind_new"), &app).unwrap();
    t.wait(Duration::from_secs(60));
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    assert!(
        run.stdout
            .iter()
            .any(|l| l.contains("\"event\":\"warning\"")
                && l.contains("replaced or deleted")
                && l.contains(app.to_str().unwrap())),
        "no warning about the replaced binary\n{}",
        run.output()
    );
    let files = hit_files(&run);
    assert!(files.len() >= 4, "{}", run.output());
    let debug = run.out.join(".debug");
    // The first snapshot was written before the deploy: its names stay.
    let text = perf_script_cached(&files[0].0, &debug);
    assert!(text.contains("old_build_level3"), "{text}");
    // The executable's frames, by address: where the first snapshot names
    // old_build_* (the process is the same, so are its addresses).
    let exe_ips = old_build_ips(&text);
    // None of them, before or after, takes the new build's names. Each
    // holds the target's samples with their stacks, and frames at those
    // addresses: `[unknown]` where perf 6.1 finds no file to read the
    // build-id from (docs/build-ids.md, "Where it stops"; 1274-1474 such
    // frames per file in one run, 476-716 in another), or named from the
    // kept copy (939-1059 per file in another), and never anything else.
    for (file, _, _) in &files {
        let text = perf_script_cached(file, &debug);
        let (old, unknown, other) = names_at(&text, &exe_ips);
        eprintln!(
            "{}: at the executable's addresses {old} frames named old_build_*, {unknown} \
             [unknown], {other} named otherwise",
            file.display()
        );
        let samples = parse_samples(&text);
        assert!(
            samples
                .iter()
                .any(|s| s.pid == t.pid() && s.frames.len() > 1),
            "{}: no stacks of the target",
            file.display()
        );
        assert!(
            !text.contains("new_build"),
            "{} names the new build's functions",
            file.display()
        );
        assert!(
            old + unknown > 0 && other == 0,
            "{}: the replaced executable's frames ({exe_ips:?}): {old} named old_build_*, \
             {unknown} [unknown], {other} named otherwise",
            file.display()
        );
    }
}

/// The addresses of the stack lines (`\tIP SYM`) that `perf script` names
/// `old_build_*`.
fn old_build_ips(text: &str) -> HashSet<String> {
    let mut ips = HashSet::new();
    for l in text.lines().filter_map(|l| l.strip_prefix('\t')) {
        let mut w = l.split_whitespace();
        if let (Some(ip), Some(sym)) = (w.next(), w.next())
            && sym.starts_with("old_build_")
        {
            ips.insert(ip.to_string());
        }
    }
    ips
}

/// Of the stack lines of `text` at `ips`: how many perf names `old_build_*`,
/// `[unknown]`, and anything else.
fn names_at(text: &str, ips: &HashSet<String>) -> (usize, usize, usize) {
    let mut counts = (0, 0, 0);
    for l in text.lines().filter_map(|l| l.strip_prefix('\t')) {
        let mut w = l.split_whitespace();
        let (Some(ip), Some(sym)) = (w.next(), w.next()) else {
            continue;
        };
        if !ips.contains(ip) {
            continue;
        }
        match sym {
            s if s.starts_with("old_build_") => counts.0 += 1,
            "[unknown]" => counts.1 += 1,
            _ => counts.2 += 1,
        }
    }
    counts
}

#[test]
fn exe_runs_share_one_cache_in_the_root_directory() {
    let bin = target_path("unwind_old");
    let exe = bin.display().to_string();
    // Continuous: these processes exit right after their hit, before a
    // flight recorder's tail-synthesized mmap records could be written
    // (docs/flight-recorder.md).
    let mut agent = Agent::start(&[
        "--exe",
        &exe,
        "--symbol",
        "trigger",
        "--continuous",
        "--json",
    ]);
    agent.wait_armed();
    // Two processes of the executable, one after the other: one recorder
    // each, in OUT/<pid>.
    let mut pids = Vec::new();
    for _ in 0..2 {
        let mut p = Target::start(&bin, &["1", "100"]);
        let pid = p.pid();
        let started = agent.proc.wait_line(Duration::from_secs(30), |l| {
            l.contains("\"event\":\"target_started\"") && l.contains(&format!("\"pid\":{pid}"))
        });
        assert!(
            started.is_some(),
            "no recorder for {pid}: {:?}",
            agent.proc.stdout()
        );
        p.go();
        p.wait(Duration::from_secs(30));
        let finished = agent.proc.wait_line(Duration::from_secs(30), |l| {
            l.contains("\"event\":\"target_finished\"") && l.contains(&format!("\"pid\":{pid}"))
        });
        assert!(
            finished.is_some(),
            "{pid} not finished: {:?}",
            agent.proc.stdout()
        );
        pids.push(pid);
    }
    agent.proc.signal(libc::SIGINT);
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let debug = run.out.join(".debug");
    // One copy of the executable for both processes, none per process.
    let copies = elf_copies(&debug.join(bin.strip_prefix("/").unwrap()));
    assert_eq!(copies.len(), 1, "{copies:?}");
    for pid in pids {
        let dir = run.out.join(pid.to_string());
        assert!(!dir.join(".debug").exists());
        let index = read_index(&dir.join("snapshots.jsonl"));
        let file = index
            .iter()
            .find(|v| v["hits"].as_array().is_some_and(|h| !h.is_empty()))
            .unwrap_or_else(|| panic!("no snapshot with a hit for {pid}: {index:?}"))["file"]
            .as_str()
            .unwrap()
            .to_string();
        let text = perf_script_cached(&dir.join(file), &debug);
        assert!(text.contains("old_build_level3"), "{text}");
    }
}

/// Of the samples in the `window_ns` before `ktime_ns` that are in
/// `main.burnCPU` (any thread: a goroutine moves between threads): how many
/// there are, and how many reach `main.handler` and the goroutine's start.
fn go_moment_reach(text: &str, ktime_ns: u64, window_ns: u64) -> (usize, usize) {
    let moment: Vec<Sample> = parse_samples(text)
        .into_iter()
        .filter(|s| s.time_ns <= ktime_ns && s.time_ns + window_ns >= ktime_ns)
        .filter(|s| s.frames.iter().any(|f| f == "main.burnCPU"))
        .collect();
    let reach = moment
        .iter()
        .filter(|s| {
            s.frames.iter().any(|f| f == "main.handler")
                && s.frames.iter().any(|f| f.starts_with("runtime.goexit"))
        })
        .count();
    (moment.len(), reach)
}

#[test]
fn go_keeps_frame_pointers_and_its_stacks_reach_the_goroutine_start() {
    // A copy, so that the deploy below (the binary deleted) is the test's own.
    let bins = tempfile::tempdir().unwrap();
    let bin = bins.path().join("srv");
    fs::copy(go_target(), &bin).unwrap();
    // handler(i) burns 300 ms in burnCPU, then calls trigger(i).
    let mut t = Target::start(&bin, &["handler", "2", "300"]);
    let run = capture(&mut t, &["--symbol", "main.trigger", "-v"]);
    let a = armed(&run);
    assert_eq!(a["unwinding"]["mode"], "fp", "{a}\n{}", run.output());
    assert!(
        a["unwinding"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("frame pointers kept") && r.contains("(Go)")),
        "{a}"
    );
    // A Go binary has a Go build ID, not a GNU one: no "has no build-id".
    let all: Vec<&String> = run.stdout.iter().chain(&run.stderr).collect();
    assert!(
        !all.iter().any(|l| l.contains("has no build-id")),
        "{}",
        run.output()
    );
    assert!(
        all.iter()
            .any(|l| l.contains("is a Go binary") && l.contains("Go build ID")),
        "no word on how the Go binary is kept\n{}",
        run.output()
    );
    // Kept by its Go build ID.
    let debug = run.out.join(".debug");
    let kept = elf_copies(&debug.join(bin.strip_prefix("/").unwrap()));
    assert!(
        kept.len() == 1
            && kept[0]
                .parent()
                .and_then(|d| d.file_name())
                .is_some_and(|n| n.to_string_lossy().starts_with("go-")),
        "{kept:?}"
    );
    let files = hit_files(&run);
    assert!(!files.is_empty(), "{}", run.output());
    let (mut n, mut reach) = (0, 0);
    for (file, _, ktime) in &files {
        let (a, b) = go_moment_reach(&perf_script_cached(file, &debug), *ktime, 200_000_000);
        n += a;
        reach += b;
    }
    eprintln!(
        "Go, fp: {reach} of {n} samples in main.burnCPU reach main.handler and runtime.goexit"
    );
    // 200 ms per hit at 999 Hz: ~200 samples each on an idle machine.
    assert!(n >= 20, "only {n} samples in the moments\n{}", run.output());
    assert!(
        reach * 10 >= n * 9,
        "{reach} of {n} samples of the moments reach main.handler and runtime.goexit"
    );

    // The deploy: the binary gone. perf would name its frames from the file
    // at the path; the report says that the build that ran is elsewhere.
    fs::remove_file(&bin).unwrap();
    let page = report_page(&run.out);
    assert!(
        page.contains(&format!("{} is now no Go binary", bin.display()))
            && page.contains(&kept[0].display().to_string()),
        "the report does not say that the Go binary that ran is gone and where it is kept"
    );
}

/// Each folded line's (frames root first, count) of every `*.all.folded`
/// file the report wrote under `out/report`.
fn all_folded(out: &Path) -> Vec<(Vec<String>, u64)> {
    let mut lines = Vec::new();
    let mut dirs = vec![out.join("report")];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.to_string_lossy().ends_with(".all.folded") {
                lines.extend(read_folded(&p));
            }
        }
    }
    lines
}

/// PostgreSQL's shape (tests/targets/deepfork.c, no frame pointers): a
/// master whose main loop holds a 6 KiB frame forks workers after the
/// agent is armed. `auto` measures the master spinning below that frame
/// and takes a copy of at most 1024 bytes: from the workers' code no copy
/// that small reaches `main`, and the workers did not exist when it
/// measured. Their cut stacks are completed by their frames' places on
/// the stack (report/graft.rs, `Links`): each worker starts with the
/// master's stack at the same addresses, which the measurement's donors
/// hold. By names alone they cannot be: no stack of a worker's own thread
/// is whole.
#[test]
fn forked_workers_cut_stacks_are_completed_by_their_frames_places() {
    let mut t = Target::start(&target_path("deepfork"), &["3", "400"]);
    let run = capture(&mut t, &["--symbol", "trigger"]);
    let a = armed(&run);
    let bytes = a["unwinding"]["copy_measured"]["bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no copy measured: {a}"));
    assert!(bytes <= 1024, "a copy of {bytes} bytes: {a}");
    report_ok(&run.out, &[]);
    let (mut workers, mut whole) = (0, 0);
    for (frames, n) in all_folded(&run.out) {
        if frames.iter().any(|f| f == "query_a" || f == "query_b") {
            workers += n;
            if frames.first().is_some_and(|f| f == "_start") {
                whole += n;
            }
        }
    }
    eprintln!("dwarf,{bytes}: {whole} of {workers} worker samples reach _start");
    assert!(
        workers >= 50,
        "only {workers} worker samples\n{}",
        run.output()
    );
    assert!(
        whole * 10 >= workers * 9,
        "{whole} of {workers} worker samples reach _start"
    );
}
