//! A capture run: checks the input, finds each trigger, loads the probes,
//! then runs the lifecycle loop on the main thread (tokio): signals and
//! `--duration`. The data path is the driver thread ([`crate::driver`]).
//!
//! Three shapes of run, one code path:
//! * `--pid N --symbol f`: one trigger, one recorder writing into OUT;
//! * `--exe PATH --symbol f`: one trigger, a recorder per process in OUT/<pid>;
//! * `--config FILE`: several triggers, in OUT/<local time>/<name>[/<pid>].

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use agent_common::DEFAULT_RING_BYTES;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc::unbounded_channel,
    time::sleep_until,
};

use crate::{
    caps, check,
    cli::{RunArgs, check_perf_args},
    conditions::{Filters, trigger_config},
    config,
    driver::{self, Command, Event, Setup, TriggerSetup, Watch},
    error::{ExitCode, Failure},
    index::{self, OutputDir},
    output::{Armed, Reporter, Summary},
    perf::{self, PerfSpec},
    probe::{AttachPlan, LoadOptions, Probes, Returns},
    recorder::EndReason,
    symbols::{self, Query, Resolution, insn},
    target,
    trigger::Policy,
};

/// perf's sampling frequency unless told otherwise, Hz.
const DEFAULT_FREQ: u32 = 999;
/// `--max-targets` unless told otherwise.
const DEFAULT_MAX_TARGETS: u64 = 8;

/// What one trigger watches, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
enum WatchArg {
    Pid(i32),
    Exe(PathBuf),
}

/// One trigger, as given on the command line or in a config file.
#[derive(Debug, Clone)]
struct TriggerArgs {
    name: String,
    watch: WatchArg,
    query: Query,
    wait_for_symbol: Option<Duration>,
    filters: Filters,
    use_uretprobe: bool,
    after: Option<Duration>,
    max_snapshots: Option<u64>,
}

/// Settings shared by every trigger of a run.
struct RunSettings {
    output: Option<PathBuf>,
    /// Write each run into a new `<output>/<local time>/` (config runs, so
    /// that a restarted service never meets its previous output).
    dated_output: bool,
    perf: Option<PathBuf>,
    event: Option<String>,
    freq: u32,
    keep: Option<u32>,
    perf_args: Vec<String>,
    max_targets: u64,
}

fn from_cli(args: &RunArgs) -> (RunSettings, Vec<TriggerArgs>) {
    let watch = match (&args.pid, &args.exe) {
        (Some(pid), _) => WatchArg::Pid(*pid),
        (None, Some(exe)) => WatchArg::Exe(exe.clone()),
        (None, None) => unreachable!("clap requires --pid, --exe or --config"),
    };
    let t = TriggerArgs {
        name: "trigger0".into(),
        watch,
        query: Query {
            symbol: args.symbol.clone(),
            object: args.object.clone(),
            offset: args.offset,
            address: args.address,
        },
        wait_for_symbol: args.wait_for_symbol,
        filters: Filters {
            tids: args.tids.clone(),
            when: args.when.clone(),
            slower_than: args.slower_than,
            every: args.every,
            max_rate: args.max_rate,
            cooldown: args.cooldown,
        },
        use_uretprobe: args.use_uretprobe,
        after: args.after,
        max_snapshots: args.max_snapshots,
    };
    let s = RunSettings {
        output: args.output.clone(),
        dated_output: false,
        perf: args.perf.clone(),
        event: args.event.clone(),
        freq: args.freq.unwrap_or(DEFAULT_FREQ),
        keep: args.keep,
        perf_args: args.perf_args.clone(),
        max_targets: args.max_targets.unwrap_or(DEFAULT_MAX_TARGETS),
    };
    (s, vec![t])
}

