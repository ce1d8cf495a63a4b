//! The arming thread: detaches and attaches a disarmed trigger's uprobes,
//! so that the driver thread never waits for either.
//!
//! Closing a uprobe's perf event unregisters it, and the kernel then waits
//! for RCU grace periods (`uprobe_unregister_sync()` in
//! kernel/events/uprobes.c); installing or removing the breakpoints takes
//! `dup_mmap_sem` for writing, a per-CPU rwsem whose writers wait for a
//! grace period too (`register_for_each_vma()`). Both run under the
//! kernel's `event_mutex` (kernel/trace/trace_event_perf.c). Measured here:
//! docs/disarming.md. So the driver hands the work to this thread and
//! hears back through a channel and its wake eventfd.
//!
//! A trigger whose uprobes are [`EventUprobes`] (tracefs uprobe events) is
//! disarmed and armed by closing and opening one perf event per uprobe,
//! in milliseconds. Otherwise (no tracefs), the first detach of a trigger
//! drops the links aya attached (taken out of the programs); later
//! attaches are made here ([`crate::sys::perf_event`]) and their links are kept
//! here until the next detach. Either way the last close of a uprobe is a
//! child's ([`crate::probe::detach`]), waited for a bounded time, so that the
//! thread always ends.

use std::{
    collections::HashMap,
    sync::{Arc, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::programs::uprobe::UProbeLink;
use nix::sys::eventfd::EventFd;

use crate::{
    disarm::{
        cycle::{RECENT, quantile},
        event_uprobes::EventUprobes,
        rcu_warmup,
        rcu_warmup::RcuWarmup,
        tracefs_events::UprobeEvents,
    },
    probe::{
        detach::{self, Detacher},
        uprobes::{ProgramFds, TriggerUprobes},
    },
    sys::{clock::monotonic_ns, perf_event, perf_event::RawLink},
};

enum Work {
    /// Detach these links and the thread's own for the trigger (or
    /// disarm its event uprobes).
    Detach(u32, Vec<UProbeLink>),
    /// Attach the trigger's uprobes again (or arm its event uprobes) so
    /// that they are in at `at_ns`, CLOCK_MONOTONIC: event uprobes are
    /// armed then, after a warm-up ([`crate::disarm::rcu_warmup`]); other
    /// uprobes are attached at once.
    Attach {
        uprobes: Arc<TriggerUprobes>,
        programs: Arc<ProgramFds>,
        at_ns: u64,
    },
    /// Make a trigger's event uprobes, arm them and keep them.
    SetUp {
        events: Arc<UprobeEvents>,
        uprobes: Arc<TriggerUprobes>,
        programs: Arc<ProgramFds>,
    },
    /// The trigger is done: drop what the thread holds of it.
    Forget(u32),
}

/// What the thread holds.
#[derive(Default)]
struct Held {
    /// Links the thread attached, by trigger.
    own: HashMap<u32, Vec<RawLink>>,
    /// Event uprobes, by trigger.
    evented: HashMap<u32, EventUprobes>,
    /// Event uprobes of triggers that are done (or failed to arm),
    /// disarmed; dropped at the end.
    retired: Vec<EventUprobes>,
    /// The warm-up uprobe, made with the first event uprobes (None: it
    /// could not be, or none yet).
    warmer: Option<RcuWarmup>,
    warmer_tried: bool,
    /// A warm-up failed: arms are made at once from then on. The warmer
    /// is kept (its keeper's last close is the detacher child's).
    warm_failed: bool,
    /// Event uprobes warmed up for, waiting for their moment.
    timed: Vec<Timed>,
    /// How long the recent arms took once warm, ns.
    warm_arms: Vec<u64>,
}

/// Event uprobes to arm at `at_ns` (CLOCK_MONOTONIC), whose warm-up took
/// `warm_ns`.
struct Timed {
    trigger: u32,
    at_ns: u64,
    warm_ns: u64,
}

/// Until measured, how long an arm takes once warm, ns (docs/disarming.md,
/// "Re-arming on time").
const PRIOR_WARM_ARM_NS: u64 = 500_000;

/// The quantile of the recent warm arms that sets how early an arm starts:
/// most land just before the cooldown's end, where a call still traps but
/// the kernel's cooldown drops it.
const ARM_LEAD_QUANTILE: f64 = 0.75;

impl Held {
    fn work(&mut self, w: Work) -> Option<Done> {
        Some(match w {
            Work::Detach(trigger, links) => match self.evented.get_mut(&trigger) {
                Some(s) => Done::Detached {
                    trigger,
                    per_link_ns: s.disarm(),
                    warning: None,
                },
                None => {
                    let own = self.own.remove(&trigger).unwrap_or_default();
                    detach(trigger, links, own)
                }
            },
            Work::Attach {
                uprobes,
                programs,
                at_ns,
            } => {
                if self.evented.contains_key(&uprobes.trigger) {
                    return self.arm_at(uprobes.trigger, at_ns);
                }
                attach(&uprobes, &programs, &mut self.own)
            }
            Work::SetUp {
                events,
                uprobes,
                programs,
            } => {
                if !std::mem::replace(&mut self.warmer_tried, true) {
                    self.warmer = RcuWarmup::new(events.clone()).ok();
                }
                let trigger = uprobes.trigger;
                let result = EventUprobes::build(events, &uprobes, &programs, &mut self.retired)
                    .map(|s| {
                        let n = s.len();
                        self.evented.insert(trigger, s);
                        n
                    });
                Done::SetUp { trigger, result }
            }
            Work::Forget(trigger) => {
                self.timed.retain(|t| t.trigger != trigger);
                let links = self.own.remove(&trigger).unwrap_or_default();
                let mut done = detach(trigger, Vec::new(), links);
                if let Some(mut s) = self.evented.remove(&trigger) {
                    if let Done::Detached { per_link_ns, .. } = &mut done {
                        per_link_ns.extend(s.disarm());
                    }
                    // Its keepers' last close waits for grace periods under
                    // `event_mutex`, which would hold up every other
                    // trigger's arm: kept, disarmed, until the thread ends.
                    self.retired.push(s);
                }
                done
            }
        })
    }

    /// Arms a trigger's event uprobes at `at_ns`: warms up now and waits
    /// ([`Held::step`]) if that is far enough off, else arms at once.
    fn arm_at(&mut self, trigger: u32, at_ns: u64) -> Option<Done> {
        let now = monotonic_ns();
        if let Some(w) = self.warmer.as_mut().filter(|_| !self.warm_failed)
            && at_ns > now + rcu_warmup::WARM_IF_AHEAD_NS
        {
            match w.warm() {
                Ok(warm_ns) => {
                    self.timed.push(Timed {
                        trigger,
                        at_ns,
                        warm_ns,
                    });
                    return None;
                }
                // Arms as they were without it, from now on (the driver
                // hears `can_warm: false` and leads as before).
                Err(_) => self.warm_failed = true,
            }
        }
        let can_warm = self.can_warm();
        let s = self.evented.get_mut(&trigger)?;
        Some(arm(trigger, s, None, can_warm))
    }

    /// Whether arms are warmed up: a warm-up uprobe, not failed.
    fn can_warm(&self) -> bool {
        self.warmer.is_some() && !self.warm_failed
    }

    /// How early to start a warm arm, ns.
    fn arm_lead(&self) -> u64 {
        quantile(&self.warm_arms, ARM_LEAD_QUANTILE).unwrap_or(PRIOR_WARM_ARM_NS)
    }

    /// When [`Held::step`] has work next, CLOCK_MONOTONIC ns.
    fn deadline(&self) -> Option<u64> {
        let first = self.timed.iter().map(|t| t.at_ns).min()?;
        let arm = first.saturating_sub(self.arm_lead());
        Some(match &self.warmer {
            Some(w) => arm.min(w.next_ns()),
            None => arm,
        })
    }

    /// At `now_ns`: arms the timed event uprobes whose moment has come, and
    /// keeps the kernel warm for the others.
    fn step(&mut self, now_ns: u64) -> Vec<Done> {
        let lead = self.arm_lead();
        let (due, wait): (Vec<Timed>, Vec<Timed>) = std::mem::take(&mut self.timed)
            .into_iter()
            .partition(|t| t.at_ns <= now_ns + lead);
        self.timed = wait;
        let mut done = Vec::new();
        for t in due {
            let Some(s) = self.evented.get_mut(&t.trigger) else {
                continue;
            };
            let d = arm(t.trigger, s, Some(t.warm_ns), true);
            if let Done::Attached { took_ns, .. } = &d {
                self.warm_arms.push(took_ns - t.warm_ns);
                let n = self.warm_arms.len();
                self.warm_arms.drain(..n.saturating_sub(RECENT));
            }
            done.push(d);
        }
        if let Some(w) = &mut self.warmer
            && !self.timed.is_empty()
            && now_ns >= w.next_ns()
        {
            let _ = w.warm();
        }
        done
    }
}

/// What the thread did.
#[derive(Debug)]
pub enum Done {
    /// A trigger's event uprobes were made and armed: its number of uprobes, or
    /// why not.
    SetUp {
        trigger: u32,
        result: Result<usize, String>,
    },
    /// A trigger's links were detached; time per uprobe, ns, and a
    /// warning to print, if any ([`detach::wait_for`]).
    Detached {
        trigger: u32,
        per_link_ns: Vec<u64>,
        warning: Option<String>,
    },
    /// A trigger was attached again (or failed to be), at CLOCK_MONOTONIC
    /// `at_ns`, after `took_ns` of work: the attach, and the warm-up before
    /// it if `warmed` ([`crate::disarm::rcu_warmup`]; not the wait between the two).
    /// `can_warm`: the thread warms up before its arms (it has a warm-up
    /// uprobe that has not failed), whether or not this arm had time to.
    Attached {
        trigger: u32,
        result: Result<(), String>,
        at_ns: u64,
        took_ns: u64,
        warmed: bool,
        can_warm: bool,
    },
}

/// The driver's handle on the thread.
pub struct ArmingThread {
    tx: Option<mpsc::Sender<Work>>,
    pub rx: mpsc::Receiver<Done>,
    thread: Option<JoinHandle<Held>>,
}

impl ArmingThread {
    /// Starts the thread; it writes `wake` after each piece of work.
    pub fn spawn(wake: Arc<EventFd>) -> std::io::Result<Self> {
        let (tx, work) = mpsc::channel::<Work>();
        let (done, rx) = mpsc::channel::<Done>();
        let thread = std::thread::Builder::new()
            .name("mt-armer".into())
            .spawn(move || {
                crate::sys::sched::raise_nice(NICE_BELOW);
                let mut held = Held::default();
                while let Some(w) = next_work(&work, held.deadline()) {
                    let mut out: Vec<Done> = w.and_then(|w| held.work(w)).into_iter().collect();
                    out.extend(held.step(monotonic_ns()));
                    for d in out {
                        let _ = done.send(d);
                        let _ = wake.write(1);
                    }
                }
                // Not dropped here: see `finish`.
                held
            })?;
        Ok(Self {
            tx: Some(tx),
            rx,
            thread: Some(thread),
        })
    }

    /// Detaches a trigger's uprobes: the given links and those this thread
    /// attached. Never blocks.
    pub fn detach(&self, trigger: u32, links: Vec<UProbeLink>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Work::Detach(trigger, links));
        }
    }

    /// Makes, arms and keeps a trigger's event uprobes. Never blocks.
    pub fn set_up(
        &self,
        events: Arc<UprobeEvents>,
        uprobes: Arc<TriggerUprobes>,
        programs: Arc<ProgramFds>,
    ) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Work::SetUp {
                events,
                uprobes,
                programs,
            });
        }
    }

    /// Drops what the thread holds of a trigger. Never blocks.
    pub fn forget(&self, trigger: u32) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Work::Forget(trigger));
        }
    }

    /// Attaches a trigger's uprobes again, to be in at `at_ns`
    /// (CLOCK_MONOTONIC). Never blocks.
    pub fn attach(&self, uprobes: Arc<TriggerUprobes>, programs: Arc<ProgramFds>, at_ns: u64) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Work::Attach {
                uprobes,
                programs,
                at_ns,
            });
        }
    }

    /// Ends the thread and detaches everything it held, the last closes
    /// in a child ([`crate::probe::detach`]): returns the child to wait for, or
    /// why none could be forked (then it is detached here).
    pub fn finish(&mut self) -> Option<Result<Detacher, std::io::Error>> {
        self.tx.take();
        let held = self.thread.take()?.join().ok()?;
        Some(detach::drop_in_child(held))
    }
}

