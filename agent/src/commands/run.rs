//! A capture run: plans it from the options ([`crate::plan`]), checks the
//! system, finds each trigger, loads the probes, then runs the lifecycle
//! loop on the main thread (tokio): signals and `--duration`. The data path
//! is the driver thread ([`crate::capture::driver`]).
//!
//! Three shapes of run, one code path:
//! * `--pid N --symbol f`: one trigger, one recorder writing into OUT;
//! * `--exe PATH --symbol f`: one trigger, a recorder per process in OUT/<pid>;
//! * `--config FILE`: several triggers, in OUT/<local time>/<name>[/<pid>].

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tokio::{
    signal::unix::{SignalKind, signal},
    sync::mpsc::{UnboundedReceiver, unbounded_channel},
    time::sleep_until,
};

use crate::{
    capture::{
        build_id_cache,
        disk_budget::Keeper,
        driver,
        driver::{Handle, Progress, Request, Setup, TriggerSetup, Watch},
        outcome::{EndReason, Outcome},
        snapshot::Policy,
        target,
    },
    commands::check,
    error::{ExitCode, Failure},
    flags::defs::RunArgs,
    output::{
        events::{Armed, Printer, Summary},
        index,
        index::OutputDir,
        run_file::StackDonors,
    },
    perf,
    perf::{
        record::{PerfSpec, Recording},
        unwind,
    },
    plan::{Plan, RunSettings, TriggerPlan, WatchArg, conditions::trigger_config, plan},
    probe::{
        LoadOptions, Probes,
        uprobes::{Program, TriggerUprobes, Uprobe},
    },
    symbols,
    symbols::{Resolution, insn},
    sys::{caps, proc},
};

/// Runs a capture; returns the exit code.
pub async fn run(
    args: RunArgs,
    printer: Arc<Printer>,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    // Input that needs no system access first.
    let plan = plan(&args)?;
    check_system(&plan)?;
    let mut prepared = prepare(&plan, &args, &printer, started)?;
    let donors = std::mem::take(&mut prepared.donors);
    let run_dir = prepared.run_dir.path.clone();
    // Handlers go in before anything can take long, so that a signal is a
    // clean end from here on.
    let signals = Signals::install()?;
    let armed_events: Vec<Armed> = prepared.triggers.iter().map(|t| t.armed.clone()).collect();
    let (progress_tx, progress) = unbounded_channel();
    let uploads = start_uploads(&plan, &run_dir, &printer);
    let (handle, _run_dir_guard) =
        start_driver(&plan, &args, prepared, &printer, started, progress_tx)?;
    let (outcome, armed) = wait(&handle, progress, signals, args.duration, &printer).await?;
    handle.join();
    let wrote = outcome.stats.hit_snapshots + outcome.stats.tail_snapshots > 0;
    if let Some(kept) = build_id_cache::finish(wrote) {
        log_symcache(&printer, &kept);
    }
    let code = summarise(&printer, &plan, outcome, armed, &run_dir, started);
    crate::report::record_triggers(&run_dir, &armed_events, &donors, &printer);
    if args.report {
        crate::report::after_run(&run_dir, plan.settings.perf.as_deref(), &printer, args.json);
    }
    let complete = finish_uploads(uploads, plan.settings.upload.as_ref(), &printer);
    Ok(if code == ExitCode::Ok && !complete {
        ExitCode::Uploads
    } else {
        code
    })
}

/// The uploads of a run: started, or why not (said at once; the run
/// captures anyway and ends with exit code 5).
type Uploads = Option<Result<crate::upload::uploader::Uploader, String>>;

fn start_uploads(plan: &Plan, run_dir: &Path, printer: &Arc<Printer>) -> Uploads {
    let up = plan.settings.upload.as_ref()?;
    let started = crate::upload::store::open(&up.url)
        .map_err(|f| f.message)
        .and_then(|store| {
            crate::upload::uploader::Uploader::start(up, store, run_dir, printer.clone())
                .map_err(|e| format!("cannot start the upload thread: {e}"))
        });
    if let Err(why) = &started {
        printer.warning(&format!(
            "upload to {}: {why}; capturing without uploading (exit code 5 at the end)",
            up.url
        ));
    }
    Some(started)
}