fn from_config(path: &Path, args: &RunArgs) -> Result<(RunSettings, Vec<TriggerArgs>), Failure> {
    let c = config::load(path)?;
    let mut triggers = Vec::new();
    for t in &c.triggers {
        let watch = match (&t.pid, &t.exe) {
            (Some(pid), _) => WatchArg::Pid(*pid),
            (None, Some(exe)) => WatchArg::Exe(exe.clone()),
            (None, None) => unreachable!("config::parse checks"),
        };
        triggers.push(TriggerArgs {
            name: t.name.clone().unwrap_or_default(),
            watch,
            query: Query {
                symbol: t.symbol.clone(),
                object: t.object.clone(),
                offset: t.offset,
                address: None,
            },
            wait_for_symbol: t.duration("wait_for_symbol", &t.wait_for_symbol)?,
            filters: Filters {
                tids: t.tid.clone(),
                when: t.when.clone(),
                slower_than: t.duration("slower_than", &t.slower_than)?,
                every: t.every,
                max_rate: t.rate()?,
                cooldown: t
                    .duration("cooldown", &t.cooldown)?
                    .unwrap_or(Duration::from_millis(100)),
            },
            use_uretprobe: t.use_uretprobe,
            after: t.duration("after", &t.after)?,
            max_snapshots: t.max_snapshots,
        });
    }
    let s = RunSettings {
        // What the command line says wins over the file.
        output: args.output.clone().or(c.output),
        dated_output: true,
        perf: args.perf.clone().or(c.perf),
        event: args.event.clone().or(c.event),
        freq: args.freq.or(c.freq).unwrap_or(DEFAULT_FREQ),
        keep: args.keep.or(c.keep),
        perf_args: if args.perf_args.is_empty() {
            c.perf_args
        } else {
            args.perf_args.clone()
        },
        max_targets: args
            .max_targets
            .or(c.max_targets)
            .unwrap_or(DEFAULT_MAX_TARGETS),
    };
    Ok((s, triggers))
}

