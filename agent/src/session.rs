//! A capture run (`mt-agent --pid N --symbol f`): checks the input, finds
//! the trigger, loads the probes, starts perf, then runs the lifecycle loop on
//! the main thread (tokio): signals, `--duration`, exec detection. The data
//! path is the driver thread ([`crate::driver`]).

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use agent_common::DEFAULT_RING_BYTES;
use anyhow::Context as _;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc::unbounded_channel,
    time::{interval, sleep_until},
};

use crate::{
    caps,
    cli::{RunArgs, check_perf_args},
    conditions::{Filters, trigger_config},
    driver::{self, Command, EndReason, Event, Setup},
    error::{ExitCode, Failure},
    index::{self, Index, OutputDir},
    perf::{self, PerfProcess, PerfSpec},
    probe::{AttachPlan, LoadOptions, Probes, Returns},
    report::{Armed, Reporter, Summary},
    symbols::{self, Query, Resolution, insn},
    target,
    trigger::Policy,
};

/// How often the target's executable is compared with the one it had at the
/// start (exec detection).
const EXEC_CHECK_EVERY: Duration = Duration::from_millis(250);

/// Runs a capture; returns the exit code.
pub async fn run(
    args: RunArgs,
    reporter: Arc<Reporter>,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    // Input that needs no system access first.
    check_perf_args(&args.perf_args).map_err(Failure::usage)?;
    let ring_bytes = args.ring_bytes.unwrap_or(DEFAULT_RING_BYTES);
    if !ring_bytes.is_power_of_two() || ring_bytes < 4096 {
        return Err(Failure::usage("--ring-bytes must be a power of two of at least 4096").into());
    }
    let filters = Filters {
        tids: args.tids.clone(),
        when: args.when.clone(),
        slower_than: args.slower_than,
        every: args.every,
        max_rate: args.max_rate,
        cooldown: args.cooldown,
    };
    trigger_config(&filters, false)?;

    let pid = args.pid.context("--pid is required")?;
    caps::check(Some(pid))?;
    let target = target::check(pid)?;
    let perf_path = perf::find_perf(args.perf.as_deref())?;
    perf::perf_version(&perf_path)?;

    let query = Query {
        symbol: args.symbol.clone(),
        object: args.object.clone(),
        offset: args.offset,
        address: args.address,
    };
    let res = symbols::resolve_waiting(pid, &query, args.wait_for_symbol)?;
    for note in &res.notes {
        reporter.warning(note);
    }
    let returns = plan_returns(&args, &res, &reporter)?;
    let cfg = trigger_config(&filters, res.is_go)?;

    let mut output = OutputDir::prepare(
        &args
            .output
            .clone()
            .unwrap_or_else(|| index::default_output_dir(pid)),
    )?;
    let out_dir = output.path.clone();
    let index = Index::create(&out_dir).map_err(|e| {
        Failure::usage(format!(
            "cannot create {} in {}: {e}; give a writable --output",
            index::INDEX_FILE,
            out_dir.display()
        ))
    })?;

    let mut probes = Probes::load(LoadOptions {
        ring_bytes,
        verbose: args.verbose,
    })?;
    const TRIGGER: u32 = 0;
    probes.configure(TRIGGER, &cfg)?;
    let plan = AttachPlan {
        trigger: TRIGGER,
        path: res.object.open_path.clone(),
        pid: Some(pid),
        entry_offset: res.attach_offset,
        returns,
    };

    let event = args
        .event
        .clone()
        .unwrap_or_else(|| perf::default_event().to_string());
    let spec = PerfSpec {
        perf: perf_path,
        pid,
        output: out_dir.join("perf.data"),
        event: event.clone(),
        freq: args.freq,
        keep: args.keep,
        extra: args.perf_args.clone(),
    };
    // From the main thread, which lives as long as the agent: perf's
    // PR_SET_PDEATHSIG fires when the spawning thread exits.
    caps::raise_ambient();
    let perf_spawned = Instant::now();
    let perf = PerfProcess::spawn(&spec)?;

    // Handlers go in before anything can take long, so that a signal is a
    // clean end from here on.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;

    let (events_tx, mut events) = unbounded_channel();
    let setup = Setup {
        trigger: TRIGGER,
        policy: Policy {
            after_ns: args.after.map_or(0, |d| d.as_nanos() as u64),
            max_snapshots: args.max_snapshots,
        },
        plan,
        probes,
        perf,
        perf_spawned,
        agent_started: started,
        index,
        out_dir: out_dir.clone(),
        reporter: reporter.clone(),
        armed: Armed {
            pid,
            perf_pid: 0,
            event,
            freq: args.freq,
            symbol: if res.probe_offset > 0 {
                format!("{}+{:#x}", res.function.demangled, res.probe_offset)
            } else {
                res.function.demangled.clone()
            },
            object: res.object.path.clone(),
            attach_offset: res.attach_offset,
            uprobes: 0,
            cost: res.cost.clone(),
            output: out_dir.clone(),
            time_to_armed_ms: 0.0,
            perf_ready_ms: 0.0,
        },
        verbose: args.verbose,
        rt_priority: args.rt_priority,
        reader_delay: args.debug_reader_delay,
    };
    let handle = driver::spawn(setup, events_tx)?;

    let mut deadline: Option<tokio::time::Instant> = None;
    let mut exec_check = interval(EXEC_CHECK_EVERY);
    let mut exec_seen = false;
    let outcome = loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(Event::Armed) => {
                    if let Some(d) = args.duration {
                        deadline = Some(tokio::time::Instant::now() + d);
                    }
                }
                Some(Event::Finished(o)) => break *o,
                None => anyhow::bail!("the driver thread ended without an outcome"),
            },
            _ = sigint.recv() => handle.send(Command::Stop(EndReason::Signal("SIGINT"))),
            _ = sigterm.recv() => handle.send(Command::Stop(EndReason::Signal("SIGTERM"))),
            _ = sighup.recv() => handle.send(Command::Stop(EndReason::Signal("SIGHUP"))),
            _ = sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                deadline = None;
                handle.send(Command::Stop(EndReason::Duration));
            }
            _ = exec_check.tick(), if !exec_seen => {
                if let Some(id) = target::exe_id(pid) && id != target.exe_id {
                    exec_seen = true;
                    reporter.warning(&format!(
                        "pid {pid} exec'd a new image ({}); the probe was bound to the old file \
                         and no longer fires; ending the run",
                        std::fs::read_link(format!("/proc/{pid}/exe"))
                            .map(|p| p.display().to_string())
                            .unwrap_or_default()
                    ));
                    handle.send(Command::Stop(EndReason::Exec));
                }
            }
        }
    };
    handle.join();
    if outcome.stats.hit_snapshots + outcome.stats.tail_snapshots > 0 {
        output.keep();
    }

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
        duration_s: started.elapsed().as_secs_f64(),
        output: out_dir,
    });
    Ok(code)
}

/// For `--slower-than`: where the returns are probed.
fn plan_returns(
    args: &RunArgs,
    res: &Resolution,
    reporter: &Reporter,
) -> Result<Option<Returns>, Failure> {
    if args.slower_than.is_none() {
        return Ok(None);
    }
    if args.use_uretprobe {
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

/// The agent's peak resident set size (VmHWM), KiB.
pub fn peak_rss_kib() -> Option<u64> {
    target::status_field(std::process::id() as i32, "VmHWM")
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
}
