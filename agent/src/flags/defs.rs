//! The options' definitions (clap): every option's name, value, default and help, the one source of `--help` and of the README's option table.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

use super::parse::{
    CallGraph, When, duration_text, parse_duration, parse_request, parse_size, parse_u64,
    parse_when, rate_text,
};

const ABOUT: &str = "Profile the moment a function is called: every accepted call of \
the trigger function makes `perf record` close its current snapshot file and start the next.";

const LONG_ABOUT: &str = "\
Profile the moment a function is called.

mt-agent runs `perf record --switch-output=signal` on a process and attaches an
eBPF uprobe to a trigger function in it. Each accepted call of the function, in
any thread of the process, makes perf close its current file (a snapshot of what
led up to the call) and open the next. The target is never stopped or ptraced,
and the probe stays attached, so one run captures many moments.

Filters run in the kernel, in this order: --tid, --when, --slower-than, --every,
--max-rate, --cooldown. A rejected call costs no wakeup and no userspace work.

Threads, forks and exec: a call in any thread of the target counts. With
--pid, a call in a process forked from the target after mt-agent attached
counts too, and switches the target's perf, which records that child already
(--no-follow-forks: only the target's own calls). If the target execs a new
image, the probe (bound to the old file) stops firing; mt-agent notices within
1 s, reports it, and ends.

Snapshots and OUT/snapshots.jsonl, which indexes them, go to --output.";

const AFTER_HELP: &str = "\
Exit codes:
  0  normal end (target exited, a limit was reached, SIGINT/SIGTERM/SIGHUP)
  2  bad usage or input (unknown pid or symbol, bad option, output directory)
  3  the environment is missing something (privileges, perf, kernel support)
  4  runtime failure (perf died, disk full, symbol resolution past its time budget)
  5  captured, but --upload is incomplete (the store refused, or uploads were pending at the end)

Examples:
  sudo mt-agent --pid 4242 --symbol handle_request
  sudo mt-agent --pid 4242 --symbol 'ns::Worker::handle' --when 'arg0 == 42'
  sudo mt-agent --pid 4242 --symbol sqlite3_step --object libsqlite3 --slower-than 5ms
  sudo mt-agent symbols --pid 4242 handle";

/// `mt-agent`: see [`LONG_ABOUT`].
#[derive(Debug, Parser)]
#[command(
    name = "mt-agent",
    version = crate::flags::version::SHORT,
    long_version = crate::flags::version::LONG,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands besides the default capture run.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the functions a process has mapped, with what a hit on each costs.
    Symbols(SymbolsArgs),
    /// Check that this host can run mt-agent (kernel, BPF, perf, privileges).
    Check(CheckArgs),
    /// Write a run's report: each hit's moment as flame graphs in one page.
    Report(ReportArgs),
    /// Print documentation generated from these definitions (for
    /// `cargo xtask docs`).
    #[command(hide = true)]
    Generate(GenerateArgs),
}

/// Options of the hidden `mt-agent generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// What to print.
    #[arg(value_enum)]
    pub what: Generated,
}

/// What `mt-agent generate` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Generated {
    /// The README's option table ([`super::doc::readme_options`]).
    ReadmeOptions,
}

/// Options of a capture run (the default command).
#[derive(Debug, Args)]
#[command(
    group = clap::ArgGroup::new("what").required(true).args(["pid", "exe", "config"]),
    // --pid and --exe (in `TriggerOptions`) come first in --help.
    next_display_order = 10
)]
pub struct RunArgs {
    /// With --exe: at most N processes recorded at once, across all
    /// triggers; more are counted and reported. [default: 8]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_targets: Option<u64>,

    /// Several triggers from a TOML file (GUIDE.md, "Deploying to a fleet");
    /// what the systemd unit runs. Trigger options (--symbol, --when, --cooldown, ...) go in
    /// the file; run options given here (--output, --event, --freq, --keep,
    /// --perf, --max-targets, --flight-recorder, --continuous,
    /// --flight-ring, --max-disk, extra perf arguments) override the file's.
    #[arg(long, value_name = "FILE", conflicts_with_all = trigger_option_ids())]
    pub config: Option<PathBuf>,

    #[command(flatten)]
    pub trigger: TriggerOptions,

