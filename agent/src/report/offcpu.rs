//! A hit's off-CPU time (runs with `--off-cpu`): the index's three figures,
//! and the stacks at which the hit's thread blocked, weighted by how long
//! it stayed blocked.
//!
//! The blocked intervals come from the snapshot's `PERF_RECORD_SWITCH`
//! records of the thread ([`crate::perf::offcpu::off_intervals`]). Each one gets
//! the call chain of the thread's latest `sched:sched_switch` sample at or
//! before its start: the tracepoint fires in the thread's context just
//! before the switch-out, so its chain (kernel frames, then user frames) is
//! where the thread went to sleep; a blocked interval whose sample is not in
//! the file is counted apart, never drawn as a stack. See docs/report.md.

use std::{collections::HashMap, path::PathBuf};

use serde::Serialize;

use super::{
    moments::Folded,
    samples::{ContextSwitchLine, Samples, SchedSwitchSample},
};
use crate::output::index::IndexedHit;
use crate::perf::offcpu::{ContextSwitch, ContextSwitchKind, Gap, OffInterval, off_intervals};

/// How many of the heaviest blocked stacks are listed.
pub const TOP: usize = 5;

/// One hit's off-CPU breakdown and blocked stacks.
#[derive(Debug, Clone)]
pub struct OffCpuView {
    /// The window, CLOCK_MONOTONIC ns: `[from_ns, to_ns]`.
    pub from_ns: u64,
    pub to_ns: u64,
    /// From the index: the thread's time in the window, ns.
    pub on_cpu_ns: u64,
    pub runnable_ns: u64,
    pub blocked_ns: u64,
    /// Not shown by the snapshot file (before its oldest record, or where
    /// perf lost records).
    pub unknown_ns: u64,
    /// The stretches the snapshot file does not show, from its index line.
    pub gaps: Vec<Gap>,
    /// Blocked time whose `sched:sched_switch` sample is not in the file
    /// (lost, or taken before the thread's last switch in), ns: in no stack.
    pub unstacked_ns: u64,
    /// Blocked time by stack, root first, weights in µs.
    pub folded: Folded,
    /// The heaviest blocked stacks, the heaviest first.
    pub top: Vec<BlockedStack>,
    /// Blocked intervals found in the snapshot's switch records.
    pub intervals: usize,
    /// The total of those with a stack, ns (what the flame graph shows,
    /// before rounding to µs).
    pub graphed_ns: u64,
    /// Name of the folded file, relative to OUT/report.
    pub file: PathBuf,
}

/// One blocked stack with its time and the thread's state when it left the
/// CPU.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BlockedStack {
    /// Leaf first: kernel frames, then user frames.
    pub frames: Vec<String>,
    /// Blocked time, µs.
    pub time_us: u64,
    /// `prev_state` of the `sched:sched_switch` sample (`S`, `D`...).
    pub state: String,
}

/// The breakdown the index gives for a hit, with no stacks yet; `None`
/// when the run did not record one. `moment_file` is the hit's moment
/// folded file (`X.moment.folded`); the off-CPU one is `X.offcpu.folded`.
/// `gaps`: what the snapshot file does not show, from its index line.
pub fn from_index(
    hit: &IndexedHit,
    moment_file: &std::path::Path,
    gaps: Vec<Gap>,
) -> Option<OffCpuView> {
    let name = moment_file.file_name()?.to_str()?;
    let stem = name.strip_suffix(".moment.folded").unwrap_or(name);
    let o = hit.off_cpu?;
    Some(OffCpuView {
        from_ns: o.off_cpu_from_ns,
        to_ns: hit.ktime_ns,
        on_cpu_ns: o.breakdown.on_cpu_ns,
        runnable_ns: o.breakdown.runnable_ns,
        blocked_ns: o.breakdown.blocked_ns,
        unknown_ns: o.breakdown.unknown_ns,
        gaps,
        unstacked_ns: 0,
        folded: Vec::new(),
        top: Vec::new(),
        intervals: 0,
        graphed_ns: 0,
        file: moment_file.with_file_name(format!("{stem}.offcpu.folded")),
    })
}

