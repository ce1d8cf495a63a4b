//! Takes the kernel's wait out of a re-arm, so that a trigger's event uprobes
//! go in when the cooldown ends rather than somewhere in the 8-16 ms before.
//!
//! Putting a uprobe's breakpoints in or out (`register_for_each_vma()` in
//! kernel/events/uprobes.c) takes `dup_mmap_sem` for writing. Its writer
//! first waits for an RCU grace period (`rcu_sync_enter()` in
//! kernel/rcu/sync.c), unless a writer left less than about a grace period
//! ago: the `rcu_sync` then is still in `GP_EXIT` or `GP_REPLAY`, and the
//! next writer goes straight in. Here the wait is 8-16 ms (in steps of the
//! 4 ms tick) and an arm without it 25 µs-1 ms (docs/disarming.md).
//!
//! So a timed arm has a warm-up: well before the arm, the arming thread
//! makes a writer that changes nothing, and takes the wait there; then it
//! makes one every [`WARM_EVERY_NS`] until the arm, which goes straight in.
//!
//! The writer: a tracefs uprobe event on an empty memfd that no process
//! maps, kept registered by a keeper perf event on kthreadd (as event uprobes
//! are, [`crate::disarm::event_uprobes`]). Opening a perf event on it for the
//! calling thread adds the agent to the event's filter and applies the
//! uprobe (`uprobe_perf_open()` → `uprobe_apply()` in
//! kernel/trace/trace_uprobe.c); closing it applies it again. Each is one
//! `register_for_each_vma()` that finds no mapping, so no breakpoint goes
//! anywhere, and no program is attached to the event.

use std::{
    io,
    os::fd::{AsRawFd, OwnedFd},
    path::PathBuf,
    sync::Arc,
};

use crate::{
    disarm::{event_uprobes, tracefs_events::UprobeEvents},
    sys::{clock, perf_event},
};

/// How often to repeat the warm-up while an arm waits, ns: well under the
/// shortest grace period after which the kernel's `rcu_sync` goes idle
/// (docs/disarming.md).
pub const WARM_EVERY_NS: u64 = 1_000_000;

/// A warm-up is worth it when the arm is at least this far off, ns: less
/// than a grace period ahead, the arm itself waits no longer.
pub const WARM_IF_AHEAD_NS: u64 = 4_000_000;

/// The warm-up uprobe.
pub struct RcuWarmup {
    events: Arc<UprobeEvents>,
    name: String,
    id: u64,
    /// Taken out first on drop: the event is deleted after it.
    keeper: Option<OwnedFd>,
    _file: OwnedFd,
    /// When the last warm-up ended, CLOCK_MONOTONIC ns (0: never).
    last_ns: u64,
}

impl RcuWarmup {
    /// Makes the warm-up event in `events`' group, with its keeper.
    pub fn new(events: Arc<UprobeEvents>) -> Result<Self, String> {
        let file = memfd().map_err(|e| format!("memfd_create: {e}"))?;
        // The agent's pid, not `self`: the listing is read by others.
        let path = PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            file.as_raw_fd()
        ));
        let (ev, keeper) = event_uprobes::kept_event(&events, &path, 0, false)?;
        Ok(Self {
            events,
            name: ev.name,
            id: ev.id,
            keeper: Some(keeper),
            _file: file,
            last_ns: 0,
        })
    }

    /// One warm-up: a writer of `dup_mmap_sem` that changes nothing. The
    /// time it took, ns (a grace period when the kernel was idle).
    pub fn warm(&mut self) -> io::Result<u64> {
        let t0 = clock::monotonic_ns();
        let me = nix::unistd::gettid().as_raw();
        let opened = perf_event::open_tracepoint(self.id, me).map(drop);
        // Also after a failure: the next try is WARM_EVERY_NS away.
        self.last_ns = clock::monotonic_ns();
        opened.map(|()| self.last_ns - t0)
    }

    /// When the next warm-up is due to keep the kernel ready,
    /// CLOCK_MONOTONIC ns.
    pub fn next_ns(&self) -> u64 {
        self.last_ns.saturating_add(WARM_EVERY_NS)
    }
}

impl Drop for RcuWarmup {
    /// Closes the keeper (its last close unregisters the uprobe: grace
    /// periods, see [`crate::probe::detach`]) and deletes the event.
    fn drop(&mut self) {
        drop(self.keeper.take());
        let _ = self.events.delete(&self.name);
    }
}

/// An empty memfd, closed on exec.
fn memfd() -> io::Result<OwnedFd> {
    nix::sys::memfd::memfd_create(c"mt-agent-warm-up", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(io::Error::from)
}
