//! `mt-agent symbols --pid N [PATTERN]`: the functions a process has
//! mapped, with what a hit on each would cost.

use crate::{
    capture::target,
    error::{ExitCode, Failure},
    flags::defs::SymbolsArgs,
    symbols,
};

/// Prints the listing (a table, or JSON with `--json`).
pub fn run(args: &SymbolsArgs) -> anyhow::Result<ExitCode> {
    target::check(args.pid)?;
    let rows = symbols::list(args.pid, args.pattern.as_deref(), args.object.as_deref())?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::Ok);
    }
    if rows.is_empty() {
        return Err(Failure::usage(format!(
            "no function matches {:?} in pid {}; try a shorter pattern",
            args.pattern.as_deref().unwrap_or(""),
            args.pid
        ))
        .into());
    }
    println!(
        "{:<18} {:>7}  {:<40} {:<34} OBJECT",
        "ADDRESS", "SIZE", "FUNCTION", "HIT COST"
    );
    for r in &rows {
        let cost = r
            .cost
            .as_ref()
            .map(|c| c.describe())
            .unwrap_or_else(|| "?".into());
        let name = match r.kind {
            "ifunc" => format!("{} (IFUNC)", r.demangled),
            "ifunc resolver" => format!("{} (IFUNC resolver)", r.demangled),
            _ => r.demangled.clone(),
        };
        let mangled = if r.mangled != r.demangled {
            format!("  [{}]", r.mangled)
        } else {
            String::new()
        };
        println!(
            "{:<#18x} {:>7}  {:<40} {:<34} {}{mangled}",
            r.address,
            r.size,
            name,
            cost,
            r.object.display()
        );
    }
    Ok(ExitCode::Ok)
}