/// Fills in the blocked stacks of thread `tid` from a snapshot.
pub fn add_stacks(o: &mut OffCpuView, s: &Samples, tid: u32) {
    let switches = thread_context_switches(&s.context_switches, tid);
    let mut taken: Vec<&SchedSwitchSample> = s
        .sched_switch_samples
        .iter()
        .filter(|x| x.sample.tid == tid)
        .collect();
    taken.sort_by_key(|x| x.sample.time_ns);
    let blocked: Vec<OffInterval> = off_intervals(&switches, &o.gaps, o.from_ns, o.to_ns)
        .into_iter()
        .filter(|i| i.blocked)
        .collect();
    let mut by_stack: HashMap<(&[u32], &str), u64> = HashMap::new();
    o.unstacked_ns = 0;
    for iv in &blocked {
        match stack_at(&taken, &switches, iv.from_ns) {
            Some(x) => {
                let key = (s.stack(&x.sample), x.prev_state.as_str());
                *by_stack.entry(key).or_default() += iv.to_ns - iv.from_ns;
            }
            None => o.unstacked_ns += iv.to_ns - iv.from_ns,
        }
    }
    o.intervals = blocked.len();
    o.graphed_ns = by_stack.values().sum();
    o.folded = fold_us(s, &by_stack);
    o.top = heaviest(s, &by_stack, TOP);
}

/// One thread's switch records in time order, in the core's terms.
pub(super) fn thread_context_switches(
    records: &[ContextSwitchLine],
    tid: u32,
) -> Vec<ContextSwitch> {
    let mut v: Vec<ContextSwitch> = records
        .iter()
        .filter(|r| r.tid == tid)
        .map(|r| ContextSwitch {
            time_ns: r.time_ns,
            kind: if r.out {
                ContextSwitchKind::Out {
                    preempted: r.preempt,
                }
            } else {
                ContextSwitchKind::In
            },
        })
        .collect();
    v.sort_by_key(|x| x.time_ns);
    v
}

/// The thread's latest `sched:sched_switch` sample at or before `at_ns`,
/// if it was taken after the thread's last switch-in before `at_ns` (an
/// older one belongs to an earlier switch-out: this one's sample was lost).
fn stack_at<'a>(
    taken: &[&'a SchedSwitchSample],
    switches: &[ContextSwitch],
    at_ns: u64,
) -> Option<&'a SchedSwitchSample> {
    let i = taken.partition_point(|x| x.sample.time_ns <= at_ns);
    let x = *taken.get(i.checked_sub(1)?)?;
    let j = switches.partition_point(|w| w.time_ns <= at_ns);
    let last_in = switches[..j]
        .iter()
        .rev()
        .find(|w| w.kind == ContextSwitchKind::In)
        .map(|w| w.time_ns);
    match last_in {
        Some(t) if x.sample.time_ns < t => None,
        _ => Some(x),
    }
}

/// Folded stacks, root first, weights in µs (rounded; a stack under half
/// a µs is left out), sorted and merged.
fn fold_us(s: &Samples, by_stack: &HashMap<(&[u32], &str), u64>) -> Folded {
    let mut out: Folded = by_stack
        .iter()
        .map(|((stack, _), &ns)| (root_first(s, stack), (ns + 500) / 1000))
        .filter(|(_, us)| *us > 0)
        .collect();
    // The same stack with two states, or two chains folding alike.
    super::moments::sort_merged(&mut out);
    out
}

fn root_first(s: &Samples, stack: &[u32]) -> String {
    let names: Vec<&str> = stack.iter().rev().map(|&f| s.name(f)).collect();
    names.join(";")
}

/// The `n` heaviest (stack, state) pairs, the heaviest first.
fn heaviest(s: &Samples, by_stack: &HashMap<(&[u32], &str), u64>, n: usize) -> Vec<BlockedStack> {
    let mut v: Vec<BlockedStack> = by_stack
        .iter()
        .map(|((stack, state), &ns)| BlockedStack {
            frames: stack.iter().map(|&f| s.name(f).to_string()).collect(),
            time_us: (ns + 500) / 1000,
            state: state.to_string(),
        })
        .collect();
    v.sort_by(|a, b| {
        b.time_us
            .cmp(&a.time_us)
            .then_with(|| a.frames.cmp(&b.frames))
            .then_with(|| a.state.cmp(&b.state))
    });
    v.truncate(n);
    v
}

/// Kernel frames that every blocked stack has: the scheduler itself and
/// the ways into and out of the kernel. They say nothing about the reason.
fn plumbing(name: &str) -> bool {
    name.starts_with("__schedule")
        || name.starts_with("schedule")
        || name.starts_with("preempt_schedule")
        || name.starts_with("entry_SYSCALL")
        || name.starts_with("asm_")
        || matches!(
            name,
            "do_syscall_64" | "exit_to_user_mode_loop" | "irqentry_exit_to_user_mode"
        )
}

