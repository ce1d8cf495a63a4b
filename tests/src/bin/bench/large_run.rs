//! The bench's `large` part: a large run's report (issue 26, "Speed").
//! `target calls 1000 20` calls its trigger every 20 ms of CPU, 1,000 times
//! (50 with `--quick`), traced with `--cooldown 0`, which keeps a snapshot
//! for most calls (hits that come while one is on its way are merged into
//! it). On that run: the seconds `mt-agent report OUT` takes and the size
//! of `report.html`; on the same files, in the same run, the anchor
//! pipeline `perf script | inferno-collapse-perf | inferno-flamegraph` file
//! by file (report.rs, [`super::report::anchor`]), and the ratio (goal: at
//! most 1.0×); and the seconds headless Chromium takes to open the page
//! (goal: at most 2 s), through the DevTools client (tests/src/cdp.rs): from
//! `Page.navigate` to the load event and two frames drawn.
//!
//! Its table is `bench_md`'s `large` part. Each side runs once, with no warm-up pass (a pass of the report alone
//! takes tens of seconds): both read files the capture has just written,
//! from the page cache, the report first.

use std::{panic::AssertUnwindSafe, path::Path, time::Duration, time::Instant};

use mt_agent_tests::*;
use serde_json::{Value, json};

use super::report::{anchor, kept_files, report_seconds};

/// The gap between two calls, ms of CPU.
const GAP_MS: &str = "20";

/// Records `calls` calls of `trigger`, `GAP_MS` apart, with `--cooldown 0`.
fn record(calls: u64) -> Run {
    let n = calls.to_string();
    let mut t = Target::start(&target_path("target"), &["calls", &n, GAP_MS]);
    let pid = t.pid().to_string();
    let mut a = Agent::start(&[
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--cooldown",
        "0",
        "--json",
    ]);
    a.wait_armed();
    t.go();
    // 1,000 × 20 ms of CPU, with room for a loaded machine.
    t.wait(Duration::from_secs(60 + calls / 10));
    a.finish(FINISH)
}

/// Seconds headless Chromium takes to open `page` (navigate, load event,
/// two frames), the page's own load-event time (ms after navigation
/// start) and its console errors; `Err` with why if it did not open.
fn open_in_chromium(page: &Path) -> Result<(f64, Option<f64>, usize), String> {
    let url = format!("file://{}", page.display());
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        let mut b = cdp::Browser::start();
        let t0 = Instant::now();
        b.open(&url);
        let secs = t0.elapsed().as_secs_f64();
        let load = b
            .eval("performance.getEntriesByType('navigation')[0].loadEventEnd")
            .as_f64();
        let errors = b.close().0.len();
        (secs, load, errors)
    }))
    .map_err(|e| {
        let why = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
        format!("Chromium did not open {url}: {}", why.unwrap_or_default())
    })
}

/// Runs the part; returns its figures.
pub fn run(quick: bool) -> Value {
    let calls = if quick { 50 } else { 1000 };
    let tmp = tempfile::tempdir().unwrap();
    let run = record(calls);
    let (files, bytes) = kept_files(&run);
    let hits: usize = run
        .entries("hit")
        .iter()
        .map(|e| e["hits"].as_array().map_or(0, Vec::len))
        .sum();
    let report_s = report_seconds(&run.out);
    let page = run.out.join("report.html");
    let page_bytes = std::fs::metadata(&page).map_or(0, |m| m.len());
    let (anchor_s, inferno) = anchor(&files, &tmp.path().join("anchor.svg"));
    let mut v = json!({
        "calls": calls,
        "gap_ms": GAP_MS.parse::<u64>().unwrap(),
        "snapshots": run.entries("hit").len(),
        "files": files.len(),
        "hits": hits,
        "bytes": bytes,
        "report_s": report_s,
        "page_bytes": page_bytes,
        "anchor_s": anchor_s,
        "ratio": report_s / anchor_s,
        "anchor": inferno,
    });
    if let Some(why) = super::failure(&run) {
        super::mark_failed(&mut v, format!("large run: {why}"));
    }
    match open_in_chromium(&page) {
        Ok((s, load, errors)) => {
            v["open_s"] = json!(s);
            v["load_event_ms"] = json!(load);
            v["console_errors"] = json!(errors);
        }
        Err(why) => super::mark_failed(&mut v, format!("large run: {why}")),
    }
    eprintln!("bench: large run {v}");
    v
}
