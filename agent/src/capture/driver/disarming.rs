//! The driver's side of disarming ([`crate::disarm::cycle`]): after an accepted
//! hit's `kill(perf)`, a `--pid` trigger with a cooldown has its uprobes
//! detached by the arming thread ([`crate::disarm::arming_thread`]), and attached again by
//! it when the cooldown ends. The driver only sends work and reads results:
//! it never waits for the kernel's grace periods.

use std::{
    collections::{HashMap, HashSet},
    os::fd::OwnedFd,
    sync::Arc,
    time::Duration,
};

use nix::sys::eventfd::EventFd;

use super::{Driver, Watch};
use crate::{
    capture::outcome::EndReason,
    disarm::{
        arming_thread::{ArmPlan, Armer, Done, Point},
        cycle::{
            Action, Disarm, PRIOR_DETACH_NS, RECENT, SWITCH_PRIOR_DETACH_NS, lead_ns, quantile,
            round_trip_ns, warm_lead_ns,
        },
        event_uprobes::Plan as SwitchPlan,
        tracefs_events,
        tracefs_events::Events,
        tracefs_reaper,
        tracefs_reaper::Reaper,
    },
    error::Failure,
    output::events::{DisarmSummary, Reporter},
    probe::{AttachPlan, Probes, Returns, detach},
    sys::clock::Now,
};

/// Don't disarm for less than this: a detach and an attach cost more than
/// the traps of a few milliseconds saved (docs/disarming.md).
const MIN_GAP_NS: u64 = 5_000_000;

/// The disarm state of a run's triggers.
#[derive(Default)]
pub(super) struct Arming {
    machines: HashMap<u32, Disarm>,
    cooldowns: HashMap<u32, u64>,
    /// Triggers detached for good (their recording ended).
    gone: HashSet<u32>,
    armer: Option<Armer>,
    programs: HashMap<&'static str, Arc<OwnedFd>>,
    /// Time to attach a trigger's uprobes again, ns per re-arm.
    attach_ns: Vec<u64>,
    /// Time to detach one uprobe, ns.
    detach_ns: Vec<u64>,
    /// Time to detach a trigger's uprobes, ns per cycle.
    detach_batch_ns: Vec<u64>,
    /// Each trigger's counters, for the recorders' index lines.
    pub(super) board: Arc<crate::disarm::cycle::Board>,
    /// The run's tracefs uprobe events, if tracefs can be used.
    events: Option<Arc<Events>>,
    /// Deletes them if the agent dies before it can.
    reaper: Option<Reaper>,
    /// Triggers whose uprobes are a switch.
    switched: HashSet<u32>,
    /// Triggers whose switch the arming thread is making: the recorder's
    /// slot, its target and how long its perf took to be ready.
    pending: HashMap<u32, (usize, i32, Duration)>,
    /// The fall-back to the slow way was reported.
    warned: bool,
    /// Whether the arming thread warms up before a switch's arm
    /// ([`crate::disarm::rcu_warmup`]), as its last arm said; None until then.
    warming: Option<bool>,
    /// Re-arms after a warm-up.
    warmed_arms: u64,
}

/// A trigger's uprobes: (program, file offset, uretprobe).
fn points_of(plan: &AttachPlan) -> Vec<(&'static str, u64, bool)> {
    let mut points = vec![("mt_entry", plan.entry_offset, false)];
    match &plan.returns {
        None => {}
        Some(Returns::RetInstructions(v)) => {
            points.extend(v.iter().map(|o| ("mt_return", *o, false)));
        }
        Some(Returns::Uretprobe) => points.push(("mt_uretprobe", plan.entry_offset, true)),
    }
    points
}

fn us(v: Option<u64>) -> Option<f64> {
    v.map(|ns| ns as f64 / 1000.0)
}

