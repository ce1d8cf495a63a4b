//! The traced process, checked before a run: a live user process that is not mt-agent itself.
//!
//! Only reads /proc ([`crate::sys::proc`]); never signals, stops or ptraces the target.

use std::{fs, io, path::PathBuf};

use crate::{
    error::Failure,
    sys::{
        caps,
        proc::{PF_KTHREAD, exe_id, stat},
    },
};

/// A process that may be traced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Thread-group id.
    pub pid: i32,
    /// Its executable as the process sees it (the /proc/PID/exe link text,
    /// which may end in ` (deleted)`).
    pub exe: PathBuf,
    /// (device, inode) of the running executable, through /proc/PID/exe.
    pub exe_id: (u64, u64),
    /// Short command name (/proc/PID/comm).
    pub comm: String,
}

/// Checks that `pid` names a process mt-agent may trace.
///
/// Errors (exit code 2): no such process, a zombie, a kernel thread, the
/// agent itself. Exit code 3 when /proc/PID/exe is not readable for lack of
/// privileges.
pub fn check(pid: i32) -> Result<Target, Failure> {
    if pid <= 0 {
        return Err(Failure::usage(format!(
            "--pid {pid} is not a process id; give the pid of a running process"
        )));
    }
    if pid as u32 == std::process::id() {
        return Err(Failure::usage(
            "--pid is mt-agent's own pid; give the pid of the process to trace",
        ));
    }
    let st = stat(pid).map_err(|_| {
        Failure::usage(format!(
            "no process with pid {pid}; check the pid (e.g. `pgrep -a NAME`)"
        ))
    })?;
    if st.state == 'Z' || st.state == 'X' {
        return Err(Failure::usage(format!(
            "pid {pid} is a zombie (it exited and waits for its parent); trace a live process"
        )));
    }
    if st.flags & PF_KTHREAD != 0 {
        return Err(Failure::usage(format!(
            "pid {pid} is a kernel thread, which has no user code to probe; give a user process"
        )));
    }
    let link = format!("/proc/{pid}/exe");
    let exe = fs::read_link(&link).map_err(|e| match e.kind() {
        io::ErrorKind::PermissionDenied => Failure::environment(exe_denied(
            &link,
            // SAFETY: geteuid has no preconditions.
            unsafe { libc::geteuid() } == 0,
            caps::has(caps::Capability::CAP_SYS_PTRACE),
        )),
        _ => Failure::usage(format!(
            "pid {pid} has no executable ({e}); give a user process"
        )),
    })?;
    let exe_id = exe_id(pid).ok_or_else(|| {
        Failure::usage(format!(
            "pid {pid} exited; give the pid of a running process"
        ))
    })?;
    let comm = fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Ok(Target {
        pid,
        exe,
        exe_id,
        comm,
    })
}

/// The refusal when `/proc/PID/exe` (`link`) cannot be read: what is
/// missing, from whether this process is root and holds `CAP_SYS_PTRACE`.
/// With the capability the kernel still refuses a process out of reach.
fn exe_denied(link: &str, root: bool, ptrace: bool) -> String {
    match (root, ptrace) {
        (_, true) => format!(
            "cannot read {link} (permission denied) although mt-agent holds CAP_SYS_PTRACE: \
             the process is out of its reach (in a parent user namespace, such as the host \
             outside this container, or refused by a security module); run the agent \
             where the process is"
        ),
        (true, false) => format!(
            "cannot read {link} (permission denied): mt-agent runs as root but without \
             CAP_SYS_PTRACE, which reading another process's executable needs; grant \
             CAP_SYS_PTRACE (docker: --cap-add SYS_PTRACE; systemd: AmbientCapabilities=)"
        ),
        (false, false) => format!(
            "cannot read {link} (permission denied); run as root or with CAP_SYS_PTRACE \
             (`mt-agent check` lists every capability needed)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_pid_kernel_threads_and_missing_pids_are_refused() {
        let me = std::process::id() as i32;
        assert!(check(me).unwrap_err().message.contains("own pid"));
        // kthreadd is pid 2 on Linux.
        assert!(check(2).unwrap_err().message.contains("kernel thread"));
        assert!(check(i32::MAX).unwrap_err().message.contains("no process"));
    }

    #[test]
    fn an_unreadable_exe_names_what_is_missing() {
        let l = "/proc/1/exe";
        let root_without = exe_denied(l, true, false);
        assert!(root_without.contains("runs as root but without CAP_SYS_PTRACE"));
        assert!(!root_without.contains("run as root"), "{root_without}");
        let out_of_reach = exe_denied(l, true, true);
        assert!(out_of_reach.contains("out of its reach"));
        assert!(!out_of_reach.contains("run as root"), "{out_of_reach}");
        assert!(exe_denied(l, false, false).contains("run as root or with CAP_SYS_PTRACE"));
        let caps = crate::sys::caps::missing_message(&["CAP_SYS_PTRACE"], true);
        assert!(!caps.contains("run as root"), "{caps}");
        assert!(
            crate::sys::caps::missing_message(&["CAP_SYS_ADMIN"], false).contains("run as root")
        );
    }
}
