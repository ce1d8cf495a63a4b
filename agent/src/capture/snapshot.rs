//! The hit-to-snapshot state machine. Pure: it takes events with their
//! CLOCK_MONOTONIC time in ns and returns the actions the I/O layer must take.
//!
//! Rules (from `docs/perf-switch-output.md`):
//! * One switch in flight. An accepted hit starts a switch: SIGUSR2 to perf
//!   (then `ping` on its control fd, which the I/O layer does). Hits that
//!   arrive before perf's `Dump` line for that switch are merged into the
//!   same snapshot and counted as merged.
//! * perf names files by centisecond, and `rename()` replaces an existing
//!   name, so at least [`MIN_GAP_NS`] pass between a `Dump` line and the next
//!   SIGUSR2 or `stop`.
//! * `--after`: the signal for a hit is sent this long after the hit.
//! * A `Dump` line we did not cause (perf stopping: on `stop`, on a signal, or
//!   when the target exits) is the `tail` snapshot. Hits that arrive while
//!   the run is stopping are merged into it.
//!
//! Accounting: every delivered hit ends in exactly one place: as the cause of
//! a `hit` snapshot, merged into a snapshot, or unsnapshotted (perf died
//! before writing it). So `delivered = hit_snapshots + merged + unsnapshotted`.

use crate::output::{
    events::Stats,
    index::{IndexedHit, Snapshot, SnapshotKind},
};

/// Least time between a `Dump` line and the next SIGUSR2 or `stop`, in ns:
/// perf's file names have centisecond resolution.
pub const MIN_GAP_NS: u64 = 10_000_000;

/// Most hits listed in one snapshot's index line; further merged hits are
/// only counted (`unlisted_hits`), so a storm cannot grow memory or the index.
pub const MAX_LISTED_HITS: usize = 100;

/// What the I/O layer must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send SIGUSR2 to perf, then write `ping` on its control fd.
    Switch,
    /// Write `stop` on perf's control fd.
    Stop,
    /// `--max-snapshots` is reached: detach the probe and end the run.
    LimitReached,
    /// Append this snapshot to the index.
    Index(Snapshot),
}

/// Settings of the state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Policy {
    /// `--after`, ns.
    pub after_ns: u64,
    /// `--max-snapshots`: hit snapshots before the run ends.
    pub max_snapshots: Option<u64>,
}

/// Hits bound for one snapshot: the first [`MAX_LISTED_HITS`] listed, the
/// rest counted.
#[derive(Debug, Default)]
struct Hits {
    listed: Vec<IndexedHit>,
    unlisted: u64,
}

impl Hits {
    fn push(&mut self, hit: IndexedHit) {
        if self.listed.len() < MAX_LISTED_HITS {
            self.listed.push(hit);
        } else {
            self.unlisted += 1;
        }
    }

    fn len(&self) -> u64 {
        self.listed.len() as u64 + self.unlisted
    }
}

#[derive(Debug)]
struct Pending {
    hits: Hits,
    fire_at: u64,
    signalled_at: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// Stop wanted; waiting for the switch in flight and the gap.
    Stopping,
    /// `stop` written to perf.
    StopSent,
}

/// The state machine for one perf recorder.
#[derive(Debug)]
pub struct SnapshotMachine {
    policy: Policy,
    pending: Option<Pending>,
    /// Hits that arrived while stopping: they go into the tail.
    late: Hits,
    last_dump_ns: Option<u64>,
    phase: Phase,
    stats: Stats,
}

