//! The driver's control of disarming: after an accepted hit's `kill(perf)`,
//! a `--pid` trigger with a cooldown has its uprobes detached by the arming
//! thread ([`crate::disarm::arming_thread`]), and attached again by it when
//! the cooldown ends. The driver only hands work over and reads results:
//! it never waits for the kernel's grace periods.
//!
//! [`Disarming`] holds every disarming trigger's [`DisarmCycle`] and
//! uprobes. The driver tells it of hits and of triggers whose recording
//! ended, and acts on the [`Notice`]s it returns for what only the driver
//! can do (report a trigger armed, end a recorder).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use nix::sys::eventfd::EventFd;

use crate::{
    disarm::{
        arming_thread::{ArmingThread, Done},
        cycle::{
            Board, DisarmAction, DisarmCycle, EVENTS_PRIOR_DETACH_NS, PRIOR_DETACH_NS, RECENT,
            lead_ns, quantile, round_trip_ns, warm_lead_ns,
        },
        tracefs_events::{self, UprobeEvents},
        tracefs_reaper::{self, TracefsReaper},
    },
    output::events::{DisarmSummary, Printer},
    probe::{
        Probes, detach,
        uprobes::{ProgramFds, TriggerUprobes},
    },
    sys::clock::Now,
};

/// Don't disarm for less than this: a detach and an attach cost more than
/// the traps of a few milliseconds saved (docs/disarming.md).
const MIN_GAP_NS: u64 = 5_000_000;

/// What the driver must do about an answer of the arming thread.
#[derive(Debug, PartialEq, Eq)]
pub enum Notice {
    /// A trigger's event uprobes were made and armed (their number), or
    /// could not be (why: the driver attaches them with aya instead).
    SetUp {
        trigger: u32,
        result: Result<usize, String>,
    },
    /// A trigger's uprobes could not be attached again: its recording
    /// ends.
    RearmFailed { trigger: u32, message: String },
}

/// One trigger that disarms.
struct Trigger {
    cycle: DisarmCycle,
    cooldown_ns: u64,
    uprobes: Arc<TriggerUprobes>,
}

/// The disarm state of a run's triggers.
#[derive(Default)]
pub struct Disarming {
    triggers: HashMap<u32, Trigger>,
    /// Triggers detached for good (their recording ended).
    gone: HashSet<u32>,
    thread: Option<ArmingThread>,
    programs: HashMap<u32, Arc<ProgramFds>>,
    /// Time to attach a trigger's uprobes again, ns per re-arm.
    attach_ns: Vec<u64>,
    /// Time to detach one uprobe, ns.
    detach_ns: Vec<u64>,
    /// Time to detach a trigger's uprobes, ns per cycle.
    detach_batch_ns: Vec<u64>,
    /// Each trigger's counters, for the recorders' index lines.
    board: Arc<Board>,
    /// The run's tracefs uprobe events, if tracefs can be used.
    events: Option<Arc<UprobeEvents>>,
    /// Deletes them if the agent dies before it can.
    reaper: Option<TracefsReaper>,
    /// Triggers whose uprobes are event uprobes.
    evented: HashSet<u32>,
    /// The fall-back to the slow way was reported.
    warned: bool,
    /// Whether the arming thread warms up before arming event uprobes
    /// ([`crate::disarm::rcu_warmup`]), as its last arm said; None until
    /// then.
    warming: Option<bool>,
    /// Re-arms after a warm-up.
    warmed_arms: u64,
}

fn us(v: Option<u64>) -> Option<f64> {
    v.map(|ns| ns as f64 / 1000.0)
}

fn recent(v: &[u64]) -> &[u64] {
    &v[v.len().saturating_sub(RECENT)..]
}