impl Arming {
    /// Machines for the triggers that disarm.
    pub(super) fn new(cooldowns: impl Iterator<Item = (u32, Duration)>) -> Self {
        let cooldowns: HashMap<u32, u64> =
            cooldowns.map(|(t, c)| (t, c.as_nanos() as u64)).collect();
        let machines = cooldowns
            .iter()
            .map(|(t, c)| (*t, Disarm::new(*c, MIN_GAP_NS)))
            .collect();
        let arming = Self {
            machines,
            cooldowns,
            ..Self::default()
        };
        for t in arming.machines.keys() {
            arming.publish(*t);
        }
        arming
    }

    /// Starts the arming thread if a trigger may disarm, so that no hit
    /// waits for a thread to start.
    pub(super) fn start(&mut self, wake: &Arc<EventFd>, reporter: &Reporter) {
        if self.machines.is_empty() || self.armer.is_some() {
            return;
        }
        match Armer::spawn(wake.clone()) {
            Ok(a) => {
                self.armer = Some(a);
                self.start_events(reporter);
            }
            Err(e) => {
                reporter.warning(&format!(
                    "cannot start the arming thread ({e}): the probes stay in during cooldowns"
                ));
                let triggers: Vec<u32> = self.machines.keys().copied().collect();
                for t in triggers {
                    self.forget(t);
                }
            }
        }
    }

    /// Prepares the tracefs uprobe events and their reaper; without them
    /// the triggers disarm through the uprobe PMU (slow detaches).
    fn start_events(&mut self, reporter: &Reporter) {
        let started = tracefs_events::tracefs().and_then(|dir| {
            tracefs_events::remove_stale(&dir);
            let events = Events::new(dir);
            if tracefs_events::has_group(&events.dir(), events.group()) {
                return Err(std::io::Error::other(format!(
                    "the event group {} is in use and cannot be deleted",
                    events.group()
                )));
            }
            let reaper = tracefs_reaper::spawn(&events.uprobe_events(), events.group())?;
            Ok((events, reaper))
        });
        match started {
            Ok((events, reaper)) => {
                self.events = Some(Arc::new(events));
                self.reaper = Some(reaper);
            }
            Err(e) => self.no_switch(reporter, &e.to_string()),
        }
    }

    /// A trigger disarms the slow way (or none can): warns once a run.
    fn no_switch(&mut self, reporter: &Reporter, why: &str) {
        if !std::mem::replace(&mut self.warned, true) {
            reporter.warning(&format!(
                "tracefs uprobe events cannot be used ({why}): probes are detached \
                 through the uprobe PMU, which takes ~0.1 s, so short cooldowns keep \
                 them in (docs/disarming.md)"
            ));
        }
    }

    /// What the arming thread needs to make a trigger's uprobes a switch,
    /// if it disarms and tracefs can be used; None: attach with aya.
    fn switch_plan(&mut self, plan: &AttachPlan, probes: &Probes) -> Option<SwitchPlan> {
        let (Some(pid), Some(events)) = (plan.pid, self.events.clone()) else {
            return None;
        };
        if !self.machines.contains_key(&plan.trigger) || self.armer.is_none() {
            return None;
        }
        let mut points = Vec::new();
        for (name, offset, ret) in points_of(plan) {
            points.push((self.program(name, probes)?, offset, ret));
        }
        Some(SwitchPlan {
            events,
            trigger: plan.trigger,
            path: plan.path.clone(),
            pid: if plan.follow_forks { -1 } else { pid },
            points,
        })
    }

    fn program(&mut self, name: &'static str, probes: &Probes) -> Option<Arc<OwnedFd>> {
        if !self.programs.contains_key(name) {
            self.programs
                .insert(name, Arc::new(probes.program_fd(name)?));
        }
        Some(self.programs[name].clone())
    }

    /// Publishes a trigger's counters for the index.
    fn publish(&self, trigger: u32) {
        if let Some(m) = self.machines.get(&trigger) {
            self.board
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(trigger, m.counters());
        }
    }

    /// How early to ask for a trigger's attach, ns.
    fn lead(&self, trigger: u32) -> u64 {
        let recent = &self.attach_ns[self.attach_ns.len().saturating_sub(RECENT)..];
        let cooldown = self.cooldowns.get(&trigger).copied().unwrap_or(0);
        if self.switched.contains(&trigger) && self.warming != Some(false) {
            warm_lead_ns(recent, cooldown)
        } else {
            lead_ns(recent, cooldown)
        }
    }

