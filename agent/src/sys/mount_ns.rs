//! A private mount namespace with one file bind-mounted over another, or a
//! fresh tmpfs holding given files, for a child between fork and exec; and
//! whether a process sees such a mount.

use std::ffi::CStr;

/// In the calling process (a child between fork and exec), or the calling
/// thread (unshare(2) gives the caller alone a mount namespace, with a
/// copy of its filesystem attributes): a mount
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

/// In the calling process (a child between fork and exec): a mount
/// namespace of its own, a slave of the parent's (as
/// [`bind_in_private_namespace`]), with a new tmpfs mounted on `dir` that
/// holds only `files` (absolute paths inside `dir`, and their contents).
/// The files exist in that tmpfs alone and go with the namespace: nothing
/// is left on any disk, whatever happens to the process. Returns whether
/// all of it is in place. Needs `CAP_SYS_ADMIN`.
///
/// Only async-signal-safe calls (no allocation: the paths and contents are
/// made before the fork): safe in `pre_exec`.
pub fn tmpfs_with_files(dir: &CStr, files: &[(std::ffi::CString, Vec<u8>)]) -> bool {
    // SAFETY: plain syscalls on NUL-terminated paths and owned buffers.
    unsafe {
        let none = std::ptr::null();
        if libc::unshare(libc::CLONE_NEWNS) == -1
            || libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_SLAVE,
                none.cast(),
            ) == -1
            || libc::mount(
                c"tmpfs".as_ptr(),
                dir.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=1777".as_ptr().cast(),
            ) == -1
        {
            return false;
        }
        files.iter().all(|(path, data)| {
            let fd = libc::open(
                path.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                0o644,
            );
            if fd == -1 {
                return false;
            }
            let mut done = 0;
            while done < data.len() {
                let n = libc::write(fd, data[done..].as_ptr().cast(), data.len() - done);
                if n <= 0 {
                    break;
                }
                done += n as usize;
            }
            libc::close(fd);
            done == data.len()
        })
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