/// Where a call chain enters the kernel: the frames before it (leaf
/// first) are the kernel's, those after it the user's.
fn kernel_entry(name: &str) -> bool {
    name.starts_with("entry_SYSCALL") || name.starts_with("asm_")
}

/// The leaf-most `n` frames that say why the thread blocked, leaf first:
/// the kernel's first frame that is not the scheduler's own (the reason:
/// `futex_wait`, `anon_pipe_read`, `do_nanosleep`...), then the user's
/// frames; without a frame repeated next to itself (perf names an inlined
/// frame twice). A chain with no kernel entry keeps all its frames but the
/// plumbing.
pub fn interesting(frames: &[String], n: usize) -> Vec<&str> {
    let names: Vec<&str> = frames.iter().map(String::as_str).collect();
    let picked: Vec<&str> = match names.iter().position(|f| kernel_entry(f)) {
        Some(e) => {
            let reason = names[..e].iter().find(|f| !plumbing(f));
            reason.into_iter().chain(&names[e + 1..]).copied().collect()
        }
        None => names.into_iter().filter(|f| !plumbing(f)).collect(),
    };
    let mut v: Vec<&str> = Vec::new();
    for f in picked {
        if v.last() != Some(&f) {
            v.push(f);
        }
        if v.len() == n {
            break;
        }
    }
    v
}