impl Drop for ArmingThread {
    fn drop(&mut self) {
        if let Some(Ok(mut d)) = self.finish() {
            d.wait(std::time::Instant::now() + detach::WAIT);
        }
    }
}

/// How much higher the arming thread's priority is than the agent's own,
/// in nice steps (so -5 for an agent at nice 0; an agent an operator
/// niced to 10 gets 5). The driver hands a hit's disarm over right after
/// the hit's `kill()`, which wakes perf too; at the agent's own nice the
/// thread then often waited behind perf's switch-output work, with the
/// probes still in. Its work is short (a close or an open), so it takes
/// little from others (docs/disarming.md, "Handing the disarm over at
/// once").
const NICE_BELOW: libc::c_int = 5;

/// The next piece of work, or Some(None) at `deadline` (CLOCK_MONOTONIC
/// ns); None once the driver is gone.
fn next_work(work: &mpsc::Receiver<Work>, deadline: Option<u64>) -> Option<Option<Work>> {
    let Some(at) = deadline else {
        return work.recv().ok().map(Some);
    };
    let wait = Duration::from_nanos(at.saturating_sub(monotonic_ns()));
    match work.recv_timeout(wait) {
        Ok(w) => Some(Some(w)),
        Err(mpsc::RecvTimeoutError::Timeout) => Some(None),
        Err(mpsc::RecvTimeoutError::Disconnected) => None,
    }
}

