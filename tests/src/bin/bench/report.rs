//! The bench's report part: seconds for `mt-agent report` on a run of
//! several snapshots totalling at least 50 MB (10 MB with `--quick`), and,
//! on the same files, the anchor pipeline
//! `perf script -i F | inferno-collapse-perf | inferno-flamegraph` for each
//! file in turn.
//!
//! The anchor runs inferno's binaries when they are installed
//! (`cargo xtask bench` installs them with `cargo install inferno`; found in
//! `INFERNO_BIN_DIR` or on PATH). Without them, its last two stages are
//! inferno's library, in this process: the same code the binaries run.

use std::{
    io::{BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use mt_agent_tests::*;
use serde_json::{Value, json};

/// Records the `moment deep` target (deep call chains, a hit every 0.7 s)
/// at a high frequency until the snapshots total `min_bytes`.
fn record(min_bytes: u64) -> Run {
    let mut t = Target::start(&target_path("moment"), &["deep", "600"]);
    let pid = t.pid().to_string();
    let mut agent = Agent::start(&["--pid", &pid, "--symbol", "handle", "--json", "-F", "20000"]);
    let out = agent.out.clone();
    agent.wait_armed();
    t.go();
    let started = Instant::now();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let bytes: u64 = read_index(&out.join("snapshots.jsonl"))
            .iter()
            .filter_map(|v| v["bytes"].as_u64())
            .sum();
        let files = read_index(&out.join("snapshots.jsonl")).len();
        if (bytes >= min_bytes && files >= 3) || started.elapsed().as_secs() > 300 {
            break;
        }
    }
    agent.proc.signal(libc::SIGINT);
    let run = agent.finish(FINISH);
    drop(t);
    run
}

/// `bin` from `INFERNO_BIN_DIR`, else from PATH.
fn inferno_bin(name: &str) -> Option<PathBuf> {
    std::env::var_os("INFERNO_BIN_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            std::env::var_os("PATH")
                .iter()
                .flat_map(std::env::split_paths),
        )
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The anchor on one file, with inferno's binaries: three processes piped.
fn anchor_binaries(file: &Path, collapse: &Path, flamegraph: &Path, svg: &Path) {
    let perf = perf_bin().unwrap();
    let mut script = Command::new(perf)
        .args(["script", "-i"])
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("perf script");
    let mut fold = Command::new(collapse)
        .stdin(script.stdout.take().unwrap())
        .stdout(Stdio::piped())
        .spawn()
        .expect("inferno-collapse-perf");
    let mut graph = Command::new(flamegraph)
        .stdin(fold.stdout.take().unwrap())
        .stdout(std::fs::File::create(svg).unwrap())
        .spawn()
        .expect("inferno-flamegraph");
    for (name, ok) in [
        ("perf script", script.wait().unwrap().success()),
        ("inferno-collapse-perf", fold.wait().unwrap().success()),
        ("inferno-flamegraph", graph.wait().unwrap().success()),
    ] {
        assert!(ok, "the anchor's {name} failed on {}", file.display());
    }
}

/// The anchor on one file, inferno's stages in this process.
fn anchor_library(file: &Path, svg: &Path) {
    use inferno::collapse::{Collapse, perf::Folder};
    let mut script = Command::new(perf_bin().unwrap())
        .args(["script", "-i"])
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("perf script");
    let mut folded = Vec::new();
    Folder::default()
        .collapse(BufReader::new(script.stdout.take().unwrap()), &mut folded)
        .expect("collapse");
    assert!(script.wait().unwrap().success(), "perf script failed");
    let mut out = std::fs::File::create(svg).unwrap();
    let mut opt = inferno::flamegraph::Options::default();
    inferno::flamegraph::from_reader(&mut opt, &folded[..], &mut out).expect("flamegraph");
    out.flush().unwrap();
}

/// Runs the part; returns its figures.
pub fn run(quick: bool) -> Value {
    let min_bytes: u64 = if quick { 10 << 20 } else { 50 << 20 };
    let tmp = tempfile::tempdir().unwrap();
    let run = record(min_bytes);
    let (files, bytes) = kept_files(&run);
    // Both sides once first, so that both meet warm caches.
    let ours = || report_seconds(&run.out);
    let svg = tmp.path().join("anchor.svg");
    ours();
    anchor(&files, &svg);
    let (ours_s, (anchor_s, inferno)) = (ours(), anchor(&files, &svg));
    json!({
        "files": files.len(),
        "bytes": bytes,
        "report_s": ours_s,
        "anchor_s": anchor_s,
        "ratio": ours_s / anchor_s,
        "anchor": inferno,
    })
}

/// The snapshot files a run kept (not those `--keep` deleted), and their
/// total size in bytes.
pub fn kept_files(run: &Run) -> (Vec<PathBuf>, u64) {
    let files: Vec<PathBuf> = run
        .index
        .iter()
        .filter(|v| v["kind"] != "deleted")
        .map(|v| run.out.join(v["file"].as_str().unwrap()))
        .collect();
    let bytes = files
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
        .sum();
    (files, bytes)
}

/// Seconds `mt-agent report OUT` takes; panics with its stderr if it fails.
pub fn report_seconds(out: &Path) -> f64 {
    let t0 = Instant::now();
    mt_agent_tests::report_ok(out, &[]);
    t0.elapsed().as_secs_f64()
}

/// The anchor pipeline on each of `files` in turn, each graph written to
/// `svg`: returns its seconds and which inferno ran ("inferno binaries",
/// or "inferno library, in process" when they are not installed).
pub fn anchor(files: &[PathBuf], svg: &Path) -> (f64, &'static str) {
    let bins = inferno_bin("inferno-collapse-perf").zip(inferno_bin("inferno-flamegraph"));
    let t0 = Instant::now();
    for f in files {
        match &bins {
            Some((c, g)) => anchor_binaries(f, c, g, svg),
            None => anchor_library(f, svg),
        }
    }
    let label = match bins {
        Some(_) => "inferno binaries",
        None => "inferno library, in process",
    };
    (t0.elapsed().as_secs_f64(), label)
}