/// The `--json` object of a hit's off-CPU stacks (`read`: the snapshot was
/// read, so the stacks and the folded file exist).
pub fn json(o: &OffCpuView, read: bool) -> serde_json::Value {
    serde_json::json!({
        "from_ns": o.from_ns,
        "to_ns": o.to_ns,
        "folded": read.then(|| std::path::Path::new(super::FOLDED_DIR).join(&o.file)),
        "blocked_intervals": o.intervals,
        "graphed_us": (o.graphed_ns + 500) / 1000,
        "blocked_without_stack_us": (o.unstacked_ns + 500) / 1000,
        "blocked_stacks": o.top,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::samples::parse;

    /// perf 6.1's output for two threads ping-ponging through pipes (see
    /// samples.rs).
    const RUN: &str = include_str!("testdata/sched_switch.script");

    fn hit(tid: u32, from_ns: u64, to_ns: u64) -> OffCpuView {
        let h = IndexedHit {
            tid,
            ktime_ns: to_ns,
            off_cpu: Some(crate::perf::offcpu::OffCpu {
                off_cpu_from_ns: from_ns,
                breakdown: crate::perf::offcpu::Breakdown {
                    on_cpu_ns: 1,
                    runnable_ns: 2,
                    blocked_ns: 3,
                    unknown_ns: 4,
                },
                reaches_start: false,
            }),
            ..IndexedHit::default()
        };
        from_index(
            &h,
            std::path::Path::new("d/perf.data.1.7.moment.folded"),
            Vec::new(),
        )
        .unwrap()
    }

    #[test]
    fn the_index_gives_the_figures_and_the_file_name() {
        let o = hit(1, 10, 20);
        assert_eq!((o.on_cpu_ns, o.runnable_ns, o.blocked_ns), (1, 2, 3));
        assert_eq!(
            o.file,
            std::path::Path::new("d/perf.data.1.7.offcpu.folded")
        );
        let no = IndexedHit::default();
        assert!(from_index(&no, std::path::Path::new("x.moment.folded"), Vec::new()).is_none());
    }

    #[test]
    fn blocked_intervals_take_the_stack_that_went_to_sleep() {
        let s = parse(RUN.as_bytes()).unwrap();
        let mut o = hit(30141, 13_735_891_000_000, 13_735_896_100_000);
        add_stacks(&mut o, &s, 30141);
        // Off CPU before its first switch-in, for a reason the file does
        // not give (unknown, not blocked), then blocked from its blocking
        // switch-out to the window's end; the preempted interval between is
        // runnable and left out.
        assert_eq!(o.intervals, 1);
        assert_eq!((o.graphed_ns, o.unstacked_ns), (52_920, 0));
        let peer = "clone3;start_thread;peer;wait_part;__GI___libc_read;__GI___libc_read;\
                    entry_SYSCALL_64_after_hwframe;do_syscall_64;ksys_read;vfs_read;\
                    anon_pipe_read;schedule;__schedule";
        assert_eq!(o.folded, [(peer.to_string(), 53)]);
        assert_eq!((o.top[0].time_us, o.top[0].state.as_str()), (53, "S"));
        assert_eq!(o.top[0].frames[0], "__schedule");
        assert_eq!(
            interesting(&o.top[0].frames, 4),
            ["anon_pipe_read", "__GI___libc_read", "wait_part", "peer"]
        );
        let mut main = hit(30139, 13_735_890_000_000, 13_735_896_300_000);
        add_stacks(&mut main, &s, 30139);
        assert_eq!(main.intervals, 1);
        assert_eq!(main.top.len(), 1);
        assert_eq!(main.top[0].time_us, 18);
        assert!(main.top[0].frames.contains(&"wait_part".to_string()));
        assert!(main.top[0].frames.contains(&"main".to_string()));
    }

    /// Blocked switch-outs of thread 5, one per stack `f0`..`f6`, blocked
    /// for 1..7 ms; `f0`'s sample is lost (it precedes the switch-in).
    fn seven_stacks() -> String {
        let mut t = String::new();
        let mut at = 1_000_000_000u64;
        for i in 0..7u64 {
            let ns = |x: u64| format!("{}.{:09}", x / 1_000_000_000, x % 1_000_000_000);
            if i == 0 {
                t += &format!(
                    "5 {}: sched:sched_switch: prev_state=D\n\tff f0 (x)\n\tff m (x)\n\n",
                    ns(at - 10)
                );
            }
            t += &format!("5 {}: PERF_RECORD_SWITCH IN\n", ns(at));
            if i > 0 {
                t += &format!(
                    "5 {}: sched:sched_switch: prev_state=S\n\tff f{i} (x)\n\tff m (x)\n\n",
                    ns(at + 5)
                );
            }
            t += &format!("5 {}: PERF_RECORD_SWITCH OUT\n", ns(at + 10));
            at += 10 + (i + 1) * 1_000_000;
        }
        t + &format!(
            "5 {}.{:09}: PERF_RECORD_SWITCH IN\n",
            at / 1_000_000_000,
            at % 1_000_000_000
        )
    }

    #[test]
    fn the_five_heaviest_and_a_lost_sample() {
        let s = parse(seven_stacks().as_bytes()).unwrap();
        let mut o = hit(5, 1_000_000_000, 2_000_000_000);
        add_stacks(&mut o, &s, 5);
        assert_eq!(o.intervals, 7);
        let top: Vec<(&str, u64, &str)> = o
            .top
            .iter()
            .map(|b| (b.frames[0].as_str(), b.time_us, b.state.as_str()))
            .collect();
        assert_eq!(
            top,
            [
                ("f6", 7000, "S"),
                ("f5", 6000, "S"),
                ("f4", 5000, "S"),
                ("f3", 4000, "S"),
                ("f2", 3000, "S")
            ]
        );
        // f0's sample came before the thread's switch-in: its interval has
        // no stack rather than an older one, and is counted apart, never
        // drawn as a stack.
        assert_eq!(o.unstacked_ns, 1_000_000);
        assert!(!o.folded.iter().any(|(l, _)| l.ends_with("f0")));
        assert!(!o.folded.iter().any(|(l, _)| l.contains("sched_switch")));
        assert_eq!(o.folded.iter().map(|(_, n)| n).sum::<u64>(), 27_000);
        assert!(o.top.iter().all(|b| !b.frames.is_empty()));
        assert_eq!(json(&o, true)["blocked_without_stack_us"], 1000);
    }

    #[test]
    fn json_gives_the_stacks_leaf_first_and_the_folded_file() {
        let s = parse(RUN.as_bytes()).unwrap();
        let mut o = hit(30139, 13_735_890_000_000, 13_735_896_300_000);
        add_stacks(&mut o, &s, 30139);
        let j = json(&o, true);
        assert_eq!(j["folded"], "report/d/perf.data.1.7.offcpu.folded");
        assert_eq!(
            (j["blocked_intervals"].as_u64(), j["graphed_us"].as_u64()),
            (Some(1), Some(18))
        );
        let top = &j["blocked_stacks"][0];
        assert_eq!(
            (top["time_us"].as_u64(), top["state"].as_str()),
            (Some(18), Some("S"))
        );
        assert_eq!(top["frames"][0], "__schedule");
        assert_eq!(json(&o, false)["folded"], serde_json::Value::Null);
    }

    #[test]
    fn interesting_frames_skip_the_scheduler_and_repeats() {
        let f: Vec<String> = [
            "__schedule",
            "schedule",
            "futex_wait",
            "do_syscall_64",
            "entry_SYSCALL_64_after_hwframe",
            "pthread_cond_wait",
            "pthread_cond_wait",
            "wait_part",
            "main",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            interesting(&f, 3),
            ["futex_wait", "pthread_cond_wait", "wait_part"]
        );
    }
}