    /// When the next attach must be asked for, CLOCK_MONOTONIC ns.
    pub(super) fn next_rearm(&self) -> Option<u64> {
        self.machines
            .iter()
            .filter_map(|(t, m)| m.rearm_at(self.lead(*t)))
            .min()
    }

    /// The run's totals at `now_ns`.
    pub(super) fn summary(&self, now_ns: u64) -> DisarmSummary {
        let mut s = crate::output::events::DisarmSummary::default();
        if !self.machines.is_empty() {
            s.probes = Some(if self.switched.is_empty() {
                "uprobe_pmu"
            } else {
                "uprobe_events"
            });
        }
        let (mut late, mut early) = (Vec::new(), Vec::new());
        for m in self.machines.values() {
            let st = m.stats_at(now_ns);
            s.cycles += st.cycles;
            s.kept_armed += st.kept_armed;
            s.disarmed_s += st.disarmed_ns as f64 / 1e9;
            late.extend(st.rearm_late_ns);
            early.extend(st.rearm_early_ns);
        }
        s.rearm_late_us_p50 = us(quantile(&late, 0.5));
        s.rearm_late_us_p99 = us(quantile(&late, 0.99));
        s.rearm_early_us_p50 = us(quantile(&early, 0.5));
        s.rearm_early_us_p99 = us(quantile(&early, 0.99));
        s.warmed_arms = self.warmed_arms;
        s.detach_us_p50 = us(quantile(&self.detach_ns, 0.5));
        s.detach_us_p99 = us(quantile(&self.detach_ns, 0.99));
        s.attach_us_p50 = us(quantile(&self.attach_ns, 0.5));
        s.attach_us_p99 = us(quantile(&self.attach_ns, 0.99));
        s
    }

    /// The trigger's uprobes are detached for good: the arming thread
    /// drops those it holds.
    pub(super) fn forget(&mut self, trigger: u32) {
        if !self.machines.contains_key(&trigger) || !self.gone.insert(trigger) {
            return;
        }
        if let Some(m) = self.machines.get_mut(&trigger) {
            m.finish(Now::read().ns);
        }
        self.publish(trigger);
        if let Some(a) = &self.armer {
            a.forget(trigger);
        }
    }

    /// Forgets every trigger, ends the arming thread and waits until what
    /// it held is detached ([`crate::probe::detach::WAIT`] at most); the warnings
    /// to print.
    pub(super) fn finish(&mut self) -> Vec<String> {
        let triggers: Vec<u32> = self.machines.keys().copied().collect();
        for t in triggers {
            self.forget(t);
        }
        let mut warnings = Vec::new();
        if let Some(a) = &mut self.armer {
            let child = a.finish();
            while let Ok(d) = a.rx.try_recv() {
                if let Done::Detached {
                    per_link_ns,
                    warning,
                    ..
                } = d
                {
                    self.detach_ns.extend(per_link_ns);
                    warnings.extend(warning);
                }
            }
            warnings.extend(child.and_then(detach::wait_for));
        }
        // Every switch's events are closed, unless a child is held up: then
        // the group is busy, and the reaper deletes it once it can.
        let deleted =
            !detach::held_up() && self.events.take().is_none_or(|e| e.delete_all().is_ok());
        match self.reaper.take() {
            // It finds nothing left to delete and ends at once.
            Some(r) if deleted => drop(r),
            Some(r) => r.let_go(),
            None => {}
        }
        warnings
    }
}