/// Waits for what is pending (`--upload-wait`), prints the `upload`
/// summary; false if anything is left unsent.
fn finish_uploads(
    uploads: Uploads,
    plan: Option<&crate::upload::UploadPlan>,
    printer: &Printer,
) -> bool {
    let (Some(uploads), Some(plan)) = (uploads, plan) else {
        return true;
    };
    let stats = match uploads {
        Ok(u) => u.finish(plan.wait),
        Err(why) => crate::upload::uploader::UploadStats {
            url: plan.url.clone(),
            last_refusal: Some(why),
            failing: true,
            ..Default::default()
        },
    };
    crate::upload::uploader::print_summary(printer, &stats);
    stats.pending == 0 && !stats.failing
}

/// A run made ready: triggers resolved, output created, programs loading.
struct Prepared {
    perf_path: PathBuf,
    event: String,
    recording: Recording,
    unwinding: unwind::Unwinding,
    /// `auto`'s measurement's whole stacks, for run.json.
    donors: StackDonors,
    /// Kept until the run ends: tidied away on drop if nothing was written.
    run_dir: OutputDir,
    loader: JoinHandle<Result<Probes, Failure>>,
    triggers: Vec<TriggerSetup>,
    /// The copy of /proc/kallsyms perf will read, being made meanwhile.
    kallsyms: Option<JoinHandle<std::io::Result<perf::kallsyms::KallsymsCopy>>>,
}

/// Finds perf, resolves every trigger, chooses the unwinding, creates the
/// output directory and starts loading the eBPF programs.
fn prepare(
    plan: &Plan,
    args: &RunArgs,
    printer: &Arc<Printer>,
    started: Instant,
) -> anyhow::Result<Prepared> {
    let perf_path = perf::binary::find_perf(plan.settings.perf.as_deref())?;
    // Read while the triggers are resolved (~50 ms of the kernel's CPU).
    let kallsyms = perf::kallsyms::KallsymsCopy::start();
    // `perf version` (~30 ms: perf's own start-up) runs while the triggers
    // are resolved and perf record starts; the loader thread joins it, so a
    // binary that is not perf is refused (exit 3) before anything attaches.
    let version = {
        let p = perf_path.clone();
        std::thread::spawn(move || perf::binary::perf_version(&p))
    };
    // Resolve every trigger before creating anything.
    let mut resolved = resolve_all(plan, printer)?;
    let unwinding = decide_unwinding(
        args,
        &plan.settings,
        resolved.iter().map(|r| (&r.res, &r.watch)),
    )?;
    for (t, r) in plan.triggers.iter().zip(&mut resolved) {
        choose_uretprobe(t, r, printer);
    }
    // Checked (and created) now, so a bad --output fails before perf runs;
    // tidied away on drop if nothing is written into it.
    let run_dir = OutputDir::prepare(&plan.output_dir(&index::local_timestamp()))?;
    build_id_cache::init(&run_dir.path, printer.clone());
    printer.verbose(&format!(
        "{:.1} ms: triggers resolved, output ready",
        started.elapsed().as_secs_f64() * 1e3
    ));
    let loader = spawn_loader(plan, args, &resolved, version)?;
    // While the programs load: the stack copy's size, measured on the
    // target when `auto` chose DWARF.
    let (unwinding, donors) = measure_copy(unwinding, plan, &perf_path, &resolved, printer);
    printer.verbose(&format!(
        "stacks: --call-graph {} ({})",
        unwinding.mode, unwinding.reason
    ));
    let recording = recording_for(&plan.settings, &unwinding);
    let event = plan
        .settings
        .event
        .clone()
        .unwrap_or_else(|| perf::binary::default_event().to_string());
    let shown = Shown {
        event: &event,
        settings: &plan.settings,
        recording,
        unwinding: &unwinding,
    };
    let triggers = trigger_setups(plan, resolved, &run_dir.path, &shown);
    Ok(Prepared {
        perf_path,
        event,
        recording,
        unwinding,
        donors,
        run_dir,
        loader,
        triggers,
        kallsyms,
    })
}