    /// Stop after this long.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Output directory. Created mode 0700; an existing one must be empty,
    /// yours and not writable by others.
    /// [default: ./mt-agent-<pid or exe name>-<YYYYmmdd-HHMMSS>]
    #[arg(long, short = 'o', value_name = "DIR")]
    pub output: Option<PathBuf>,

    /// Print newline-delimited JSON events on stdout instead of text.
    #[arg(long)]
    pub json: bool,

    /// Forward the eBPF program's log records (aya-log), show perf's
    /// messages and print more detail.
    #[arg(long, short = 'v')]
    pub verbose: bool,

    /// Run the ring-buffer reader thread with SCHED_FIFO at this priority
    /// (1-99), to cut hit-to-signal latency on a busy host.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..=99))]
    pub rt_priority: Option<i32>,

    /// perf binary to run. [default: `perf` on PATH]
    #[arg(long, value_name = "PATH")]
    pub perf: Option<PathBuf>,

    /// perf event to sample. [default: `cycles` with a hardware PMU,
    /// else `cpu-clock`]
    #[arg(long, short = 'e', value_name = "EVENT")]
    pub event: Option<String>,

    /// Sampling frequency, in Hz; above the kernel's
    /// `kernel.perf_event_max_sample_rate` it is refused. [default: 999]
    #[arg(long, short = 'F', value_name = "HZ")]
    pub freq: Option<u32>,

    /// How perf unwinds stacks: `fp` (frame pointers), `dwarf[,SIZE]` (a
    /// copy of SIZE bytes of stack per sample, default 8192), or `auto`:
    /// `fp` when the traced code keeps frame pointers; else DWARF, its copy
    /// size measured on the running target first (0.5 s: the smallest
    /// size that keeps 99% of its samples whole once the report completes
    /// cut stacks, 1024 at least if a traced thread did not run), or 4096
    /// where nothing runs to measure. A call-graph option after `--` decides instead of
    /// `auto`. [default: auto]
    #[arg(long, value_name = "MODE", value_parser = parse_request)]
    pub call_graph: Option<CallGraph>,

    /// Let perf record BPF program events (its default). mt-agent passes
    /// --no-bpf-event otherwise: perf would rewrite every known BPF
    /// program's info into each snapshot, slowing every switch.
    #[arg(long)]
    pub perf_bpf_events: bool,

    /// Keep only the newest N snapshot files (perf's --switch-max-files).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub keep: Option<u32>,

    /// Keep samples in perf's flight recorder (--overwrite): nothing is
    /// written while waiting, and each snapshot holds what the rings held at
    /// the hit. [default for --exe and --config runs]
    #[arg(long, conflicts_with = "continuous")]
    pub flight_recorder: bool,

    /// Write every sample: each snapshot holds everything since the
    /// previous one. [default for --pid runs]
    #[arg(long)]
    pub continuous: bool,

    /// Size of each of perf's flight-recorder rings (one per CPU), e.g.
    /// 512K, 2M; rounded up to a power of two pages. [default: 2M, or 16M
    /// when stacks are unwound with DWARF]
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub flight_ring: Option<u64>,

    /// Keep at most this much in the output directory (e.g. 500M, 2G): the
    /// oldest snapshots are deleted first, and indexed as `deleted`.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_disk: Option<u64>,

    /// Upload each finished snapshot, its index line, run.json and the
    /// objects it maps to S3-compatible storage, e.g. s3://moments/prod
    /// (docs/upload.md). Credentials and endpoint come from the AWS
    /// variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
    /// AWS_ENDPOINT_URL, a web identity); plain HTTP needs AWS_ALLOW_HTTP=true.
    /// Uploads never hold up a hit; while the store is unreachable,
    /// snapshots wait in OUT within --max-disk.
    #[arg(long, value_name = "URL")]
    pub upload: Option<String>,

    /// With --upload: delete each snapshot locally once the store has
    /// confirmed it (by checksum), keeping only what is in flight.
    #[arg(long, requires = "upload")]
    pub upload_delete: bool,

    /// With --upload: how long the end of a run waits for pending uploads;
    /// what is left is said, and sent by the next agent on the same output
    /// root. [default: 30s]
    #[arg(long, value_name = "DURATION", requires = "upload", value_parser = parse_duration)]
    pub upload_wait: Option<Duration>,

    /// With --upload: this host's name in the store's keys.
    /// [default: the kernel's host name]
    #[arg(long, value_name = "NAME", requires = "upload")]
    pub upload_host: Option<String>,

