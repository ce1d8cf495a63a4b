//! Closing uprobes without waiting for the kernel: the last close of a
//! uprobe's perf event happens in a forked child, `mt-agent-detach`.
//!
//! Closing the last perf event of a uprobe unregisters it, and
//! `uprobe_unregister_sync()` (kernel/events/uprobes.c) then waits for an
//! RCU Tasks Trace grace period and for one of `uretprobes_srcu`. SRCU runs
//! its callbacks from a kworker of the boot CPU
//! (`srcu_gp_start_if_needed()` in kernel/rcu/srcutree.c, small mode). Here
//! (kernel 6.18), two threads passing a byte back and forth on CPU 0 kept
//! that kworker runnable but unscheduled for as long as they ran (its
//! `se.sum_exec_runtime` did not move for seconds), and the close waited
//! 60 s+ in `__synchronize_srcu()`, uninterruptibly. A process cannot exit
//! while one of its threads is in such a wait, so the agent hung at its
//! end (docs/disarming.md, "Detaching off the agent's exit").
//!
//! So [`drop_in_child`] forks a child that holds a copy of every fd, drops
//! the value here (a close that is not the last does not unregister
//! anything), and lets the child go: its close is the last, and the wait,
//! if any, is the child's. The caller waits for the child with a bound
//! ([`Detacher::wait`]); past it, the child finishes on its own and the
//! agent goes on.
//!
//! The child is forked from a threaded process, so it only makes
//! async-signal-safe system calls (signal-safety(7)) on memory prepared
//! before the fork.

use std::{
    io,
    os::fd::{AsRawFd, OwnedFd, RawFd},
    sync::Mutex,
    time::{Duration, Instant},
};

use nix::{
    fcntl::OFlag,
    sys::wait::{WaitPidFlag, WaitStatus, waitpid},
    unistd::{Pid, pipe2},
};

use crate::sys::child;

/// How long a caller waits for a child to close what it holds: far beyond
/// what a uprobe's detach takes (docs/disarming.md, "Measured here: the
/// slow way"), even with a few dozen `ret` probes.
pub const WAIT: Duration = Duration::from_secs(5);

/// One fork at a time: a child must not inherit another child's pipe.
static FORKING: Mutex<()> = Mutex::new(());

/// A child that makes the last close of what [`drop_in_child`] dropped.
#[derive(Debug)]
pub struct Detacher {
    /// None once it has been reaped.
    pid: Option<Pid>,
    pidfd: Option<OwnedFd>,
}

/// Drops `value` (uprobe links, perf events) without waiting for the
/// kernel to unregister its uprobes: see the module's docs. If the fork
/// fails, drops it here, waiting as before, and says why.
pub fn drop_in_child<T>(value: T) -> io::Result<Detacher> {
    let _one = FORKING.lock().unwrap_or_else(|e| e.into_inner());
    let forked = fork_holder();
    drop(value);
    // End of file: the child closes its copies, the last ones.
    forked.map(|(pid, _go)| Detacher::of(pid))
}

/// Forks the child; returns its pid and the write end of its pipe, whose
/// end of file lets it go. Until then, what this process closes is not
/// the last close.
pub fn fork_holder() -> io::Result<(Pid, OwnedFd)> {
    let (read, write) = pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let mut early = fds_to_close_early();
    early.retain(|fd| *fd != read.as_raw_fd());
    early.push(write.as_raw_fd());
    // SAFETY: the child runs `hold`, which only makes async-signal-safe
    // calls on memory prepared before the fork, and never returns.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => hold(read.as_raw_fd(), &early),
        pid => Ok((Pid::from_raw(pid), write)),
    }
}

/// The fds that are not anonymous inodes (pipes, files, sockets, the
/// terminal): the child closes them at once, so that nobody waits for it
/// to see an end of file (the agent's stdout, the reaper's pipe). It holds
/// the rest (perf events, BPF objects) until it is let go.
fn fds_to_close_early() -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return (0..3).collect();
    };
    dir.flatten()
        .filter_map(|e| {
            let fd: RawFd = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            (!target.to_string_lossy().starts_with("anon_inode:")).then_some(fd)
        })
        .collect()
}

/// The child: closes `early`, waits for the end of file on `go`, closes
/// everything (the last closes) and exits.
fn hold(go: RawFd, early: &[RawFd]) -> ! {
    // SAFETY: async-signal-safe calls only (signal-safety(7); close_range
    // and prctl are plain system calls).
    unsafe {
        for fd in early {
            libc::close(*fd);
        }
        libc::prctl(libc::PR_SET_NAME, c"mt-agent-detach".as_ptr());
        // If this child died first, the agent's own close would be the
        // last one.
        child::ignore_group_signals();
        child::wait_for_eof(go);
        libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
        libc::_exit(0)
    }
}

