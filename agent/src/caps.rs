//! Privileges: which Linux capabilities mt-agent needs, and which it has.
//!
//! Measured on kernel 6.18: with CAP_BPF + CAP_PERFMON only,
//! `perf_event_open` for the uprobe PMU fails with EACCES; since the fix for
//! CVE-2025-38466 (also backported to 5.10, 5.15, 6.1, 6.6 and 6.12) it needs
//! CAP_SYS_ADMIN again. Reading another user's /proc/PID/maps, /proc/PID/root
//! and /proc/PID/exe, and `perf record -p` on it, need CAP_SYS_PTRACE.

use crate::error::Failure;

/// A capability mt-agent needs, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// Bit number (include/uapi/linux/capability.h).
    pub bit: u32,
    pub name: &'static str,
    pub why: &'static str,
}

/// The capability set mt-agent (and the perf it starts) needs.
pub const REQUIRED: &[Cap] = &[
    Cap {
        bit: 39,
        name: "CAP_BPF",
        why: "load eBPF programs and maps",
    },
    Cap {
        bit: 38,
        name: "CAP_PERFMON",
        why: "perf_event_open for perf record and the uprobe",
    },
    Cap {
        bit: 21,
        name: "CAP_SYS_ADMIN",
        why: "the uprobe PMU needs it since the fix for CVE-2025-38466",
    },
    Cap {
        bit: 19,
        name: "CAP_SYS_PTRACE",
        why: "read another user's /proc/PID/{maps,root,exe} and record it with perf -p",
    },
];

/// The capability names of [`REQUIRED`], comma-separated.
pub fn required_names() -> String {
    REQUIRED
        .iter()
        .map(|c| c.name)
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses a `CapEff:`-style hex mask.
pub fn parse_mask(hex: &str) -> Option<u64> {
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// This process's effective capabilities (from /proc/self/status).
pub fn effective() -> u64 {
    crate::target::status_field(std::process::id() as i32, "CapEff")
        .and_then(|v| parse_mask(&v))
        .unwrap_or(0)
}

/// The required capabilities missing from `mask`.
pub fn missing_from(mask: u64) -> Vec<Cap> {
    REQUIRED
        .iter()
        .copied()
        .filter(|c| mask & (1u64 << c.bit) == 0)
        .collect()
}

/// Fails (exit code 3) unless every required capability is effective.
pub fn check() -> Result<(), Failure> {
    let missing = missing_from(effective());
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|c| c.name).collect();
    Err(Failure::environment(format!(
        "missing privileges: {}; run as root (sudo mt-agent ...) or grant {} \
         (`mt-agent check` explains each)",
        names.join(", "),
        required_names()
    ))
    .with_detail(missing.iter().map(|c| format!("{}: {}", c.name, c.why))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        assert_eq!(parse_mask("000001ffffffffff"), Some(0x1ff_ffff_ffff));
        assert!(missing_from(0x1ff_ffff_ffff).is_empty());
        let only_bpf_perfmon = (1u64 << 39) | (1u64 << 38);
        let names: Vec<&str> = missing_from(only_bpf_perfmon)
            .iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["CAP_SYS_ADMIN", "CAP_SYS_PTRACE"]);
    }
}
