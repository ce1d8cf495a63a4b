//! How perf keeps samples between snapshots: the flight recorder writes
//! nothing while it waits, and `--max-disk` bounds what a run keeps.
//! Privileged.

use std::{fs, time::Duration};

use mt_agent_tests::*;

/// Ring size used by the flight-recorder test, per CPU: small enough that it
/// cannot hold the 5 s of two busy threads before a hit (~100 bytes a sample
/// here, so ~160 samples a ring: under a second even on a loaded machine).
const RING: u64 = 16 << 10;

/// Bytes of perf's open file while it waits in flight-recorder mode: the
/// header and the synthesized process and mmap events, no samples. Loose:
/// the header alone is a few KiB here.
const WAITING_FILE_MAX: u64 = 128 << 10;

#[test]
fn the_flight_recorder_writes_only_at_a_hit_and_holds_the_moment_before_it() {
    let mut t = Target::start(&target_path("target"), &["busy", "2", "5000"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--flight-recorder",
        "--flight-ring",
        "16K",
        "--json",
    ]);
    agent.wait_armed();
    let out = agent.out.clone();
    t.go();
    // 2.5 s into the first 5 s of work, before the first hit.
    t.proc
        .wait_line(Duration::from_secs(20), |l| l.starts_with("halfway 0"))
        .expect("target reached halfway");
    let mut names: Vec<String> = fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    // `.perf.data.open` is a second name of perf's open file (the recorder
    // keeps the next snapshot's file by it: capture/recorder.rs,
    // `keep_newest`), not a file of its own.
    assert_eq!(
        names,
        [".perf.data.open", "perf.data", "snapshots.jsonl"],
        "OUT while waiting"
    );
    let ino = |n: &str| std::os::unix::fs::MetadataExt::ino(&fs::metadata(out.join(n)).unwrap());
    assert_eq!(ino(".perf.data.open"), ino("perf.data"));
    let waiting = fs::metadata(out.join("perf.data")).unwrap().len();
    assert!(
        waiting <= WAITING_FILE_MAX,
        "perf.data holds {waiting} bytes after 2.5 s of waiting: samples were written"
    );
    assert_eq!(fs::metadata(out.join("snapshots.jsonl")).unwrap().len(), 0);

    t.wait(Duration::from_secs(30));
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    run.assert_index_consistent();
    let hits = run.entries("hit");
    assert_eq!(hits.len(), 2, "{}", run.output());
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    for h in &hits {
        let hit_ns = h["hits"][0]["ktime_ns"].as_u64().unwrap();
        let first = h["first_sample_ns"].as_u64().expect("first_sample_ns");
        let last = h["last_sample_ns"].as_u64().expect("last_sample_ns");
        // The moment before the hit is there...
        assert!(
            last <= hit_ns + 50_000_000,
            "last sample after the hit: {h}"
        );
        assert!(
            hit_ns.saturating_sub(last) < 1_000_000_000,
            "no sample in the last second before the hit: {h}"
        );
        // ...but not the whole 5 s of work: the rings are too small.
        assert!(
            hit_ns - first < 4_000_000_000,
            "samples from {} ms before the hit: the ring kept more than it can hold: {h}",
            (hit_ns - first) / 1_000_000
        );
        let bytes = h["bytes"].as_u64().unwrap();
        assert!(
            bytes <= cpus * RING + WAITING_FILE_MAX,
            "{bytes} bytes: more than {cpus} rings of {RING}: {h}"
        );
        // The index's span is the file's.
        let file = run.out.join(h["file"].as_str().unwrap());
        let samples = perf_samples(&file);
        let min = samples.iter().map(|s| s.time_ns).min().unwrap();
        let max = samples.iter().map(|s| s.time_ns).max().unwrap();
        assert_eq!(h["samples"].as_u64(), Some(samples.len() as u64), "{h}");
        // perf script prints ns; parsing through f64 costs under 1 µs.
        assert!(
            min.abs_diff(first) < 1_000,
            "first {first} vs perf script {min}"
        );
        assert!(
            max.abs_diff(last) < 1_000,
            "last {last} vs perf script {max}"
        );
    }
    let armed = run
        .stdout
        .iter()
        .find(|l| l.contains("\"event\":\"armed\""))
        .unwrap();
    assert!(
        armed.contains("\"recording\":\"flight-recorder\""),
        "{armed}"
    );
    assert!(
        armed.contains(&format!("\"flight_ring_bytes\":{RING}")),
        "{armed}"
    );
}

#[test]
fn max_disk_keeps_the_newest_snapshots_within_the_budget() {
    // 12 hits, 150 ms apart, each snapshot ~15-40 KiB of two busy threads.
    let mut t = Target::start(&target_path("target"), &["busy", "12", "150"]);
    let budget: u64 = 64 << 10;
    let run = capture(
        &mut t,
        &[
            "--symbol",
            "trigger",
            "--continuous",
            "--max-disk",
            "64K",
            "--cooldown",
            "0",
        ],
    );
    let hits = run.entries("hit");
    // On a loaded machine two hits can share a snapshot (merged).
    assert!(hits.len() >= 6, "{}", run.output());
    let deleted: Vec<&str> = run
        .entries("deleted")
        .iter()
        .map(|e| e["file"].as_str().unwrap())
        .collect();
    assert!(!deleted.is_empty(), "nothing deleted: {}", run.output());
    // Every file the index still lists is on disk, every deleted one is
    // gone, and what is kept fits the budget.
    let mut kept = 0;
    for e in run.index.iter().filter(|e| e["kind"] != "deleted") {
        let name = e["file"].as_str().unwrap();
        let path = run.out.join(name);
        if deleted.contains(&name) {
            assert!(!path.exists(), "{name} indexed as deleted but still there");
        } else {
            kept += fs::metadata(&path)
                .unwrap_or_else(|_| panic!("{name} is listed but gone"))
                .len();
        }
    }
    // The newest hit stays beside the tail even when both exceed the
    // budget; the run then says so.
    let warned = run.stdout.iter().any(|l| l.contains("--max-disk is"));
    assert!(
        kept <= budget || warned,
        "{kept} bytes kept over a {budget} budget, without a warning"
    );
    // The oldest went first: the deleted files are the first ones listed,
    // and the newest snapshot (the tail, written last) is kept.
    let listed: Vec<&str> = run
        .index
        .iter()
        .filter(|e| e["kind"] != "deleted")
        .map(|e| e["file"].as_str().unwrap())
        .collect();
    assert_eq!(
        &listed[..deleted.len()],
        &deleted[..],
        "not the oldest first: listed {listed:?}, deleted {deleted:?}"
    );
    let newest = listed.last().unwrap();
    assert!(!deleted.contains(newest), "the newest snapshot was deleted");
}

