//! Where a thread's time went in a window: on CPU, runnable (preempted,
//! waiting for a CPU) or blocked (sleeping), from the context-switch records
//! perf writes with `--switch-events` (docs/off-cpu.md).
//!
//! A switch-out record carries the kernel's `PERF_RECORD_MISC_SWITCH_OUT_PREEMPT`
//! flag when the thread was still `TASK_RUNNING` (include/uapi/linux/perf_event.h):
//! it was preempted, so its off-CPU time until the next switch-in is run-queue
//! time. Any other switch-out is a sleep; its time until the switch-in, wake-up
//! latency included, is blocked time.

use serde::{Deserialize, Serialize};

/// Direction of one context switch of a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextSwitchKind {
    /// The thread got a CPU.
    In,
    /// The thread left its CPU; `preempted` when it was still runnable.
    Out { preempted: bool },
}

/// One context switch of a thread, at `time_ns` (CLOCK_MONOTONIC, ns: perf
/// records with `-k CLOCK_MONOTONIC`, the clock of the hits' `ktime_ns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextSwitch {
    pub time_ns: u64,
    pub kind: ContextSwitchKind,
}

/// A thread's time in a window, ns. The three add up to the window's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Breakdown {
    /// Running on a CPU.
    pub on_cpu_ns: u64,
    /// Preempted, in the run queue: CPU contention.
    pub runnable_ns: u64,
    /// Sleeping (lock, I/O, timer...), wake-up latency included.
    pub blocked_ns: u64,
}

/// The breakdown of one hit's thread, as the index and `--json` show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffCpu {
    /// Start of the window, CLOCK_MONOTONIC ns; it ends at the hit's
    /// `ktime_ns`. A `--slower-than` hit's window is its call.
    pub off_cpu_from_ns: u64,
    #[serde(flatten)]
    pub breakdown: Breakdown,
    /// The file has a switch record of the thread at or before the window's
    /// start, so it reaches back to it even when the thread was asleep
    /// there and left no sample.
    #[serde(skip)]
    pub reaches_start: bool,
}

/// One stretch off CPU, clipped to the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffInterval {
    pub from_ns: u64,
    pub to_ns: u64,
    /// Sleeping rather than preempted.
    pub blocked: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    OnCpu,
    Runnable,
    Blocked,
}

fn after(kind: ContextSwitchKind) -> State {
    match kind {
        ContextSwitchKind::In => State::OnCpu,
        ContextSwitchKind::Out { preempted: true } => State::Runnable,
        ContextSwitchKind::Out { preempted: false } => State::Blocked,
    }
}

/// The thread's state at `from_ns`: set by the last switch at or before it;
/// with none, the opposite of the first one after it (off CPU before a
/// switch-in counts as blocked); with no switch at all, on CPU.
fn state_at(sorted: &[ContextSwitch], from_ns: u64) -> State {
    if let Some(s) = sorted.iter().rev().find(|s| s.time_ns <= from_ns) {
        return after(s.kind);
    }
    match sorted.first().map(|s| s.kind) {
        Some(ContextSwitchKind::In) => State::Blocked,
        _ => State::OnCpu,
    }
}

/// The window `[from_ns, to_ns]` cut into stretches of one state each.
fn segments(switches: &[ContextSwitch], from_ns: u64, to_ns: u64) -> Vec<(u64, u64, State)> {
    let mut sorted = switches.to_vec();
    // perf writes each CPU's buffer in turn: one thread's records can be out
    // of order in the file.
    sorted.sort_by_key(|s| s.time_ns);
    let mut state = state_at(&sorted, from_ns);
    let mut at = from_ns;
    let mut out = Vec::new();
    for s in sorted
        .iter()
        .filter(|s| s.time_ns > from_ns && s.time_ns < to_ns)
    {
        out.push((at, s.time_ns, state));
        at = s.time_ns;
        state = after(s.kind);
    }
    if to_ns > at {
        out.push((at, to_ns, state));
    }
    out
}

/// How the thread's time in `[from_ns, to_ns]` divides. `switches` are one
/// thread's, in any order.
pub fn breakdown(switches: &[ContextSwitch], from_ns: u64, to_ns: u64) -> Breakdown {
    let mut b = Breakdown::default();
    for (a, z, state) in segments(switches, from_ns, to_ns) {
        let slot = match state {
            State::OnCpu => &mut b.on_cpu_ns,
            State::Runnable => &mut b.runnable_ns,
            State::Blocked => &mut b.blocked_ns,
        };
        *slot += z - a;
    }
    b
}

