//! A trigger's uprobes as tracefs uprobe events
//! ([`crate::disarm::tracefs_events`]) that stay registered all run, whose
//! breakpoints go into the target's code when they are armed and out
//! of it when they are disarmed, without the kernel's grace periods.
//!
//! Each uprobe is one event with two kinds of perf event on it:
//! * the keeper, opened on a kernel thread (kthreadd). It registers the
//!   uprobe and holds the program's BPF link with the trigger's cookie. A
//!   uprobe event only puts breakpoints into the processes its perf events
//!   are for (`uprobe_perf_filter()` in kernel/trace/trace_uprobe.c), and a
//!   kernel thread has no user memory, so the keeper puts none anywhere.
//!   The program runs for every hit of the event (`call->prog_array`).
//! * the arm, opened on the target (or on every process, -1, for a trigger
//!   that follows forks): opening it installs the breakpoints in the
//!   target, closing it removes them.

use std::{
    os::fd::{AsFd, OwnedFd},
    path::Path,
    sync::Arc,
    time::Instant,
};

use crate::{
    disarm::tracefs_events::{UprobeEvent, UprobeEvents},
    probe::uprobes::{ProgramFds, TriggerUprobes},
    sys::perf_event,
};

/// kthreadd: a kernel thread there always is.
const KEEPER_PID: i32 = 2;

/// Defines a uprobe event of `path`+`offset` (a uretprobe if `ret`) and
/// opens its keeper on [`KEEPER_PID`]: the uprobe is registered for as long
/// as the keeper is open, with a breakpoint in no process. On an error,
/// the event is deleted again.
pub fn kept_event(
    events: &UprobeEvents,
    path: &Path,
    offset: u64,
    ret: bool,
) -> Result<(UprobeEvent, OwnedFd), String> {
    if !crate::sys::proc::is_kernel_thread(KEEPER_PID) {
        return Err(format!("pid {KEEPER_PID} is not a kernel thread here"));
    }
    let ev = events
        .create(path, offset, ret)
        .map_err(|e| format!("defining a uprobe event: {e}"))?;
    match perf_event::open_tracepoint(ev.id, KEEPER_PID) {
        Ok(keeper) => Ok((ev, keeper)),
        Err(e) => {
            let _ = events.delete(&ev.name);
            Err(format!("opening uprobe event {}: {e}", ev.name))
        }
    }
}

/// One uprobe, kept registered.
struct Kept {
    event: String,
    id: u64,
    // Field order is drop order: the arm, the link, the keeper.
    arm: Option<OwnedFd>,
    _link: OwnedFd,
    _keeper: OwnedFd,
}

/// A trigger's uprobes as tracefs uprobe events, each kept registered.
pub struct EventUprobes {
    events: Arc<UprobeEvents>,
    pid: i32,
    kept: Vec<Kept>,
}

impl EventUprobes {
    /// Makes a trigger's uprobes as events and arms them. If they cannot be
    /// armed, they go to `failed`, disarmed: their keepers' last close can
    /// wait for the kernel, so it is for the caller to drop
    /// ([`crate::probe::detach`]).
    pub fn build(
        events: Arc<UprobeEvents>,
        uprobes: &TriggerUprobes,
        programs: &ProgramFds,
        failed: &mut Vec<EventUprobes>,
    ) -> Result<Self, String> {
        let mut s = Self::new(events, uprobes, programs)?;
        if let Err(e) = s.arm() {
            failed.push(s);
            return Err(format!("arming: {e}"));
        }
        Ok(s)
    }

    /// Defines the uprobes of a trigger, for its [`TriggerUprobes::perf_pid`],
    /// with their keepers, disarmed.
    pub fn new(
        events: Arc<UprobeEvents>,
        uprobes: &TriggerUprobes,
        programs: &ProgramFds,
    ) -> Result<Self, String> {
        let mut s = Self {
            events,
            pid: uprobes.perf_pid(),
            kept: Vec::new(),
        };
        let cookie = u64::from(uprobes.trigger);
        for u in &uprobes.uprobes {
            let prog = programs
                .get(u.program)
                .ok_or_else(|| format!("no fd of program {}", u.program.name()))?;
            let (ev, keeper) = kept_event(&s.events, &uprobes.path, u.offset, u.is_uretprobe())?;
            match perf_event::link(prog, keeper.as_fd(), cookie) {
                Ok(link) => s.kept.push(Kept {
                    event: ev.name,
                    id: ev.id,
                    arm: None,
                    _link: link,
                    _keeper: keeper,
                }),
                Err(e) => {
                    drop(keeper);
                    let _ = s.events.delete(&ev.name);
                    return Err(format!("opening uprobe event {}: {e}", ev.name));
                }
            }
        }
        Ok(s)
    }
    /// Number of uprobes.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// Puts the breakpoints in, the return probes first and the entry
    /// last: an entry seen then has its returns watched. On an error, none
    /// is in.
    pub fn arm(&mut self) -> std::io::Result<()> {
        for i in (0..self.kept.len()).rev() {
            if self.kept[i].arm.is_some() {
                continue;
            }
            match perf_event::open_tracepoint(self.kept[i].id, self.pid) {
                Ok(fd) => self.kept[i].arm = Some(fd),
                Err(e) => {
                    self.disarm();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Takes the breakpoints out, the entry first; the time of each
    /// close, ns.
    pub fn disarm(&mut self) -> Vec<u64> {
        let mut took = Vec::new();
        for p in &mut self.kept {
            if let Some(fd) = p.arm.take() {
                let t = Instant::now();
                drop(fd);
                took.push(t.elapsed().as_nanos() as u64);
            }
        }
        took
    }
}

impl Drop for EventUprobes {
    /// Disarms, closes the keepers (the last perf event of an event
    /// unregisters its uprobe: grace periods, on the arming thread) and
    /// deletes the events.
    fn drop(&mut self) {
        for p in std::mem::take(&mut self.kept) {
            let name = p.event.clone();
            drop(p);
            let _ = self.events.delete(&name);
        }
    }
}