/// Starts the driver thread on a prepared run; hands back the output
/// directory's guard, which the run keeps until it ends.
fn start_driver(
    plan: &Plan,
    args: &RunArgs,
    p: Prepared,
    printer: &Arc<Printer>,
    started: Instant,
    progress_tx: tokio::sync::mpsc::UnboundedSender<Progress>,
) -> anyhow::Result<(Handle, OutputDir)> {
    let perf = PerfSpec {
        perf: p.perf_path,
        pid: 0,
        output: PathBuf::new(),
        event: p.event,
        freq: plan.settings.freq,
        keep: plan.settings.keep,
        bpf_events: args.perf_bpf_events,
        call_graph: p.unwinding.perf_args(),
        recording: p.recording,
        // Per trigger: set as each recorder starts.
        off_cpu: None,
        extra: plan.settings.perf_args.clone(),
    };
    let keeper = plan
        .settings
        .max_disk
        .map(|b| Arc::new(Mutex::new(Keeper::new(b, &p.run_dir.path))));
    let handle = driver::spawn(
        Setup {
            triggers: p.triggers,
            loader: Some(p.loader),
            perf,
            keeper,
            max_targets: plan.settings.max_targets as usize,
            agent_started: started,
            printer: printer.clone(),
            single_pid_run: plan.single_pid_run(),
            verbose: args.verbose,
            rt_priority: args.rt_priority,
            kallsyms: p.kallsyms,
            reader_delay: args.debug_reader_delay,
        },
        progress_tx,
    )?;
    Ok((handle, p.run_dir))
}

/// What every trigger's `armed` event shows of the run's settings.
struct Shown<'a> {
    event: &'a str,
    settings: &'a RunSettings,
    recording: Recording,
    unwinding: &'a unwind::Unwinding,
}

/// The recording mode once the unwinding is known: a flight-recorder ring
/// left at its default grows to [`DWARF_FLIGHT_RING`] for DWARF stacks,
/// whose samples are ~4-8 KiB instead of ~100 bytes (docs/flight-recorder.md).
fn recording_for(settings: &RunSettings, unwinding: &unwind::Unwinding) -> Recording {
    match settings.recording {
        crate::perf::record::Recording::FlightRecorder { .. }
            if !settings.flight_ring_given && unwinding.mode.starts_with("dwarf") =>
        {
            crate::perf::record::Recording::FlightRecorder {
                ring_pages: perf::record::ring_pages(DWARF_FLIGHT_RING),
            }
        }
        r => r,
    }
}

/// The flight-recorder ring for DWARF stacks unless told otherwise, bytes:
/// ~4.4 KiB a sample at `dwarf,4096` (`auto`'s size where it cannot
/// measure the target), so ~3.8 s of one busy CPU at 999 Hz (~2 s at
/// `dwarf,8192`); the sizes `auto` measures are mostly smaller
/// (docs/unwinding.md, "How much stack a sample needs").
const DWARF_FLIGHT_RING: u64 = 16 << 20;

/// The kernel is recent enough, and we may trace each trigger's target.
/// Errors (exit code 3): an old kernel, missing privileges.
fn check_system(plan: &Plan) -> Result<(), Failure> {
    let (release, version) = check::kernel_version();
    if version < check::MIN_KERNEL {
        return Err(Failure::environment(format!(
            "kernel {release} is too old: mt-agent needs Linux 5.15 or later (BPF ring buffer, \
             uprobe attach cookies); `mt-agent check` lists what else is missing"
        )));
    }
    check::sample_rate(plan.settings.freq, check::max_sample_rate())?;
    for t in &plan.triggers {
        match &t.watch {
            WatchArg::Pid(pid) => caps::check(Some(*pid))?,
            WatchArg::Exe(_) => caps::check(None)?,
        }
    }
    Ok(())
}