/// Runs a capture; returns the exit code.
pub async fn run(
    args: RunArgs,
    reporter: Arc<Reporter>,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    let (settings, triggers) = match &args.config {
        Some(path) => from_config(path, &args)?,
        None => from_cli(&args),
    };
    // Input that needs no system access first.
    check_perf_args(&settings.perf_args).map_err(Failure::usage)?;
    let ring_bytes = args.ring_bytes.unwrap_or(DEFAULT_RING_BYTES);
    if !ring_bytes.is_power_of_two() || ring_bytes < 4096 {
        return Err(Failure::usage("--ring-bytes must be a power of two of at least 4096").into());
    }
    for t in &triggers {
        trigger_config(&t.filters, false)?;
    }
    let (release, version) = check::kernel_version();
    if version < check::MIN_KERNEL {
        return Err(Failure::environment(format!(
            "kernel {release} is too old: mt-agent needs Linux 5.15 or later (BPF ring buffer, \
             uprobe attach cookies); `mt-agent check` lists what else is missing"
        ))
        .into());
    }
    for t in &triggers {
        match &t.watch {
            WatchArg::Pid(pid) => caps::check(Some(*pid))?,
            WatchArg::Exe(_) => caps::check(None)?,
        }
    }
    let stage = |what: &str| {
        reporter.verbose(&format!(
            "{:.1} ms: {what}",
            started.elapsed().as_secs_f64() * 1e3
        ))
    };
    let perf_path = perf::find_perf(settings.perf.as_deref())?;
    // `perf version` (~30 ms: perf's own start-up) runs while the triggers
    // are resolved and perf record starts; the loader thread joins it, so a
    // binary that is not perf is refused (exit 3) before anything attaches.
    let version = {
        let p = perf_path.clone();
        std::thread::spawn(move || perf::perf_version(&p))
    };

    // Resolve every trigger before creating anything.
    let mut resolved = Vec::new();
    for t in &triggers {
        let (res, watch) = match &t.watch {
            WatchArg::Pid(pid) => {
                target::check(*pid)?;
                (
                    symbols::resolve_waiting(*pid, &t.query, t.wait_for_symbol)?,
                    Watch::Pid(*pid),
                )
            }
            WatchArg::Exe(path) => {
                let id = exe_identity(path)?;
                let res = symbols::resolve_file(path, &t.query)?;
                (
                    res,
                    Watch::Exe {
                        path: path.clone(),
                        id,
                    },
                )
            }
        };
        for note in &res.notes {
            reporter.warning(note);
        }
        let returns = plan_returns(t, &res, &reporter)?;
        let mut cfg = trigger_config(&t.filters, res.is_go)?;
        if matches!(watch, Watch::Exe { .. }) {
            // Many processes fire this trigger: each keeps its own cooldown,
            // rate and count.
            cfg.flags |= agent_common::CFG_PER_PROCESS;
        }
        resolved.push((res, watch, returns, cfg));
    }

    // Output directories.
    let single = args.config.is_none() && matches!(triggers[0].watch, WatchArg::Pid(_));
    let base = match &settings.output {
        Some(o) if settings.dated_output => o.join(index::local_timestamp()),
        Some(o) => o.clone(),
        None => index::default_output_dir(&match &triggers[0].watch {
            WatchArg::Pid(pid) => pid.to_string(),
            WatchArg::Exe(p) => p
                .file_name()
                .map_or("exe".into(), |n| n.to_string_lossy().into_owned()),
        }),
    };
    // Checked (and created) now, so a bad --output fails before perf runs;
    // tidied away on drop if nothing is written into it.
    let base_dir = OutputDir::prepare(&base)?;
    stage("triggers resolved, output ready");

    // The eBPF programs load (the verifier) on a thread of their own, while
    // the driver starts perf: the two take ~100 ms and ~250 ms here.
    let configs: Vec<_> = resolved.iter().map(|(_, _, _, cfg)| *cfg).collect();
    let load = LoadOptions {
        ring_bytes,
        verbose: args.verbose,
        returns: resolved
            .iter()
            .any(|(_, _, r, _)| matches!(r, Some(Returns::RetInstructions(_)))),
        uretprobe: resolved
            .iter()
            .any(|(_, _, r, _)| matches!(r, Some(Returns::Uretprobe))),
        single_trigger: (resolved.len() == 1).then_some(0),
    };
    let loader = std::thread::Builder::new()
        .name("mt-agent-load".into())
        .spawn(move || {
            version
                .join()
                .unwrap_or_else(|_| Err(Failure::runtime("the perf check panicked")))?;
            let mut probes = Probes::load(load)?;
            for (i, cfg) in configs.iter().enumerate() {
                probes.configure(i as u32, cfg).map_err(|e| {
                    Failure::runtime(format!("writing the trigger settings: {e:#}"))
                })?;
            }
            Ok(probes)
        })?;
    let event = settings
        .event
        .clone()
        .unwrap_or_else(|| perf::default_event().to_string());
    let mut setups = Vec::new();
    for (i, (t, (res, watch, returns, _))) in triggers.iter().zip(resolved).enumerate() {
        let index = i as u32;
        let out = if args.config.is_none() {
            base_dir.path.clone()
        } else {
            base_dir.path.join(&t.name)
        };
        let pid = match watch {
            Watch::Pid(p) => Some(p),
            Watch::Exe { .. } => None,
        };
        let uprobes = 1 + match &returns {
            Some(Returns::RetInstructions(v)) => v.len(),
            Some(Returns::Uretprobe) => 1,
            None => 0,
        };
        setups.push(TriggerSetup {
            index,
            plan: AttachPlan {
                trigger: index,
                path: res.object.open_path.clone(),
                pid,
                entry_offset: res.attach_offset,
                returns,
            },
            policy: Policy {
                after_ns: t.after.map_or(0, |d| d.as_nanos() as u64),
                max_snapshots: t.max_snapshots,
            },
            armed: Armed {
                pid,
                perf_pid: None,
                exe: match &watch {
                    Watch::Exe { path, .. } => Some(path.clone()),
                    Watch::Pid(_) => None,
                },
                trigger: index,
                event: event.clone(),
                freq: settings.freq,
                symbol: if res.probe_offset > 0 {
                    format!("{}+{:#x}", res.function.demangled, res.probe_offset)
                } else {
                    res.function.demangled.clone()
                },
                object: res.object.path.clone(),
                attach_offset: res.attach_offset,
                uprobes,
                cost: res.cost.clone(),
                output: out.clone(),
                time_to_armed_ms: 0.0,
                perf_ready_ms: 0.0,
            },
            out,
            watch,
        });
    }

    // Handlers go in before anything can take long, so that a signal is a
    // clean end from here on.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;

    let (events_tx, mut events) = unbounded_channel();
    let handle = driver::spawn(
        Setup {
            triggers: setups,
            loader: Some(loader),
            perf: PerfSpec {
                perf: perf_path,
                pid: 0,
                output: PathBuf::new(),
                event,
                freq: settings.freq,
                keep: settings.keep,
                bpf_events: args.perf_bpf_events,
                extra: settings.perf_args.clone(),
            },
            max_targets: settings.max_targets as usize,
            agent_started: started,
            reporter: reporter.clone(),
            single,
            verbose: args.verbose,
            rt_priority: args.rt_priority,
            reader_delay: args.debug_reader_delay,
        },
        events_tx,
    )?;

    let mut deadline: Option<tokio::time::Instant> = None;
    let outcome = loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(Event::Armed) => {
                    if let Some(d) = args.duration && deadline.is_none() {
                        deadline = Some(tokio::time::Instant::now() + d);
                    }
                }
                Some(Event::Finished(o)) => break *o,
                None => anyhow::bail!("the driver thread ended without an outcome"),
            },
            _ = sigint.recv() => handle.send(Command::Stop(EndReason::Signal("SIGINT"))),
            _ = sigterm.recv() => handle.send(Command::Stop(EndReason::Signal("SIGTERM"))),
            _ = sighup.recv() => handle.send(Command::Stop(EndReason::Signal("SIGHUP"))),
            // stdout's reader went away (`| head`): a clean end, as for SIGTERM.
            _ = reporter.stdout_closed() => handle.send(Command::Stop(EndReason::Signal("SIGPIPE"))),
            _ = sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                deadline = None;
                handle.send(Command::Stop(EndReason::Duration));
            }
        }
    };
    handle.join();

    let code = outcome.failure.as_ref().map_or(ExitCode::Ok, |f| f.code);
    if let Some(f) = &outcome.failure {
        reporter.error(f);
    }
    reporter.summary(&Summary {
        end: outcome.reason.describe(),
        exit_code: code as i32,
        counters: outcome.counters,
        stats: outcome.stats,
        open_calls: outcome.open_calls,
        perf_cpu_s: outcome.perf_cpu.map(|d| d.as_secs_f64()),
        perf_exit: outcome.perf_exit.clone(),
        agent_peak_rss_kib: peak_rss_kib(),
        agent_cpu_s: own_cpu_seconds(),
        duration_s: started.elapsed().as_secs_f64(),
        output: base_dir.path.clone(),
        recorders: if single {
            Vec::new()
        } else {
            outcome.recorders.clone()
        },
        unrecorded_hits: outcome.unrecorded_hits,
        extra_processes: outcome.extra_processes,
    });
    Ok(code)
}