/// Detaches links, the last closes in a child ([`crate::probe::detach`]): the
/// time each uprobe took, ns (the child's time, shared out).
fn detach(trigger: u32, links: Vec<UProbeLink>, own: Vec<RawLink>) -> Done {
    let n = (links.len() + own.len()) as u64;
    if n == 0 {
        return Done::Detached {
            trigger,
            per_link_ns: Vec::new(),
            warning: None,
        };
    }
    let t = Instant::now();
    let warning = detach::drop_and_wait((links, own));
    let each = t.elapsed().as_nanos() as u64 / n;
    Done::Detached {
        trigger,
        per_link_ns: vec![each; n as usize],
        warning,
    }
}

/// Arms event uprobes; `warm_ns`: the warm-up's time, if there was one.
fn arm(trigger: u32, s: &mut EventUprobes, warm_ns: Option<u64>, can_warm: bool) -> Done {
    let t = Instant::now();
    let result = s
        .arm()
        .map_err(|e| format!("arming the uprobe events of trigger {trigger}: {e}"));
    Done::Attached {
        trigger,
        result,
        at_ns: monotonic_ns(),
        took_ns: t.elapsed().as_nanos() as u64 + warm_ns.unwrap_or(0),
        warmed: warm_ns.is_some(),
        can_warm,
    }
}

