//! How many bytes of stack a DWARF sample needs for perf to unwind it whole
//! (issue 28 §4): the measurement behind `auto`'s `dwarf,SIZE`
//! (docs/unwinding.md, "How much stack a sample needs").
//!
//! perf records the processes once with a large copy
//! ([`FULL_BYTES`]); the agent's own measurement
//! (`mt_agent::report::stack_need`, which this file uses) explains how
//! lowering each sample's `dyn_size` in the file shows exactly what
//! `dwarf,N` would have unwound. The file is patched in place for each
//! size, from the largest down, and `perf script` unwinds it each time: a
//! sample is whole at N if its stack there is the stack it has with the
//! full copy. Then the agent's own choice is measured on the same live
//! processes, as a run with `--call-graph auto` makes it.

use std::{fs, path::Path, process::Command};

use mt_agent::{
    output::run_file::StackDonors,
    report::stack_need::{
        FULL_BYTES, NotMeasured, Samples, data_section, dyn_size_offsets_of, names,
        read as read_recording, set_copy_size, whole_percent,
    },
};
use mt_agent_tests::perf_bin;

use crate::stack_targets::{self, Loaded};
use serde_json::{Value, json};

/// The copy sizes tried, bytes, largest first.
pub const SIZES: &[u64] = &[
    16384, 12288, 8192, 6144, 4096, 3072, 2048, 1536, 1024, 768, 512,
];

/// Of each sample, the smallest size of [`SIZES`] at which its stack is the
/// one it has with the full copy, or `None` where none is: sizes are tried
/// largest first, so `stacks[k]` is the recording read at `SIZES[k]`.
pub fn needed(full: &Samples, stacks: &[Samples]) -> Vec<Option<u64>> {
    (0..full.samples.len())
        .map(|i| {
            let whole = names(full, i);
            let mut need = None;
            for (k, at) in stacks.iter().enumerate() {
                match (i < at.samples.len()).then(|| names(at, i)) {
                    Some(t) if t == whole => need = Some(SIZES[k]),
                    _ => break,
                }
            }
            need
        })
        .collect()
}

/// Whether sample `i`'s stack reaches its thread's start: the outermost
/// frame is where a process or a thread begins.
fn reaches_start(s: &Samples, i: usize) -> bool {
    names(s, i).last().is_some_and(|f| {
        [
            "_start",
            "clone",
            "clone3",
            "start_thread",
            "__libc_start_main",
        ]
        .iter()
        .any(|start| f == start || f.starts_with(&format!("{start}@")))
    })
}

/// The recording as the report reads it, with its frames' places.
fn read(file: &Path) -> Samples {
    read_recording(&perf_bin().expect("perf"), file).expect("perf script")
}

/// Records `pids` for `seconds` at 999 Hz with a [`FULL_BYTES`] copy into
/// `dir/full.data`, then measures the file. `name` labels the row.
pub fn measure(name: &str, pids: &[u32], seconds: u64, dir: &Path) -> Value {
    let file = dir.join("full.data");
    let list: Vec<String> = pids.iter().map(u32::to_string).collect();
    let ok = Command::new(perf_bin().expect("perf"))
        // --no-buildid-cache: nothing goes into ~/.debug.
        .args([
            "record",
            "-q",
            "--no-buildid-cache",
            "-F",
            "999",
            "-e",
            "cpu-clock",
            "--call-graph",
        ])
        .arg(format!("dwarf,{FULL_BYTES}"))
        .args(["-p", &list.join(","), "-o"])
        .arg(&file)
        .args(["--", "sleep", &seconds.to_string()])
        .status()
        .expect("perf record")
        .success();
    if !ok {
        return json!({"target": name, "failed": "perf record failed"});
    }
    let mut v = measure_file(name, &file);
    auto_choice(&mut v, pids, dir, &file);
    let _ = fs::remove_file(&file);
    v
}

