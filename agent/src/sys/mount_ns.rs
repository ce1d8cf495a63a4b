//! A private mount namespace with one file bind-mounted over another, for a
//! child between fork and exec; and whether a process sees such a mount.

use std::ffi::CStr;

/// In the calling process (a child between fork and exec): a mount
/// namespace of its own (`unshare(CLONE_NEWNS)`), the tree made a slave of
/// the parent's so that later mounts still reach it (`MS_REC | MS_SLAVE`),
/// and `src` bind-mounted over `dst` (mount(2), mount_namespaces(7)).
/// Returns whether the bind mount is in place; on failure the process keeps
/// what it has, and sees `dst` as before. Needs `CAP_SYS_ADMIN`.
///
/// Only async-signal-safe calls: safe in `pre_exec`.
pub fn bind_in_private_namespace(src: &CStr, dst: &CStr) -> bool {
    // SAFETY: plain syscalls on NUL-terminated paths.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) == -1 {
            return false;
        }
        let none = std::ptr::null();
        if libc::mount(
            none,
            c"/".as_ptr(),
            none,
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        ) == -1
        {
            return false;
        }
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            none,
            libc::MS_BIND,
            std::ptr::null(),
        ) == 0
    }
}

/// Whether process `pid` sees a mount at `path` (field 5, the mount point,
/// of `/proc/PID/mountinfo`; proc(5)). `false` when it can't be read.
pub fn has_mount_at(pid: i32, path: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .is_ok_and(|info| mounted_at(&info, path))
}

/// [`has_mount_at`]'s pure part.
fn mounted_at(mountinfo: &str, path: &str) -> bool {
    mountinfo.lines().any(|l| l.split(' ').nth(4) == Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_point_is_found_in_mountinfo() {
        let info = "22 27 0:21 / /proc rw,nosuid - proc proc rw\n\
                    301 22 0:25 /.mt-agent-kallsyms.7.0//deleted /proc/kallsyms rw - tmpfs tmpfs rw\n";
        assert!(mounted_at(info, "/proc/kallsyms"));
        assert!(!mounted_at(info, "/proc/modules"));
        assert!(has_mount_at(std::process::id() as i32, "/"));
    }
}
