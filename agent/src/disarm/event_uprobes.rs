//! A trigger's uprobes as a switch: tracefs uprobe events
//! ([`crate::disarm::tracefs_events`]) that stay registered all run, whose
//! breakpoints go into the target's code when the switch is armed and out
//! of it when it is disarmed, without the kernel's grace periods.
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
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use crate::{
    disarm::tracefs_events::{Event, Events},
    sys::perf_event,
};

/// kthreadd: a kernel thread there always is.
const KEEPER_PID: i32 = 2;

/// Defines a uprobe event of `path`+`offset` (a uretprobe if `ret`) and
/// opens its keeper on [`KEEPER_PID`]: the uprobe is registered for as long
/// as the keeper is open, with a breakpoint in no process. On an error,
/// the event is deleted again.
pub fn kept_event(
    events: &Events,
    path: &Path,
    offset: u64,
    ret: bool,
) -> Result<(Event, OwnedFd), String> {
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

/// One uprobe of the switch.
struct Point {
    event: String,
    id: u64,
    // Field order is drop order: the arm, the link, the keeper.
    arm: Option<OwnedFd>,
    _link: OwnedFd,
    _keeper: OwnedFd,
}

/// A trigger's uprobes.
pub struct Switch {
    events: Arc<Events>,
    pid: i32,
    points: Vec<Point>,
}

/// One uprobe to make: the program, the file offset, a uretprobe or not.
pub struct Spec<'a> {
    pub prog: BorrowedFd<'a>,
    pub offset: u64,
    pub ret: bool,
}

/// A trigger's switch to make (on the arming thread).
pub struct Plan {
    pub events: Arc<Events>,
    pub trigger: u32,
    pub path: PathBuf,
    /// The target, or -1 for every process (a trigger following forks).
    pub pid: i32,
    /// (program, file offset, uretprobe).
    pub points: Vec<(Arc<OwnedFd>, u64, bool)>,
}

impl Plan {
    /// Makes the switch and arms it. If it cannot be armed, the switch
    /// goes to `failed`, disarmed: its keepers' last close can wait for
    /// the kernel, so it is for the caller to drop ([`crate::probe::detach`]).
    pub fn build(self, failed: &mut Vec<Switch>) -> Result<Switch, String> {
        let specs: Vec<Spec> = self
            .points
            .iter()
            .map(|(prog, offset, ret)| Spec {
                prog: prog.as_fd(),
                offset: *offset,
                ret: *ret,
            })
            .collect();
        let cookie = u64::from(self.trigger);
        let mut s = Switch::new(self.events.clone(), &self.path, self.pid, cookie, &specs)?;
        if let Err(e) = s.arm() {
            failed.push(s);
            return Err(format!("arming: {e}"));
        }
        Ok(s)
    }
}

impl Switch {
    /// Defines the uprobes of `path` for process `pid` (-1: every
    /// process) with their keepers, disarmed.
    pub fn new(
        events: Arc<Events>,
        path: &Path,
        pid: i32,
        cookie: u64,
        specs: &[Spec<'_>],
    ) -> Result<Self, String> {
        let mut s = Self {
            events,
            pid,
            points: Vec::new(),
        };
        for spec in specs {
            let (ev, keeper) = kept_event(&s.events, path, spec.offset, spec.ret)?;
            match perf_event::link(spec.prog, keeper.as_fd(), cookie) {
                Ok(link) => s.points.push(Point {
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
        self.points.len()
    }

    /// Puts the breakpoints in, the return probes first and the entry
    /// last: an entry seen then has its returns watched. On an error, none
    /// is in.
    pub fn arm(&mut self) -> std::io::Result<()> {
        for i in (0..self.points.len()).rev() {
            if self.points[i].arm.is_some() {
                continue;
            }
            match perf_event::open_tracepoint(self.points[i].id, self.pid) {
                Ok(fd) => self.points[i].arm = Some(fd),
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
        for p in &mut self.points {
            if let Some(fd) = p.arm.take() {
                let t = Instant::now();
                drop(fd);
                took.push(t.elapsed().as_nanos() as u64);
            }
        }
        took
    }
}

impl Drop for Switch {
    /// Disarms, closes the keepers (the last perf event of an event
    /// unregisters its uprobe: grace periods, on the arming thread) and
    /// deletes the events.
    fn drop(&mut self) {
        for p in std::mem::take(&mut self.points) {
            let name = p.event.clone();
            drop(p);
            let _ = self.events.delete(&name);
        }
    }
}
