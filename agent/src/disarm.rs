//! Disarming a trigger while its cooldown runs: the pure state machine.
//!
//! After an accepted hit, the eBPF program drops every call until the
//! cooldown ends (`cooldown_next_ns = ktime + cooldown`). Each of those
//! calls still pays the uprobe trap. So the driver detaches the trigger's
//! uprobes (entry and `ret` probes) after the hit's `kill(perf)` and
//! attaches them again when the cooldown ends. This module decides when;
//! the driver does the I/O and gives it the time (CLOCK_MONOTONIC ns, the
//! clock of the hits' `ktime_ns`).
//!
//! Only a `--pid` trigger with a cooldown disarms: with `--exe` each
//! process has its own cooldown and one probe serves them all, so another
//! process's hit would be missed.

use serde::Serialize;

/// Disarming over a run, for the summary (JSON field `disarm`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct DisarmSummary {
    /// Disarm cycles, over triggers.
    pub cycles: u64,
    /// Time the probes were detached, seconds, summed over triggers.
    pub disarmed_s: f64,
    /// How late the re-arm was against the cooldown's end, µs (p50, p99).
    pub rearm_late_us_p50: Option<f64>,
    pub rearm_late_us_p99: Option<f64>,
    /// Time to detach one uprobe (detacher thread), µs (p50, p99).
    pub detach_us_p50: Option<f64>,
    pub detach_us_p99: Option<f64>,
    /// Time to attach a trigger's uprobes again (driver thread), µs.
    pub attach_us_p50: Option<f64>,
    pub attach_us_p99: Option<f64>,
}

/// What the driver must do after telling the machine about an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    Keep,
    /// Detach the trigger's uprobes now.
    Detach,
}

/// Totals of one trigger's disarming, for the summary and the index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DisarmStats {
    /// Disarm cycles (detach, then attach again or the end of the run).
    pub cycles: u64,
    /// Time spent disarmed, ns (closed cycles, and the open one up to the
    /// time given to [`Disarm::stats_at`]).
    pub disarmed_ns: u64,
    /// For each re-arm: how late it was against the cooldown's end, ns.
    pub rearm_late_ns: Vec<u64>,
}

/// One trigger's disarm state.
#[derive(Debug, Clone)]
pub struct Disarm {
    cooldown_ns: u64,
    /// Don't disarm when less than this is left of the cooldown: the detach
    /// and the attach would cost more than the traps saved.
    min_gap_ns: u64,
    /// Disarmed since (ns) until the cooldown's end (ns).
    disarmed: Option<(u64, u64)>,
    stats: DisarmStats,
}

impl Disarm {
    /// A machine for a cooldown of `cooldown_ns` (> 0).
    pub fn new(cooldown_ns: u64, min_gap_ns: u64) -> Self {
        Self {
            cooldown_ns,
            min_gap_ns,
            disarmed: None,
            stats: DisarmStats::default(),
        }
    }

    /// An accepted hit at `ktime_ns` was handled (perf signalled) at `now_ns`.
    pub fn on_hit(&mut self, ktime_ns: u64, now_ns: u64) -> Action {
        let end = ktime_ns.saturating_add(self.cooldown_ns);
        if let Some((_, until)) = &mut self.disarmed {
            // A hit read after the detach (it was in the ring buffer):
            // the latest cooldown counts.
            *until = (*until).max(end);
            return Action::Keep;
        }
        if end <= now_ns.saturating_add(self.min_gap_ns) {
            return Action::Keep;
        }
        self.disarmed = Some((now_ns, end));
        self.stats.cycles += 1;
        Action::Detach
    }

    /// When the probes must be attached again (CLOCK_MONOTONIC ns), if
    /// disarmed.
    pub fn rearm_at(&self) -> Option<u64> {
        self.disarmed.map(|(_, until)| until)
    }