/// What `--call-graph auto` chooses on the same live processes (the
/// agent's own measurement, 0.5 s), how whole the 5 s recording's samples
/// (`file`) are at that size once grafted as the run's report grafts them
/// (from their own thread's whole stacks, then from the measurement's),
/// and how much further back a ring of the same size then reaches than
/// with perf's `dwarf,8192` (bytes per sample, derived from this file's).
fn auto_choice(v: &mut Value, pids: &[u32], dir: &Path, file: &Path) {
    let pids: Vec<i32> = pids.iter().map(|&p| p as i32).collect();
    let perf = perf_bin().expect("perf");
    let m = match mt_agent::report::stack_need::measure(&perf, &pids, 999, dir) {
        Ok(m) => m,
        // Too few samples in 0.5 s is the agent's own fallback (it keeps
        // 4096 and says so), not a failed row: the demo's bursty load
        // gave 77-99 samples in some quick runs.
        Err(why @ NotMeasured::TooFewSamples(_)) => {
            v["auto"] = json!({"not_measured": why.to_string()});
            return;
        }
        Err(why) => {
            v["auto"] = json!({"failed": why.to_string()});
            return;
        }
    };
    let bytes = m.measured.bytes;
    let mut f = open_to_patch(file);
    // As recorded: `measure_file` left each sample's own `dyn_size`.
    let sizes = dyn_size_offsets_of(&mut f).unwrap();
    let full = read(file);
    set_copy_size(&mut f, &sizes, bytes, |_| false).unwrap();
    let cut = read(file);
    let other = v["other_bytes_per_sample"].as_f64().unwrap_or(0.0);
    let own = whole_percent(&full, cut.clone(), 0, &StackDonors::default());
    v["auto"] = json!({
        "bytes": bytes,
        "measured_whole_percent": m.measured.whole_percent,
        "measured_samples": m.measured.samples,
        "threads_not_sampled": m.measured.threads_not_sampled,
        "measure_ms": m.measured.ms,
        "donor_stacks": m.donors.stacks.len(),
        "whole_percent_grafted": own,
        "whole_percent_with_donors": whole_percent(&full, cut, 0, &m.donors),
        "reach_vs_8192": (8192.0 + other) / (bytes as f64 + other),
    });
}

/// The table: each program of stack_targets.rs recorded for 5 s (2 s with
/// `--quick`) under its load.
pub fn run(quick: bool) -> Value {
    let seconds = if quick { 2 } else { 5 };
    let mut rows = Vec::new();
    let mut one = |name: &str, start: &dyn Fn(&Path) -> Loaded| {
        let dir = tempfile::tempdir().unwrap();
        let loaded = start(dir.path());
        let v = measure(name, &loaded.pids, seconds, dir.path());
        drop(loaded);
        eprintln!("bench: stack need {v}");
        rows.push(v);
    };
    one("nginx (Debian)", &|d| stack_targets::nginx(d));
    one("postgres (Debian)", &|d| {
        stack_targets::postgres(d, seconds)
    });
    for (name, path, args) in stack_targets::own_targets(seconds) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        one(name, &|_| stack_targets::own(&path, &args));
    }
    json!({"full_bytes": FULL_BYTES, "rows": rows})
}

/// A recording opened for its `dyn_size`s to be patched in place.
fn open_to_patch(file: &Path) -> fs::File {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap()
}

