//! The extra `perf record` arguments a user passes after `--`: those that would break the agent, and whether they choose the unwinding.

/// Whether perf arguments passed after `--` choose the unwinding themselves
/// (`-g` alone or in a cluster, `--call-graph`, `--no-call-graph`).
pub fn pass_through_decides(perf_args: &[String]) -> bool {
    perf_args.iter().any(|a| {
        a.starts_with("--call-graph")
            || a.starts_with("--no-call-graph")
            || (a.starts_with('-') && !a.starts_with("--") && short_cluster_has_g(&a[1..]))
    })
}

/// `-g`, `-ag`, `-gT`: [`SHORT_FLAGS`] before the `g` (as
/// [`short_cluster_forbidden`] walks a cluster).
fn short_cluster_has_g(body: &str) -> bool {
    for c in body.chars() {
        if c == 'g' {
            return true;
        }
        if !SHORT_FLAGS.contains(c) {
            return false;
        }
    }
    false
}

/// perf options that would break the agent, with why. Matched against the
/// option name, with or without an attached value.
const FORBIDDEN_PERF_ARGS: &[(&str, &str)] = &[
    ("-q", "mt-agent reads perf's `Dump` lines on stderr"),
    ("--quiet", "mt-agent reads perf's `Dump` lines on stderr"),
    ("-o", "mt-agent sets the output; use --output"),
    ("--output", "mt-agent sets the output; use --output"),
    ("--threads", "perf disables --switch-output with --threads"),
    ("--switch-output", "mt-agent drives switch-output itself"),
    (
        "--switch-output-event",
        "mt-agent drives switch-output itself",
    ),
    ("--switch-max-files", "use --keep"),
    ("--control", "mt-agent uses perf's control fd"),
    ("-p", "mt-agent sets the target; use --pid"),
    ("--pid", "mt-agent sets the target; use --pid"),
    ("-t", "mt-agent records the whole target process"),
    ("--tid", "mt-agent records the whole target process"),
    ("-a", "system-wide recording is not what mt-agent snapshots"),
    (
        "--all-cpus",
        "system-wide recording is not what mt-agent snapshots",
    ),
];

/// Checks extra `perf record` arguments; returns the first one that would
/// break the agent, with the reason. perf's option parser
/// (tools/lib/subcmd/parse-options.c) also takes a unique prefix of a long
/// option (`--out=x` is `--output=x`) and clusters of short options
/// (`-gp 42` is `-g -p 42`), so both are checked.
pub fn check_perf_args(args: &[String]) -> Result<(), String> {
    for arg in args {
        let why = if let Some(long) = arg.strip_prefix("--") {
            let name = long.split('=').next().unwrap_or("");
            FORBIDDEN_PERF_ARGS.iter().find_map(|(opt, why)| {
                let opt = opt.strip_prefix("--")?;
                let hit = !name.is_empty()
                    && (opt.starts_with(name)
                        || (opt == "switch-output" && name.starts_with("switch-output")));
                hit.then_some(*why)
            })
        } else if let Some(body) = arg.strip_prefix('-') {
            short_cluster_forbidden(body)
        } else {
            None
        };
        if let Some(why) = why {
            return Err(format!("perf option `{arg}` is not allowed: {why}"));
        }
    }
    Ok(())
}

/// perf record's short options that take no value, so that another option
/// may follow them in one cluster (`-ag`).
const SHORT_FLAGS: &str = "aqgnvsTdPRBNbWi";

/// Walks a short-option cluster such as `ag` or `gp42`: flags in
/// [`SHORT_FLAGS`] may be followed by more options; any other letter takes
/// the rest of the cluster (or the next argument) as its value. Returns why
/// the first forbidden letter is refused.
fn short_cluster_forbidden(body: &str) -> Option<&'static str> {
    for c in body.chars() {
        let found = FORBIDDEN_PERF_ARGS
            .iter()
            .find(|(opt, _)| opt.len() == 2 && !opt.starts_with("--") && opt.ends_with(c));
        if let Some((_, why)) = found {
            return Some(why);
        }
        if !SHORT_FLAGS.contains(c) {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_args_that_break_the_agent_are_refused() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_perf_args(&s(&["--call-graph", "dwarf"])).is_ok());
        assert!(check_perf_args(&s(&["-e", "cycles", "-c", "1000"])).is_ok());
        assert!(check_perf_args(&s(&["--no-no-buildid"])).is_ok());
        // A value attached to an option that takes one is not a cluster.
        assert!(check_perf_args(&s(&["-ecycles", "-F99", "-gT"])).is_ok());
        assert!(check_perf_args(&s(&["--all-user", "--call-graph=dwarf"])).is_ok());
        for bad in [
            "-q",
            "--quiet",
            "-o",
            "-ofoo",
            "--output=x",
            "--threads",
            "--threads=2",
            "--switch-output=1M",
            "--switch-output-event=x",
            "--switch-max-files=3",
            "--control=fd:1,2",
            "-p",
            "-t",
            "-a",
            "-ag",
            "--all-cpus",
            "--pid=3",
            "-gp",
            "-go",
            "-gofile",
            "--out=x",
            "--thread",
            "--contr=fd:1,2",
            "--all-c",
        ] {
            assert!(
                check_perf_args(&s(&[bad])).is_err(),
                "{bad} should be refused"
            );
        }
    }
}