impl Driver {
    /// Has the arming thread make a `--pid` trigger's uprobes a switch and
    /// arm it, if it can; `armed` is reported when it is done
    /// ([`Self::switched_in`]). False: attach with aya.
    pub(super) fn set_up_switch(&mut self, slot: usize, pid: i32, ready_after: Duration) -> bool {
        let Some(r) = self.slots[slot].as_ref() else {
            return false;
        };
        let trigger = r.trigger;
        let plan = self.trigger(trigger).plan.clone();
        let Some(sp) = self
            .probes
            .as_ref()
            .and_then(|p| self.arming.switch_plan(&plan, p))
        else {
            return false;
        };
        self.arming
            .pending
            .insert(trigger, (slot, pid, ready_after));
        self.arming.armer.as_ref().expect("checked").set_up(sp);
        true
    }

    /// The arming thread made (or failed to make) a trigger's switch.
    fn switched_in(&mut self, trigger: u32, result: Result<usize, String>) {
        let Some((slot, pid, ready_after)) = self.arming.pending.remove(&trigger) else {
            return;
        };
        let live = self.stopping.is_none()
            && !self.arming.gone.contains(&trigger)
            && self.slots[slot]
                .as_ref()
                .is_some_and(|r| r.trigger == trigger && r.tgid == pid && r.recording());
        match result {
            // The first arm follows the keepers' registration, which leaves
            // the kernel's grace period just passed: faster than a re-arm,
            // so it does not count among the attach times.
            Ok(n) if live => {
                self.arming.switched.insert(trigger);
                self.report_armed(slot, ready_after, n);
            }
            // The recording ended meanwhile: the thread drops the switch.
            Ok(_) => {
                if let Some(a) = &self.arming.armer {
                    a.forget(trigger);
                }
            }
            Err(e) => {
                self.arming.no_switch(&self.setup.reporter, &e);
                if live {
                    self.attach_and_report(slot, ready_after);
                }
            }
        }
    }

    /// After an accepted hit's `kill(perf)`: disarm its trigger if it
    /// can't accept a call before its cooldown ends.
    pub(super) fn disarm_after_hit(&mut self, trigger: u32, ktime_ns: u64) {
        if self.stopping.is_some() || self.arming.gone.contains(&trigger) {
            return;
        }
        let now = Now::read().ns;
        let a = &self.arming;
        let prior = if a.switched.contains(&trigger) {
            SWITCH_PRIOR_DETACH_NS
        } else {
            PRIOR_DETACH_NS
        };
        let gap = round_trip_ns(
            &a.detach_batch_ns[a.detach_batch_ns.len().saturating_sub(RECENT)..],
            &a.attach_ns[a.attach_ns.len().saturating_sub(RECENT)..],
            prior,
        );
        let Some(m) = self.arming.machines.get_mut(&trigger) else {
            return;
        };
        m.set_min_gap(gap.max(MIN_GAP_NS));
        if m.on_hit(ktime_ns, now) == Action::Detach {
            self.arming.publish(trigger);
            self.send_detach(trigger);
        }
    }

    fn send_detach(&mut self, trigger: u32) {
        if self.arming.armer.is_none() {
            // It failed to start (warned): keep the probes in.
            self.arming.forget(trigger);
            return;
        }
        // The first time, the links aya made; later, the thread's own.
        let links = self
            .probes
            .as_mut()
            .map(|p| p.take_trigger_links(trigger))
            .unwrap_or_default();
        if let Some(a) = &self.arming.armer {
            a.detach(trigger, links);
        }
    }

    /// Asks for the attach of the triggers whose cooldown is about to end,
    /// and takes the arming thread's results.
    pub(super) fn rearm_due(&mut self) {
        self.arming_results();
        let now = Now::read().ns;
        let due: Vec<u32> = self
            .arming
            .machines
            .iter()
            .filter(|(t, m)| m.due(now, self.arming.lead(**t)))
            .map(|(t, _)| *t)
            .collect();
        for trigger in due {
            match self.arm_plan(trigger) {
                Some(plan) => {
                    // Before the probes go in: frames older than this are
                    // not matched by a return (a `ret` probe may have missed
                    // theirs while out).
                    if let Some(p) = self.probes.as_mut()
                        && let Err(e) = p.rearming(trigger, Now::read().ns)
                    {
                        self.setup.reporter.warning(&format!("REARMED map: {e:#}"));
                    }
                    self.arming
                        .machines
                        .get_mut(&trigger)
                        .expect("due")
                        .rearming();
                    if let Some(a) = &self.arming.armer {
                        a.attach(plan);
                    }
                }
                None => self.arming.forget(trigger),
            }
        }
    }