/// (device, inode) of an executable for `--exe`. Errors (exit code 2) when
/// it is not a file.
fn exe_identity(path: &Path) -> Result<(u64, u64), Failure> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).map_err(|e| {
        Failure::usage(format!(
            "--exe {}: {e}; give the path of an executable",
            path.display()
        ))
    })?;
    if !m.is_file() {
        return Err(Failure::usage(format!(
            "--exe {} is not a file",
            path.display()
        )));
    }
    Ok((m.dev(), m.ino()))
}

/// For `--slower-than`: where the returns are probed.
fn plan_returns(
    t: &TriggerArgs,
    res: &Resolution,
    reporter: &Reporter,
) -> Result<Option<Returns>, Failure> {
    if t.filters.slower_than.is_none() {
        return Ok(None);
    }
    if res.probe_offset > 0 {
        // The entry probe would see the stack pointer after the prologue's
        // pushes, so no return would ever match its frame.
        return Err(Failure::usage(format!(
            "--slower-than times a call from its entry, but the probe is at {}+{:#x}; drop \
             --offset/--address or point it at the function's first instruction",
            res.function.demangled, res.probe_offset
        )));
    }
    if t.use_uretprobe {
        if res.is_go {
            return Err(Failure::usage(
                "--use-uretprobe is refused on Go binaries: a uretprobe replaces return addresses, \
                 which corrupts goroutine stacks the runtime moves; drop it (mt-agent probes `ret` \
                 instructions instead)",
            ));
        }
        reporter.warning(
            "--use-uretprobe: a uretprobe replaces the return address, which breaks C++ exception \
             unwinding through the function (sourceware bug 12275); prefer the default",
        );
        return Ok(Some(Returns::Uretprobe));
    }
    let f = &res.function;
    let cold_range: Vec<(u64, u64)> = res
        .cold
        .iter()
        .map(|(c, _)| (c.elf_address, c.elf_address + c.size))
        .collect();
    let main = insn::exits(&res.body, f.elf_address, &cold_range);
    let mut offsets: Vec<u64> = main.rets.iter().map(|r| f.file_offset + r).collect();
    let mut tail_jumps = main.tail_jumps;
    let mut indirect = main.indirect_jumps;
    if let Some((cold, bytes)) = &res.cold {
        let e = insn::exits(
            bytes,
            cold.elf_address,
            &[(f.elf_address, f.elf_address + f.size)],
        );
        offsets.extend(e.rets.iter().map(|r| cold.file_offset + r));
        tail_jumps += e.tail_jumps;
        indirect += e.indirect_jumps;
    }
    if offsets.is_empty() {
        return Err(Failure::usage(format!(
            "{} has no `ret` instruction to probe (it only leaves by jumps); --slower-than cannot \
             time it. Probe its caller, or use --use-uretprobe",
            f.demangled
        )));
    }
    if tail_jumps + indirect > 0 {
        reporter.warning(&format!(
            "--slower-than: {} return(s) probed; {tail_jumps} tail jump(s) and {indirect} indirect \
             jump(s) leave {} without a probed `ret`: such calls are not timed (counted as no-return)",
            offsets.len(),
            f.demangled
        ));
    }
    Ok(Some(Returns::RetInstructions(offsets)))
}

