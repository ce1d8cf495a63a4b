//! Scheduling the calling thread or process: `SCHED_BATCH`, `SCHED_FIFO` and nice (sched(7), setpriority(2)).

use std::io;

/// Puts the calling process under `SCHED_BATCH`: the same share of the
/// CPU, but its wake-ups do not preempt the running task
/// (`check_preempt_wakeup_fair()` in kernel/sched/fair.c). Best effort, and
/// async-signal-safe, so that it may run between `fork` and `exec`.
pub fn set_batch() {
    // SAFETY: sched_param is plain data; all-zero is a valid value (the
    // only priority SCHED_BATCH takes). pid 0 is the calling process.
    unsafe {
        let param: libc::sched_param = std::mem::zeroed();
        libc::sched_setscheduler(0, libc::SCHED_BATCH, &param);
    }
}

/// Puts the calling thread under `SCHED_FIFO` at `prio`, with
/// `SCHED_RESET_ON_FORK`: a process spawned from this thread, and any
/// thread it creates, start at normal priority.
pub fn set_fifo(prio: i32) -> io::Result<()> {
    // Zeroed, then set: musl's sched_param has more fields than glibc's.
    // SAFETY: sched_param is plain data; all-zero is a valid value.
    let mut param: libc::sched_param = unsafe { std::mem::zeroed() };
    param.sched_priority = prio;
    let policy = libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK;
    // SAFETY: pid 0 is the calling thread; `param` is valid.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Lowers the calling thread's nice by `steps` below its own; best effort:
/// without `CAP_SYS_NICE` (or a `RLIMIT_NICE` that allows it) the thread
/// keeps its nice.
pub fn raise_nice(steps: libc::c_int) {
    let tid = nix::unistd::gettid().as_raw() as libc::id_t;
    nix::errno::Errno::clear();
    // SAFETY: PRIO_PROCESS with a thread id reads and sets that thread's
    // nice (setpriority(2), Linux notes). getpriority returns -1 both for
    // nice -1 and for an error, hence the errno check.
    unsafe {
        let own = libc::getpriority(libc::PRIO_PROCESS, tid);
        if own == -1 && nix::errno::Errno::last_raw() != 0 {
            return;
        }
        libc::setpriority(libc::PRIO_PROCESS, tid, own - steps);
    }
}

/// Raises the calling thread's nice by `steps` (lower priority), for work
/// that must never compete with the data path (the upload thread). Best
/// effort. On Linux, `setpriority(PRIO_PROCESS, 0, …)` applies to the
/// calling thread (setpriority(2), "BUGS").
pub fn lower_priority(steps: libc::c_int) {
    // SAFETY: plain syscalls on the calling thread.
    unsafe {
        *libc::__errno_location() = 0;
        let now = libc::getpriority(libc::PRIO_PROCESS, 0);
        if now == -1 && *libc::__errno_location() != 0 {
            return;
        }
        libc::setpriority(libc::PRIO_PROCESS, 0, (now + steps).min(19));
    }
}
