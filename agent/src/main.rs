//! The `mt-agent` binary: parses the command line and hands it to its subcommand.

use std::{sync::Arc, time::Instant};

use clap::Parser as _;

use mt_agent::{
    commands,
    error::ExitCode,
    error::{Failure, failure_of},
    flags::{
        self,
        defs::{Cli, Command, Generated},
    },
    output::events::Printer,
};

/// Makes glibc's malloc map every buffer of 1 MiB or more on its own and
/// unmap it when freed. By default it raises that threshold to the size of
/// each such buffer freed (up to 32 MiB), after which the symbol tables'
/// string tables (7.5 MB for node) and the kernel's BTF stay in the heap of
/// the thread that read them once freed, and add up in the peak RSS
/// (docs/symbol-lookup.md, "Memory"). musl's malloc returns large buffers
/// by itself.
fn return_large_buffers() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a malloc parameter; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

fn main() -> std::process::ExitCode {
    let started = Instant::now();
    return_large_buffers();
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Some(Command::Symbols(_) | Command::Check(_) | Command::Report(_) | Command::Generate(_))
    ) {
        default_sigpipe();
    }
    let (json, verbose) = match &cli.command {
        None => (cli.run.json, cli.run.verbose),
        Some(Command::Symbols(a)) => (a.json, false),
        Some(Command::Check(_) | Command::Generate(_)) => (false, false),
        Some(Command::Report(a)) => (a.json, false),
    };
    if verbose {
        // aya-log forwards the eBPF program's records through `log`.
        env_logger::Builder::new()
            .filter_level(log::LevelFilter::Debug)
            .format_timestamp_micros()
            .init();
    }
    let printer = Arc::new(Printer::new(json, verbose));
    let result = match cli.command {
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(commands::run::run(cli.run, printer.clone(), started))),
        Some(Command::Symbols(args)) => commands::symbols::run(&args),
        Some(Command::Check(args)) => commands::check::run(&args),
        Some(Command::Report(args)) => commands::report::run(&args),
        Some(Command::Generate(args)) => Ok(generate(args.what)),
    };
    let code = match result {
        Ok(code) => code,
        Err(err) => {
            let failure = failure_of(&err)
                .cloned()
                .unwrap_or_else(|| Failure::runtime(format!("{err:#}")));
            printer.error(&failure);
            failure.code
        }
    };
    std::process::ExitCode::from(code as u8)
}

/// `mt-agent generate`: documentation from the options' definitions.
fn generate(what: Generated) -> ExitCode {
    match what {
        Generated::ReadmeOptions => print!("{}", flags::doc::readme_options()),
    }
    ExitCode::Ok
}

/// Restores SIGPIPE's default action (Rust's runtime ignores it), for the
/// subcommands that print only after their work is done and have nothing
/// to clean up: when stdout's reader goes away (`mt-agent symbols | head
/// -1`), the kernel ends the process quietly, as it does `cat` or `grep`
/// (the shell shows status 141), instead of `println!` panicking on EPIPE.
/// The capture run keeps SIGPIPE ignored and treats EPIPE as an end request
/// (see `output::Printer`): perf and the probes must be cleaned up.
fn default_sigpipe() {
    // SAFETY: called at start-up, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
