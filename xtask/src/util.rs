//! Running commands: plainly, or with `sudo` for the privileged steps when
//! we are not root.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};

/// Whether we run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A command that runs with root privileges: as is when we are root, else
/// through `sudo env K=V ... PROGRAM`. The variables are passed explicitly
/// (not `sudo --preserve-env`, which sudoers often refuse); sudo resets the
/// rest, HOME included, so nothing root-owned lands in the user's home.
pub fn privileged(
    program: impl AsRef<std::ffi::OsStr>,
    env: &[(&str, &std::ffi::OsStr)],
) -> Command {
    if is_root() {
        let mut c = Command::new(program);
        c.envs(env.iter().map(|(k, v)| (*k, *v)));
        c
    } else {
        let mut c = Command::new("sudo");
        c.arg("env");
        for (k, v) in env {
            let mut kv = std::ffi::OsString::from(format!("{k}="));
            kv.push(v);
            c.arg(kv);
        }
        c.arg(program);
        c
    }
}

/// The same as a cargo `runner` (a TOML array), for `cargo test --config`.
pub fn privileged_runner(env: &[(&str, &std::ffi::OsStr)]) -> String {
    let mut parts = vec!["sudo".to_string(), "env".to_string()];
    for (k, v) in env {
        parts.push(format!("{k}={}", v.to_string_lossy()));
    }
    let quoted: Vec<String> = parts.iter().map(|p| format!("{p:?}")).collect();
    format!(
        "target.x86_64-unknown-linux-gnu.runner=[{}]",
        quoted.join(",")
    )
}

/// Runs a command, echoing it; fails if it fails.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("xtask: $ {}", show(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("running {}", show(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", show(cmd));
    }
    Ok(())
}

/// Tests a `cargo test` run reported on its `test result:` lines.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TestCounts {
    pub passed: u64,
    pub ignored: u64,
    pub filtered_out: u64,
}

impl TestCounts {
    /// Adds one line of libtest's output if it is a `test result:` line
    /// (`test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 7
    /// filtered out; finished in 0.01s`).
    pub fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().skip_while(|w| w.ends_with('.'));
            let (Some(n), Some(what)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "ignored" => self.ignored += n,
                "filtered" => self.filtered_out += n,
                _ => {}
            }
        }
    }
}

/// Runs a `cargo test` command as [`run`] does, echoing its output, and
/// returns the tests its `test result:` lines count.
pub fn run_tests(cmd: &mut Command) -> anyhow::Result<TestCounts> {
    use std::io::{BufRead as _, Write as _};
    eprintln!("xtask: $ {}", show(cmd));
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", show(cmd)))?;
    let mut counts = TestCounts::default();
    let stdout = child.stdout.take().expect("piped stdout");
    let mut echo = std::io::stdout().lock();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.context("reading the test output")?;
        counts.add_line(&line);
        let _ = writeln!(echo, "{line}");
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("`{}` failed ({status})", show(cmd));
    }
    Ok(counts)
}

/// Runs a command quietly and returns its stdout, or None if it failed.
pub fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A command line for messages.
pub fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The workspace root (the parent of xtask/).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// cargo, as the one running us.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(workspace());
    c
}

/// The target directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"))
}

/// Whether a program is on PATH.
pub fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_result_lines_are_summed() {
        let mut c = TestCounts::default();
        for line in [
            "running 3 tests",
            "test a ... ok",
            "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 7 filtered out; finished in 0.01s",
            "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 12 filtered out; finished in 0.00s",
            "test something about test result: ok. 9 passed",
        ] {
            c.add_line(line);
        }
        assert_eq!(
            c,
            TestCounts {
                passed: 3,
                ignored: 1,
                filtered_out: 19
            }
        );
    }
}
