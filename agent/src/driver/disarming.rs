//! The driver's side of disarming ([`crate::disarm`]): after an accepted
//! hit's `kill(perf)`, a `--pid` trigger with a cooldown has its links taken
//! out of the programs and dropped on the detacher thread; when the
//! cooldown ends, the driver attaches them again.

use std::{collections::HashMap, time::Duration};

use super::{Driver, Watch};
use crate::{
    clock::Now,
    detacher::Detacher,
    disarm::{Action, Disarm, DisarmSummary, quantile},
    run::EndReason,
};

/// Don't disarm for less than this: a detach and an attach cost more than
/// the traps of a millisecond saved (docs/disarming.md).
const MIN_GAP_NS: u64 = 2_000_000;

/// The disarm state of a run's triggers.
#[derive(Default)]
pub(super) struct Arming {
    machines: HashMap<u32, Disarm>,
    detacher: Option<Detacher>,
    /// Time to attach a trigger's probes again, ns per re-arm.
    attach_ns: Vec<u64>,
}

fn us(v: Option<u64>) -> Option<f64> {
    v.map(|ns| ns as f64 / 1000.0)
}

impl Arming {
    /// Machines for the triggers that disarm.
    pub(super) fn new(cooldowns: impl Iterator<Item = (u32, Duration)>) -> Self {
        let machines: HashMap<u32, Disarm> = cooldowns
            .map(|(t, c)| (t, Disarm::new(c.as_nanos() as u64, MIN_GAP_NS)))
            .collect();
        Self {
            machines,
            ..Self::default()
        }
    }

    /// Whether no detach is in flight: an attach now would not wait for
    /// one (detacher.rs).
    fn idle(&self) -> bool {
        self.detacher.as_ref().is_none_or(Detacher::idle)
    }

    /// The earliest re-arm, CLOCK_MONOTONIC ns; None while a detach is in
    /// flight (the detacher wakes the driver when it is done).
    pub(super) fn next_rearm(&self) -> Option<u64> {
        if !self.idle() {
            return None;
        }
        self.machines.values().filter_map(Disarm::rearm_at).min()
    }

    /// The run's totals at `now_ns`.
    pub(super) fn summary(&self, now_ns: u64) -> DisarmSummary {
        let mut s = DisarmSummary::default();
        let mut late = Vec::new();
        for m in self.machines.values() {
            let st = m.stats_at(now_ns);
            s.cycles += st.cycles;
            s.disarmed_s += st.disarmed_ns as f64 / 1e9;
            late.extend(st.rearm_late_ns);
        }
        let detach = self
            .detacher
            .as_ref()
            .map(Detacher::per_link_ns)
            .unwrap_or_default();
        s.rearm_late_us_p50 = us(quantile(&late, 0.5));
        s.rearm_late_us_p99 = us(quantile(&late, 0.99));
        s.detach_us_p50 = us(quantile(&detach, 0.5));
        s.detach_us_p99 = us(quantile(&detach, 0.99));
        s.attach_us_p50 = us(quantile(&self.attach_ns, 0.5));
        s.attach_us_p99 = us(quantile(&self.attach_ns, 0.99));
        s
    }

    /// Waits for every handed-over link to be detached.
    pub(super) fn finish(&mut self) {
        let now = Now::read().ns;
        for m in self.machines.values_mut() {
            m.finish(now);
        }
        if let Some(d) = &mut self.detacher {
            d.finish();
        }
    }
}

impl Driver {
    /// After an accepted hit's `kill(perf)`: disarm its trigger if it
    /// can't accept a call before its cooldown ends.
    pub(super) fn disarm_after_hit(&mut self, trigger: u32, ktime_ns: u64) {
        if self.stopping.is_some() || !self.arming.machines.contains_key(&trigger) {
            return;
        }
        let now = Now::read().ns;
        let m = self.arming.machines.get_mut(&trigger).expect("checked");
        if m.on_hit(ktime_ns, now) != Action::Detach {
            return;
        }
        let links = self
            .probes
            .as_mut()
            .map(|p| p.take_trigger_links(trigger))
            .unwrap_or_default();
        if links.is_empty() {
            // Already detached for good (the recorder ended).
            m.finish(now);
            return;
        }
        if self.arming.detacher.is_none() {
            match Detacher::spawn(self.wake.clone()) {
                Ok(d) => self.arming.detacher = Some(d),
                Err(e) => {
                    self.setup
                        .reporter
                        .warning(&format!("cannot start the detacher thread: {e}"));
                }
            }
        }
        match &self.arming.detacher {
            Some(d) => d.detach(links),
            None => drop(links),
        }
        self.setup
            .reporter
            .disarmed(trigger, m.rearm_at().unwrap_or(0));
    }

    /// Attaches again the triggers whose cooldown has ended.
    pub(super) fn rearm_due(&mut self) {
        if !self.arming.idle() {
            return;
        }
        let now = Now::read().ns;
        let due: Vec<u32> = self
            .arming
            .machines
            .iter()
            .filter(|(_, m)| m.due(now))
            .map(|(t, _)| *t)
            .collect();
        for trigger in due {
            self.rearm(trigger);
        }
    }

    fn rearm(&mut self, trigger: u32) {
        let slot = self
            .by_target
            .iter()
            .find(|((t, _), _)| *t == trigger)
            .map(|(_, s)| *s);
        let ready = slot
            .and_then(|s| self.slots[s].as_ref())
            .is_some_and(|r| r.recording());
        let t = self.trigger(trigger);
        if self.stopping.is_some() || !ready || !matches!(t.watch, Watch::Pid(_)) {
            let now = Now::read().ns;
            if let Some(m) = self.arming.machines.get_mut(&trigger) {
                m.finish(now);
            }
            return;
        }
        let plan = t.plan.clone();
        let started = Now::read();
        let attached = self.attach(&plan);
        let now = Now::read();
        self.arming
            .attach_ns
            .push(now.ns.saturating_sub(started.ns));
        let m = self.arming.machines.get_mut(&trigger).expect("due");
        let late_ns = now.ns.saturating_sub(m.rearm_at().unwrap_or(now.ns));
        m.rearmed(now.ns);
        match attached {
            Ok(()) => self.setup.reporter.rearmed(trigger, late_ns),
            Err(f) => {
                self.detach_trigger(trigger);
                let pid = plan.pid.unwrap_or(0);
                if let Some(r) = slot.and_then(|s| self.slots[s].as_mut()) {
                    if crate::target::is_alive(pid) {
                        r.fail(f, now);
                    } else {
                        r.stop(EndReason::TargetExited, now);
                    }
                }
            }
        }
    }
}