/// One trigger, found in its target.
struct Resolved {
    res: Resolution,
    watch: Watch,
    /// The return probes (`--slower-than`).
    returns: Vec<Uprobe>,
    /// Why the returns are seen by uprobes on `ret`s, not a uretprobe.
    returns_why: Option<String>,
    /// What the `ret` uprobes miss (tail jumps), warned of if they stay.
    ret_warning: Option<String>,
    cfg: agent_common::TriggerConfig,
}

/// Finds every trigger's function and builds its kernel table. Errors (exit
/// code 2): an unknown pid, executable or symbol, bad `--slower-than` use.
fn resolve_all(plan: &Plan, printer: &Printer) -> Result<Vec<Resolved>, Failure> {
    let mut resolved = Vec::new();
    for t in &plan.triggers {
        let (res, watch) = match &t.watch {
            WatchArg::Pid(pid) => {
                target::check(*pid)?;
                (
                    symbols::resolve_waiting(*pid, &t.query, t.wait_for_symbol, &|m| {
                        printer.verbose(m)
                    })?,
                    Watch::Pid(*pid),
                )
            }
            WatchArg::Exe(path) => {
                let id = exe_identity(path)?;
                let res = symbols::resolve_file(path, &t.query)?;
                let path = path.clone();
                (res, Watch::Exe { path, id })
            }
        };
        for note in &res.notes {
            printer.warning(note);
        }
        let (returns, ret_warning) = plan_returns(t, &res, printer)?;
        let mut cfg = trigger_config(&t.filters, res.is_go)?;
        if matches!(watch, Watch::Exe { .. }) {
            // Many processes fire this trigger: each keeps its own cooldown,
            // rate and count.
            cfg.flags |= agent_common::CFG_PER_PROCESS;
        }
        if let (true, Watch::Pid(pid)) = (t.follow_forks, &watch) {
            if res.object.is_main {
                cfg.flags |= agent_common::CFG_FOLLOW_FORKS;
                // The target's own calls count without a FOLLOWED lookup.
                cfg.target_tgid = *pid as u32;
            } else {
                // Following puts the uprobe on the file for every process:
                // on a shared library (libc) every process of the host
                // would trap there. Only the target's own executable is.
                printer.verbose(&format!(
                    "forks are not followed: {} is a shared library, and a probe on it for \
                     every process would cost every process that maps it",
                    res.object.path.display()
                ));
            }
        }
        resolved.push(Resolved {
            res,
            watch,
            returns,
            returns_why: None,
            ret_warning,
            cfg,
        });
    }
    Ok(resolved)
}

/// The eBPF programs load (the verifier) on a thread of their own, while
/// the driver starts perf: the two take ~100 ms and ~250 ms here.
fn spawn_loader(
    plan: &Plan,
    args: &RunArgs,
    resolved: &[Resolved],
    perf_version: JoinHandle<Result<String, Failure>>,
) -> std::io::Result<JoinHandle<Result<Probes, Failure>>> {
    let configs: Vec<_> = resolved.iter().map(|r| r.cfg).collect();
    let followed: Vec<i32> = resolved
        .iter()
        .filter(|r| r.cfg.flags & agent_common::CFG_FOLLOW_FORKS != 0)
        .filter_map(|r| match r.watch {
            Watch::Pid(p) => Some(p),
            Watch::Exe { .. } => None,
        })
        .collect();
    let load = LoadOptions {
        ring_bytes: plan.ring_bytes,
        verbose: args.verbose,
        returns: resolved
            .iter()
            .flat_map(|r| &r.returns)
            .any(|u| u.program == Program::Return),
        uretprobe: resolved
            .iter()
            .flat_map(|r| &r.returns)
            .any(Uprobe::is_uretprobe),
        single_trigger: (resolved.len() == 1).then_some(0),
        follow_forks: resolved
            .iter()
            .any(|r| r.cfg.flags & agent_common::CFG_FOLLOW_FORKS != 0),
    };
    std::thread::Builder::new()
        .name("mt-agent-load".into())
        .spawn(move || {
            perf_version
                .join()
                .unwrap_or_else(|_| Err(Failure::runtime("the perf check panicked")))?;
            let mut probes = Probes::load(load)?;
            for (i, cfg) in configs.iter().enumerate() {
                probes.configure(i as u32, cfg).map_err(|e| {
                    Failure::runtime(format!("writing the trigger settings: {e:#}"))
                })?;
            }
            for pid in followed {
                probes.follow(pid)?;
            }
            Ok(probes)
        })
}

