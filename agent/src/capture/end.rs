//! How a recorder and a run end: the decisions, pure and unit-tested. The
//! recorder and the driver gather the facts; these functions say which end
//! reason and which failure (if any) the summary reports.

use crate::{capture::outcome::EndReason, error::Failure};

/// What is known about a recorder once its perf has exited.
#[derive(Debug, Clone)]
pub struct RecorderFacts<'a> {
    /// The traced process.
    pub tgid: i32,
    /// perf acked its first `ping` (it reached its main loop).
    pub perf_was_ready: bool,
    /// Why the recorder was asked to end, if it was.
    pub requested: Option<EndReason>,
    /// A failure recorded while it ran (the first one).
    pub failure: Option<Failure>,
    /// perf or the index hit a full file system.
    pub disk_full: bool,
    /// The target still runs.
    pub target_alive: bool,
    /// We ended perf: `stop` written, or SIGTERM/SIGKILL sent.
    pub we_ended_perf: bool,
    /// perf's exit status, described (`exit code 1`, `signal 9`).
    pub perf_exit: Option<String>,
    /// perf's last stderr lines.
    pub perf_lines: &'a [String],
}

/// Why a recorder ended and its failure, if any. In order: a target that
/// is gone ended it; a perf that exited before it was ready failed to start;
/// a full disk is a failure; a perf that exited by itself while the target
/// runs ended unexpectedly. A full disk is always the end reason.
pub fn recorder_end(f: RecorderFacts<'_>) -> (EndReason, Option<Failure>) {
    let mut reason = f.requested;
    let mut failure = f.failure;
    if !f.target_alive && reason.is_none() {
        reason = Some(EndReason::TargetExited);
    }
    let perf_detail = || f.perf_lines.iter().map(|l| format!("perf: {l}"));
    let how = || {
        f.perf_exit
            .clone()
            .unwrap_or_else(|| "unknown status".into())
    };
    if failure.is_none() {
        if !f.perf_was_ready && f.target_alive && reason.is_none() {
            failure = Some(perf_start_failure(&how(), f.perf_lines));
        } else if f.disk_full {
            failure = Some(Failure::runtime(
                "the output file system is full: perf could not write; completed snapshots are \
                 kept and listed",
            ));
        } else if f.target_alive && !f.we_ended_perf {
            failure = Some(
                Failure::runtime(format!(
                    "perf ended unexpectedly ({}) while the target (pid {}) still runs",
                    how(),
                    f.tgid
                ))
                .with_detail(perf_detail()),
            );
            reason = Some(EndReason::PerfEnded);
        }
    }
    if f.disk_full {
        reason = Some(EndReason::DiskFull);
        // perf's own words on the full disk, as for any runtime failure.
        if let Some(fl) = failure.as_mut().filter(|fl| fl.detail.is_empty()) {
            fl.detail.extend(perf_detail());
        }
    }
    (reason.unwrap_or(EndReason::PerfEnded), failure)
}

/// Why the run ended and its failure, if any. `stop` is what the run was
/// asked to end for (signal, `--duration`, a fatal failure); `fatal` a
/// failure of the run itself; `single` the end of the only recorder of a
/// `--pid` run, whose end is the run's. A stop for a reason other than a
/// failure wins; then the single recorder's reason; a run that failed is
/// not reported as "the target exited".
pub fn run_end(
    stop: Option<&EndReason>,
    fatal: Option<Failure>,
    single: Option<(&EndReason, Option<&Failure>)>,
) -> (EndReason, Option<Failure>) {
    let reason = match (stop, single) {
        (Some(r), _) if *r != EndReason::Failed => r.clone(),
        (_, Some((r, _))) => r.clone(),
        (Some(r), None) => r.clone(),
        (None, None) => EndReason::TargetExited,
    };
    let failure = fatal.or_else(|| single.and_then(|(_, f)| f.cloned()));
    if failure.is_some() && reason == EndReason::TargetExited {
        (EndReason::Failed, failure)
    } else {
        (reason, failure)
    }
}

