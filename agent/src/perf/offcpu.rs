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

/// A thread's time in a window, ns. The four add up to the window's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Breakdown {
    /// Running on a CPU.
    pub on_cpu_ns: u64,
    /// Preempted, in the run queue: CPU contention.
    pub runnable_ns: u64,
    /// Sleeping (lock, I/O, timer...), wake-up latency included.
    pub blocked_ns: u64,
    /// Not shown by the file: before its oldest record, where perf lost
    /// records, or off CPU since then with no record saying why
    /// ([`Gap`]). Absent from index lines written before it existed.
    #[serde(default)]
    pub unknown_ns: u64,
}

/// A stretch the snapshot file shows nothing of, CLOCK_MONOTONIC ns
/// `[from_ns, to_ns)`: before its oldest record, or where perf lost records
/// (`PERF_RECORD_LOST`). Written `[from_ns, to_ns]` in the index.
pub type Gap = [u64; 2];

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
    /// Inside a [`Gap`], or off CPU with no record of why.
    Unknown,
    /// Since a gap's end, with no switch of the thread yet: the next one
    /// tells (a switch out: it was running; a switch in: it was off CPU,
    /// preempted or asleep, which the file does not say).
    Pending,
}

fn after(kind: ContextSwitchKind) -> State {
    match kind {
        ContextSwitchKind::In => State::OnCpu,
        ContextSwitchKind::Out { preempted: true } => State::Runnable,
        ContextSwitchKind::Out { preempted: false } => State::Blocked,
    }
}

/// What a pending stretch was, told by the switch that ends it (`None`: no
/// switch before the hit, which ran on the thread: it was running).
fn resolve(next: Option<ContextSwitchKind>) -> State {
    match next {
        None | Some(ContextSwitchKind::Out { .. }) => State::OnCpu,
        Some(ContextSwitchKind::In) => State::Unknown,
    }
}

/// One point of the thread's timeline, in time order; at one time a gap's
/// end comes before a switch, a switch before a gap's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Mark {
    GapEnd,
    Switch,
    GapStart,
}

/// The window `[from_ns, to_ns]` cut into stretches of one state each.
/// The timeline starts pending (the thread's state before its first record
/// is not in the file); inside a gap every switch is ignored and the state
/// is unknown; after it, pending again.
fn segments(
    switches: &[ContextSwitch],
    gaps: &[Gap],
    from_ns: u64,
    to_ns: u64,
) -> Vec<(u64, u64, State)> {
    let mut marks: Vec<(u64, Mark, Option<ContextSwitchKind>)> = Vec::new();
    // perf writes each CPU's buffer in turn: one thread's records can be out
    // of order in the file.
    marks.extend(
        switches
            .iter()
            .map(|s| (s.time_ns, Mark::Switch, Some(s.kind))),
    );
    for g in gaps.iter().filter(|g| g[1] > g[0]) {
        marks.push((g[0], Mark::GapStart, None));
        marks.push((g[1], Mark::GapEnd, None));
    }
    marks.sort_by_key(|m| (m.0, m.1));
    let mut raw: Vec<(u64, u64, State)> = Vec::new();
    let (mut at, mut state, mut open_gaps) = (0u64, State::Pending, 0usize);
    for &(t, mark, kind) in &marks {
        let next = match (mark, kind) {
            (Mark::GapStart, _) => {
                open_gaps += 1;
                State::Unknown
            }
            (Mark::GapEnd, _) => {
                open_gaps -= 1;
                if open_gaps > 0 {
                    State::Unknown
                } else {
                    State::Pending
                }
            }
            (Mark::Switch, Some(k)) if open_gaps == 0 => {
                if state == State::Pending {
                    state = resolve(Some(k));
                }
                after(k)
            }
            _ => continue,
        };
        raw.push((at, t, state));
        (at, state) = (t, next);
    }
    if state == State::Pending {
        state = resolve(None);
    }
    raw.push((at, u64::MAX, state));
    raw.into_iter()
        .map(|(a, z, s)| (a.max(from_ns), z.min(to_ns), s))
        .filter(|(a, z, _)| z > a)
        .collect()
}

/// How the thread's time in `[from_ns, to_ns]` divides. `switches` are one
/// thread's, in any order; `gaps` are the stretches the file does not show.
pub fn breakdown(switches: &[ContextSwitch], gaps: &[Gap], from_ns: u64, to_ns: u64) -> Breakdown {
    let mut b = Breakdown::default();
    for (a, z, state) in segments(switches, gaps, from_ns, to_ns) {
        let slot = match state {
            State::OnCpu => &mut b.on_cpu_ns,
            State::Runnable => &mut b.runnable_ns,
            State::Blocked => &mut b.blocked_ns,
            State::Unknown | State::Pending => &mut b.unknown_ns,
        };
        *slot += z - a;
    }
    b
}

