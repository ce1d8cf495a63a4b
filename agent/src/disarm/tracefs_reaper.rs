//! A child process that deletes the agent's uprobe events
//! ([`crate::disarm::tracefs_events`]) when the agent dies, however it dies.
//!
//! The perf events and BPF links of the agent are file descriptors, so the
//! kernel takes them down with the process. A tracefs uprobe event is not:
//! after a SIGKILL it would stay defined (with no breakpoint and no
//! program, but listed in `uprobe_events`). So the agent forks this child,
//! which holds the read end of a pipe whose write end only the agent has:
//! end of file means the agent is gone. The child then deletes the group,
//! retrying while the dying agent's perf events still hold it (`EBUSY`).
//!
//! The child is forked from a threaded process, so it only makes
//! async-signal-safe system calls (signal-safety(7)); everything it writes
//! is prepared before the fork.

use std::{
    ffi::CString,
    io,
    os::{fd::AsRawFd, unix::ffi::OsStrExt},
    path::Path,
};

use crate::sys::child;
use nix::{
    fcntl::OFlag,
    sys::wait::waitpid,
    unistd::{Pid, pipe2},
};

/// How the child retries the delete: the dying agent's last perf event
/// on a uprobe event unregisters it, which waits for RCU grace periods, so
/// every 40 ms for 10 s; then every second, up to 10 minutes in all, for a
/// grace period held up by a starved CPU (docs/disarming.md, "Detaching off
/// the agent's exit", has both waits).
const FAST_RETRIES: u32 = 250;
const RETRIES: u32 = FAST_RETRIES + 590;
const FAST_RETRY_NS: libc::c_long = 40_000_000;

/// The running reaper. Dropping it (at the end of a run, after the agent
/// deleted its events itself) lets the child go and waits for it.
pub struct TracefsReaper {
    pid: Pid,
    pipe: Option<std::os::fd::OwnedFd>,
}

/// Forks the reaper of `group` in the tracefs file `uprobe_events`.
pub fn spawn(uprobe_events: &Path, group: &str) -> io::Result<TracefsReaper> {
    let file = CString::new(uprobe_events.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let line = format!("-:{group}/\n").into_bytes();
    let (read, write) = pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    // SAFETY: the child runs `reap`, which only makes async-signal-safe
    // calls on memory prepared before the fork, and never returns.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => reap(read.as_raw_fd(), &file, &line),
        pid => {
            drop(read);
            Ok(TracefsReaper {
                pid: Pid::from_raw(pid),
                pipe: Some(write),
            })
        }
    }
}

/// The child: waits for the end of file, deletes the group, exits.
fn reap(read: i32, file: &CString, line: &[u8]) -> ! {
    // SAFETY: async-signal-safe calls only (signal-safety(7); close_range
    // and prctl are plain system calls).
    unsafe {
        // Keep the pipe as fd 0; close every other inherited fd, so that
        // nothing of the agent's (its stdout, BPF programs, perf pipes)
        // lives on in this process.
        libc::dup2(read, 0);
        libc::syscall(libc::SYS_close_range, 1u32, u32::MAX, 0u32);
        libc::prctl(libc::PR_SET_NAME, c"mt-agent-reaper".as_ptr());
        child::ignore_group_signals();
        child::wait_for_eof(0);
        for i in 0..RETRIES {
            let fd = libc::open(file.as_ptr(), libc::O_WRONLY | libc::O_APPEND);
            if fd < 0 {
                break;
            }
            let n = libc::write(fd, line.as_ptr().cast(), line.len());
            let err = *libc::__errno_location();
            libc::close(fd);
            if n >= 0 || err != libc::EBUSY {
                break;
            }
            let t = if i < FAST_RETRIES {
                libc::timespec {
                    tv_sec: 0,
                    tv_nsec: FAST_RETRY_NS,
                }
            } else {
                libc::timespec {
                    tv_sec: 1,
                    tv_nsec: 0,
                }
            };
            libc::nanosleep(&t, std::ptr::null_mut());
        }
        libc::_exit(0)
    }
}

impl TracefsReaper {
    /// Lets the child go without waiting for it: it deletes the group when
    /// the agent's perf events no longer hold it (10 minutes at most).
    pub fn let_go(mut self) {
        self.pipe.take();
        // Not waited for: init reaps it once the agent is gone.
        std::mem::forget(self);
    }
}

impl Drop for TracefsReaper {
    fn drop(&mut self) {
        self.pipe.take();
        let _ = waitpid(self.pid, None);
    }
}
