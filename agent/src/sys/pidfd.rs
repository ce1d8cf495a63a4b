//! pidfds: a file descriptor that becomes readable when its process ends (pidfd_open(2), Linux 5.3+).

use std::{
    io,
    os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd},
};

use nix::fcntl::{FcntlArg, FdFlag, fcntl};

/// `pidfd_open(2)`: an fd that becomes readable when the process exits.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; the result is a new fd we own, or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = fd as RawFd;
    // pidfds are created with O_CLOEXEC.
    let _ = fcntl(
        unsafe { BorrowedFd::borrow_raw(fd) },
        FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC),
    );
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
