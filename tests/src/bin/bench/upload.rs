//! The bench's `upload` part (issue 27, "The hit path never waits on the
//! network"): hit → SIGUSR2 latency (`hit_to_kill_ns`) and SIGUSR2 → Dump
//! (`kill_to_dump_ns`) of a capture with no upload (the anchor), uploading
//! to a live SeaweedFS on loopback, and uploading to one that is down for
//! the whole capture (every upload fails and backs off), run in turn round
//! by round.

use std::time::Duration;

use mt_agent_tests::{store::SeaweedFs, *};
use serde_json::{Value, json};

/// (setup name, upload?, store up?).
const SETUPS: [(&str, bool, bool); 3] = [
    ("no upload", false, true),
    ("uploading", true, true),
    ("store down", true, false),
];

/// One capture of `hits` hits 100 ms apart: (hit_to_kill ms, kill_to_dump
/// ms, ended well).
fn capture_once(
    store: &mut SeaweedFs,
    hits: usize,
    upload: bool,
    up: bool,
) -> (Vec<f64>, Vec<f64>, bool) {
    // The store is brought back only when a setup needs it (a restart
    // takes 5-20 s here), and taken down only for the outage.
    match (up, store.is_running()) {
        (true, false) => store.restart(),
        (false, true) => store.stop(),
        _ => {}
    }
    let n = hits.to_string();
    let mut t = Target::start(&target_path("target"), &["calls", &n, "100"]);
    let pid = t.pid().to_string();
    let url = store.url("bench");
    let mut args = vec![
        "--pid",
        &pid,
        "--symbol",
        "trigger",
        "--cooldown",
        "0",
        "--json",
    ];
    if upload {
        args.extend(["--upload", &url, "--upload-wait", "2s"]);
    }
    let env = store.admin_env();
    let mut a = Agent::start_with(&args, |c| {
        c.envs(env);
    });
    a.wait_armed();
    t.go();
    let status = t.wait(Duration::from_secs(60));
    let run = a.finish(FINISH);
    let ms = |field: &str| -> Vec<f64> {
        run.entries("hit")
            .iter()
            .filter_map(|e| e[field].as_f64())
            .map(|ns| ns / 1e6)
            .collect()
    };
    // Down: the run ends with exit 5 (uploads pending), as it should.
    let want = if upload && !up { 5 } else { 0 };
    (
        ms("hit_to_kill_ns"),
        ms("kill_to_dump_ns"),
        status.success() && run.code == Some(want),
    )
}

fn pct(v: &[f64], p: f64) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let i = ((p / 100.0) * (s.len().checked_sub(1)? as f64)).round() as usize;
    s.get(i).copied()
}

/// Runs the part: `rounds` rounds of each setup.
pub fn run(quick: bool) -> Value {
    let (hits, rounds) = if quick { (10, 1) } else { (40, 5) };
    let mut store = SeaweedFs::start();
    let mut kill = vec![Vec::new(); SETUPS.len()];
    let mut dump = vec![Vec::new(); SETUPS.len()];
    let mut failed = vec![0; SETUPS.len()];
    for _ in 0..rounds {
        for (i, (_, upload, up)) in SETUPS.iter().enumerate() {
            let (k, d, ok) = capture_once(&mut store, hits, *upload, *up);
            kill[i].extend(k);
            dump[i].extend(d);
            failed[i] += u32::from(!ok);
        }
    }
    let rows: Vec<Value> = SETUPS
        .iter()
        .enumerate()
        .map(|(i, (name, ..))| {
            json!({
                "setup": name,
                "hits": kill[i].len(),
                "hit_to_kill_ms_p50": pct(&kill[i], 50.0),
                "hit_to_kill_ms_p90": pct(&kill[i], 90.0),
                "hit_to_kill_ms_p99": pct(&kill[i], 99.0),
                "hit_to_kill_ms_max": pct(&kill[i], 100.0),
                "kill_to_dump_ms_p50": pct(&dump[i], 50.0),
                "kill_to_dump_ms_p99": pct(&dump[i], 99.0),
                "failed_runs": failed[i],
            })
        })
        .collect();
    json!({"hits": hits, "rounds": rounds, "rows": rows})
}