/// What the driver needs of each trigger.
fn trigger_setups(
    plan: &Plan,
    resolved: Vec<Resolved>,
    run_dir: &Path,
    shown: &Shown,
) -> Vec<TriggerSetup> {
    let mut setups = Vec::new();
    for (i, (t, r)) in plan.triggers.iter().zip(resolved).enumerate() {
        let index = i as u32;
        let out = plan.trigger_dir(run_dir, t);
        let pid = match r.watch {
            Watch::Pid(p) => Some(p),
            Watch::Exe { .. } => None,
        };
        setups.push(TriggerSetup {
            index,
            armed: armed(index, &r, &out, shown, t.off_cpu.is_some()),
            uprobes: TriggerUprobes::new(
                index,
                r.res.object.open_path.clone(),
                pid,
                r.cfg.flags & agent_common::CFG_FOLLOW_FORKS != 0,
                r.res.attach_offset,
                r.returns,
            ),
            policy: Policy {
                after_ns: t.after.map_or(0, |d| d.as_nanos() as u64),
                max_snapshots: t.max_snapshots,
            },
            out,
            // One probe serves every process of an --exe, each with its own
            // cooldown: detaching it would miss the others' hits.
            disarm: crate::plan::conditions::disarmed_after_hit(&t.filters)
                .filter(|_| pid.is_some() && !t.always_armed),
            off_cpu: t.off_cpu,
            watch: r.watch,
        });
    }
    setups
}

/// A trigger's `armed` event, less what is known only once it is armed.
fn armed(index: u32, r: &Resolved, out: &Path, shown: &Shown, off_cpu: bool) -> Armed {
    let res = &r.res;
    Armed {
        pid: match r.watch {
            Watch::Pid(p) => Some(p),
            Watch::Exe { .. } => None,
        },
        perf_pid: None,
        exe: match &r.watch {
            Watch::Exe { path, .. } => Some(path.clone()),
            Watch::Pid(_) => None,
        },
        trigger: index,
        event: shown.event.to_string(),
        freq: shown.settings.freq,
        symbol: {
            // The version picked (`f@@V2`), which a plain name leaves unsaid.
            let version = crate::symbols::names::SymbolName::new(&res.function.name)
                .version
                .unwrap_or_default();
            if res.probe_offset > 0 {
                format!(
                    "{}{version}+{:#x}",
                    res.function.demangled, res.probe_offset
                )
            } else {
                format!("{}{version}", res.function.demangled)
            }
        },
        object: res.object.path.clone(),
        attach_offset: res.attach_offset,
        uprobes: 1 + r.returns.len(),
        returns: r
            .returns
            .first()
            .map(|u| if u.is_uretprobe() { "uretprobe" } else { "ret" }),
        returns_why: r.returns_why.clone(),
        cost: res.cost.clone(),
        output: out.to_path_buf(),
        time_to_armed_ms: 0.0,
        perf_ready_ms: 0.0,
        perf_kallsyms: "proc",
        recording: shown.recording.name(),
        flight_ring_bytes: shown.recording.ring_bytes(),
        unwinding: shown.unwinding.clone(),
        off_cpu,
        go: res.is_go,
    }
}

