//! `mt-agent-fuzz SECONDS SEED CRASH_DIR`: the long mutation run that `cargo xtask fuzz` starts (a debug build, so that arithmetic overflow panics too).

use std::{path::PathBuf, process::ExitCode, time::Duration};

use mt_agent_fuzz::{SLOW, mutation_loop};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [secs, seed, crash_dir] = args.as_slice() else {
        eprintln!("usage: mt-agent-fuzz SECONDS SEED CRASH_DIR");
        return ExitCode::from(2);
    };
    let (Ok(secs), Ok(seed)) = (secs.parse::<u64>(), seed.parse::<u64>()) else {
        eprintln!("mt-agent-fuzz: SECONDS and SEED are whole numbers");
        return ExitCode::from(2);
    };
    let crash_dir = PathBuf::from(crash_dir);
    let f = mutation_loop(seed, Duration::from_secs(secs), &crash_dir);
    println!(
        "fuzz: seed {seed}, {secs} s, {} inputs, {} distinct panic(s), slowest input {:?}{}",
        f.iterations,
        f.panics.len(),
        f.slowest.0,
        f.slowest
            .1
            .as_ref()
            .map(|p| format!(" (saved: {})", p.display()))
            .unwrap_or_default()
    );
    for p in &f.panics {
        println!("  {p}");
    }
    if !f.panics.is_empty() || f.slowest.1.is_some() {
        eprintln!(
            "mt-agent-fuzz: inputs saved in {} (an input took over {SLOW:?}, or panicked)",
            crash_dir.display()
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