impl Detacher {
    /// The child `pid` of [`fork_holder`], to wait for.
    pub fn of(pid: Pid) -> Self {
        Self {
            pid: Some(pid),
            pidfd: crate::sys::pidfd::pidfd_open(pid.as_raw()).ok(),
        }
    }

    /// The child's pid, until it is reaped.
    pub fn pid(&self) -> Option<i32> {
        self.pid.map(Pid::as_raw)
    }

    /// Waits until the child has exited (its closes are done), until
    /// `deadline` at most. True when it is done.
    pub fn wait(&mut self, deadline: Instant) -> bool {
        let Some(pid) = self.pid else {
            return true;
        };
        loop {
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {}
                // Exited (or not ours to wait for any more).
                _ => {
                    self.pid = None;
                    return true;
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            self.sleep_until_exit(left.min(Duration::from_millis(100)));
        }
    }

    /// Sleeps until the child exits, or `d`.
    fn sleep_until_exit(&self, d: Duration) {
        match &self.pidfd {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, d.as_millis().max(1) as i32) };
            }
            None => std::thread::sleep(d.min(Duration::from_millis(2))),
        }
    }
}

/// How long a caller waits for a child while an earlier one is still
/// held up: the kernel is likely still stuck, and an end must not wait
/// [`WAIT`] once per child.
pub const WAIT_HELD_UP: Duration = Duration::from_secs(1);

/// The children that were slower than their wait, until they end: one
/// list for the process, so that every caller (the driver, the arming
/// thread) knows the kernel is held up.
static HELD_UP: Mutex<Vec<Detacher>> = Mutex::new(Vec::new());

fn no_fork(e: &io::Error) -> String {
    format!("cannot fork a child to detach the uprobes ({e}): detached in the agent")
}

/// Drops `value` on a child's last close ([`drop_in_child`]) and waits for
/// the child ([`wait_for`]). Returns a warning to print, if any.
pub fn drop_and_wait<T>(value: T) -> Option<String> {
    wait_for(drop_in_child(value))
}

/// Waits for a child, [`WAIT`] at most ([`WAIT_HELD_UP`] while an earlier
/// child is still held up). Returns a warning if it is slower (it then
/// finishes on its own), or if there was no child.
pub fn wait_for(d: io::Result<Detacher>) -> Option<String> {
    let mut d = match d {
        Ok(d) => d,
        Err(e) => return Some(no_fork(&e)),
    };
    let bound = if held_up() { WAIT_HELD_UP } else { WAIT };
    if d.wait(Instant::now() + bound) {
        return None;
    }
    let pid = d.pid().unwrap_or(0);
    HELD_UP.lock().unwrap_or_else(|e| e.into_inner()).push(d);
    Some(format!(
        "the kernel has not removed uprobes within {:.0} s (a grace period is held up, \
         docs/disarming.md); mt-agent-detach (pid {pid}) finishes it, after the agent \
         if need be",
        bound.as_secs_f64()
    ))
}

/// True if a child is still held up; reaps those that ended.
pub fn held_up() -> bool {
    let mut held = HELD_UP.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    held.retain_mut(|d| !d.wait(now));
    !held.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_with_nothing_to_close_ends_at_once() {
        let mut d = drop_in_child(()).expect("fork");
        let pid = d.pid().expect("a child");
        assert!(d.wait(Instant::now() + Duration::from_secs(10)));
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "the child was not reaped"
        );
    }

    #[test]
    fn the_child_does_not_hold_pipes() {
        // A pipe stands for the agent's stdout: its reader must see the
        // end of file when the agent closes it, while the child still
        // holds the agent's perf events.
        let (read, write) = pipe2(OFlag::O_CLOEXEC).unwrap();
        let (pid, go) = fork_holder().unwrap();
        drop(write);
        let mut p = libc::pollfd {
            fd: read.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd. 10 s: far beyond a fork (no timing
        // is asserted; without the early close, this would time out).
        let n = unsafe { libc::poll(&mut p, 1, 10_000) };
        assert_eq!(n, 1, "no end of file while the child lives");
        assert_ne!(p.revents & libc::POLLHUP, 0, "{:#x}", p.revents);
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
        drop(go);
        assert!(Detacher::of(pid).wait(Instant::now() + Duration::from_secs(10)));
    }

    #[test]
    fn only_anonymous_inodes_are_held() {
        let (read, write) = pipe2(OFlag::O_CLOEXEC).unwrap();
        let efd = nix::sys::eventfd::EventFd::new().unwrap();
        let early = fds_to_close_early();
        assert!(early.contains(&read.as_raw_fd()));
        assert!(early.contains(&write.as_raw_fd()));
        assert!(!early.contains(&std::os::fd::AsFd::as_fd(&efd).as_raw_fd()));
    }
}
