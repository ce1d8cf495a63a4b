//! Privileges: which Linux capabilities mt-agent needs, and which it has.
//!
//! Measured on kernel 6.18, running as `nobody` against another user's
//! process, dropping one capability at a time:
//! * without CAP_SYS_ADMIN, `perf_event_open` for the uprobe PMU fails with
//!   EACCES: since the fix for CVE-2025-38466 (also backported to 5.10,
//!   5.15, 6.1, 6.6 and 6.12) the uprobe PMU needs CAP_SYS_ADMIN again;
//! * without CAP_SYS_PTRACE, /proc/PID/exe of the target cannot be read;
//! * CAP_BPF and CAP_PERFMON can be dropped: the kernel's `bpf_capable()` and
//!   `perfmon_capable()` accept CAP_SYS_ADMIN in their place.
//!
//! So the least set is CAP_SYS_ADMIN, plus CAP_SYS_PTRACE when the target
//! belongs to another user. perf, which mt-agent starts, needs the same and
//! gets them as ambient capabilities across `execve` ([`raise_ambient`]).

use caps::CapSet;
pub use caps::Capability;

use crate::error::Failure;

/// One privilege requirement: any of `caps` satisfies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirement {
    /// Name for messages (the preferred capability).
    pub name: &'static str,
    /// Any of these satisfies it.
    pub caps: &'static [Capability],
    /// Why it is needed.
    pub why: &'static str,
    /// Only needed when the target belongs to another user.
    pub other_users_only: bool,
}

/// What mt-agent (and the perf it starts) needs.
pub const REQUIREMENTS: &[Requirement] = &[
    Requirement {
        name: "CAP_SYS_ADMIN",
        caps: &[Capability::CAP_SYS_ADMIN],
        why: "perf_event_open for the uprobe PMU needs it since the fix for CVE-2025-38466; \
              it also covers CAP_BPF and CAP_PERFMON",
        other_users_only: false,
    },
    Requirement {
        name: "CAP_BPF",
        caps: &[Capability::CAP_BPF, Capability::CAP_SYS_ADMIN],
        why: "load the eBPF programs and maps (CAP_SYS_ADMIN also grants it)",
        other_users_only: false,
    },
    Requirement {
        name: "CAP_PERFMON",
        caps: &[Capability::CAP_PERFMON, Capability::CAP_SYS_ADMIN],
        why: "perf_event_open for perf record (CAP_SYS_ADMIN also grants it)",
        other_users_only: false,
    },
    Requirement {
        name: "CAP_SYS_PTRACE",
        caps: &[Capability::CAP_SYS_PTRACE],
        why: "read another user's /proc/PID/{maps,root,exe} and record it with perf -p",
        other_users_only: true,
    },
];

/// The least capability set, as systemd and setpriv spell it.
pub const LEAST_SET: &str = "CAP_SYS_ADMIN CAP_SYS_PTRACE";

/// Whether `have` satisfies `r`.
fn satisfied(r: &Requirement, have: &dyn Fn(Capability) -> bool) -> bool {
    r.caps.iter().any(|c| have(*c))
}

/// The requirements `have` does not meet, for a target that is (or is not)
/// another user's.
pub fn missing(have: &dyn Fn(Capability) -> bool, other_user: bool) -> Vec<Requirement> {
    REQUIREMENTS
        .iter()
        .copied()
        .filter(|r| (other_user || !r.other_users_only) && !satisfied(r, have))
        .collect()
}

/// Whether this process has `cap` in its effective set.
pub fn has(cap: Capability) -> bool {
    caps::has_cap(None, CapSet::Effective, cap).unwrap_or(false)
}

/// Whether this process holds CAP_PERFMON or CAP_SYS_ADMIN: what the
/// kernel's `perfmon_capable()` asks, and what lets perf ignore
/// perf_event_paranoid.
pub fn perfmon_capable() -> bool {
    has(Capability::CAP_PERFMON) || has(Capability::CAP_SYS_ADMIN)
}

/// The uid that owns a process (the real uid in /proc/PID/status).
pub fn owner(pid: i32) -> Option<u32> {
    crate::sys::proc::status_field(pid, "Uid")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Fails (exit code 3) unless this process can trace `pid`.
pub fn check(pid: Option<i32>) -> Result<(), Failure> {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let other_user = pid.and_then(owner).is_some_and(|uid| uid != euid);
    let missing = missing(&has, other_user);
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|r| r.name).collect();
    Err(Failure::environment(missing_message(&names, euid == 0))
        .with_detail(missing.iter().map(|r| format!("{}: {}", r.name, r.why))))
}

/// The refusal for missing capabilities `names`. Root that lacks them had
/// them dropped (a container, a service's `CapabilityBoundingSet=`):
/// "run as root" would not help, granting them does.
pub fn missing_message(names: &[&str], root: bool) -> String {
    let names = names.join(", ");
    if root {
        format!(
            "missing privileges: mt-agent runs as root but without {names} (dropped from its \
             capability set, as containers and services do); grant {names} (docker: \
             --cap-add; systemd: AmbientCapabilities=) (`mt-agent check` explains each)"
        )
    } else {
        format!(
            "missing privileges: {names}; run as root (sudo mt-agent ...), or grant \
             {LEAST_SET} (`mt-agent check` explains each)"
        )
    }
}

/// Raises every needed capability this process holds into its inheritable
/// and ambient sets, so that perf, started with `execve`, has them too
/// (ambient capabilities survive `execve` of a binary without file
/// capabilities). A no-op for root, whose perf gets full privileges anyway.
pub fn raise_ambient() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return;
    }
    for cap in [
        Capability::CAP_SYS_ADMIN,
        Capability::CAP_BPF,
        Capability::CAP_PERFMON,
        Capability::CAP_SYS_PTRACE,
    ] {
        if caps::has_cap(None, CapSet::Permitted, cap).unwrap_or(false) {
            let _ = caps::raise(None, CapSet::Inheritable, cap);
            let _ = caps::raise(None, CapSet::Ambient, cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[Requirement]) -> Vec<&str> {
        v.iter().map(|r| r.name).collect()
    }

    #[test]
    fn sys_admin_covers_bpf_and_perfmon() {
        let only = |set: &'static [Capability]| move |c: Capability| set.contains(&c);
        let admin = only(&[Capability::CAP_SYS_ADMIN]);
        assert!(missing(&admin, false).is_empty());
        assert_eq!(names(&missing(&admin, true)), ["CAP_SYS_PTRACE"]);
        let bpf_perfmon = only(&[Capability::CAP_BPF, Capability::CAP_PERFMON]);
        assert_eq!(names(&missing(&bpf_perfmon, false)), ["CAP_SYS_ADMIN"]);
        let none = only(&[]);
        assert_eq!(
            names(&missing(&none, true)),
            ["CAP_SYS_ADMIN", "CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE"]
        );
    }
}