/// The signals that end a run.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }
}

/// Relays signals and `--duration` (counted from the first `armed`) to the
/// driver until it reports the run's outcome; also says whether any trigger
/// was armed.
async fn wait(
    handle: &Handle,
    mut progress: UnboundedReceiver<Progress>,
    mut signals: Signals,
    duration: Option<Duration>,
    printer: &Printer,
) -> anyhow::Result<(Outcome, bool)> {
    let mut deadline: Option<tokio::time::Instant> = None;
    let mut armed = false;
    loop {
        tokio::select! {
            ev = progress.recv() => match ev {
                Some(Progress::Armed) => {
                    armed = true;
                    if let Some(d) = duration && deadline.is_none() {
                        deadline = Some(tokio::time::Instant::now() + d);
                    }
                }
                Some(Progress::Finished(o)) => return Ok((*o, armed)),
                None => anyhow::bail!("the driver thread ended without an outcome"),
            },
            _ = signals.int.recv() => handle.send(Request::Stop(EndReason::Signal("SIGINT"))),
            _ = signals.term.recv() => handle.send(Request::Stop(EndReason::Signal("SIGTERM"))),
            _ = signals.hup.recv() => handle.send(Request::Stop(EndReason::Signal("SIGHUP"))),
            // stdout's reader went away (`| head`): a clean end, as for SIGTERM.
            _ = printer.stdout_closed() => handle.send(Request::Stop(EndReason::Signal("SIGPIPE"))),
            _ = sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                deadline = None;
                handle.send(Request::Stop(EndReason::Duration));
            }
        }
    }
}

/// Prints the failure (if any) and the summary; returns the exit code. A
/// run that failed before anything was armed prints the error alone.
fn summarise(
    printer: &Printer,
    plan: &Plan,
    outcome: Outcome,
    armed: bool,
    run_dir: &Path,
    started: Instant,
) -> ExitCode {
    let code = outcome.failure.as_ref().map_or(ExitCode::Ok, |f| f.code);
    if let Some(f) = &outcome.failure {
        printer.error(f);
        if !armed {
            // Nothing was attached or recorded: the error alone says it all.
            return code;
        }
    }
    printer.summary(&Summary {
        end: outcome.reason.describe(),
        exit_code: code as i32,
        counters: outcome.counters,
        stats: outcome.stats,
        open_calls: outcome.open_calls,
        perf_cpu_s: outcome.perf_cpu.map(|d| d.as_secs_f64()),
        perf_exit: outcome.perf_exit,
        agent_peak_rss_kib: peak_rss_kib(),
        agent_cpu_s: own_cpu_seconds(),
        duration_s: started.elapsed().as_secs_f64(),
        output: run_dir.to_path_buf(),
        recorders: if plan.single_pid_run() {
            Vec::new()
        } else {
            outcome.recorders
        },
        unrecorded_hits: outcome.unrecorded_hits,
        hits_before_recording: outcome.hits_before_recording,
        extra_processes: outcome.extra_processes,
        disarm: outcome.disarm,
    });
    code
}