    /// Whether the probes must be attached again at `now_ns`.
    pub fn due(&self, now_ns: u64) -> bool {
        self.rearm_at().is_some_and(|at| now_ns >= at)
    }

    /// The probes were attached again; `now_ns` is when the attach
    /// returned.
    pub fn rearmed(&mut self, now_ns: u64) {
        if let Some((since, until)) = self.disarmed.take() {
            self.stats.disarmed_ns += now_ns.saturating_sub(since);
            self.stats.rearm_late_ns.push(now_ns.saturating_sub(until));
        }
    }

    /// The probes will not be attached again (the run or the recording
    /// ended) at `now_ns`: closes the open cycle.
    pub fn finish(&mut self, now_ns: u64) {
        if let Some((since, _)) = self.disarmed.take() {
            self.stats.disarmed_ns += now_ns.saturating_sub(since);
        }
    }

    /// Whether the probes are detached.
    #[cfg(test)]
    pub fn is_disarmed(&self) -> bool {
        self.disarmed.is_some()
    }

    /// The totals, counting an open cycle up to `now_ns`.
    pub fn stats_at(&self, now_ns: u64) -> DisarmStats {
        let mut s = self.stats.clone();
        if let Some((since, _)) = self.disarmed {
            s.disarmed_ns += now_ns.saturating_sub(since);
        }
        s
    }
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

    #[test]
    fn a_hit_disarms_until_the_cooldown_ends() {
        let mut d = Disarm::new(100 * MS, MS);
        assert_eq!(d.on_hit(1_000 * MS, 1_000 * MS + 50_000), Action::Detach);
        assert!(d.is_disarmed());
        assert_eq!(d.rearm_at(), Some(1_100 * MS));
        assert!(!d.due(1_099 * MS));
        assert!(d.due(1_100 * MS));
        d.rearmed(1_100 * MS + 300_000);
        assert!(!d.is_disarmed());
        let s = d.stats_at(2_000 * MS);
        assert_eq!(s.cycles, 1);
        assert_eq!(s.rearm_late_ns, vec![300_000]);
        assert_eq!(s.disarmed_ns, 100 * MS + 300_000 - 50_000);
    }

    #[test]
    fn a_hit_read_too_late_does_not_disarm() {
        let mut d = Disarm::new(100 * MS, MS);
        // Read 99.5 ms after it happened: half a ms left, below the gap.
        assert_eq!(d.on_hit(0, 99 * MS + MS / 2), Action::Keep);
        assert!(!d.is_disarmed());
        assert_eq!(d.on_hit(0, 200 * MS), Action::Keep);
        assert_eq!(d.stats_at(300 * MS), DisarmStats::default());
    }

    #[test]
    fn hits_read_while_disarmed_extend_the_cooldown_only_forward() {
        let mut d = Disarm::new(100 * MS, MS);
        assert_eq!(d.on_hit(10 * MS, 10 * MS), Action::Detach);
        assert_eq!(d.on_hit(5 * MS, 11 * MS), Action::Keep);
        assert_eq!(d.rearm_at(), Some(110 * MS));
        assert_eq!(d.on_hit(20 * MS, 21 * MS), Action::Keep);
        assert_eq!(d.rearm_at(), Some(120 * MS));
        assert_eq!(d.stats_at(50 * MS).cycles, 1);
    }

    #[test]
    fn finish_closes_an_open_cycle_without_a_rearm() {
        let mut d = Disarm::new(100 * MS, MS);
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
        let mut d = Disarm::new(10 * MS, 0);
        for i in 0..5 {
            let t = i * 20 * MS;
            assert_eq!(d.on_hit(t, t), Action::Detach);
            d.rearmed(t + 10 * MS + i * 1000);
        }
        let s = d.stats_at(1_000 * MS);
        assert_eq!(s.cycles, 5);
        assert_eq!(s.disarmed_ns, 50 * MS + 10_000);
        assert_eq!(s.rearm_late_ns, vec![0, 1000, 2000, 3000, 4000]);
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
