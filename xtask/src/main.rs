//! `cargo xtask`: the project's tasks.
//!
//! * `setup [--with-test-deps]`: install what is missing (idempotent).
//! * `demo`: the main job on a bundled demo workload.
//! * `test [FILTER]`: setup, then every test (end-to-end ones one at a time).
//! * `dist`: the static musl release tarball, reproducibly.
//! * `bench [--quick] [--only PART]`: overhead, latency, storm and time to armed, as tables.
//! * `fuzz [--seconds N] [--seed S]`: malformed ELF files and names, for N seconds.
//! * `docs`: the README's option table, generated from the options' definitions, and
//!   BENCHMARKS.md's tables, from the bench runs committed in docs/bench/.
//! * `layout`: the layout rules of `agent/src` checked, and its figures.

mod bench;
mod demo;
mod dist;
mod docs;
mod fuzz;
mod layout;
mod setup;
mod test;
mod util;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "mt-agent's project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the toolchain pieces and system packages mt-agent needs.
    Setup {
        /// Also install what the tests build and trace.
        #[arg(long)]
        with_test_deps: bool,
    },
    /// Build in release mode and run mt-agent on the bundled demo workload.
    Demo,
    /// Benchmark mt-agent against the floor, perf's own trigger and a
    /// hardware breakpoint; tables on stdout, raw figures in target/bench/.
    Bench {
        /// A short run (under a minute) that exercises every part.
        #[arg(long)]
        quick: bool,
        /// Run one part: overhead, latency, storm, armed, waiting, stacks,
        /// report or switch.
        #[arg(long, value_name = "PART")]
        only: Option<String>,
    },
    /// Build the release tarball: static musl binary, systemd unit, DaemonSet.
    Dist {
        /// Build in this target directory (default: the workspace's).
        #[arg(long)]
        target_dir: Option<std::path::PathBuf>,
        /// Put the tarball and SHA256SUMS here (default: dist/).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Feed the agent's ELF, symbol, demangling and instruction-decoding
    /// code with mutated malformed ELF files for a while; panics are saved
    /// under target/fuzz/.
    Fuzz {
        /// How long to run, seconds.
        #[arg(long, default_value_t = 300)]
        seconds: u64,
        /// The RNG's seed; the same seed repeats the same inputs.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Generate the README's option table from the options' definitions, and
    /// BENCHMARKS.md's tables from the bench runs in docs/bench/.
    Docs,
    /// Check agent/src's layout (stages, import circles, `//!` lines) and
    /// that no file names a missing file; print the figures.
    Layout,
    /// The reproducibility check's two clean release builds, into DIR/a
    /// and DIR/b (run by `test`, in the background).
    #[command(hide = true)]
    ReleaseBuilds { dir: std::path::PathBuf },
    /// Run setup, then every test. End-to-end tests run as root (via sudo).
    Test {
        /// Skip setup (it is idempotent, but checks take a few seconds).
        #[arg(long)]
        no_setup: bool,
        /// Skip the release tests (two clean release builds, ~5 min of CPU here,
        /// in the background while the other tests run).
        #[arg(long)]
        skip_release: bool,
        /// Only end-to-end tests whose name contains this.
        filter: Vec<String>,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Setup { with_test_deps } => setup::setup(with_test_deps),
        Task::Demo => demo::demo(),
        Task::Test {
            no_setup,
            skip_release,
            filter,
        } => test::test(&filter, no_setup, skip_release),
        Task::Bench { quick, only } => bench::bench(quick, only.as_deref()),
        Task::Fuzz { seconds, seed } => fuzz::fuzz(seconds, seed),
        Task::Layout => layout::layout(),
        Task::Docs => docs::docs(),
        Task::ReleaseBuilds { dir } => test::release_builds(&dir),
        Task::Dist { target_dir, out } => {
            dist::dist(target_dir.as_deref(), out.as_deref()).map(|_| ())
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