/// The failure for a perf that exited before it was ready: bad arguments
/// (exit code 2), no permission to open perf events (3) or anything else
/// (4), with its last stderr lines. `how` is its exit status, described.
pub fn perf_start_failure(how: &str, lines: &[String]) -> Failure {
    let usage = lines.iter().any(|l| {
        l.contains("event syntax error")
            || l.contains("unknown tracepoint")
            || l.contains("Usage:")
            || l.contains("unknown option")
            || l.contains("unknown switch")
            || l.contains("invalid or unsupported event")
    });
    // perf's messages for EACCES/EPERM from perf_event_open
    // (tools/perf/util/evsel.c, evsel__open_strerror).
    let denied = lines.iter().find(|l| {
        l.contains("Permission denied")
            || l.contains("perf_event_paranoid")
            || l.contains("No permission")
    });
    let first = lines.first().cloned().unwrap_or_default();
    let detail = lines.iter().map(|l| format!("perf: {l}"));
    if let Some(why) = denied.filter(|_| !usage) {
        Failure::environment(format!(
            "perf may not open its events here ({how}): {why}; run as root or with \
             CAP_PERFMON/CAP_SYS_ADMIN, or lower kernel.perf_event_paranoid"
        ))
        .with_detail(detail)
    } else if usage {
        Failure::usage(format!(
            "perf rejected its arguments ({how}): {first}; fix --event or the extra perf arguments"
        ))
        .with_detail(detail)
    } else {
        Failure::runtime(format!(
            "perf exited at start ({how}); see its messages below"
        ))
        .with_detail(detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ExitCode;

    fn facts(lines: &[String]) -> RecorderFacts<'_> {
        RecorderFacts {
            tgid: 42,
            perf_was_ready: true,
            requested: None,
            failure: None,
            disk_full: false,
            target_alive: true,
            we_ended_perf: false,
            perf_exit: Some("exit code 1".into()),
            perf_lines: lines,
        }
    }

    fn failure_for(lines: &[&str]) -> Failure {
        let lines: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        perf_start_failure("exit code 255", &lines)
    }

    #[test]
    fn perf_start_failures_get_the_documented_exit_code() {
        let bad_event = failure_for(&["event syntax error: 'nosuch'", "Run 'perf list'"]);
        assert_eq!(bad_event.code, ExitCode::Usage);
        let denied = failure_for(&[
            "Error:",
            "Access to performance monitoring and observability operations is limited.",
            "perf_event_paranoid setting is 4:",
        ]);
        assert_eq!(denied.code, ExitCode::Environment);
        assert!(denied.message.contains("paranoid"), "{}", denied.message);
        let other = failure_for(&["failed to mmap with 12 (Cannot allocate memory)"]);
        assert_eq!(other.code, ExitCode::Runtime);
        assert_eq!(other.detail.len(), 1);
    }

    #[test]
    fn a_stop_we_asked_for_ends_without_failure() {
        let f = RecorderFacts {
            requested: Some(EndReason::Signal("SIGINT")),
            we_ended_perf: true,
            ..facts(&[])
        };
        let (reason, failure) = recorder_end(f);
        assert_eq!(reason, EndReason::Signal("SIGINT"));
        assert!(failure.is_none());
    }

    #[test]
    fn a_target_that_is_gone_ended_the_recording() {
        let f = RecorderFacts {
            target_alive: false,
            ..facts(&[])
        };
        assert_eq!(recorder_end(f), (EndReason::TargetExited, None));
    }

    #[test]
    fn perf_exiting_on_its_own_while_the_target_runs_is_a_failure() {
        let lines = vec!["something broke".to_string()];
        let (reason, failure) = recorder_end(facts(&lines));
        assert_eq!(reason, EndReason::PerfEnded);
        let failure = failure.unwrap();
        assert_eq!(failure.code, ExitCode::Runtime);
        assert!(
            failure.message.contains("exit code 1"),
            "{}",
            failure.message
        );
        assert!(failure.message.contains("pid 42"), "{}", failure.message);
        assert_eq!(failure.detail, ["perf: something broke"]);
    }

    #[test]
    fn perf_exiting_before_it_was_ready_failed_to_start() {
        let lines = vec!["event syntax error: 'x'".to_string()];
        let f = RecorderFacts {
            perf_was_ready: false,
            ..facts(&lines)
        };
        let (reason, failure) = recorder_end(f);
        assert_eq!(reason, EndReason::PerfEnded);
        assert_eq!(failure.unwrap().code, ExitCode::Usage);
    }

    #[test]
    fn a_full_disk_is_the_end_reason_and_a_failure_with_perfs_words() {
        let lines = vec!["No space left on device".to_string()];
        let f = RecorderFacts {
            requested: Some(EndReason::Duration),
            we_ended_perf: true,
            disk_full: true,
            ..facts(&lines)
        };
        let (reason, failure) = recorder_end(f);
        assert_eq!(reason, EndReason::DiskFull);
        let failure = failure.unwrap();
        assert!(failure.message.contains("full"), "{}", failure.message);
        assert_eq!(failure.detail, ["perf: No space left on device"]);
    }

    #[test]
    fn the_first_recorded_failure_is_kept() {
        let f = RecorderFacts {
            requested: Some(EndReason::Failed),
            failure: Some(Failure::runtime("writing the index: EIO")),
            ..facts(&[])
        };
        let (reason, failure) = recorder_end(f);
        assert_eq!(reason, EndReason::Failed);
        assert_eq!(failure.unwrap().message, "writing the index: EIO");
    }

    #[test]
    fn a_run_stopped_by_a_signal_ends_for_the_signal() {
        let sigterm = EndReason::Signal("SIGTERM");
        let single = (&EndReason::TargetExited, None);
        assert_eq!(
            run_end(Some(&sigterm), None, Some(single)),
            (sigterm.clone(), None)
        );
    }

    #[test]
    fn a_pid_run_ends_as_its_recorder_did() {
        let perf_died = Failure::runtime("perf ended unexpectedly");
        let (reason, failure) = run_end(
            Some(&EndReason::Failed),
            None,
            Some((&EndReason::PerfEnded, Some(&perf_died))),
        );
        assert_eq!(reason, EndReason::PerfEnded);
        assert_eq!(failure.unwrap().message, perf_died.message);
    }

    #[test]
    fn a_run_failure_wins_over_the_recorders() {
        let fatal = Failure::runtime("epoll_wait: EBADF");
        let theirs = Failure::runtime("perf ended unexpectedly");
        let (_, failure) = run_end(
            Some(&EndReason::Failed),
            Some(fatal.clone()),
            Some((&EndReason::PerfEnded, Some(&theirs))),
        );
        assert_eq!(failure.unwrap().message, fatal.message);
    }

    #[test]
    fn a_failed_run_is_not_reported_as_the_target_exiting() {
        let fatal = Failure::runtime("attaching failed");
        let (reason, _) = run_end(None, Some(fatal), Some((&EndReason::TargetExited, None)));
        assert_eq!(reason, EndReason::Failed);
        assert_eq!(run_end(None, None, None), (EndReason::TargetExited, None));
    }
}
