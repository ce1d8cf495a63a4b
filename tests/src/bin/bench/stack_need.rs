//! How many bytes of stack a DWARF sample needs for perf to unwind it whole
//! (issue 28 §4): the measurement behind the default `dwarf,SIZE`
//! (docs/unwinding.md, "How much stack a sample needs").
//!
//! perf records the processes once with a large copy
//! ([`FULL_BYTES`]). Each `PERF_SAMPLE_STACK_USER` part of a sample ends
//! with `dyn_size`, the number of bytes the kernel did copy, and perf's
//! unwinder reads no further than that (`evsel__parse_sample()` in perf's
//! evsel code sets `user_stack.size` from it). So lowering `dyn_size` in
//! the file to N shows, exactly, what a recording with `dwarf,N` would have
//! unwound from the same samples. The file is patched in place for each
//! size, from the largest down, and `perf script` unwinds it each time: a
//! sample is whole at N if its stack there is the stack it has with the
//! full copy.

use std::{
    fs,
    io::{Read, Seek, SeekFrom, Write},
    path::Path,
    process::Command,
};

use mt_agent_tests::{Sample, parse_samples, perf_bin};

use crate::stack_targets::{self, Loaded};
use serde_json::{Value, json};

/// The copy the reference recording asks for, bytes: 32 KiB, which a sample
/// record (at most 64 KiB, its size being a `u16`) holds without the kernel
/// shrinking it.
pub const FULL_BYTES: u64 = 32768;

/// The copy sizes tried, bytes, largest first.
pub const SIZES: &[u64] = &[
    16384, 12288, 8192, 6144, 4096, 3072, 2048, 1536, 1024, 768, 512,
];

/// Where each stack sample's `dyn_size` lies in a perf.data file, and its
/// value: (file offset, bytes copied).
///
/// A sample record holding a user stack copy of `copy` bytes has
/// `u64 size (= copy) | copy bytes | u64 dyn_size`, followed by the `u64`
/// fields that come after `PERF_SAMPLE_STACK_USER` in perf_event_open(2)'s
/// order: perf 6.1's `--call-graph dwarf` asks for one, `DATA_SRC`
/// (`perf evlist -v`). A record is taken as one when, for some number of
/// such fields (0 to 3), the `u64` `copy + 16` bytes before them is `copy`.
pub fn stack_sizes(data: &[u8], data_offset: u64, copy: u64) -> Vec<(u64, u64)> {
    const PERF_RECORD_SAMPLE: u32 = 9;
    let u64_at = |o: usize| u64::from_le_bytes(data[o..o + 8].try_into().unwrap());
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 8 <= data.len() {
        let kind = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
        let size = u16::from_le_bytes(data[at + 6..at + 8].try_into().unwrap()) as usize;
        if size < 8 || at + size > data.len() {
            break;
        }
        let end = at + size;
        let stack_end = (0..4).filter_map(|t| end.checked_sub(8 * t)).find(|&e| {
            e.checked_sub(copy as usize + 16)
                .is_some_and(|c| c >= at + 8 && u64_at(c) == copy)
        });
        if let (PERF_RECORD_SAMPLE, Some(e)) = (kind, stack_end) {
            out.push((data_offset + e as u64 - 8, u64_at(e - 8)));
        }
        at = end;
    }
    out
}

/// The data section of a perf.data file: (offset, size), from its header
/// (`struct perf_file_header`: magic, size, attr_size, then the attrs'
/// and the data's `{offset, size}`).
fn data_section(file: &mut fs::File) -> std::io::Result<(u64, u64)> {
    let mut h = [0u8; 56];
    file.read_exact(&mut h)?;
    if &h[0..8] != b"PERFILE2" {
        return Err(std::io::Error::other("not a perf.data file"));
    }
    let at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
    Ok((at(40), at(48)))
}

/// Of each sample, the smallest size of [`SIZES`] at which its stack is the
/// one it has with the full copy, or `None` where none is: sizes are tried
/// largest first, so `stacks[k]` is the stacks at `SIZES[k]`.
pub fn needed(full: &[Sample], stacks: &[Vec<Sample>]) -> Vec<Option<u64>> {
    full.iter()
        .enumerate()
        .map(|(i, s)| {
            let mut need = None;
            for (k, at) in stacks.iter().enumerate() {
                match at.get(i) {
                    Some(t) if t.frames == s.frames => need = Some(SIZES[k]),
                    _ => break,
                }
            }
            need
        })
        .collect()
}