    /// Size of the hit ring buffer in bytes (a power of two, at least one
    /// page). For tests.
    #[arg(long, hide = true, value_name = "BYTES")]
    pub ring_bytes: Option<u32>,

    /// Delay the ring-buffer reader by this long after arming. For tests
    /// that force ring-buffer overflow.
    #[arg(long, hide = true, value_name = "DURATION", value_parser = parse_duration)]
    pub debug_reader_delay: Option<Duration>,

    /// When the run ends, write its report (OUT/report.html), as
    /// `mt-agent report OUT` would, and print `report: PATH` (or a `report`
    /// JSON event).
    #[arg(long)]
    pub report: bool,

    /// Extra arguments for `perf record`, after `--`. Those that would break
    /// the agent (such as -q, -o, --threads, -p, -a) are refused.
    #[arg(last = true, value_name = "PERF_ARGS")]
    pub perf_args: Vec<String>,
}

/// Default of `--cooldown`, and of `cooldown` in a config file.
pub const DEFAULT_COOLDOWN: &str = "100ms";

/// One trigger's options, as written: on the command line (clap) and in a
/// config file's `[[trigger]]` (serde), with the same names. Durations and
/// rates stay text here (clap checks them as it parses); the session turns
/// them into values, with one error message for both sources. The field
/// order is the config file's; `display_order` keeps --help's.
#[derive(Debug, Default, PartialEq, Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerOptions {
    /// Config file only: the trigger's output subdirectory.
    #[arg(skip)]
    pub name: Option<String>,

    /// Process to trace (its thread-group id).
    #[arg(long, short = 'p', value_name = "PID", display_order = 0)]
    pub pid: Option<i32>,

    /// Trace every process, running now or started later, whose executable
    /// is PATH: one perf per process, in OUT/<pid>/.
    #[arg(long, value_name = "PATH", conflicts_with = "pid", display_order = 1)]
    pub exe: Option<PathBuf>,

    /// Trigger function: a plain, mangled or demangled name
    /// (`handle`, `ns::Worker::handle(int)`, `my_crate::server::handle`).
    #[arg(
        long,
        short = 's',
        value_name = "NAME",
        required_unless_present_any = ["address", "config"]
    )]
    pub symbol: Option<String>,

    /// Search only this mapped object: a path, or a file name such as
    /// `libsqlite3`. A PATH the process has not mapped yet is probed at
    /// once, in the file itself.
    #[arg(long, value_name = "PATH|NAME")]
    pub object: Option<String>,

    /// Probe this many bytes into the function; must be an instruction
    /// boundary.
    #[arg(long, value_name = "BYTES", value_parser = parse_u64)]
    pub offset: Option<u64>,

    /// Probe this virtual address in the target; must be an instruction
    /// boundary inside a known function.
    #[arg(long, value_name = "0xADDR", value_parser = parse_u64, conflicts_with = "offset")]
    #[serde(skip)]
    pub address: Option<u64>,

    /// Least time between two accepted hits. Hits sooner are counted and
    /// dropped in the kernel. 0 disables it. With --pid, the uprobes are
    /// taken out of the target's code while it runs (see --always-armed),
    /// but not with --slower-than, whose calls are timed from their entry.
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_COOLDOWN, value_parser = duration_text)]
    pub cooldown: Option<String>,

    /// Accept only calls whose arguments satisfy EXPR, e.g. `arg0 == 42`,
    /// `sarg1 < 0`, `arg2 & 0x4`. Repeatable; all must hold.
    #[arg(long = "when", value_name = "EXPR")]
    #[serde(default)]
    pub when: Vec<String>,

    /// Trigger at the return of calls that lasted at least DURATION. The
    /// returns are seen by uprobes on each `ret` instruction (~6 µs a call),
    /// or by a uretprobe (~1 µs) where mt-agent proves it harmless: a C
    /// process (no exceptions, Go, stack switching or dlopen)
    /// (docs/uprobe-cost.md).
    #[arg(long, value_name = "DURATION", value_parser = duration_text)]
    pub slower_than: Option<String>,

    /// With --slower-than: see returns with a uretprobe even where it is not
    /// proven harmless. Breaks C++ exception unwinding through the function;
    /// refused on Go binaries.
    #[arg(long, requires = "slower_than", conflicts_with = "probe_rets")]
    #[serde(default)]
    pub use_uretprobe: bool,

    /// With --slower-than: see returns with uprobes on each `ret`
    /// instruction even where a uretprobe is proven harmless.
    #[arg(long, requires = "slower_than")]
    #[serde(default)]
    pub probe_rets: bool,

    /// Keep the uprobes attached during cooldowns (and --max-rate
    /// intervals), so that `seen` counts every call. By default a `--pid`
    /// trigger's uprobes are detached from an accepted hit until its
    /// cooldown ends (a --slower-than trigger's stay in).
    #[arg(long)]
    #[serde(default)]
    pub always_armed: bool,

    /// Record where each hit's thread spent its time: on CPU, runnable
    /// (preempted, waiting for a CPU) or blocked, with the stacks it blocked
    /// at. On by default with --slower-than, where the window is the call;
    /// for other hits it is --off-cpu-window before the hit.
    #[arg(long, conflicts_with = "no_off_cpu")]
    #[serde(default)]
    pub off_cpu: bool,

    /// Turn the off-CPU breakdown off, also with --slower-than.
    #[arg(long)]
    #[serde(default)]
    pub no_off_cpu: bool,

    /// The off-CPU window before a hit that has no call duration. [default: 1s]
    #[arg(long, value_name = "DURATION", value_parser = duration_text)]
    pub off_cpu_window: Option<String>,

    /// With `--pid`, count only the target's own calls. By default a call
    /// in any process forked from the target after the agent attached
    /// counts too, and switches the target's perf, which records that
    /// child already.
    #[arg(long)]
    #[serde(default)]
    pub no_follow_forks: bool,

    /// Accept one hit in N (after the tid, when and duration filters).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub every: Option<u64>,

    /// Only hits in these threads (repeatable).
    #[arg(long = "tid", value_name = "TID")]
    #[serde(default, rename = "tid")]
    pub tids: Vec<u32>,

    /// Accept at most R hits per second (token bucket, burst 1), e.g. `10/s`.
    /// With --pid and a cooldown, the uprobes are out of the code for 1/R
    /// after a hit when that is longer than the cooldown.
    #[arg(long, value_name = "R/s", value_parser = rate_text)]
    pub max_rate: Option<String>,

    /// After an accepted hit, wait this long before closing the snapshot, so
    /// it also holds what the function did right after entry.
    #[arg(long, value_name = "DURATION", value_parser = duration_text)]
    pub after: Option<String>,

    /// Stop after this many hit snapshots.
    #[arg(long, value_name = "N")]
    pub max_snapshots: Option<u64>,

    /// If the symbol is not mapped yet (a library still to be dlopen'ed),
    /// poll the target's mappings for up to this long. A process younger
    /// than 1 s gets 1 s without it.
    // Listed after --address in --help (17 is --address's place).
    #[arg(long, value_name = "DURATION", value_parser = duration_text, display_order = 17)]
    pub wait_for_symbol: Option<String>,
}

