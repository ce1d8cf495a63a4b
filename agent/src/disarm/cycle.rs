//! Disarming a trigger while its cooldown runs: the pure state machine.
//!
//! After an accepted hit, the eBPF program drops every call until the
//! cooldown ends (`cooldown_next_ns = ktime + cooldown`). Each of those
//! calls still pays the uprobe trap. So the driver detaches the trigger's
//! entry uprobe after the hit's `kill(perf)` and
//! attaches it again when the cooldown ends. This module decides when;
//! the driver does the I/O and gives it the time (CLOCK_MONOTONIC ns, the
//! clock of the hits' `ktime_ns`).
//!
//! Only a `--pid` trigger with a cooldown and no `--slower-than` disarms
//! (`plan::conditions::disarmed_after_hit`): with `--exe` each process has
//! its own cooldown and one probe serves them all, so another process's hit
//! would be missed; a `--slower-than` call entering during the cooldown
//! would not be timed.

use crate::output::index::DisarmCounters;

/// The driver publishes each trigger's [`DisarmCounters`] here; recorders
/// read them when they index a snapshot.
pub type Board = std::sync::Mutex<std::collections::HashMap<u32, DisarmCounters>>;

/// What the driver must do after telling the machine about an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DisarmAction {
    /// Nothing.
    Keep,
    /// Detach the trigger's uprobes now.
    Detach,
}

/// Totals of one trigger's disarming, for the summary and the index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DisarmStats {
    /// DisarmCycle cycles (detach, then attach again or the end of the run).
    pub cycles: u64,
    /// Time spent disarmed, ns (closed cycles, and the open one up to the
    /// time given to [`DisarmCycle::stats_at`]).
    pub disarmed_ns: u64,
    /// For each re-arm: how late it was against the cooldown's end, ns.
    pub rearm_late_ns: Vec<u64>,
    /// For each re-arm: how early it was, ns.
    pub rearm_early_ns: Vec<u64>,
    /// Accepted hits after which the probes stayed in: a detach and an
    /// attach would not have fit in what was left of the cooldown.
    pub kept_armed: u64,
}

/// Where a trigger's uprobes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Armed,
    /// Detached since `since` (ns); the cooldown ends at `until` (ns).
    Disarmed {
        since: u64,
        until: u64,
    },
    /// An attach was asked for and has not returned. `next` is the end of
    /// the cooldown of a hit read meanwhile (the new probes saw it).
    Rearming {
        since: u64,
        until: u64,
        next: Option<u64>,
    },
}

/// One trigger's disarm state.
#[derive(Debug, Clone)]
pub struct DisarmCycle {
    cooldown_ns: u64,
    /// Don't disarm when less than this is left of the cooldown: the probes
    /// would not be back by its end ([`round_trip_ns`]).
    min_gap_ns: u64,
    state: State,
    stats: DisarmStats,
}

impl DisarmCycle {
    /// A machine for a cooldown of `cooldown_ns` (> 0).
    pub fn new(cooldown_ns: u64, min_gap_ns: u64) -> Self {
        Self {
            cooldown_ns,
            min_gap_ns,
            state: State::Armed,
            stats: DisarmStats::default(),
        }
    }

    /// Sets the least cooldown left that is worth a disarm, ns.
    pub fn set_min_gap(&mut self, ns: u64) {
        self.min_gap_ns = ns;
    }

    /// An accepted hit at `ktime_ns` was handled (perf signalled) at `now_ns`.
    pub fn on_hit(&mut self, ktime_ns: u64, now_ns: u64) -> DisarmAction {
        let end = ktime_ns.saturating_add(self.cooldown_ns);
        match &mut self.state {
            State::Armed => {
                if end <= now_ns.saturating_add(self.min_gap_ns) {
                    if end > now_ns {
                        self.stats.kept_armed += 1;
                    }
                    return DisarmAction::Keep;
                }
                self.state = State::Disarmed {
                    since: now_ns,
                    until: end,
                };
                self.stats.cycles += 1;
                DisarmAction::Detach
            }
            // A hit read after the detach (it was in the ring buffer):
            // the latest cooldown counts.
            State::Disarmed { until, .. } => {
                *until = (*until).max(end);
                DisarmAction::Keep
            }
            State::Rearming { until, next, .. } => {
                if end > *until {
                    *next = Some(next.unwrap_or(0).max(end));
                }
                DisarmAction::Keep
            }
        }
    }