/// The thread's stretches off CPU in `[from_ns, to_ns]`, clipped to it, in
/// time order.
pub fn off_intervals(switches: &[ContextSwitch], from_ns: u64, to_ns: u64) -> Vec<OffInterval> {
    segments(switches, from_ns, to_ns)
        .into_iter()
        .filter(|(a, z, s)| *s != State::OnCpu && z > a)
        .map(|(from_ns, to_ns, s)| OffInterval {
            from_ns,
            to_ns,
            blocked: s == State::Blocked,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sw(time_ns: u64, kind: ContextSwitchKind) -> ContextSwitch {
        ContextSwitch { time_ns, kind }
    }
    const IN: ContextSwitchKind = ContextSwitchKind::In;
    const SLEEP: ContextSwitchKind = ContextSwitchKind::Out { preempted: false };
    const PREEMPT: ContextSwitchKind = ContextSwitchKind::Out { preempted: true };

    #[test]
    fn a_thread_that_never_switched_was_on_cpu_throughout() {
        let b = breakdown(&[], 100, 200);
        assert_eq!(b.on_cpu_ns, 100);
        assert_eq!(b.runnable_ns + b.blocked_ns, 0);
    }

    #[test]
    fn compute_then_sleep_then_compute_splits_into_on_cpu_and_blocked() {
        let s = [sw(120, SLEEP), sw(170, IN)];
        let b = breakdown(&s, 100, 200);
        assert_eq!(
            b,
            Breakdown {
                on_cpu_ns: 50,
                runnable_ns: 0,
                blocked_ns: 50
            }
        );
    }

    #[test]
    fn a_preempted_thread_is_runnable_until_it_runs_again() {
        let s = [sw(110, PREEMPT), sw(150, IN), sw(160, PREEMPT), sw(190, IN)];
        let b = breakdown(&s, 100, 200);
        assert_eq!(b.runnable_ns, 70);
        assert_eq!(b.on_cpu_ns, 30);
    }

    #[test]
    fn records_out_of_order_in_the_file_are_sorted() {
        let s = [sw(170, IN), sw(120, SLEEP)];
        assert_eq!(breakdown(&s, 100, 200).blocked_ns, 50);
    }

    #[test]
    fn the_state_at_the_window_start_comes_from_the_switch_before_it() {
        // Asleep since 50, woken at 150.
        let s = [sw(40, IN), sw(50, SLEEP), sw(150, IN)];
        let b = breakdown(&s, 100, 200);
        assert_eq!((b.blocked_ns, b.on_cpu_ns), (50, 50));
    }

    #[test]
    fn with_nothing_before_the_window_a_first_switch_in_means_it_was_off_cpu() {
        let b = breakdown(&[sw(130, IN)], 100, 200);
        assert_eq!((b.blocked_ns, b.on_cpu_ns), (30, 70));
        let b = breakdown(&[sw(130, SLEEP)], 100, 200);
        assert_eq!((b.on_cpu_ns, b.blocked_ns), (30, 70));
    }

    #[test]
    fn the_figures_always_add_up_to_the_window() {
        let s = [
            sw(90, PREEMPT),
            sw(105, IN),
            sw(111, SLEEP),
            sw(140, IN),
            sw(141, PREEMPT),
            sw(199, IN),
            sw(250, SLEEP),
        ];
        let b = breakdown(&s, 100, 200);
        assert_eq!(b.on_cpu_ns + b.runnable_ns + b.blocked_ns, 100);
    }

    #[test]
    fn off_intervals_are_clipped_to_the_window_and_say_which_kind() {
        let s = [
            sw(50, SLEEP),
            sw(120, IN),
            sw(150, PREEMPT),
            sw(160, IN),
            sw(190, SLEEP),
        ];
        let v = off_intervals(&s, 100, 200);
        assert_eq!(
            v,
            [
                OffInterval {
                    from_ns: 100,
                    to_ns: 120,
                    blocked: true
                },
                OffInterval {
                    from_ns: 150,
                    to_ns: 160,
                    blocked: false
                },
                OffInterval {
                    from_ns: 190,
                    to_ns: 200,
                    blocked: true
                },
            ]
        );
    }
}
