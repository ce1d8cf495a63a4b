//! The perf binary: finding it, checking that it is perf, and the command every perf run starts from.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use crate::error::Failure;

/// The environment perf runs with: everything else is cleared.
const PERF_PATH_ENV: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// The event sampled by default: `cycles` where a hardware PMU exists,
/// `cpu-clock` otherwise (VMs without a virtual PMU). A core PMU shows up as
/// `/sys/bus/event_source/devices/cpu` (or `cpu_core` on hybrid CPUs).
pub fn default_event() -> &'static str {
    if has_hardware_pmu() {
        "cycles"
    } else {
        "cpu-clock"
    }
}

/// Whether the kernel exposes a hardware (core) PMU.
pub fn has_hardware_pmu() -> bool {
    ["cpu", "cpu_core", "armv8_pmuv3_0"]
        .iter()
        .any(|d| Path::new("/sys/bus/event_source/devices").join(d).exists())
}

/// Finds the perf binary: `explicit` if given, else `perf` on PATH. Returns
/// an absolute, canonical path, so the same file is run every time.
///
/// Errors: exit code 3 when it is missing or not executable.
pub fn find_perf(explicit: Option<&Path>) -> Result<PathBuf, Failure> {
    let candidate = match explicit {
        Some(p) => p.to_path_buf(),
        None => std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .chain(["/usr/bin".into(), "/usr/sbin".into()])
            .map(|d| d.join("perf"))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                Failure::environment(
                    "perf not found on PATH; install it (Debian: apt install linux-perf) \
                     or pass --perf PATH",
                )
            })?,
    };
    let path = candidate.canonicalize().map_err(|e| {
        Failure::environment(format!(
            "perf binary {}: {e}; install perf (Debian: apt install linux-perf) or fix --perf",
            candidate.display()
        ))
    })?;
    let meta = std::fs::metadata(&path)
        .map_err(|e| Failure::environment(format!("perf binary {}: {e}", path.display())))?;
    use std::os::unix::fs::PermissionsExt as _;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(Failure::environment(format!(
            "{} is not an executable file; pass a working perf with --perf",
            path.display()
        )));
    }
    Ok(path)
}

/// A command that runs `perf` with the environment perf always gets:
/// everything cleared but [`PERF_PATH_ENV`].
pub fn command(perf: &Path) -> Command {
    let mut cmd = Command::new(perf);
    cmd.env_clear().env("PATH", PERF_PATH_ENV);
    cmd
}

/// perf's last non-blank line on stderr, trimmed: what a failed perf
/// command says of why ("" when it said nothing).
pub fn last_message(stderr: &str) -> &str {
    stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
}

/// Runs `perf version` and returns its version line, e.g. `perf version
/// 6.1.187`. Fails (exit code 3) when the binary does not behave like perf.
pub fn perf_version(perf: &Path) -> Result<String, Failure> {
    let out = command(perf)
        .arg("version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Failure::environment(format!("cannot run {}: {e}", perf.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().next().unwrap_or("").trim().to_string();
    if !out.status.success() || !line.starts_with("perf version") {
        return Err(Failure::environment(format!(
            "{} does not look like perf (`perf version` printed {:?}); \
             install linux-perf or pass a working --perf",
            perf.display(),
            if line.is_empty() {
                String::from_utf8_lossy(&out.stderr).trim().to_string()
            } else {
                line
            }
        )));
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_perf_is_an_environment_failure() {
        let err = find_perf(Some(Path::new("/nonexistent/perf"))).unwrap_err();
        assert_eq!(err.code, crate::error::ExitCode::Environment);
    }

    #[test]
    fn a_binary_that_is_not_perf_is_refused() {
        let err = perf_version(Path::new("/bin/true")).unwrap_err();
        assert!(
            err.message.contains("does not look like perf"),
            "{}",
            err.message
        );
    }
}