/// Frame pointers or DWARF, from `--call-graph`, the pass-through and the
/// code of each trigger's executable and object. Errors (exit code 2) when
/// `--call-graph` and the pass-through both choose.
fn decide_unwinding<'a>(
    args: &RunArgs,
    settings: &RunSettings,
    traced: impl Iterator<Item = (&'a Resolution, &'a Watch)>,
) -> Result<unwind::Unwinding, Failure> {
    let mut objects: Vec<(String, PathBuf)> = Vec::new();
    for (res, watch) in traced {
        let exe = match watch {
            Watch::Pid(pid) => {
                let path = PathBuf::from(format!("/proc/{pid}/exe"));
                let name = std::fs::read_link(&path).unwrap_or_else(|_| path.clone());
                (name, path)
            }
            Watch::Exe { path, .. } => (path.clone(), path.clone()),
        };
        for (name, path) in [exe, (res.object.path.clone(), res.object.open_path.clone())] {
            let name = name.file_name().map_or_else(
                || name.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            if !objects.iter().any(|(n, _)| *n == name) {
                objects.push((name, path));
            }
        }
    }
    let refs: Vec<(String, &Path)> = objects
        .iter()
        .map(|(n, p)| (n.clone(), p.as_path()))
        .collect();
    unwind::decide(args.call_graph, &settings.perf_args, &refs).map_err(Failure::usage)
}

/// `unwinding` with its DWARF copy size measured on the traced processes
/// (each `--pid` and its descendants; `report::stack_need`), when `auto`
/// chose DWARF, and the measurement's whole stacks for run.json. A program started with the recording (`--exe`) has no
/// stacks yet to measure; `auto`'s fixed size then stays.
fn measure_copy(
    unwinding: unwind::Unwinding,
    plan: &Plan,
    perf_path: &Path,
    resolved: &[Resolved],
    printer: &Printer,
) -> (unwind::Unwinding, StackDonors) {
    if !unwinding.measure_copy {
        return (unwinding, StackDonors::default());
    }
    let mut pids = Vec::new();
    for r in resolved {
        match r.watch {
            Watch::Pid(pid) => {
                pids.push(pid);
                pids.extend(crate::sys::proc::descendants(pid, 256));
            }
            Watch::Exe { .. } => {
                let why = "a program started with the recording";
                return (unwinding.measured(Err(why.into())), StackDonors::default());
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    printer.verbose(&format!(
        "stacks: measuring the stack copy DWARF samples need ({} process(es), {:.1} s)",
        pids.len(),
        crate::report::stack_need::MEASURE_FOR.as_secs_f64()
    ));
    let measured = tempfile::tempdir()
        .map_err(|e| format!("a temporary directory: {e}"))
        .and_then(|dir| {
            let freq = plan.settings.freq;
            crate::report::stack_need::measure(perf_path, &pids, freq, dir.path())
                .map_err(|why| why.to_string())
        });
    match measured {
        Ok(m) => (unwinding.measured(Ok(m.measured)), m.donors),
        Err(why) => (unwinding.measured(Err(why)), StackDonors::default()),
    }
}

/// The -v line on what `OUT/.debug` keeps.
fn log_symcache(printer: &Printer, kept: &build_id_cache::CacheStats) {
    printer.verbose(&format!(
        "{} object(s), {} bytes, kept by build-id in {}",
        kept.objects,
        kept.bytes,
        build_id_cache::DIR
    ));
    for p in &kept.without_build_id {
        printer.warning(&format!(
            "{} has no build-id: a report names its functions from whatever file is at that \
             path then",
            p.display()
        ));
    }
    for (p, go) in &kept.go_build_id {
        printer.warning(&format!(
            "{} is a Go binary: it has a Go build ID ({go}) but no GNU build-id, which is what \
             perf finds objects by, so a report names its frames from the file at that path; \
             the captured build is kept in {} by its Go build ID, and the report warns if the \
             file at the path has another one (link with -ldflags=-B=0x<hex> to give it a GNU \
             build-id)",
            p.display(),
            build_id_cache::DIR
        ));
    }
    for f in &kept.failed {
        printer.verbose(&format!("not kept: {f}"));
    }
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

/// For `--slower-than`: the uprobes that see the returns, and, for `ret`
/// uprobes, a warning of the exits they miss.
fn plan_returns(
    t: &TriggerPlan,
    res: &Resolution,
    printer: &Printer,
) -> Result<(Vec<Uprobe>, Option<String>), Failure> {
    if t.filters.slower_than.is_none() {
        return Ok((Vec::new(), None));
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
        printer.warning(
            "--use-uretprobe: a uretprobe replaces the return address, which breaks C++ exception \
             unwinding through the function (sourceware bug 12275); prefer the default",
        );
        let uretprobe = Uprobe {
            program: Program::Uretprobe,
            offset: res.attach_offset,
        };
        return Ok((vec![uretprobe], None));
    }
    let (offsets, warning) = ret_offsets(res)?;
    let probes = offsets
        .into_iter()
        .map(|offset| Uprobe {
            program: Program::Return,
            offset,
        })
        .collect();
    Ok((probes, warning))
}

/// For `--slower-than` without `--use-uretprobe`: sees the returns with a
/// uretprobe instead of the uprobes on each `ret` when no process the
/// uprobes reach can be harmed by one
/// ([`symbols::uretprobe_safety::process_hazard`]). The kernel gives a
/// frame-pointer stack the real return address, and the report puts it
/// back into the DWARF stack copies of the hits' calls
/// (report/pending_returns.rs); docs/uprobe-cost.md.
fn choose_uretprobe(t: &TriggerPlan, r: &mut Resolved, printer: &Printer) {
    if !r.returns.iter().any(|u| u.program == Program::Return) {
        return;
    }
    let why = uretprobe_hazard(t, r);
    let f = &r.res.function.demangled;
    match &why {
        None => {
            printer.verbose(&format!(
                "--slower-than: the returns of {f} are seen by a uretprobe (no process it reaches \
                 raises exceptions, runs Go, switches stacks or loads code later)"
            ));
            r.returns = vec![Uprobe {
                program: Program::Uretprobe,
                offset: r.res.attach_offset,
            }];
        }
        Some(why) => {
            printer.verbose(&format!(
                "--slower-than: the returns of {f} are seen by uprobes on {} `ret`(s), \
                 single-stepped (a uretprobe would cost less, but is not proven harmless: {why})",
                r.returns.len()
            ));
            if let Some(w) = &r.ret_warning {
                printer.warning(w);
            }
        }
    }
    r.returns_why = why;
}

/// Why a uretprobe is not proven harmless for this trigger, if it is not.
fn uretprobe_hazard(t: &TriggerPlan, r: &Resolved) -> Option<String> {
    use crate::symbols::uretprobe_safety::{process_hazard, processes_mapping};
    if t.probe_rets {
        return Some("--probe-rets".into());
    }
    if r.res.is_go {
        return Some("the function is Go's (its runtime walks and moves stacks)".into());
    }
    let Watch::Pid(pid) = r.watch else {
        return Some(
            "--exe: the processes it will trace cannot be checked before they start".into(),
        );
    };
    let mut pids = vec![pid];
    if r.cfg.flags & agent_common::CFG_FOLLOW_FORKS != 0 {
        // File-wide uprobes: every process that maps the executable.
        let o = &r.res.object;
        pids.extend(
            processes_mapping(o.inode, &o.path)
                .into_iter()
                .filter(|p| *p != pid),
        );
    }
    let hazard = pids
        .iter()
        .find_map(|p| process_hazard(*p).map(|h| format!("in process {p}, {h}")));
    // DWARF stack copies (`--call-graph dwarf`, the off-CPU breakdown's
    // switch samples) hold the trampoline's address while a call is
    // pending; the report puts each hit's return address back
    // (report/pending_returns.rs), so they are no reason here.
    hazard
}

/// The file offsets of a function's `ret` instructions, its `.cold` part
/// included, and a warning naming the exits no probe sees, if any.
fn ret_offsets(res: &Resolution) -> Result<(Vec<u64>, Option<String>), Failure> {
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
    let warning = (tail_jumps + indirect > 0).then(|| {
        format!(
            "--slower-than: {} return(s) probed; {tail_jumps} tail jump(s) and {indirect} indirect \
             jump(s) leave {} without a probed `ret`: such calls are not timed (counted as no-return). \
             --use-uretprobe times every return (refused on Go; it breaks C++ exception unwinding \
             through the function)",
            offsets.len(),
            f.demangled
        )
    });
    Ok((offsets, warning))
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
    proc::status_field(std::process::id() as i32, "VmHWM")
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
}
