//! Exit codes and the one-line failures that carry them.
//!
//! Every error a user can cause or meet is a [`Failure`]: one line that says
//! what is wrong and what to do, plus the documented exit code. Internal
//! errors travel as `anyhow::Error`; [`failure_of`] finds the `Failure`
//! inside (without one, the error is a runtime failure).

use std::fmt;

/// The process exit codes, as documented in the README.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitCode {
    /// A normal end: the target exited, a limit was reached, or SIGINT,
    /// SIGTERM or SIGHUP arrived.
    Ok = 0,
    /// Bad usage or input: unknown pid or symbol, bad option, unusable
    /// output directory.
    Usage = 2,
    /// The environment is missing something: privileges, perf, or kernel
    /// support.
    Environment = 3,
    /// A runtime failure: perf died, the disk is full.
    Runtime = 4,
    /// The run captured, but not everything reached the store (`--upload`):
    /// it refused (URL, credentials, bucket, quota) or uploads were pending
    /// at the end. The next agent on the same output root sends the rest.
    Uploads = 5,
}

/// A user-facing error: one line, plus optional detail lines (such as a
/// list of candidate symbols or perf's last stderr lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The exit code this failure ends the process with.
    pub code: ExitCode,
    /// What is wrong and what to do, on one line.
    pub message: String,
    /// Extra lines printed after the message, indented.
    pub detail: Vec<String>,
}

impl Failure {
    /// A failure with exit code 2 (bad usage or input).
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(ExitCode::Usage, message)
    }

    /// A failure with exit code 3 (the environment lacks something).
    pub fn environment(message: impl Into<String>) -> Self {
        Self::new(ExitCode::Environment, message)
    }

    /// A failure with exit code 4 (something broke while running).
    pub fn runtime(message: impl Into<String>) -> Self {
        Self::new(ExitCode::Runtime, message)
    }

    fn new(code: ExitCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            detail: Vec::new(),
        }
    }

    /// Adds detail lines shown under the message.
    pub fn with_detail(mut self, detail: impl IntoIterator<Item = String>) -> Self {
        self.detail.extend(detail);
        self
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// The first [`Failure`] in the error's chain, if any.
pub fn failure_of(err: &anyhow::Error) -> Option<&Failure> {
    err.chain().find_map(|e| e.downcast_ref::<Failure>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context as _;

    #[test]
    fn exit_code_is_found_through_context() {
        let err = anyhow::Error::from(Failure::usage("no such pid"));
        assert_eq!(failure_of(&err).map(|f| f.code), Some(ExitCode::Usage));
        let err = Err::<(), _>(Failure::environment("no perf"))
            .context("starting")
            .unwrap_err();
        assert_eq!(
            failure_of(&err).map(|f| f.code),
            Some(ExitCode::Environment)
        );
        assert!(failure_of(&anyhow::anyhow!("plain")).is_none());
    }

    #[test]
    fn exit_codes_are_the_documented_numbers() {
        assert_eq!(ExitCode::Ok as u8, 0);
        assert_eq!(ExitCode::Usage as u8, 2);
        assert_eq!(ExitCode::Environment as u8, 3);
        assert_eq!(ExitCode::Runtime as u8, 4);
        assert_eq!(ExitCode::Uploads as u8, 5);
    }
}