    /// Whether to ask for the attach at `now_ns`, `lead_ns` before the
    /// cooldown ends (an attach takes time; attaching before the end is
    /// harmless: the kernel's cooldown still drops those calls).
    pub fn due(&self, now_ns: u64, lead_ns: u64) -> bool {
        matches!(self.state, State::Disarmed { until, .. } if now_ns.saturating_add(lead_ns) >= until)
    }

    /// When to ask for the attach (ns), if disarmed and not asked yet.
    pub fn rearm_at(&self, lead_ns: u64) -> Option<u64> {
        match self.state {
            State::Disarmed { until, .. } => Some(until.saturating_sub(lead_ns)),
            _ => None,
        }
    }

    /// The attach was asked for.
    pub fn rearming(&mut self) {
        if let State::Disarmed { since, until } = self.state {
            self.state = State::Rearming {
                since,
                until,
                next: None,
            };
        }
    }

    /// The attach returned at `now_ns`. Returns [`DisarmAction::Detach`] when a
    /// hit read meanwhile started a cooldown long enough to disarm again.
    pub fn rearmed(&mut self, now_ns: u64) -> DisarmAction {
        let State::Rearming { since, until, next } = self.state else {
            return DisarmAction::Keep;
        };
        self.stats.disarmed_ns += now_ns.saturating_sub(since);
        self.stats.rearm_late_ns.push(now_ns.saturating_sub(until));
        self.stats.rearm_early_ns.push(until.saturating_sub(now_ns));
        self.state = State::Armed;
        match next {
            Some(end) if end > now_ns.saturating_add(self.min_gap_ns) => {
                self.state = State::Disarmed {
                    since: now_ns,
                    until: end,
                };
                self.stats.cycles += 1;
                DisarmAction::Detach
            }
            _ => DisarmAction::Keep,
        }
    }

    /// The probes will not be attached again (the run or the recording
    /// ended, or the attach failed) at `now_ns`: closes the open cycle.
    pub fn finish(&mut self, now_ns: u64) {
        if let State::Disarmed { since, .. } | State::Rearming { since, .. } = self.state {
            self.stats.disarmed_ns += now_ns.saturating_sub(since);
        }
        self.state = State::Armed;
    }

    /// Whether the probes are detached (or being attached again).
    #[cfg(test)]
    pub fn is_disarmed(&self) -> bool {
        self.state != State::Armed
    }

    /// Cycles started, and time out in the cycles that have ended.
    pub fn counters(&self) -> DisarmCounters {
        DisarmCounters {
            cycles: self.stats.cycles,
            disarmed_ns: self.stats.disarmed_ns,
        }
    }

    /// The totals, counting an open cycle up to `now_ns`.
    pub fn stats_at(&self, now_ns: u64) -> DisarmStats {
        let mut s = self.stats.clone();
        if let State::Disarmed { since, .. } | State::Rearming { since, .. } = self.state {
            s.disarmed_ns += now_ns.saturating_sub(since);
        }
        s
    }
}

/// Before anything is measured: a detach and an attach, ns (measured
/// here: docs/disarming.md).
pub const PRIOR_DETACH_NS: u64 = 130_000_000;
pub const PRIOR_ATTACH_NS: u64 = 20_000_000;
/// The same for event uprobes' detach: closing one perf event per uprobe
/// (docs/disarming.md, "The fast way"), rounded up.
pub const EVENTS_PRIOR_DETACH_NS: u64 = 5_000_000;

