//! `mt-agent report`: a run's output directory (the report stage's own
//! `report::run`), or `s3://BUCKET/PREFIX`, the fleet report
//! (`report::fleet`). The fleet report's options are refused for a local
//! directory.

use crate::{
    error::{ExitCode, Failure},
    flags::defs::ReportArgs,
    report,
};

/// Runs the report `args.out` names.
pub fn run(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    if report::fleet::is_store(&args.out) {
        return report::fleet::run(args);
    }
    let fleet_only = [
        ("--output", args.output.is_some()),
        ("--host", !args.host.is_empty()),
        ("--trigger", args.trigger.is_some()),
        ("--since", args.since.is_some()),
        ("--until", args.until.is_some()),
        ("--slower-than", args.slower_than.is_some()),
    ];
    if let Some((flag, _)) = fleet_only.iter().find(|(_, given)| *given) {
        return Err(Failure::usage(format!(
            "{flag} is for a fleet report (report s3://BUCKET/PREFIX --output DIR); a local \
             report writes its page in {}",
            args.out.display()
        ))
        .into());
    }
    report::run(args)
}
