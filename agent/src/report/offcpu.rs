//! A hit's off-CPU time (runs with `--off-cpu`): the index's three figures,
//! and the stacks at which the hit's thread blocked, weighted by how long
//! it stayed blocked.
//!
//! The blocked intervals come from the snapshot's `PERF_RECORD_SWITCH`
//! records of the thread ([`crate::offcpu::off_intervals`]). Each one gets
//! the call chain of the thread's latest `sched:sched_switch` sample at or
//! before its start: the tracepoint fires in the thread's context just
//! before the switch-out, so its chain (kernel frames, then user frames) is
//! where the thread went to sleep. See docs/report.md.

use std::{collections::HashMap, path::PathBuf};

use serde::Serialize;

use super::{
    moments::Folded,
    runs::Hit,
    samples::{Samples, SwitchRecord, SwitchSample},
};
use crate::offcpu::{OffInterval, Switch, SwitchKind, off_intervals};

/// The frame of a blocked interval whose stack is not in the snapshot (no
/// `sched:sched_switch` sample between the thread's switch-in and it).
pub const NO_STACK: &str = "[no sched_switch sample]";

/// How many of the heaviest blocked stacks are listed.
pub const TOP: usize = 5;

/// One hit's off-CPU breakdown and blocked stacks.
#[derive(Debug, Clone)]
pub struct OffCpu {
    /// The window, CLOCK_MONOTONIC ns: `[from_ns, to_ns]`.
    pub from_ns: u64,
    pub to_ns: u64,
    /// From the index: the thread's time in the window, ns.
    pub on_cpu_ns: u64,
    pub runnable_ns: u64,
    pub blocked_ns: u64,
    /// Blocked time by stack, root first, weights in µs.
    pub folded: Folded,
    /// The heaviest blocked stacks, the heaviest first.
    pub top: Vec<BlockedStack>,
    /// Blocked intervals found in the snapshot's switch records.
    pub intervals: usize,
    /// Their total, ns (what the flame graph shows, before rounding to µs).
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
pub fn from_index(hit: &Hit, moment_file: &std::path::Path) -> Option<OffCpu> {
    let name = moment_file.file_name()?.to_str()?;
    let stem = name.strip_suffix(".moment.folded").unwrap_or(name);
    Some(OffCpu {
        from_ns: hit.off_cpu_from_ns?,
        to_ns: hit.ktime_ns,
        on_cpu_ns: hit.on_cpu_ns?,
        runnable_ns: hit.runnable_ns?,
        blocked_ns: hit.blocked_ns?,
        folded: Vec::new(),
        top: Vec::new(),
        intervals: 0,
        graphed_ns: 0,
        file: moment_file.with_file_name(format!("{stem}.offcpu.folded")),
    })
}

/// Fills in the blocked stacks of thread `tid` from a snapshot.
pub fn add_stacks(o: &mut OffCpu, s: &Samples, tid: u32) {
    let switches = thread_switches(&s.switches, tid);
    let mut taken: Vec<&SwitchSample> = s
        .switch_samples
        .iter()
        .filter(|x| x.sample.tid == tid)
        .collect();
    taken.sort_by_key(|x| x.sample.time_ns);
    let blocked: Vec<OffInterval> = off_intervals(&switches, o.from_ns, o.to_ns)
        .into_iter()
        .filter(|i| i.blocked)
        .collect();
    let mut by_stack: HashMap<(&[u32], &str), u64> = HashMap::new();
    for iv in &blocked {
        let key = match stack_at(&taken, &switches, iv.from_ns) {
            Some(x) => (s.stack(&x.sample), x.prev_state.as_str()),
            None => (&[][..], "?"),
        };
        *by_stack.entry(key).or_default() += iv.to_ns - iv.from_ns;
    }
    o.intervals = blocked.len();
    o.graphed_ns = by_stack.values().sum();
    o.folded = fold_us(s, &by_stack);
    o.top = heaviest(s, &by_stack, TOP);
}

/// One thread's switch records in time order, in the core's terms.
fn thread_switches(records: &[SwitchRecord], tid: u32) -> Vec<Switch> {
    let mut v: Vec<Switch> = records
        .iter()
        .filter(|r| r.tid == tid)
        .map(|r| Switch {
            time_ns: r.time_ns,
            kind: if r.out {
                SwitchKind::Out {
                    preempted: r.preempt,
                }
            } else {
                SwitchKind::In
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
    taken: &[&'a SwitchSample],
    switches: &[Switch],
    at_ns: u64,
) -> Option<&'a SwitchSample> {
    let i = taken.partition_point(|x| x.sample.time_ns <= at_ns);
    let x = *taken.get(i.checked_sub(1)?)?;
    let j = switches.partition_point(|w| w.time_ns <= at_ns);
    let last_in = switches[..j]
        .iter()
        .rev()
        .find(|w| w.kind == SwitchKind::In)
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
    out.sort_unstable();
    // The same stack with two states, or two chains folding alike.
    out.dedup_by(|b, a| {
        if a.0 == b.0 {
            a.1 += b.1;
            true
        } else {
            false
        }
    });
    out
}

fn root_first(s: &Samples, stack: &[u32]) -> String {
    if stack.is_empty() {
        return NO_STACK.into();
    }
    let names: Vec<&str> = stack.iter().rev().map(|&f| s.name(f)).collect();
    names.join(";")
}

/// The `n` heaviest (stack, state) pairs, the heaviest first.
fn heaviest(s: &Samples, by_stack: &HashMap<(&[u32], &str), u64>, n: usize) -> Vec<BlockedStack> {
    let mut v: Vec<BlockedStack> = by_stack
        .iter()
        .map(|((stack, state), &ns)| BlockedStack {
            frames: if stack.is_empty() {
                vec![NO_STACK.into()]
            } else {
                stack.iter().map(|&f| s.name(f).to_string()).collect()
            },
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

/// The leaf-most `n` frames that say why the thread blocked: leaf first,
/// without the scheduler's and the syscall entry's frames, and without a
/// frame repeated next to itself (perf names an inlined frame twice).
pub fn interesting(frames: &[String], n: usize) -> Vec<&str> {
    let mut v: Vec<&str> = Vec::new();
    for f in frames.iter().map(String::as_str).filter(|f| !plumbing(f)) {
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
pub fn json(o: &OffCpu, read: bool) -> serde_json::Value {
    serde_json::json!({
        "from_ns": o.from_ns,
        "to_ns": o.to_ns,
        "folded": read.then(|| std::path::Path::new(super::FOLDED_DIR).join(&o.file)),
        "blocked_intervals": o.intervals,
        "graphed_us": o.graphed_ns / 1000,
        "blocked_stacks": o.top,
    })
}