/// How long the probes take to go out and come back: the median of the
/// recent detaches (one trigger's uprobes, ns) plus that of the recent
/// attaches, each with its prior until measured. A cooldown shorter than
/// this would bring the probes back late and miss calls it could accept.
/// `prior_detach_ns`: [`PRIOR_DETACH_NS`] or [`EVENTS_PRIOR_DETACH_NS`].
pub fn round_trip_ns(detaches: &[u64], attaches: &[u64], prior_detach_ns: u64) -> u64 {
    let median = |v: &[u64]| quantile(v, 0.5);
    median(detaches).unwrap_or(prior_detach_ns) + median(attaches).unwrap_or(PRIOR_ATTACH_NS)
}

/// How many recent attach (or detach) times the estimates use.
pub const RECENT: usize = 8;

/// The quantile of the recent attach times that sets the lead. An attach
/// that takes longer than the lead is late by the difference (calls the
/// cooldown would let through are not seen meanwhile); one that takes less
/// puts the probes in early (those calls trap, and the kernel's cooldown
/// drops them). The slowest of the last 8 (q = 1) kept the probes in too
/// early; docs/disarming.md ("Re-arming on time") has the measurements.
pub const LEAD_QUANTILE: f64 = 0.75;

/// How early to ask for an attach: the [`LEAD_QUANTILE`] of the recent
/// attaches (`recent`, ns; [`PRIOR_ATTACH_NS`] counts as one of them until
/// [`RECENT`] are measured), at most half the cooldown.
pub fn lead_ns(recent: &[u64], cooldown_ns: u64) -> u64 {
    let mut v = recent.to_vec();
    if v.len() < RECENT {
        v.push(PRIOR_ATTACH_NS);
    }
    quantile(&v, LEAD_QUANTILE)
        .unwrap_or(PRIOR_ATTACH_NS)
        .min(cooldown_ns / 2)
}

/// What a warm-up's lead adds to the slowest recent one, ns: a tick
/// (4 ms at HZ=250), the step in which grace periods end here.
pub const WARM_MARGIN_NS: u64 = 4_000_000;

/// How early to ask for a switch's warmed-up arm ([`crate::disarm::rcu_warmup`]): the
/// slowest of the recent warm-ups and arms (`recent`, ns; as in
/// [`lead_ns`]) plus [`WARM_MARGIN_NS`], at most half the cooldown. A lead
/// too long costs the arming thread a warm-up a millisecond, not the
/// target a trap: the arm waits for the cooldown's end.
pub fn warm_lead_ns(recent: &[u64], cooldown_ns: u64) -> u64 {
    let mut v = recent.to_vec();
    if v.len() < RECENT {
        v.push(PRIOR_ATTACH_NS);
    }
    (quantile(&v, 1.0).unwrap_or(PRIOR_ATTACH_NS) + WARM_MARGIN_NS).min(cooldown_ns / 2)
}

