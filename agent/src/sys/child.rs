//! What a forked helper child does before its work: ignore the signals meant for the agent, and wait for the end of a pipe.

/// In a forked child: a Ctrl-C (or SIGTERM, SIGHUP, SIGQUIT) to the
/// agent's process group is for the agent, not for its helper children.
/// Async-signal-safe.
pub fn ignore_group_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: signal(2) with SIG_IGN, async-signal-safe.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

/// In a forked child: reads `fd` until end of file (or an error other
/// than EINTR). Async-signal-safe.
pub fn wait_for_eof(fd: i32) {
    let mut b = [0u8; 1];
    loop {
        // SAFETY: read(2) into a local buffer of 1 byte.
        let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), 1) };
        // SAFETY: errno of this thread.
        if n == 0 || (n < 0 && unsafe { *libc::__errno_location() } != libc::EINTR) {
            return;
        }
    }
}