/// Every trigger option's id: what `--config` conflicts with.
fn trigger_option_ids() -> Vec<clap::Id> {
    TriggerOptions::augment_args(clap::Command::new("trigger"))
        .get_arguments()
        .map(|a| a.get_id().clone())
        .collect()
}

/// Options of `mt-agent symbols`.
#[derive(Debug, Args)]
pub struct SymbolsArgs {
    /// Process whose mapped objects are listed.
    #[arg(long, short = 'p', value_name = "PID")]
    pub pid: i32,

    /// Only functions whose name (mangled or demangled) contains PATTERN.
    pub pattern: Option<String>,

    /// Search only this mapped object: a path, or a file name such as
    /// `libsqlite3`.
    #[arg(long, value_name = "PATH|NAME")]
    pub object: Option<String>,

    /// Print the listing as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Options of `mt-agent check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Also check that this process can be traced.
    #[arg(long, short = 'p', value_name = "PID")]
    pub pid: Option<i32>,

    /// perf binary to check. [default: `perf` on PATH]
    #[arg(long, value_name = "PATH")]
    pub perf: Option<PathBuf>,

    /// Directory whose free space is checked. [default: .]
    #[arg(long, short = 'o', value_name = "DIR")]
    pub output: Option<PathBuf>,

    /// Also check that this store can be written (s3://BUCKET/PREFIX, with
    /// the AWS variables --upload reads): an object is written, read back
    /// and deleted.
    #[arg(long, value_name = "URL")]
    pub upload: Option<String>,
}