/// CPU time this process has used (user + system, all threads), seconds.
fn own_cpu_seconds() -> f64 {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .map(|u| {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or(0.0)
}

/// The agent's peak resident set size (VmHWM), KiB.
pub fn peak_rss_kib() -> Option<u64> {
    target::status_field(std::process::id() as i32, "VmHWM")
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Cli;

    #[test]
    fn command_line_run_options_override_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "output = \"/from/file\"\nfreq = 49\nmax_targets = 3\nevent = \"task-clock\"\n\
             [[trigger]]\npid = 1\nsymbol = \"f\"\n",
        )
        .unwrap();
        let p = path.to_str().unwrap();
        let run_args = |argv: &[&str]| -> RunArgs {
            let cli = Cli::try_parse_from(argv).unwrap();
            cli.run
        };
        let (s, t) = from_config(&path, &run_args(&["mt-agent", "--config", p])).unwrap();
        assert_eq!(s.output.as_deref(), Some(Path::new("/from/file")));
        assert_eq!((s.freq, s.max_targets), (49, 3));
        assert_eq!(s.event.as_deref(), Some("task-clock"));
        assert_eq!(t.len(), 1);
        let (s, _) = from_config(
            &path,
            &run_args(&["mt-agent", "--config", p, "-o", "/from/cli", "-F", "99"]),
        )
        .unwrap();
        assert_eq!(s.output.as_deref(), Some(Path::new("/from/cli")));
        assert_eq!((s.freq, s.max_targets), (99, 3));
    }
}