/// The `q` quantile (0..=1) of `v`, nearest rank; None when empty.
pub fn quantile(v: &[u64], q: f64) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    Some(s[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000_000_000;

    fn rearm(d: &mut DisarmCycle, at: u64) -> DisarmAction {
        d.rearming();
        d.rearmed(at)
    }

    #[test]
    fn a_hit_disarms_until_the_cooldown_ends() {
        let mut d = DisarmCycle::new(100 * MS, MS);
        assert_eq!(
            d.on_hit(1_000 * MS, 1_000 * MS + 50_000),
            DisarmAction::Detach
        );
        assert!(d.is_disarmed());
        assert_eq!(d.rearm_at(0), Some(1_100 * MS));
        assert_eq!(d.rearm_at(10 * MS), Some(1_090 * MS));
        assert!(!d.due(1_099 * MS, 0));
        assert!(d.due(1_099 * MS, MS));
        assert!(d.due(1_100 * MS, 0));
        d.rearming();
        assert_eq!(d.rearm_at(0), None, "asked once");
        assert!(!d.due(2_000 * MS, 0));
        assert_eq!(d.rearmed(1_100 * MS + 300_000), DisarmAction::Keep);
        assert!(!d.is_disarmed());
        let s = d.stats_at(2_000 * MS);
        assert_eq!(s.cycles, 1);
        assert_eq!(s.rearm_late_ns, vec![300_000]);
        assert_eq!(s.disarmed_ns, 100 * MS + 300_000 - 50_000);
    }

    #[test]
    fn an_early_rearm_is_not_late() {
        let mut d = DisarmCycle::new(100 * MS, MS);
        d.on_hit(0, 0);
        assert_eq!(rearm(&mut d, 95 * MS), DisarmAction::Keep);
        assert_eq!(d.stats_at(95 * MS).rearm_late_ns, vec![0]);
    }

    #[test]
    fn a_hit_read_too_late_does_not_disarm() {
        let mut d = DisarmCycle::new(100 * MS, MS);
        // Read 99.5 ms after it happened: half a ms left, below the gap.
        assert_eq!(d.on_hit(0, 99 * MS + MS / 2), DisarmAction::Keep);
        assert!(!d.is_disarmed());
        assert_eq!(d.on_hit(0, 200 * MS), DisarmAction::Keep);
        // The first had half a ms of cooldown left; the second none.
        let s = d.stats_at(300 * MS);
        assert_eq!((s.cycles, s.disarmed_ns, s.kept_armed), (0, 0, 1));
    }

    #[test]
    fn hits_read_while_disarmed_extend_the_cooldown_only_forward() {
        let mut d = DisarmCycle::new(100 * MS, MS);
        assert_eq!(d.on_hit(10 * MS, 10 * MS), DisarmAction::Detach);
        assert_eq!(d.on_hit(5 * MS, 11 * MS), DisarmAction::Keep);
        assert_eq!(d.rearm_at(0), Some(110 * MS));
        assert_eq!(d.on_hit(20 * MS, 21 * MS), DisarmAction::Keep);
        assert_eq!(d.rearm_at(0), Some(120 * MS));
        assert_eq!(d.stats_at(50 * MS).cycles, 1);
    }

    #[test]
    fn a_hit_of_the_new_probes_before_the_attach_returns_disarms_again() {
        let mut d = DisarmCycle::new(100 * MS, MS);
        d.on_hit(0, 0);
        d.rearming();
        // The probes went in at ~99 ms; a call at 100 ms was accepted and
        // read before the attach returned.
        assert_eq!(d.on_hit(100 * MS, 101 * MS), DisarmAction::Keep);
        assert_eq!(d.rearmed(102 * MS), DisarmAction::Detach);
        assert_eq!(d.rearm_at(0), Some(200 * MS));
        let s = d.stats_at(102 * MS);
        assert_eq!((s.cycles, s.disarmed_ns), (2, 102 * MS));
        assert_eq!(s.rearm_late_ns, vec![2 * MS]);
    }

    #[test]
    fn finish_closes_an_open_cycle_without_a_rearm() {
        let mut d = DisarmCycle::new(100 * MS, MS);
        d.on_hit(0, 0);
        assert_eq!(d.stats_at(30 * MS).disarmed_ns, 30 * MS);
        d.finish(40 * MS);
        assert!(!d.is_disarmed());
        let s = d.stats_at(1_000 * MS);
        assert_eq!((s.cycles, s.disarmed_ns), (1, 40 * MS));
        assert!(s.rearm_late_ns.is_empty());
    }

    #[test]
    fn cycles_add_up() {
        let mut d = DisarmCycle::new(10 * MS, 0);
        for i in 0..5 {
            let t = i * 20 * MS;
            assert_eq!(d.on_hit(t, t), DisarmAction::Detach);
            assert_eq!(rearm(&mut d, t + 10 * MS + i * 1000), DisarmAction::Keep);
        }
        let s = d.stats_at(1_000 * MS);
        assert_eq!(s.cycles, 5);
        assert_eq!(s.disarmed_ns, 50 * MS + 10_000);
        assert_eq!(s.rearm_late_ns, vec![0, 1000, 2000, 3000, 4000]);
    }

    #[test]
    fn the_lead_is_the_upper_quartile_of_recent_attaches_within_half_the_cooldown() {
        // Until 8 are measured, the prior is one of them.
        assert_eq!(lead_ns(&[], 100 * MS), PRIOR_ATTACH_NS);
        assert_eq!(lead_ns(&[3 * MS], 100 * MS), PRIOR_ATTACH_NS);
        assert_eq!(lead_ns(&[3 * MS, 12 * MS, 5 * MS], 100 * MS), 12 * MS);
        let eight = [9, 3, 4, 40, 5, 7, 6, 8].map(|v| v * MS);
        assert_eq!(lead_ns(&eight, 100 * MS), 8 * MS);
        assert_eq!(lead_ns(&[80 * MS], 100 * MS), 50 * MS);
        assert_eq!(lead_ns(&[], 30 * MS), 15 * MS);
    }

    #[test]
    fn a_cooldown_shorter_than_the_round_trip_keeps_the_probes_in() {
        let mut d = DisarmCycle::new(100 * MS, MS);
        d.set_min_gap(round_trip_ns(&[], &[], PRIOR_DETACH_NS));
        assert_eq!(d.on_hit(0, 0), DisarmAction::Keep);
        assert_eq!(d.stats_at(0).kept_armed, 1);
        d.set_min_gap(round_trip_ns(
            &[40 * MS, 50 * MS, 300 * MS],
            &[10 * MS],
            PRIOR_DETACH_NS,
        ));
        assert_eq!(d.on_hit(200 * MS, 200 * MS), DisarmAction::Detach);
        let s = d.stats_at(200 * MS);
        assert_eq!((s.cycles, s.kept_armed), (1, 1));
    }

    #[test]
    fn the_round_trip_is_measured_medians_or_the_priors() {
        assert_eq!(
            round_trip_ns(&[], &[], PRIOR_DETACH_NS),
            PRIOR_DETACH_NS + PRIOR_ATTACH_NS
        );
        assert_eq!(
            round_trip_ns(&[], &[], EVENTS_PRIOR_DETACH_NS),
            EVENTS_PRIOR_DETACH_NS + PRIOR_ATTACH_NS
        );
        assert_eq!(
            round_trip_ns(&[5, 7, 900], &[], PRIOR_DETACH_NS),
            7 + PRIOR_ATTACH_NS
        );
        assert_eq!(round_trip_ns(&[5], &[3, 1, 2], PRIOR_DETACH_NS), 7);
    }

    #[test]
    fn a_warm_lead_covers_the_slowest_recent_warm_up() {
        // Until RECENT are measured, the prior counts as one of them.
        assert_eq!(warm_lead_ns(&[], SEC), PRIOR_ATTACH_NS + WARM_MARGIN_NS);
        assert_eq!(
            warm_lead_ns(&[30 * MS], SEC),
            30 * MS + WARM_MARGIN_NS,
            "a slower one than the prior"
        );
        let recent = [
            9 * MS,
            13 * MS,
            16 * MS,
            12 * MS,
            8 * MS,
            9 * MS,
            13 * MS,
            12 * MS,
        ];
        assert_eq!(warm_lead_ns(&recent, SEC), 16 * MS + WARM_MARGIN_NS);
        assert_eq!(warm_lead_ns(&recent, 20 * MS), 10 * MS, "half the cooldown");
    }

    #[test]
    fn a_rearm_records_how_early_or_late_it_was() {
        let mut d = DisarmCycle::new(100 * MS, MS);
        d.on_hit(0, 0);
        rearm(&mut d, 99 * MS);
        d.on_hit(100 * MS, 100 * MS);
        rearm(&mut d, 200 * MS + 300_000);
        let s = d.stats_at(300 * MS);
        assert_eq!(s.rearm_early_ns, vec![MS, 0]);
        assert_eq!(s.rearm_late_ns, vec![0, 300_000]);
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[7], 0.99), Some(7));
        let v: Vec<u64> = (1..=100).rev().collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&v, 1.0), Some(100));
    }
}