    /// The uprobes of a trigger whose recorder still records.
    fn arm_plan(&mut self, trigger: u32) -> Option<ArmPlan> {
        let t = self.trigger(trigger);
        let Watch::Pid(pid) = t.watch else {
            return None;
        };
        let recording = self
            .by_target
            .get(&(trigger, pid))
            .and_then(|s| self.slots[*s].as_ref())
            .is_some_and(|r| r.recording());
        if self.stopping.is_some() || !recording {
            return None;
        }
        let plan = t.plan.clone();
        // A trigger following forks has file-wide uprobes (-1: every process).
        let pid = if plan.follow_forks { -1 } else { pid };
        let mut out = Vec::new();
        for (name, offset, ret) in points_of(&plan) {
            let prog = self.arming.program(name, self.probes.as_ref()?)?;
            out.push(Point { prog, offset, ret });
        }
        let at_ns = self.arming.machines.get(&trigger)?.rearm_at(0)?;
        Some(ArmPlan {
            trigger,
            path: plan.path,
            pid,
            points: out,
            at_ns,
        })
    }

    fn arming_results(&mut self) {
        let done: Vec<Done> = match &self.arming.armer {
            Some(a) => a.rx.try_iter().collect(),
            None => return,
        };
        for d in done {
            match d {
                Done::SetUp { trigger, result } => self.switched_in(trigger, result),
                Done::Detached {
                    trigger,
                    per_link_ns,
                    warning,
                } => {
                    if let Some(w) = warning {
                        self.setup.reporter.warning(&w);
                    }
                    if !per_link_ns.is_empty() {
                        self.arming.detach_batch_ns.push(per_link_ns.iter().sum());
                    }
                    self.arming.detach_ns.extend(per_link_ns);
                    // The code is the target's own again (until the attach).
                    if !self.arming.gone.contains(&trigger)
                        && let Some(until) = self
                            .arming
                            .machines
                            .get(&trigger)
                            .and_then(|m| m.rearm_at(0))
                    {
                        self.setup.reporter.disarmed(trigger, until);
                    }
                }
                Done::Attached {
                    trigger,
                    result,
                    at_ns,
                    took_ns,
                    warmed,
                    can_warm,
                } => {
                    if self.arming.switched.contains(&trigger) {
                        self.arming.warming = Some(can_warm);
                    }
                    self.arming.warmed_arms += u64::from(warmed);
                    self.attached(trigger, result, at_ns, took_ns)
                }
            }
        }
    }

    fn attached(&mut self, trigger: u32, result: Result<(), String>, at_ns: u64, took_ns: u64) {
        self.arming.attach_ns.push(took_ns);
        if self.arming.gone.contains(&trigger) {
            return;
        }
        let Some(m) = self.arming.machines.get_mut(&trigger) else {
            return;
        };
        match result {
            Ok(()) => {
                let again = m.rearmed(at_ns);
                let late = m.stats_at(at_ns).rearm_late_ns.last().copied().unwrap_or(0);
                self.arming.publish(trigger);
                self.setup.reporter.rearmed(trigger, late);
                if again == Action::Detach {
                    self.send_detach(trigger);
                }
            }
            Err(message) => {
                self.arming.forget(trigger);
                let Watch::Pid(pid) = self.trigger(trigger).watch else {
                    return;
                };
                let now = Now::read();
                if let Some(r) = self
                    .by_target
                    .get(&(trigger, pid))
                    .copied()
                    .and_then(|s| self.slots[s].as_mut())
                {
                    if crate::sys::proc::is_alive(pid) {
                        r.fail(Failure::runtime(message), now);
                    } else {
                        // The target exited while disarmed: a normal end.
                        r.stop(EndReason::TargetExited, now);
                    }
                }
            }
        }
    }
}
