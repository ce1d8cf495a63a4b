//! The demo's last line: what the slowest call did, from `mt-agent report
//! --json` (one object per hit; GUIDE.md, "mt-agent report"). Pure.

use serde_json::Value;

/// A time in ns as the demo prints it: whole ms from 10 ms up, tenths
/// below.
fn ms(ns: u64) -> String {
    let ms = ns as f64 / 1e6;
    if ms >= 10.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

/// Where the call's CPU time went: the function with the largest self
/// share of the moment's samples (`moment.top`), and its part of
/// `on_cpu_ns` (share × on-CPU time: the moment's samples are the thread's
/// on-CPU samples during the call).
fn on_cpu_part(h: &Value, on_cpu_ns: u64) -> String {
    let top = h["moment"]["top"].as_array();
    let heaviest = top.into_iter().flatten().max_by(|a, b| {
        let s = |v: &Value| v["self"].as_f64().unwrap_or(0.0);
        s(a).total_cmp(&s(b))
    });
    match heaviest.and_then(|f| Some((f["name"].as_str()?, f["self"].as_f64()?))) {
        Some((name, share)) if share > 0.0 => format!(
            "{} on CPU, {} of it in {name}",
            ms(on_cpu_ns),
            ms((on_cpu_ns as f64 * share) as u64)
        ),
        _ => format!("{} on CPU", ms(on_cpu_ns)),
    }
}

/// Where the call blocked: of its heaviest blocked stacks
/// (`off_cpu.blocked_stacks`, frames leaf first), the function the trigger
/// called on the way to the wait (the frame just leafward of `trigger`),
/// the one with the most blocked time, and that time.
fn blocked_part(h: &Value, blocked_ns: u64, trigger: &str) -> String {
    let mut by_callee: Vec<(&str, u64)> = Vec::new();
    for s in h["off_cpu"]["blocked_stacks"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let frames: Vec<&str> = s["frames"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let Some(at) = frames.iter().position(|f| *f == trigger) else {
            continue;
        };
        // perf names an inlined frame twice: skip repeats of the trigger.
        let Some(callee) = frames[..at].iter().rev().find(|f| **f != trigger) else {
            continue;
        };
        let us = s["time_us"].as_u64().unwrap_or(0);
        match by_callee.iter_mut().find(|(c, _)| c == callee) {
            Some((_, t)) => *t += us,
            None => by_callee.push((callee, us)),
        }
    }
    match by_callee.iter().max_by_key(|(_, us)| *us) {
        Some((callee, us)) => format!(
            "{} blocked, {} of it in {callee}",
            ms(blocked_ns),
            ms(us * 1000)
        ),
        None => format!("{} blocked", ms(blocked_ns)),
    }
}

/// One line saying what the slowest call (the hit with the largest
/// `duration_ns`) did: its time, on CPU and where, runnable when it is a
/// tenth of the call or more, and blocked and where. `trigger` is the
/// traced function's name as perf prints it. `None` without a slow call.
pub fn line(hits: &[Value], trigger: &str) -> Option<String> {
    let h = hits
        .iter()
        .filter(|h| h["duration_ns"].is_u64())
        .max_by_key(|h| h["duration_ns"].as_u64())?;
    let duration = h["duration_ns"].as_u64()?;
    let mut parts = Vec::new();
    if let Some(on) = h["on_cpu_ns"].as_u64() {
        parts.push(on_cpu_part(h, on));
    }
    if let Some(r) = h["runnable_ns"].as_u64().filter(|r| *r * 10 >= duration) {
        parts.push(format!("{} runnable (waiting for a CPU)", ms(r)));
    }
    if let Some(b) = h["blocked_ns"].as_u64().filter(|b| *b > 0) {
        parts.push(blocked_part(h, b, trigger));
    }
    let head = format!(
        "slowest call: {} (hit {}, {trigger}({}))",
        ms(duration),
        h["seq"],
        args(h)
    );
    Some(match parts.is_empty() {
        true => head,
        false => format!("{head}: {}", parts.join("; ")),
    })
}

/// The hit's first two arguments, as the demo's trigger takes them.
fn args(h: &Value) -> String {
    let a = |i: usize| h["args"][i].as_u64().map_or("?".into(), |v| v.to_string());
    format!("id={}, bytes={}", a(0), a(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A hit as `mt-agent report --json` writes it (the fields used here).
    fn hit(seq: u64, duration_ms: u64, on_ms: u64, runnable_ms: u64, blocked_ms: u64) -> Value {
        json!({
            "seq": seq, "args": [7, 150000, 0, 0, 0, 0],
            "duration_ns": duration_ms * 1_000_000,
            "on_cpu_ns": on_ms * 1_000_000,
            "runnable_ns": runnable_ms * 1_000_000,
            "blocked_ns": blocked_ms * 1_000_000,
            "moment": {"top": [
                {"name": "main", "inclusive": 1.0, "self": 0.0},
                {"name": "handle_request", "inclusive": 1.0, "self": 0.0},
                {"name": "demo_workload::parse_slow_path", "inclusive": 0.75, "self": 0.75},
                {"name": "demo_workload::parse_payload", "inclusive": 0.25, "self": 0.25},
            ]},
            "off_cpu": {"blocked_stacks": [
                {"frames": ["__schedule", "futex_wait", "entry_SYSCALL_64", "syscall",
                    "std::sys::sync::mutex::futex::Mutex::lock_contended",
                    "demo_workload::wait_for_lock", "handle_request", "handle_request", "main"],
                 "time_us": 140_000, "state": "S"},
                {"frames": ["__schedule", "do_nanosleep", "entry_SYSCALL_64",
                    "demo_workload::compress_payload", "handle_request", "main"],
                 "time_us": 3_000, "state": "S"},
                {"frames": ["__schedule", "futex_wait", "entry_SYSCALL_64", "syscall",
                    "demo_workload::wait_for_lock", "handle_request", "main"],
                 "time_us": 5_000, "state": "S"},
                {"frames": ["__schedule", "futex_wait"], "time_us": 9_000, "state": "S"},
            ]},
        })
    }

    #[test]
    fn the_slowest_call_is_told_with_its_cpu_function_and_its_wait() {
        let hits = [
            hit(1, 60, 40, 0, 20),
            hit(2, 182, 20, 0, 162),
            hit(3, 30, 30, 0, 0),
        ];
        assert_eq!(
            line(&hits, "handle_request").unwrap(),
            "slowest call: 182 ms (hit 2, handle_request(id=7, bytes=150000)): \
             20 ms on CPU, 15 ms of it in demo_workload::parse_slow_path; \
             162 ms blocked, 145 ms of it in demo_workload::wait_for_lock"
        );
    }

    #[test]
    fn runnable_time_is_told_when_it_is_a_tenth_of_the_call() {
        let l = line(&[hit(1, 100, 40, 10, 50)], "handle_request").unwrap();
        assert!(
            l.contains("; 10 ms runnable (waiting for a CPU); 50 ms blocked"),
            "{l}"
        );
        let l = line(&[hit(1, 100, 41, 9, 50)], "handle_request").unwrap();
        assert!(!l.contains("runnable"), "{l}");
    }

    #[test]
    fn what_the_report_does_not_know_is_left_out() {
        let bare = json!({"seq": 4, "args": [1, 2], "duration_ns": 5_500_000u64});
        assert_eq!(
            line(&[bare], "handle_request").unwrap(),
            "slowest call: 5.5 ms (hit 4, handle_request(id=1, bytes=2))"
        );
        // Blocked stacks that do not reach the trigger name no function.
        let mut h = hit(1, 100, 40, 0, 60);
        h["off_cpu"]["blocked_stacks"] = json!([{"frames": ["__schedule"], "time_us": 60_000}]);
        h["moment"]["top"] = json!([]);
        assert_eq!(
            line(&[h], "handle_request").unwrap(),
            "slowest call: 100 ms (hit 1, handle_request(id=7, bytes=150000)): \
             40 ms on CPU; 60 ms blocked"
        );
        // Hits without a duration (not a --slower-than run): no line.
        assert_eq!(line(&[json!({"seq": 1})], "handle_request"), None);
    }
}