/// The thread's known stretches off CPU in `[from_ns, to_ns]`, clipped to
/// it, in time order (unknown stretches are left out).
pub fn off_intervals(
    switches: &[ContextSwitch],
    gaps: &[Gap],
    from_ns: u64,
    to_ns: u64,
) -> Vec<OffInterval> {
    segments(switches, gaps, from_ns, to_ns)
        .into_iter()
        .filter(|(_, _, s)| matches!(s, State::Runnable | State::Blocked))
        .map(|(from_ns, to_ns, s)| OffInterval {
            from_ns,
            to_ns,
            blocked: s == State::Blocked,
        })
        .collect()
}

/// A thread's known stretches in a window by state, each a list of
/// `[start_ns, end_ns]` in time order, clipped to the window; what the
/// file does not show (a [`Gap`], or off CPU with no record of why) is in
/// none of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct States {
    pub on_cpu: Vec<[u64; 2]>,
    pub runnable: Vec<[u64; 2]>,
    pub blocked: Vec<[u64; 2]>,
}

/// The thread's states over `[from_ns, to_ns]`, by the rule of
/// [`breakdown`] (the same stretches, not added up); stretches of one state
/// that touch are joined.
pub fn states(switches: &[ContextSwitch], gaps: &[Gap], from_ns: u64, to_ns: u64) -> States {
    let mut out = States::default();
    for (a, z, state) in segments(switches, gaps, from_ns, to_ns) {
        let list = match state {
            State::OnCpu => &mut out.on_cpu,
            State::Runnable => &mut out.runnable,
            State::Blocked => &mut out.blocked,
            State::Unknown | State::Pending => continue,
        };
        match list.last_mut() {
            Some(last) if last[1] == a => last[1] = z,
            _ => list.push([a, z]),
        }
    }
    out
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
        let b = breakdown(&[], &[], 100, 200);
        assert_eq!(b.on_cpu_ns, 100);
        assert_eq!(b.runnable_ns + b.blocked_ns, 0);
    }

    #[test]
    fn compute_then_sleep_then_compute_splits_into_on_cpu_and_blocked() {
        let s = [sw(120, SLEEP), sw(170, IN)];
        let b = breakdown(&s, &[], 100, 200);
        assert_eq!(
            b,
            Breakdown {
                on_cpu_ns: 50,
                runnable_ns: 0,
                blocked_ns: 50,
                unknown_ns: 0,
            }
        );
    }

    #[test]
    fn a_preempted_thread_is_runnable_until_it_runs_again() {
        let s = [sw(110, PREEMPT), sw(150, IN), sw(160, PREEMPT), sw(190, IN)];
        let b = breakdown(&s, &[], 100, 200);
        assert_eq!(b.runnable_ns, 70);
        assert_eq!(b.on_cpu_ns, 30);
    }

    #[test]
    fn records_out_of_order_in_the_file_are_sorted() {
        let s = [sw(170, IN), sw(120, SLEEP)];
        assert_eq!(breakdown(&s, &[], 100, 200).blocked_ns, 50);
    }

    #[test]
    fn the_state_at_the_window_start_comes_from_the_switch_before_it() {
        // Asleep since 50, woken at 150.
        let s = [sw(40, IN), sw(50, SLEEP), sw(150, IN)];
        let b = breakdown(&s, &[], 100, 200);
        assert_eq!((b.blocked_ns, b.on_cpu_ns), (50, 50));
    }

    #[test]
    fn before_a_first_switch_in_the_thread_was_off_cpu_for_a_reason_the_file_does_not_give() {
        // Preempted or asleep before 130: the switch out is not in the file.
        let b = breakdown(&[sw(130, IN)], &[], 100, 200);
        assert_eq!((b.unknown_ns, b.on_cpu_ns, b.blocked_ns), (30, 70, 0));
        // Before a first switch out it was running.
        let b = breakdown(&[sw(130, SLEEP)], &[], 100, 200);
        assert_eq!((b.on_cpu_ns, b.blocked_ns, b.unknown_ns), (30, 70, 0));
    }

    #[test]
    fn a_window_that_starts_before_the_file_is_unknown_until_the_file_shows_the_thread() {
        // The file's oldest record is at 150. A thread spinning through the
        // whole window, preempted once before the file began: its switch
        // in at 170 is all the file holds of that preemption.
        let gap = [[0, 150]];
        let s = [sw(170, IN), sw(240, PREEMPT), sw(260, IN)];
        let b = breakdown(&s, &gap, 100, 300);
        assert_eq!(
            b,
            Breakdown {
                on_cpu_ns: 70 + 40,
                runnable_ns: 20,
                blocked_ns: 0,
                unknown_ns: 50 + 20,
            }
        );
        // First record a switch out: it ran from the file's start.
        let b = breakdown(&[sw(200, PREEMPT), sw(220, IN)], &gap, 100, 300);
        assert_eq!(
            (b.unknown_ns, b.on_cpu_ns, b.runnable_ns),
            (50, 50 + 80, 20)
        );
        // No record of the thread at all: it ran from the file's start to
        // the hit, which it made.
        let b = breakdown(&[], &gap, 100, 300);
        assert_eq!((b.unknown_ns, b.on_cpu_ns), (50, 150));
        // The whole window before the file.
        let b = breakdown(&[], &[[0, 400]], 100, 300);
        assert_eq!((b.unknown_ns, b.on_cpu_ns), (200, 0));
    }

    #[test]
    fn lost_records_make_their_stretch_unknown_and_the_state_after_it_pending() {
        // Asleep at 110; perf lost records in [150, 180): the switch in
        // that ended the sleep among them. Its next record is a switch out
        // at 250: it ran from 180 on.
        let s = [sw(100, IN), sw(110, SLEEP), sw(250, SLEEP), sw(270, IN)];
        let b = breakdown(&s, &[[150, 180]], 100, 300);
        assert_eq!(
            b,
            Breakdown {
                on_cpu_ns: 10 + 70 + 30,
                runnable_ns: 0,
                blocked_ns: 40 + 20,
                unknown_ns: 30,
            }
        );
        // After the loss its first record is a switch in: off CPU until
        // then, preempted or asleep, the file does not say.
        let s = [sw(110, SLEEP), sw(200, IN)];
        let b = breakdown(&s, &[[150, 180]], 100, 300);
        assert_eq!(
            (b.on_cpu_ns, b.blocked_ns, b.unknown_ns),
            (10 + 100, 40, 30 + 20)
        );
    }

    #[test]
    fn a_sleep_hidden_by_lost_records_is_never_on_cpu() {
        // The case: a thread sleeps 30 ms between two hits while
        // perf loses records; the second hit's window used to read as all
        // on CPU. The switch records inside the loss are ignored (their
        // neighbours may be lost), so the sleep is unknown, never on CPU.
        let s = [sw(10, IN), sw(400, SLEEP)];
        let b = breakdown(&s, &[[390, 460]], 100, 1000);
        assert_eq!(b.blocked_ns, 0);
        assert_eq!(b.unknown_ns, 70);
        assert_eq!(b.on_cpu_ns, 290 + 540);
    }

    #[test]
    fn overlapping_and_empty_gaps_are_one_unknown_stretch() {
        // Before the first gap nothing shows what the thread did either.
        let b = breakdown(&[], &[[120, 150], [140, 160], [170, 170]], 100, 200);
        assert_eq!((b.unknown_ns, b.on_cpu_ns), (20 + 40, 40));
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
        let gaps = [[0, 95], [130, 145]];
        let b = breakdown(&s, &gaps, 100, 200);
        assert_eq!(
            b.on_cpu_ns + b.runnable_ns + b.blocked_ns + b.unknown_ns,
            100
        );
    }

    #[test]
    fn states_are_the_breakdowns_stretches_joined_where_they_touch() {
        // Two switch-ins in a row (a lost switch-out) do not split the
        // stretch on CPU; what the gap hides is in no list.
        let s = [
            sw(120, IN),
            sw(130, IN),
            sw(150, SLEEP),
            sw(170, IN),
            sw(180, PREEMPT),
            sw(190, IN),
        ];
        let v = states(&s, &[[0, 110]], 100, 200);
        assert_eq!(
            v,
            States {
                on_cpu: vec![[120, 150], [170, 180], [190, 200]],
                runnable: vec![[180, 190]],
                blocked: vec![[150, 170]],
            }
        );
        let b = breakdown(&s, &[[0, 110]], 100, 200);
        let len = |l: &[[u64; 2]]| l.iter().map(|i| i[1] - i[0]).sum::<u64>();
        assert_eq!(
            (len(&v.on_cpu), len(&v.runnable), len(&v.blocked)),
            (b.on_cpu_ns, b.runnable_ns, b.blocked_ns)
        );
    }

    #[test]
    fn off_intervals_leave_out_what_is_unknown() {
        let s = [sw(120, SLEEP), sw(140, IN), sw(170, IN)];
        let v = off_intervals(&s, &[[130, 150]], 100, 200);
        assert_eq!(
            v,
            [OffInterval {
                from_ns: 120,
                to_ns: 130,
                blocked: true
            }]
        );
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
        let v = off_intervals(&s, &[], 100, 200);
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