impl Disarming {
    /// The triggers that disarm: their uprobes, and how long they stay out
    /// after a hit.
    pub fn new(triggers: impl Iterator<Item = (TriggerUprobes, Duration)>) -> Self {
        let triggers: HashMap<u32, Trigger> = triggers
            .map(|(uprobes, d)| {
                let cooldown_ns = d.as_nanos() as u64;
                let t = Trigger {
                    cycle: DisarmCycle::new(cooldown_ns, MIN_GAP_NS),
                    cooldown_ns,
                    uprobes: Arc::new(uprobes),
                };
                (t.uprobes.trigger, t)
            })
            .collect();
        let d = Self {
            triggers,
            ..Self::default()
        };
        for t in d.triggers.keys() {
            d.publish(*t);
        }
        d
    }

    /// Each trigger's counters, for the recorders' index lines.
    pub fn board(&self) -> Arc<Board> {
        self.board.clone()
    }

    /// Starts the arming thread if a trigger may disarm, so that no hit
    /// waits for a thread to start.
    pub fn start(&mut self, wake: &Arc<EventFd>, printer: &Printer) {
        if self.triggers.is_empty() || self.thread.is_some() {
            return;
        }
        match ArmingThread::spawn(wake.clone()) {
            Ok(a) => {
                self.thread = Some(a);
                self.start_events(printer);
            }
            Err(e) => {
                printer.warning(&format!(
                    "cannot start the arming thread ({e}): the probes stay in during cooldowns"
                ));
                let triggers: Vec<u32> = self.triggers.keys().copied().collect();
                for t in triggers {
                    self.forget(t);
                }
            }
        }
    }