/// Whether a stack reaches its thread's start: the outermost frame is
/// where a process or a thread begins.
fn reaches_start(s: &Sample) -> bool {
    s.frames.last().is_some_and(|f| {
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

fn script(file: &Path) -> Vec<Sample> {
    let out = Command::new(perf_bin().expect("perf"))
        .args([
            "script",
            "--no-inline",
            "-F",
            "pid,tid,time,ip,sym",
            "--ns",
            "-i",
        ])
        .arg(file)
        .output()
        .expect("perf script");
    assert!(out.status.success(), "perf script -i {}", file.display());
    parse_samples(&String::from_utf8_lossy(&out.stdout))
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
    let v = measure_file(name, &file);
    let _ = fs::remove_file(&file);
    v
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

/// The row for one recorded file (see the module's docs).
fn measure_file(name: &str, file: &Path) -> Value {
    let full = script(file);
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let (offset, size) = data_section(&mut f).unwrap();
    let mut data = vec![0u8; size as usize];
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.read_exact(&mut data).unwrap();
    let sizes = stack_sizes(&data, offset, FULL_BYTES);
    drop(data);
    let mut stacks = Vec::new();
    let mut grafted = Vec::new();
    for &n in SIZES {
        for (i, &(at, dyn_size)) in sizes.iter().enumerate() {
            // Every REFERENCE_EVERY-th sample keeps its whole copy: a
            // reference stream (see `grafted_whole`).
            let keep = i.is_multiple_of(REFERENCE_EVERY);
            f.seek(SeekFrom::Start(at)).unwrap();
            f.write_all(&if keep { dyn_size } else { dyn_size.min(n) }.to_le_bytes())
                .unwrap();
        }
        f.flush().unwrap();
        let at = script(file);
        grafted.push(grafted_whole(&full, &at));
        // The reference samples were left whole: their stacks at this
        // size are their cut ones, so `needed` reads them from the
        // unpatched pass above.
        stacks.push(at);
    }
    // What a sample holds besides its stack copy, from this file: its data
    // section's bytes per stack sample, less the copy.
    let other = (size as f64 / sizes.len().max(1) as f64 - FULL_BYTES as f64).max(0.0);
    // The reference samples kept their whole copy at every size: the
    // sizes' figures leave them out.
    let not_ref = |i: usize| !i.is_multiple_of(REFERENCE_EVERY);
    let need: Vec<_> = needed(&full, &stacks)
        .into_iter()
        .enumerate()
        .filter_map(|(i, n)| not_ref(i).then_some(n))
        .collect();
    let full: Vec<Sample> = full
        .into_iter()
        .enumerate()
        .filter_map(|(i, s)| not_ref(i).then_some(s))
        .collect();
    let mut v = row(name, &full, &need, sizes.len());
    v["other_bytes_per_sample"] = json!(other);
    v["grafted"] = json!(
        SIZES
            .iter()
            .zip(&grafted)
            .rev()
            .map(|(n, g)| json!({"bytes": n, "own_percent": g.0, "with_references_percent": g.1}))
            .collect::<Vec<_>>()
    );
    // The smallest size whole for ≥ 99% once the report grafts (from the
    // thread's own complete samples: what report/graft.rs does).
    let grafted_99 = SIZES
        .iter()
        .zip(&grafted)
        .rev()
        .find(|(_, g)| g.0 >= 99.0)
        .map(|(n, _)| *n);
    v["bytes_for_99_percent_grafted"] = json!(grafted_99);
    // How much further a ring of the same size reaches back with a copy
    // than with perf's default 8192: bytes per sample.
    let reach = |chosen: Option<f64>| chosen.map(|c| (8192.0 + other) / (c + other));
    v["reach_vs_8192"] = json!(reach(v["bytes_for_99_percent"].as_f64()));
    v["reach_vs_8192_grafted"] = json!(reach(grafted_99.map(|n| n as f64)));
    v
}

/// One sample in this many keeps its whole copy in the graft passes:
/// 999 Hz ÷ 100, a reference stream of ~10 Hz.
pub const REFERENCE_EVERY: usize = 100;

/// Complete stacks, leaf first.
type Stacks<'a> = Vec<&'a [String]>;

/// Of the samples that are not references, the percentages whole (their
/// stack at the full copy) after `report::graft` completes the cut ones:
/// (from the other samples of the thread that are complete at this size,
/// from those and the reference samples).
fn grafted_whole(full: &[Sample], cut: &[Sample]) -> (f64, f64) {
    use std::collections::{HashMap, HashSet};

    use mt_agent::report::graft::{Complete, is_start};
    // Each thread's distinct complete stacks: (not references, references).
    let mut complete: HashMap<i32, (Stacks, Stacks)> = HashMap::new();
    let mut seen = HashSet::new();
    for (j, o) in cut.iter().enumerate() {
        let reference = j.is_multiple_of(REFERENCE_EVERY);
        if o.frames.last().is_some_and(|f| is_start(f))
            && seen.insert((o.tid, reference, &o.frames))
        {
            let lists = complete.entry(o.tid).or_default();
            if reference {
                &mut lists.1
            } else {
                &mut lists.0
            }
            .push(o.frames.as_slice());
        }
    }
    let unknown = |f: &String| f == "[unknown]";
    // Per thread: (its own complete stacks, those and the references).
    let indexed: HashMap<i32, (Complete<String>, Complete<String>)> = complete
        .iter()
        .map(|(tid, (mine, refs))| {
            let all = mine.iter().chain(refs).copied();
            (
                *tid,
                (Complete::new(mine.iter().copied()), Complete::new(all)),
            )
        })
        .collect();
    let (mut own, mut with_refs, mut n) = (0usize, 0usize, 0usize);
    for (i, (s, f)) in cut.iter().zip(full).enumerate() {
        if i.is_multiple_of(REFERENCE_EVERY) {
            continue;
        }
        n += 1;
        let whole = |with: Option<&Complete<String>>| {
            let g = with.and_then(|c| c.graft(&s.frames, |f| is_start(f), unknown));
            g.as_ref().unwrap_or(&s.frames) == &f.frames
        };
        let sets = indexed.get(&s.tid);
        own += usize::from(whole(sets.map(|c| &c.0)));
        with_refs += usize::from(whole(sets.map(|c| &c.1)));
    }
    let pct = |k: usize| 100.0 * k as f64 / n.max(1) as f64;
    (pct(own), pct(with_refs))
}

/// Sizes whole for at least 99% of the samples, and the spread.
fn row(name: &str, full: &[Sample], need: &[Option<u64>], stack_samples: usize) -> Value {
    let n = full.len().max(1) as f64;
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
        "samples": full.len(),
        "stack_samples": stack_samples,
        "reach_start_percent": 100.0 * full.iter().filter(|s| reaches_start(s)).count() as f64 / n,
        "whole_at": per_size,
        "bytes_for_99_percent": choose,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32, body: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&kind.to_le_bytes());
        r.extend_from_slice(&0u16.to_le_bytes());
        r.extend_from_slice(&((8 + body.len()) as u16).to_le_bytes());
        r.extend_from_slice(body);
        r
    }

    #[test]
    fn finds_the_dyn_size_of_stack_samples_only() {
        let copy = 32u64;
        let mut sample = vec![7u8; 24]; // ip, pid/tid, time
        sample.extend_from_slice(&copy.to_le_bytes());
        sample.extend_from_slice(&[0xaa; 32]);
        sample.extend_from_slice(&20u64.to_le_bytes());
        sample.extend_from_slice(&0u64.to_le_bytes()); // DATA_SRC
        let mut data = record(3, &[1u8; 16]); // a COMM record
        let at = data.len();
        data.extend(record(9, &sample));
        data.extend(record(9, &[0u8; 16])); // a sample without a stack
        let found = stack_sizes(&data, 1000, copy);
        assert_eq!(found, vec![(1000 + at as u64 + 8 + 24 + 8 + 32, 20)]);
    }

    fn s(frames: &[&str]) -> Sample {
        Sample {
            pid: 1,
            tid: 1,
            time_ns: 0,
            frames: frames.iter().map(|f| f.to_string()).collect(),
        }
    }

    #[test]
    fn a_sample_needs_the_smallest_size_that_keeps_its_whole_stack() {
        let full = vec![s(&["f", "main", "_start"]), s(&["g", "main"])];
        let mut stacks = vec![full.clone(); SIZES.len()];
        // The first sample loses main below SIZES[3]; the second never does.
        for at in stacks.iter_mut().skip(4) {
            at[0] = s(&["f"]);
        }
        assert_eq!(needed(&full, &stacks), vec![Some(SIZES[3]), Some(512)]);
        assert!(reaches_start(&full[0]) && !reaches_start(&full[1]));
    }
}