/// Options of `mt-agent report`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// A run's output directory (with --exe or --config, its top directory:
    /// every process and trigger in it is reported), or s3://BUCKET/PREFIX,
    /// where --upload sent the runs of a fleet (a fleet report: give
    /// --output; GUIDE.md, "Reporting from the store").
    #[arg(value_name = "OUT")]
    pub out: PathBuf,

    /// Fleet report: the local directory the selected runs are fetched into
    /// (as DIR/<host>/<run>/, fetched objects kept in DIR/.store so that a
    /// later report fetches only what is new) and the page is written in.
    #[arg(long, short = 'o', value_name = "DIR")]
    pub output: Option<PathBuf>,

    /// Fleet report: only this host's runs (the host name --upload-host
    /// gave). Repeat for several hosts.
    #[arg(long, value_name = "HOST")]
    pub host: Vec<String>,

    /// Fleet report: only this trigger's snapshots: its function (--symbol)
    /// or, for a --config run, its directory name.
    #[arg(long, value_name = "NAME")]
    pub trigger: Option<String>,

    /// Fleet report: only moments at or after WHEN: a duration ago (1h, 30m)
    /// or an RFC 3339 time (2026-12-02T09:30:00Z), on each run's wall clock.
    #[arg(long, value_name = "WHEN", value_parser = parse_when)]
    pub since: Option<When>,

    /// Fleet report: only moments at or before WHEN (as --since).
    #[arg(long, value_name = "WHEN", value_parser = parse_when)]
    pub until: Option<When>,

    /// Fleet report: only hits whose call took at least this long (a
    /// --slower-than capture's duration_ns); snapshots without a timed hit
    /// are left out.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub slower_than: Option<Duration>,

    /// Print one JSON object per hit on stdout (OUT/report.html and the
    /// folded files are written too).
    #[arg(long)]
    pub json: bool,

    /// The moment of a hit without a duration: this long before the hit.
    /// (A --slower-than hit's moment is its call.)
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub window: Duration,

    /// perf binary to run. [default: `perf` on PATH]
    #[arg(long, value_name = "PATH")]
    pub perf: Option<PathBuf>,

    /// Also write pprof profiles (gzipped profile.proto, for `go tool pprof`,
    /// Pyroscope, Parca, Grafana): beside each folded file the same name with
    /// `.pb.gz`, and OUT/report/moments.pb.gz with every hit's moment; samples
    /// are labelled hit, tid, trigger and duration_ns (docs/pprof.md).
    #[arg(long)]
    pub pprof: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_requires_pid_and_symbol_but_subcommands_do_not() {
        assert!(Cli::try_parse_from(["mt-agent", "--pid", "1"]).is_err());
        assert!(Cli::try_parse_from(["mt-agent", "--symbol", "f"]).is_err());
        assert!(Cli::try_parse_from(["mt-agent", "--exe", "/bin/x", "--symbol", "f"]).is_ok());
        assert!(Cli::try_parse_from(["mt-agent", "--config", "x.toml"]).is_ok());
        assert!(Cli::try_parse_from(["mt-agent", "--config", "x.toml", "--pid", "1"]).is_err());
        assert!(
            Cli::try_parse_from(["mt-agent", "--config", "x.toml", "--cooldown", "1s"]).is_err()
        );
        assert!(
            Cli::try_parse_from(["mt-agent", "--config", "x.toml", "--when", "arg0 == 1"]).is_err()
        );
        assert!(
            Cli::try_parse_from(["mt-agent", "--config", "x.toml", "-o", "/tmp/x", "-F", "99"])
                .is_ok()
        );
        assert!(Cli::try_parse_from(["mt-agent", "--exe", "/x", "--pid", "1", "-s", "f"]).is_err());
        assert!(Cli::try_parse_from(["mt-agent", "--pid", "1", "--symbol", "f"]).is_ok());
        assert!(Cli::try_parse_from(["mt-agent", "check"]).is_ok());
        let cli = Cli::try_parse_from([
            "mt-agent",
            "-p",
            "1",
            "-s",
            "f",
            "--",
            "--call-graph",
            "dwarf",
        ])
        .unwrap();
        assert_eq!(cli.run.perf_args, ["--call-graph", "dwarf"]);
    }
}