/// The row for one recorded file (see the module's docs).
fn measure_file(name: &str, file: &Path) -> Value {
    let full = read(file);
    let mut f = open_to_patch(file);
    let sizes = dyn_size_offsets_of(&mut f).unwrap();
    let (_, size) = data_section(&mut f).unwrap();
    let mut stacks = Vec::new();
    let mut grafted = Vec::new();
    for &n in SIZES {
        set_copy_size(&mut f, &sizes, n, |_| false).unwrap();
        let at = read(file);
        // Completed from the recording's own stacks only, as a snapshot
        // of a run without `auto`'s donors.
        grafted.push(whole_percent(&full, at.clone(), 0, &StackDonors::default()));
        stacks.push(at);
    }
    // The file as recorded again (`sizes` holds each sample's own
    // `dyn_size`), for `auto_choice`.
    set_copy_size(&mut f, &sizes, FULL_BYTES, |_| false).unwrap();
    // What a sample holds besides its stack copy, from this file: its data
    // section's bytes per stack sample, less the copy.
    let other = (size as f64 / sizes.len().max(1) as f64 - FULL_BYTES as f64).max(0.0);
    let need = needed(&full, &stacks);
    let mut v = row(name, &full, &need, sizes.len());
    v["other_bytes_per_sample"] = json!(other);
    v["grafted"] = json!(
        SIZES
            .iter()
            .zip(&grafted)
            .rev()
            .map(|(n, g)| json!({"bytes": n, "own_percent": g}))
            .collect::<Vec<_>>()
    );
    // The smallest size whole for ≥ 99% once the report completes the cut
    // stacks from the recording's own.
    let grafted_99 = SIZES
        .iter()
        .zip(&grafted)
        .rev()
        .find(|(_, g)| **g >= 99.0)
        .map(|(n, _)| *n);
    v["bytes_for_99_percent_grafted"] = json!(grafted_99);
    // How much further a ring of the same size reaches back with a copy
    // than with perf's default 8192: bytes per sample.
    let reach = |chosen: Option<f64>| chosen.map(|c| (8192.0 + other) / (c + other));
    v["reach_vs_8192"] = json!(reach(v["bytes_for_99_percent"].as_f64()));
    v["reach_vs_8192_grafted"] = json!(reach(grafted_99.map(|n| n as f64)));
    v
}

/// Sizes whole for at least 99% of the samples, and the spread.
fn row(name: &str, full: &Samples, need: &[Option<u64>], stack_samples: usize) -> Value {
    let n = full.samples.len().max(1) as f64;
    let whole_at = |size: u64| need.iter().filter(|m| m.is_some_and(|m| m <= size)).count();
    let per_size: Vec<Value> = SIZES
        .iter()
        .rev()
        .map(|&s| json!({"bytes": s, "whole_percent": 100.0 * whole_at(s) as f64 / n}))
        .collect();
    let choose = SIZES
        .iter()
        .rev()
        .copied()
        .find(|&s| whole_at(s) as f64 >= 0.99 * n);
    json!({
        "target": name,
        "samples": full.samples.len(),
        "stack_samples": stack_samples,
        "reach_start_percent": 100.0
            * (0..full.samples.len()).filter(|&i| reaches_start(full, i)).count() as f64
            / n,
        "whole_at": per_size,
        "bytes_for_99_percent": choose,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(samples: &[&str]) -> Samples {
        let mut text = String::new();
        for (k, frames) in samples.iter().enumerate() {
            text.push_str(&format!(" 1 1.{k:09}: \n"));
            for f in frames.split(';') {
                text.push_str(&format!("\t1 {f} (/t)\n"));
            }
            text.push('\n');
        }
        mt_agent::report::stack_need::parse_samples(text.as_bytes()).unwrap()
    }

    #[test]
    fn a_sample_needs_the_smallest_size_that_keeps_its_whole_stack() {
        let full = run(&["f;main;_start", "g;main"]);
        // The first sample loses main below SIZES[3]; the second never does.
        let stacks: Vec<Samples> = (0..SIZES.len())
            .map(|k| {
                if k < 4 {
                    run(&["f;main;_start", "g;main"])
                } else {
                    run(&["f", "g;main"])
                }
            })
            .collect();
        assert_eq!(needed(&full, &stacks), vec![Some(SIZES[3]), Some(512)]);
        assert!(reaches_start(&full, 0) && !reaches_start(&full, 1));
    }
}
