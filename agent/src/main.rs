//! mt-agent: profile the moment a function is called.
//!
//! Modules, one concern each (no import circle: main → session → driver
//! → recorder → {snapshot, perf, index}, with output beside them):
//! * [`cli`]: options and their parsing, one trigger's options for both the
//!   command line and `--config`;
//! * [`config`]: `--config` files;
//! * [`plan`]: a run's plan, checked without system access;
//! * [`session`]: a capture run's setup and lifecycle (main thread, tokio);
//! * [`driver`]: the data path: ring buffer → recorders, exec events;
//! * [`recorder`]: one perf process, its state machine and index;
//! * [`end`]: how a recorder and a run end (pure);
//! * [`run`]: end reasons and outcomes, shared by driver, recorder, output;
//! * [`snapshot`]: the hit-to-snapshot state machine (pure);
//! * [`clock`]: reading CLOCK_MONOTONIC;
//! * [`counters`]: the kernel's counters and the table of drop reasons;
//! * [`perf`]: spawning and driving `perf record`;
//! * [`probe`]: loading and attaching the eBPF programs;
//! * [`symbols`]: finding the trigger in the target's mapped objects;
//! * [`symcache`]: the mapped objects kept by build-id in `OUT/.debug`;
//! * [`conditions`]: `--when` and the kernel's filter table;
//! * [`index`]: the output directory and `snapshots.jsonl`;
//! * [`output`]: the run's text and JSON events;
//! * [`target`], [`caps`]: the traced process and privileges;
//! * [`check`]: `mt-agent check`, the preflight;
//! * [`list`]: `mt-agent symbols`;
//! * [`unwind`]: frame pointers or DWARF: how perf unwinds stacks.
//! * [`report`]: `mt-agent report`, a run's moments as flame graphs.

mod armer;
mod btf;
mod budget;
mod caps;
mod check;
mod cli;
mod clock;
mod conditions;
mod config;
mod counters;
mod detacher;
mod disarm;
mod disk_budget;
mod driver;
mod end;
mod error;
mod index;
mod list;
mod offcpu;
mod output;
mod perf;
mod perf_data;
mod plan;
mod probe;
mod rawprobe;
mod reaper;
mod recorder;
mod report;
mod run;
mod safe_open;
mod session;
mod snapshot;
mod symbols;
mod symcache;
mod target;
mod unwind;
mod uprobe_events;
mod uprobe_switch;
mod version;
mod warmer;

use std::{sync::Arc, time::Instant};

use clap::Parser as _;

use crate::{
    cli::{Cli, Command},
    error::{Failure, failure_of},
    output::Reporter,
};

fn main() -> std::process::ExitCode {
    let started = Instant::now();
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Some(Command::Symbols(_) | Command::Check(_) | Command::Report(_))
    ) {
        default_sigpipe();
    }
    let (json, verbose) = match &cli.command {
        None => (cli.run.json, cli.run.verbose),
        Some(Command::Symbols(a)) => (a.json, false),
        Some(Command::Check(_)) => (false, false),
        Some(Command::Report(a)) => (a.json, false),
    };
    if verbose {
        // aya-log forwards the eBPF program's records through `log`.
        env_logger::Builder::new()
            .filter_level(log::LevelFilter::Debug)
            .format_timestamp_micros()
            .init();
    }
    let reporter = Arc::new(Reporter::new(json, verbose));
    let result = match cli.command {
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(session::run(cli.run, reporter.clone(), started))),
        Some(Command::Symbols(args)) => list::run(&args),
        Some(Command::Check(args)) => check::run(&args),
        Some(Command::Report(args)) => report::run(&args),
    };
    let code = match result {
        Ok(code) => code,
        Err(err) => {
            let failure = failure_of(&err)
                .cloned()
                .unwrap_or_else(|| Failure::runtime(format!("{err:#}")));
            reporter.error(&failure);
            failure.code
        }
    };
    std::process::ExitCode::from(code as u8)
}

/// Restores SIGPIPE's default action (Rust's runtime ignores it), for the
/// subcommands that print only after their work is done and have nothing
/// to clean up: when stdout's reader goes away (`mt-agent symbols | head
/// -1`), the kernel ends the process quietly, as it does `cat` or `grep`
/// (the shell shows status 141), instead of `println!` panicking on EPIPE.
/// The capture run keeps SIGPIPE ignored and treats EPIPE as an end request
/// (see `output::Reporter`): perf and the probes must be cleaned up.
fn default_sigpipe() {
    // SAFETY: called at start-up, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(test)]
mod tests {
    use crate::error::ExitCode;

    #[test]
    fn exit_codes_are_the_documented_numbers() {
        assert_eq!(ExitCode::Ok as u8, 0);
        assert_eq!(ExitCode::Usage as u8, 2);
        assert_eq!(ExitCode::Environment as u8, 3);
        assert_eq!(ExitCode::Runtime as u8, 4);
    }
}