/// The kernel's records in a snapshot: perf's `MMAP` of
/// `[kernel.kallsyms]_text` and any `KSYMBOL`s, from `perf script
/// -D`, perf's dump of every record (the part of the line after the file
/// offset).
fn kernel_records(file: &std::path::Path) -> Vec<String> {
    let out = std::process::Command::new(perf_bin().expect("perf"))
        .args(["script", "-D", "-i"])
        .arg(file)
        .output()
        .expect("perf script");
    assert!(
        out.status.success(),
        "perf script: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            (l.contains("PERF_RECORD_MMAP") && l.contains("kernel.kallsyms"))
                || (l.contains("PERF_RECORD_KSYMBOL") && !is_bpf_program(l))
        })
        .map(|l| {
            l.split_once("PERF_RECORD")
                .map_or(l, |(_, r)| r)
                .trim()
                .to_string()
        })
        .collect()
}

/// Whether a `KSYMBOL` record names a loaded BPF program. perf writes those
/// from the kernel's program list (`BPF_PROG_GET_INFO_BY_FD`,
/// tools/perf/util/bpf-event.c) or from the kernel's live records, not from
/// `/proc/kallsyms`, and the agent's own programs load in a thread while
/// perf starts (capture/driver `start`): whether perf's synthesis finds them
/// is a race, seen both ways on one machine (stop 40). The kernel's `MMAP`
/// record and the trampolines' and dispatchers' `KSYMBOL`s, which perf does
/// take from kallsyms, are kept whole.
fn is_bpf_program(record: &str) -> bool {
    record.contains(" name bpf_prog_")
}

/// One capture of two hits, perf reading `kallsyms` (`copy` or `proc`):
/// the first hit snapshot's kernel records.
fn kernel_records_reading(kallsyms: &str) -> Vec<String> {
    let mut t = Target::start(&target_path("target"), &["calls", "2", "100"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start_with(
        &[
            "--pid",
            &pid,
            "--symbol",
            "trigger",
            "--cooldown",
            "0",
            "--json",
        ],
        |c| {
            if kallsyms == "proc" {
                c.env("MT_AGENT_PERF_KALLSYMS", "proc");
            }
        },
    );
    agent.wait_armed();
    t.go();
    t.wait(Duration::from_secs(30));
    let run = agent.finish(FINISH);
    assert_eq!(run.code, Some(0), "{}", run.output());
    let armed = armed_event(&run.stdout).expect("an armed event");
    assert_eq!(armed["perf_kallsyms"], kallsyms, "{}", run.output());
    let hit = run.entries("hit")[0]["file"].as_str().unwrap().to_string();
    kernel_records(&run.out.join(hit))
}

/// perf reads a copy of `/proc/kallsyms` with only the lines its record side
/// uses (perf/kallsyms.rs, docs/perf-kallsyms.md): what it writes of the
/// kernel must be what it writes reading the real file, and the copy's name
/// must be gone.
#[test]
fn perf_reading_the_kallsyms_copy_writes_the_kernel_records_it_writes_from_the_real_file() {
    let copied = kernel_records_reading("copy");
    let real = kernel_records_reading("proc");
    assert!(
        copied.iter().any(|l| l.contains("[kernel.kallsyms]_text")),
        "no kernel MMAP record: {copied:?}"
    );
    assert_eq!(copied, real, "the kernel's records differ");
    let left: Vec<_> = fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".mt-agent-kallsyms"))
        .collect();
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

#[test]
fn a_budget_below_one_snapshot_keeps_the_newest_hit_and_says_so() {
    let mut t = Target::start(&target_path("target"), &["calls", "3", "300"]);
    let run = capture(&mut t, &["--symbol", "trigger", "--max-disk", "1"]);
    let hits: Vec<&str> = run
        .entries("hit")
        .iter()
        .map(|e| e["file"].as_str().unwrap())
        .collect();
    assert_eq!(hits.len(), 3, "{}", run.output());
    let tail = run.entries("tail")[0]["file"].as_str().unwrap();
    // The last hit's snapshot and the tail are on disk; older hits are gone.
    assert!(run.out.join(hits[2]).is_file(), "{}", run.output());
    assert!(run.out.join(tail).is_file(), "{}", run.output());
    for old in &hits[..2] {
        assert!(!run.out.join(old).exists(), "{old} kept: {}", run.output());
    }
    let warnings: Vec<&String> = run
        .stdout
        .iter()
        .filter(|l| l.contains("\"warning\"") && l.contains("--max-disk is"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", run.output());
    eprintln!("--max-disk 1: {}", warnings[0]);
}