impl SnapshotMachine {
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            pending: None,
            late: Hits::default(),
            last_dump_ns: None,
            phase: Phase::Running,
            stats: Stats::default(),
        }
    }

    /// The counts so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Whether `stop` has been written to perf.
    pub fn stop_sent(&self) -> bool {
        self.phase == Phase::StopSent
    }

    /// Whether a SIGUSR2 was sent and its `Dump` line has not arrived yet.
    #[cfg(test)]
    pub fn switch_in_flight(&self) -> bool {
        self.pending
            .as_ref()
            .is_some_and(|p| p.signalled_at.is_some())
    }

    /// An accepted hit arrived from the ring buffer. `hit.merged` is set here.
    pub fn on_hit(&mut self, mut hit: IndexedHit, now: u64) -> Vec<Action> {
        self.stats.delivered += 1;
        if self.phase != Phase::Running {
            hit.merged = true;
            self.stats.merged += 1;
            self.late.push(hit);
            return Vec::new();
        }
        if let Some(p) = &mut self.pending {
            hit.merged = true;
            self.stats.merged += 1;
            p.hits.push(hit);
            return Vec::new();
        }
        hit.merged = false;
        let mut hits = Hits::default();
        hits.push(hit);
        let mut fire_at = now + self.policy.after_ns;
        if let Some(last) = self.last_dump_ns {
            fire_at = fire_at.max(last + MIN_GAP_NS);
        }
        self.pending = Some(Pending {
            hits,
            fire_at,
            signalled_at: None,
        });
        self.on_tick(now)
    }

    /// perf printed `Dump <file>`: a snapshot file is complete.
    pub fn on_dump(&mut self, file: String, now: u64) -> Vec<Action> {
        self.last_dump_ns = Some(now);
        let mut actions = Vec::new();
        match self.pending.take() {
            Some(p) if p.signalled_at.is_some() => {
                let first_ktime = p.hits.listed.first().map_or(0, |h| h.ktime_ns);
                let hit_to_kill_ns = p.signalled_at.map(|s| s.saturating_sub(first_ktime));
                self.stats.hit_snapshots += 1;
                actions.push(Action::Index(Snapshot {
                    kind: SnapshotKind::Hit,
                    file,
                    bytes: 0,
                    hits: p.hits.listed,
                    hit_to_kill_ns,
                    kill_to_dump_ns: p.signalled_at.map(|s| now.saturating_sub(s)),
                    unlisted_hits: p.hits.unlisted,
                    span: None,
                    records_from_ns: None,
                    lost_records: 0,
                    lost_ns: Vec::new(),
                }));
                if self.phase == Phase::Running
                    && self
                        .policy
                        .max_snapshots
                        .is_some_and(|max| self.stats.hit_snapshots >= max)
                {
                    self.phase = Phase::Stopping;
                    actions.push(Action::LimitReached);
                }
            }
            unsignalled => {
                // perf closed a file on its own: it is stopping. Hits still
                // waiting for their signal are in this file, merged into it.
                let mut hits = Hits::default();
                if let Some(p) = unsignalled {
                    hits.unlisted = p.hits.unlisted;
                    for mut h in p.hits.listed {
                        if !h.merged {
                            h.merged = true;
                            self.stats.merged += 1;
                        }
                        hits.push(h);
                    }
                }
                let late = std::mem::take(&mut self.late);
                hits.unlisted += late.unlisted;
                for h in late.listed {
                    hits.push(h);
                }
                hits.listed.sort_by_key(|h| h.seq);
                self.stats.tail_snapshots += 1;
                // perf is ending: a signal now would only race its exit, and
                // it needs no `stop`. Later hits wait for the end (unsnapshotted).
                self.phase = Phase::StopSent;
                actions.push(Action::Index(Snapshot {
                    kind: SnapshotKind::Tail,
                    file,
                    bytes: 0,
                    hits: hits.listed,
                    hit_to_kill_ns: None,
                    kill_to_dump_ns: None,
                    unlisted_hits: hits.unlisted,
                    span: None,
                    records_from_ns: None,
                    lost_records: 0,
                    lost_ns: Vec::new(),
                }));
            }
        }
        actions.extend(self.on_tick(now));
        actions
    }

    /// The run should end (signal, duration, target exit, exec): finish the
    /// switch in flight, then stop perf.
    pub fn on_stop_request(&mut self, now: u64) -> Vec<Action> {
        if self.phase == Phase::Running {
            self.phase = Phase::Stopping;
        }
        self.on_tick(now)
    }

    /// Time passed: fire what is due.
    pub fn on_tick(&mut self, now: u64) -> Vec<Action> {
        let mut actions = Vec::new();
        if let Some(p) = &mut self.pending {
            if p.signalled_at.is_none() && now >= p.fire_at {
                p.signalled_at = Some(now);
                actions.push(Action::Switch);
            }
            return actions;
        }
        if self.phase == Phase::Stopping && self.gap_passed(now) {
            self.phase = Phase::StopSent;
            actions.push(Action::Stop);
        }
        actions
    }

    /// When [`SnapshotMachine::on_tick`] next has something to do, if ever.
    pub fn next_deadline(&self) -> Option<u64> {
        match &self.pending {
            Some(p) if p.signalled_at.is_none() => Some(p.fire_at),
            Some(_) => None,
            None if self.phase == Phase::Stopping => {
                Some(self.last_dump_ns.map_or(0, |t| t + MIN_GAP_NS))
            }
            None => None,
        }
    }

    /// perf has exited and every file it left has been passed to
    /// [`SnapshotMachine::on_dump`]. Returns how many hits never got a snapshot.
    pub fn on_perf_exit(&mut self) -> u64 {
        let pending = self.pending.take().map(|p| p.hits).unwrap_or_default();
        let late = std::mem::take(&mut self.late);
        // Everything but the cause of the pending switch was counted as
        // merged; the snapshot never came, so they are unsnapshotted instead.
        let merged = pending.len().saturating_sub(1) + late.len();
        self.stats.merged -= merged;
        let lost = pending.len() + late.len();
        self.stats.unsnapshotted += lost;
        lost
    }

    fn gap_passed(&self, now: u64) -> bool {
        self.last_dump_ns.is_none_or(|t| now >= t + MIN_GAP_NS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn hit(seq: u64, ktime_ns: u64) -> IndexedHit {
        IndexedHit {
            seq,
            tgid: 10,
            tid: 11,
            cpu: 0,
            ktime_ns,
            args: [seq, 0, 0, 0, 0, 0],
            duration_ns: None,
            retval: None,
            pending_return: None,
            merged: false,
            starts_before_samples: false,
            off_cpu: None,
        }
    }

    fn indexed(actions: &[Action]) -> Vec<&Snapshot> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Index(s) => Some(s),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_hit_switches_at_once_and_its_dump_indexes_it() {
        let mut t = SnapshotMachine::new(Policy::default());
        assert_eq!(
            t.on_hit(hit(1, 100 * MS), 100 * MS + 150_000),
            [Action::Switch]
        );
        assert!(t.switch_in_flight());
        let a = t.on_dump("perf.data.1".into(), 101 * MS);
        let s = indexed(&a);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].kind, SnapshotKind::Hit);
        assert_eq!(s[0].hits.len(), 1);
        assert_eq!(s[0].hit_to_kill_ns, Some(150_000));
        assert_eq!(s[0].kill_to_dump_ns, Some(MS - 150_000));
        assert_eq!(t.stats().hit_snapshots, 1);
    }

    #[test]
    fn after_perf_closes_a_file_on_its_own_no_signal_is_sent() {
        let mut t = SnapshotMachine::new(Policy::default());
        // perf is ending (the target exited): it writes its last file.
        let a = t.on_dump("tail".into(), 10 * MS);
        assert_eq!(indexed(&a)[0].kind, SnapshotKind::Tail);
        // A hit that comes after must not signal a perf that is exiting,
        // and no `stop` is sent either.
        assert!(t.on_hit(hit(1, 50 * MS), 50 * MS).is_empty());
        assert!(t.on_tick(100 * MS).is_empty());
        assert!(t.on_stop_request(100 * MS).is_empty());
        assert_eq!(t.on_perf_exit(), 1);
    }

    #[test]
    fn hits_during_a_switch_are_merged_into_it() {
        let mut t = SnapshotMachine::new(Policy::default());
        assert_eq!(t.on_hit(hit(1, 0), 0), [Action::Switch]);
        assert!(t.on_hit(hit(2, MS), MS).is_empty());
        assert!(t.on_hit(hit(3, MS), MS).is_empty());
        let a = t.on_dump("f".into(), 2 * MS);
        let s = indexed(&a);
        assert_eq!(
            s[0].hits.iter().map(|h| h.merged).collect::<Vec<_>>(),
            [false, true, true]
        );
        let st = t.stats();
        assert_eq!((st.delivered, st.hit_snapshots, st.merged), (3, 1, 2));
        assert_eq!(st.delivered, st.hit_snapshots + st.merged);
    }

    #[test]
    fn the_next_signal_waits_for_the_centisecond_gap() {
        let mut t = SnapshotMachine::new(Policy::default());
        t.on_hit(hit(1, 0), 0);
        t.on_dump("a".into(), 50 * MS);
        // 3 ms after the Dump: too soon, so the signal waits.
        assert!(t.on_hit(hit(2, 53 * MS), 53 * MS).is_empty());
        assert_eq!(t.next_deadline(), Some(60 * MS));
        assert!(t.on_tick(59 * MS).is_empty());
        assert_eq!(t.on_tick(60 * MS), [Action::Switch]);
        // A hit while it waited was merged, not a new switch.
        let a = t.on_dump("b".into(), 61 * MS);
        assert_eq!(indexed(&a)[0].hit_to_kill_ns, Some(7 * MS));
    }

    #[test]
    fn after_delays_the_signal() {
        let mut t = SnapshotMachine::new(Policy {
            after_ns: 20 * MS,
            ..Policy::default()
        });
        assert!(t.on_hit(hit(1, 0), 0).is_empty());
        assert_eq!(t.next_deadline(), Some(20 * MS));
        assert!(t.on_hit(hit(2, 5 * MS), 5 * MS).is_empty());
        assert_eq!(t.on_tick(20 * MS), [Action::Switch]);
        let a = t.on_dump("f".into(), 21 * MS);
        assert_eq!(indexed(&a)[0].hits.len(), 2);
    }

    #[test]
    fn max_snapshots_ends_the_run_after_the_last_dump() {
        let mut t = SnapshotMachine::new(Policy {
            max_snapshots: Some(2),
            ..Policy::default()
        });
        t.on_hit(hit(1, 0), 0);
        assert!(!t.on_dump("a".into(), MS).contains(&Action::LimitReached));
        t.on_hit(hit(2, 100 * MS), 100 * MS);
        let a = t.on_dump("b".into(), 101 * MS);
        assert!(a.contains(&Action::LimitReached));
        // The stop waits for the gap after the Dump.
        assert!(!a.contains(&Action::Stop));
        // A hit that slips in now goes into the tail, not a new switch.
        assert!(t.on_hit(hit(3, 105 * MS), 105 * MS).is_empty());
        assert_eq!(t.on_tick(111 * MS), [Action::Stop]);
        assert!(t.stop_sent());
        let a = t.on_dump("tail".into(), 120 * MS);
        let s = indexed(&a);
        assert_eq!(s[0].kind, SnapshotKind::Tail);
        assert_eq!(s[0].hits.len(), 1);
        assert!(s[0].hits[0].merged);
        let st = t.stats();
        assert_eq!(st.delivered, st.hit_snapshots + st.merged);
    }

    #[test]
    fn a_stop_request_waits_for_the_switch_in_flight() {
        let mut t = SnapshotMachine::new(Policy::default());
        t.on_hit(hit(1, 0), 0);
        assert!(t.on_stop_request(MS).is_empty());
        assert_eq!(t.next_deadline(), None);
        let a = t.on_dump("a".into(), 2 * MS);
        assert_eq!(indexed(&a)[0].kind, SnapshotKind::Hit);
        assert!(!a.contains(&Action::Stop));
        assert_eq!(t.next_deadline(), Some(12 * MS));
        assert_eq!(t.on_tick(12 * MS), [Action::Stop]);
    }

    #[test]
    fn a_stop_with_nothing_in_flight_is_immediate() {
        let mut t = SnapshotMachine::new(Policy::default());
        assert_eq!(t.on_stop_request(5 * MS), [Action::Stop]);
        let a = t.on_dump("tail".into(), 6 * MS);
        assert_eq!(indexed(&a)[0].kind, SnapshotKind::Tail);
        assert!(indexed(&a)[0].hits.is_empty());
    }

    #[test]
    fn a_dump_we_did_not_cause_is_the_tail_and_takes_waiting_hits() {
        // The target exited: perf closes its last file by itself while a hit
        // still waits for --after.
        let mut t = SnapshotMachine::new(Policy {
            after_ns: 50 * MS,
            ..Policy::default()
        });
        t.on_hit(hit(1, 0), 0);
        let a = t.on_dump("last".into(), 10 * MS);
        let s = indexed(&a);
        assert_eq!(s[0].kind, SnapshotKind::Tail);
        assert_eq!(s[0].hits.len(), 1);
        let st = t.stats();
        assert_eq!((st.merged, st.hit_snapshots, st.tail_snapshots), (1, 0, 1));
        assert_eq!(t.on_perf_exit(), 0);
    }

    #[test]
    fn a_storm_of_merged_hits_is_counted_not_listed() {
        let mut t = SnapshotMachine::new(Policy::default());
        for s in 1..=10_000 {
            t.on_hit(hit(s, s), s);
        }
        let a = t.on_dump("f".into(), 20_000);
        let s = indexed(&a);
        assert_eq!(s[0].hits.len(), MAX_LISTED_HITS);
        assert_eq!(s[0].unlisted_hits, 10_000 - MAX_LISTED_HITS as u64);
        let st = t.stats();
        assert_eq!(st.delivered, st.hit_snapshots + st.merged);
    }

    #[test]
    fn hits_perf_never_wrote_are_unsnapshotted() {
        let mut t = SnapshotMachine::new(Policy::default());
        t.on_hit(hit(1, 0), 0);
        t.on_hit(hit(2, 0), 0);
        let lost = t.on_perf_exit();
        assert_eq!(lost, 2);
        let st = t.stats();
        assert_eq!((st.delivered, st.merged, st.unsnapshotted), (2, 0, 2));
        assert_eq!(
            st.delivered,
            st.hit_snapshots + st.merged + st.unsnapshotted
        );
    }
}