    /// Prepares the tracefs uprobe events and their reaper; without them
    /// the triggers disarm through the uprobe PMU (slow detaches).
    fn start_events(&mut self, printer: &Printer) {
        let started = tracefs_events::tracefs().and_then(|dir| {
            tracefs_events::remove_stale(&dir);
            let events = UprobeEvents::new(dir);
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
            Err(e) => self.no_events(printer, &e.to_string()),
        }
    }

    /// A trigger disarms the slow way (or none can): warns once a run.
    pub fn no_events(&mut self, printer: &Printer, why: &str) {
        if !std::mem::replace(&mut self.warned, true) {
            printer.warning(&format!(
                "tracefs uprobe events cannot be used ({why}): probes are detached \
                 through the uprobe PMU, which takes ~0.1 s, so short cooldowns keep \
                 them in (docs/disarming.md)"
            ));
        }
    }

    /// The loaded programs a trigger's uprobes run, as fds.
    fn programs(&mut self, trigger: u32, probes: &Probes) -> Option<Arc<ProgramFds>> {
        if !self.programs.contains_key(&trigger) {
            let fds = ProgramFds::of(probes, &self.triggers.get(&trigger)?.uprobes)?;
            self.programs.insert(trigger, fds);
        }
        self.programs.get(&trigger).cloned()
    }

    /// Has the arming thread make a disarming trigger's uprobes event
    /// uprobes and arm them, if tracefs can be used; its answer is a
    /// [`Notice::SetUp`]. False: the driver attaches them with aya.
    pub fn set_up(&mut self, trigger: u32, probes: &Probes) -> bool {
        let Some(events) = self.events.clone() else {
            return false;
        };
        if self.thread.is_none() || self.gone.contains(&trigger) {
            return false;
        }
        let Some(uprobes) = self.triggers.get(&trigger).map(|t| t.uprobes.clone()) else {
            return false;
        };
        if uprobes.pid.is_none() {
            return false;
        }
        let Some(programs) = self.programs(trigger, probes) else {
            return false;
        };
        if let Some(a) = &self.thread {
            a.set_up(events, uprobes, programs);
        }
        true
    }

    /// The event uprobes of a trigger that was set up while its recording
    /// ended are dropped by the arming thread.
    pub fn drop_set_up(&mut self, trigger: u32) {
        if let Some(a) = &self.thread {
            a.forget(trigger);
        }
    }

    /// A trigger's event uprobes are armed: it disarms through them.
    pub fn set_up_done(&mut self, trigger: u32) {
        self.evented.insert(trigger);
    }

    /// Publishes a trigger's counters for the index.
    fn publish(&self, trigger: u32) {
        if let Some(t) = self.triggers.get(&trigger) {
            self.board
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(trigger, t.cycle.counters());
        }
    }

    /// How early to ask for a trigger's attach, ns.
    fn lead(&self, trigger: u32) -> u64 {
        let recent = recent(&self.attach_ns);
        let cooldown = self.triggers.get(&trigger).map_or(0, |t| t.cooldown_ns);
        if self.evented.contains(&trigger) && self.warming != Some(false) {
            warm_lead_ns(recent, cooldown)
        } else {
            lead_ns(recent, cooldown)
        }
    }

    /// When the next attach must be asked for, CLOCK_MONOTONIC ns.
    pub fn next_rearm(&self) -> Option<u64> {
        self.triggers
            .iter()
            .filter_map(|(n, t)| t.cycle.rearm_at(self.lead(*n)))
            .min()
    }

    /// After an accepted hit's `kill(perf)`: disarms its trigger if it
    /// can't accept a call before its cooldown ends.
    pub fn after_hit(&mut self, trigger: u32, ktime_ns: u64, probes: Option<&mut Probes>) {
        if self.gone.contains(&trigger) {
            return;
        }
        let now = Now::read().ns;
        let prior = if self.evented.contains(&trigger) {
            EVENTS_PRIOR_DETACH_NS
        } else {
            PRIOR_DETACH_NS
        };
        let gap = round_trip_ns(
            recent(&self.detach_batch_ns),
            recent(&self.attach_ns),
            prior,
        );
        let Some(t) = self.triggers.get_mut(&trigger) else {
            return;
        };
        t.cycle.set_min_gap(gap.max(MIN_GAP_NS));
        if t.cycle.on_hit(ktime_ns, now) == DisarmAction::Detach {
            self.publish(trigger);
            self.send_detach(trigger, probes);
        }
    }

    fn send_detach(&mut self, trigger: u32, probes: Option<&mut Probes>) {
        if self.thread.is_none() {
            // It failed to start (warned): keep the probes in.
            self.forget(trigger);
            return;
        }
        // The first time, the links aya made; later, the thread's own.
        let links = probes
            .map(|p| p.take_trigger_links(trigger))
            .unwrap_or_default();
        if let Some(a) = &self.thread {
            a.detach(trigger, links);
        }
    }

    /// Asks for the attach of the triggers whose cooldown is about to end
    /// (those still `recording`; the others are forgotten).
    pub fn rearm_due(&mut self, probes: Option<&Probes>, recording: impl Fn(u32) -> bool) {
        let now = Now::read().ns;
        let due: Vec<u32> = self
            .triggers
            .iter()
            .filter(|(n, t)| t.cycle.due(now, self.lead(**n)))
            .map(|(n, _)| *n)
            .collect();
        for trigger in due {
            let programs = probes.and_then(|p| self.programs(trigger, p));
            let at_ns = self
                .triggers
                .get(&trigger)
                .and_then(|t| t.cycle.rearm_at(0));
            let (Some(programs), Some(at_ns), true) = (programs, at_ns, recording(trigger)) else {
                self.forget(trigger);
                continue;
            };
            let t = self.triggers.get_mut(&trigger).expect("due");
            t.cycle.rearming();
            if let Some(a) = &self.thread {
                a.attach(t.uprobes.clone(), programs, at_ns);
            }
        }
    }

    /// Takes the arming thread's answers since the last call: what the
    /// driver must act on.
    pub fn answers(&mut self, mut probes: Option<&mut Probes>, printer: &Printer) -> Vec<Notice> {
        let done: Vec<Done> = match &self.thread {
            Some(a) => a.rx.try_iter().collect(),
            None => return Vec::new(),
        };
        let mut notices = Vec::new();
        for d in done {
            match d {
                Done::SetUp { trigger, result } => notices.push(Notice::SetUp { trigger, result }),
                Done::Detached {
                    trigger,
                    per_link_ns,
                    warning,
                } => self.detached(trigger, per_link_ns, warning, printer),
                Done::Attached {
                    trigger,
                    result,
                    at_ns,
                    took_ns,
                    warmed,
                    can_warm,
                } => {
                    if self.evented.contains(&trigger) {
                        self.warming = Some(can_warm);
                    }
                    self.warmed_arms += u64::from(warmed);
                    let attached = self.attached(trigger, result, at_ns, took_ns, printer);
                    if let Some(n) = attached.notice {
                        notices.push(n);
                    }
                    if attached.again {
                        self.send_detach(trigger, probes.as_deref_mut());
                    }
                }
            }
        }
        notices
    }

    fn detached(
        &mut self,
        trigger: u32,
        per_link_ns: Vec<u64>,
        warning: Option<String>,
        printer: &Printer,
    ) {
        if let Some(w) = warning {
            printer.warning(&w);
        }
        if !per_link_ns.is_empty() {
            self.detach_batch_ns.push(per_link_ns.iter().sum());
        }
        self.detach_ns.extend(per_link_ns);
        // The code is the target's own again (until the attach).
        if !self.gone.contains(&trigger)
            && let Some(until) = self
                .triggers
                .get(&trigger)
                .and_then(|t| t.cycle.rearm_at(0))
        {
            printer.disarmed(trigger, until);
        }
    }

    fn attached(
        &mut self,
        trigger: u32,
        result: Result<(), String>,
        at_ns: u64,
        took_ns: u64,
        printer: &Printer,
    ) -> Attached {
        self.attach_ns.push(took_ns);
        let none = Attached {
            notice: None,
            again: false,
        };
        if self.gone.contains(&trigger) {
            return none;
        }
        let Some(t) = self.triggers.get_mut(&trigger) else {
            return none;
        };
        match result {
            Ok(()) => {
                let again = t.cycle.rearmed(at_ns);
                let late = t
                    .cycle
                    .stats_at(at_ns)
                    .rearm_late_ns
                    .last()
                    .copied()
                    .unwrap_or(0);
                self.publish(trigger);
                printer.rearmed(trigger, late);
                Attached {
                    notice: None,
                    again: again == DisarmAction::Detach,
                }
            }
            Err(message) => {
                self.forget(trigger);
                Attached {
                    notice: Some(Notice::RearmFailed { trigger, message }),
                    again: false,
                }
            }
        }
    }

    /// The run's totals at `now_ns`.
    pub fn summary(&self, now_ns: u64) -> DisarmSummary {
        let mut s = DisarmSummary::default();
        if !self.triggers.is_empty() {
            s.probes = Some(if self.evented.is_empty() {
                "uprobe_pmu"
            } else {
                "uprobe_events"
            });
        }
        let (mut late, mut early) = (Vec::new(), Vec::new());
        for t in self.triggers.values() {
            let st = t.cycle.stats_at(now_ns);
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
    pub fn forget(&mut self, trigger: u32) {
        if !self.triggers.contains_key(&trigger) || !self.gone.insert(trigger) {
            return;
        }
        if let Some(t) = self.triggers.get_mut(&trigger) {
            t.cycle.finish(Now::read().ns);
        }
        self.publish(trigger);
        if let Some(a) = &self.thread {
            a.forget(trigger);
        }
    }

    /// Whether a trigger's uprobes are detached for good.
    pub fn is_gone(&self, trigger: u32) -> bool {
        self.gone.contains(&trigger)
    }

    /// Forgets every trigger, ends the arming thread and waits until what
    /// it held is detached ([`crate::probe::detach::WAIT`] at most); the
    /// warnings to print.
    pub fn finish(&mut self) -> Vec<String> {
        let triggers: Vec<u32> = self.triggers.keys().copied().collect();
        for t in triggers {
            self.forget(t);
        }
        let mut warnings = Vec::new();
        if let Some(a) = &mut self.thread {
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
        // Every trigger's events are closed, unless a child is held up:
        // then the group is busy, and the reaper deletes it once it can.
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

/// What became of a re-arm: a notice for the driver, and whether the
/// trigger must be detached again at once (a hit came meanwhile).
struct Attached {
    notice: Option<Notice>,
    again: bool,
}