fn attach(
    uprobes: &TriggerUprobes,
    programs: &ProgramFds,
    own: &mut HashMap<u32, Vec<RawLink>>,
) -> Done {
    let t = Instant::now();
    let mut links = Vec::new();
    let mut result = Ok(());
    // The return probes first and the entry last (as `EventUprobes::arm`).
    for u in uprobes.uprobes.iter().rev() {
        let attached = programs
            .get(u.program)
            .ok_or_else(|| std::io::Error::other(format!("no fd of {}", u.program.name())))
            .and_then(|prog| {
                perf_event::attach(
                    prog,
                    &uprobes.path,
                    u.offset,
                    u.is_uretprobe(),
                    uprobes.perf_pid(),
                    u64::from(uprobes.trigger),
                )
            });
        match attached {
            Ok(l) => links.push(l),
            Err(e) => {
                result = Err(format!(
                    "attaching a uprobe to {}+{:#x}: {e}",
                    uprobes.path.display(),
                    u.offset
                ));
                links.clear();
                break;
            }
        }
    }
    own.entry(uprobes.trigger).or_default().extend(links);
    Done::Attached {
        trigger: uprobes.trigger,
        result,
        at_ns: monotonic_ns(),
        took_ns: t.elapsed().as_nanos() as u64,
        warmed: false,
        can_warm: false,
    }
}
