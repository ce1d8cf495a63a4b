//! The driver thread: the data path of a run.
//!
//! One thread owns the probes, the ring buffers, the perf recorders and
//! their indexes, and waits in `epoll` on all of them. A hit goes from the
//! ring buffer to `kill(perf, SIGUSR2)` on this thread with no hop to another
//! thread. The main thread (tokio) handles signals and `--duration`; it talks
//! to the driver through [`Request`]s and hears back through [`Progress`]s.
//!
//! Triggers come in two kinds:
//! * a `--pid` trigger has one recorder; its uprobes are attached (scoped to
//!   that process) once perf is ready, and `armed` is printed then;
//! * an `--exe` trigger's uprobes are attached at once, for every process;
//!   a recorder is started for each process running the executable: those
//!   found at the start, those the `sched_process_exec` tracepoint reports,
//!   and any other process whose hit comes first (a fork without exec), up to
//!   `--max-targets` at once.
//!
//! Hits from processes without a recorder are counted as unrecorded; those
//! from a process whose recorder's perf is not recording yet (a new
//! process calls the trigger right after its exec, while its perf starts)
//! are counted apart, as hits before recording.

use std::{
    collections::{HashMap, HashSet},
    fs,
    os::fd::AsFd,
    path::PathBuf,
    sync::{Arc, Mutex, OnceLock, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use agent_common::{Exec, HIT_AT_RETURN, Hit};
use aya::{
    maps::{MapData, RingBuf},
    programs::uprobe::UProbeLink,
};
use nix::sys::{
    epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout},
    eventfd::{EfdFlags, EventFd},
};
use tokio::sync::mpsc::UnboundedSender;

use crate::{
    capture::{
        end::run_end,
        outcome::{EndReason, Outcome, RecorderOutcome},
        recorder::{Feedback, Recorder, RecorderFd, Shared},
        snapshot::Policy,
    },
    disarm::control::{Disarming, Notice},
    error::Failure,
    output::{
        events::{Armed, Printer},
        index::{IndexedHit, PendingReturn},
    },
    perf::{kallsyms::KallsymsCopy, record::PerfSpec},
    probe::{Probes, counters::Counters, detach, uprobes::TriggerUprobes},
    sys::{caps, clock::Now, proc},
};

/// How many generations up a forked process's recorded ancestor is looked
/// for (a pre-fork server's workers are its children or grandchildren).
const MAX_FOLLOW_DEPTH: usize = 8;

/// What a trigger watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Watch {
    /// One process.
    Pid(i32),
    /// Every process whose executable is this file, identified by
    /// (device, inode).
    Exe { path: PathBuf, id: (u64, u64) },
}

/// One trigger, resolved and ready to attach.
pub struct TriggerSetup {
    /// Index: the attach cookie.
    pub index: u32,
    pub watch: Watch,
    /// Attach point; for `--pid`, scoped to the process.
    pub uprobes: TriggerUprobes,
    pub policy: Policy,
    /// Output: the recorder's directory for `--pid`, the parent of the
    /// per-process directories for `--exe`.
    pub out: PathBuf,
    /// For the `armed` event.
    pub armed: Armed,
    /// Detach the probes for this long after each accepted hit: the
    /// cooldown, or the `--max-rate` interval if longer (`--pid` with a
    /// cooldown, without `--always-armed`).
    pub disarm: Option<Duration>,
    /// The off-CPU breakdown (`--off-cpu`): the window before a hit
    /// without a duration.
    pub off_cpu: Option<Duration>,
}

/// From the main thread to the driver.
#[derive(Debug)]
pub enum Request {
    /// End the run for this reason (the first reason wins).
    Stop(EndReason),
}

/// From the driver to the main thread.
#[derive(Debug)]
pub enum Progress {
    /// A trigger is armed (the first one starts `--duration`).
    Armed,
    /// The run is over.
    Finished(Box<Outcome>),
}

/// Everything the driver needs.
pub struct Setup {
    pub triggers: Vec<TriggerSetup>,
    /// Loads (and configures) the eBPF programs while perf starts.
    pub loader: Option<std::thread::JoinHandle<Result<Probes, Failure>>>,
    /// perf's command, without pid and output (set per recorder).
    pub perf: PerfSpec,
    pub max_targets: usize,
    pub agent_started: Instant,
    pub printer: Arc<Printer>,
    /// A `--pid` run (one trigger, one recorder): that recorder's end and
    /// failure are the run's.
    pub single_pid_run: bool,
    pub verbose: bool,
    pub rt_priority: Option<i32>,
    pub reader_delay: Option<Duration>,
    /// `--max-disk`, shared by every recorder.
    pub keeper: Option<Arc<Mutex<crate::capture::disk_budget::Keeper>>>,
    /// The small copy of `/proc/kallsyms` perf reads, being made
    /// (perf/kallsyms.rs); `None`: perf reads the real file.
    pub kallsyms: Option<JoinHandle<std::io::Result<KallsymsCopy>>>,
}

/// The main thread's handle on the driver.
pub struct Handle {
    tx: mpsc::Sender<Request>,
    wake: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl Handle {
    /// Sends a command and wakes the driver.
    pub fn send(&self, cmd: Request) {
        if self.tx.send(cmd).is_ok() {
            let _ = self.wake.write(1);
        }
    }

    /// Waits for the thread to end.
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What an epoll event is about: the driver's own fds, or one fd of the
/// recorder in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    /// The HITS ring buffer.
    Ring,
    /// The EXECS ring buffer (`--exe`).
    Execs,
    /// The eventfd the main thread writes after sending a [`Request`].
    Wake,
    /// The aya-log reader (`-v`).
    Logger,
    Recorder(usize, RecorderFd),
}

impl Token {
    /// The epoll event's data: small numbers for the driver's fds, and
    /// `(slot + 1) << 3 | fd kind` for a recorder's.
    fn encode(self) -> u64 {
        match self {
            Token::Ring => 1,
            Token::Execs => 2,
            Token::Wake => 3,
            Token::Logger => 4,
            Token::Recorder(slot, fd) => ((slot as u64 + 1) << 3) | fd as u64,
        }
    }

    fn decode(data: u64) -> Option<Self> {
        Some(match data {
            1 => Token::Ring,
            2 => Token::Execs,
            3 => Token::Wake,
            4 => Token::Logger,
            d if d >= 8 => Token::Recorder(
                (d >> 3) as usize - 1,
                *RecorderFd::ALL.get((d & 7) as usize)?,
            ),
            _ => return None,
        })
    }

    fn event(self) -> EpollEvent {
        EpollEvent::new(EpollFlags::EPOLLIN, self.encode())
    }
}

/// Starts the driver thread.
pub fn spawn(setup: Setup, progress: UnboundedSender<Progress>) -> anyhow::Result<Handle> {
    let (tx, rx) = mpsc::channel();
    let wake = Arc::new(EventFd::from_flags(
        EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK,
    )?);
    let thread_wake = wake.clone();
    let thread = std::thread::Builder::new()
        .name("mt-agent-driver".into())
        .spawn(move || {
            let outcome =
                Driver::new(setup, rx, thread_wake, progress.clone()).map(|mut d| d.run());
            let outcome = outcome.unwrap_or_else(|e| {
                Outcome::failed(
                    crate::error::failure_of(&e)
                        .cloned()
                        .unwrap_or_else(|| Failure::runtime(format!("{e:#}"))),
                )
            });
            let _ = progress.send(Progress::Finished(Box::new(outcome)));
        })?;
    Ok(Handle {
        tx,
        wake,
        thread: Some(thread),
    })
}

struct Driver {
    setup: Setup,
    progress: UnboundedSender<Progress>,
    epoll: Epoll,
    rx: mpsc::Receiver<Request>,
    wake: Arc<EventFd>,
    /// Filled in once the loader thread is done.
    probes: Option<Probes>,
    ring: Option<RingBuf<MapData>>,
    ring_watched: bool,
    execs: Option<RingBuf<MapData>>,
    counters: Arc<OnceLock<Counters>>,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    slots: Vec<Option<Recorder>>,
    by_target: HashMap<(u32, i32), usize>,
    /// Processes forked without exec from a recorded process: their
    /// recorded ancestor, whose perf follows them.
    followers: HashMap<(u32, i32), i32>,
    /// Processes whose recording ended while they live on (per trigger).
    done: HashSet<(u32, i32)>,
    next_seq: u64,
    armed_at: Option<Instant>,
    stopping: Option<EndReason>,
    fatal: Option<Failure>,
    finished: Vec<RecorderOutcome>,
    unrecorded: u64,
    /// Hits of a process whose perf was not recording yet.
    before_recording: u64,
    extra: u64,
    disarming: Disarming,
    /// Triggers whose event uprobes the arming thread is making: the
    /// recorder's slot, its target and how long its perf took to be ready.
    pending_set_up: HashMap<u32, (usize, i32, Duration)>,
    /// The copy every perf of the run reads as `/proc/kallsyms`, once made.
    kallsyms: Option<Arc<KallsymsCopy>>,
    /// The warning that perf reads the real `/proc/kallsyms` was printed.
    kallsyms_warned: bool,
}

impl Driver {
    fn new(
        setup: Setup,
        rx: mpsc::Receiver<Request>,
        wake: Arc<EventFd>,
        progress: UnboundedSender<Progress>,
    ) -> anyhow::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(wake.as_fd(), Token::Wake.event())?;
        if let Some(prio) = setup.rt_priority {
            set_fifo(prio, &setup.printer);
        }
        // perf inherits these across execve when we run with capabilities.
        caps::raise_ambient();
        let mut disarming = Disarming::new(
            setup
                .triggers
                .iter()
                .filter_map(|t| Some((t.uprobes.clone(), t.disarm?))),
        );
        disarming.start(&wake, &setup.printer);
        Ok(Self {
            setup,
            progress,
            epoll,
            rx,
            wake,
            probes: None,
            ring: None,
            ring_watched: false,
            execs: None,
            counters: Arc::new(OnceLock::new()),
            logger: None,
            slots: Vec::new(),
            by_target: HashMap::new(),
            followers: HashMap::new(),
            done: HashSet::new(),
            next_seq: 0,
            armed_at: None,
            stopping: None,
            fatal: None,
            finished: Vec::new(),
            unrecorded: 0,
            before_recording: 0,
            extra: 0,
            disarming,
            pending_set_up: HashMap::new(),
            kallsyms: None,
            kallsyms_warned: false,
        })
    }

    fn run(&mut self) -> Outcome {
        self.start();
        let mut events = [EpollEvent::empty(); 32];
        while !self.over() {
            let timeout = self.timeout();
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(e) => {
                    self.fatal(Failure::runtime(format!("epoll_wait: {e}")));
                    0
                }
            };
            for ev in &events[..n] {
                match Token::decode(ev.data()) {
                    Some(Token::Ring) => self.read_ring(),
                    Some(Token::Execs) => self.read_execs(),
                    Some(Token::Wake) => self.requests(),
                    Some(Token::Logger) => {
                        if let Some(l) = &mut self.logger {
                            l.flush();
                        }
                    }
                    Some(Token::Recorder(slot, fd)) => self.recorder_event(slot, fd),
                    None => {}
                }
            }
            self.timers();
            self.reap();
        }
        self.outcome()
    }

    /// Starts `--pid` recorders and arms `--exe` triggers.
    fn start(&mut self) {
        let mut exe_triggers = false;
        for i in 0..self.setup.triggers.len() {
            let (index, watch) = (
                self.setup.triggers[i].index,
                self.setup.triggers[i].watch.clone(),
            );
            match watch {
                Watch::Pid(pid) => {
                    let dir = self.setup.triggers[i].out.clone();
                    if let Err(f) = self.start_recorder(index, pid, dir) {
                        if self.setup.single_pid_run {
                            self.fatal(f);
                        } else {
                            self.setup
                                .printer
                                .warning(&format!("pid {pid}: {}", f.message));
                        }
                    }
                }
                Watch::Exe { .. } => exe_triggers = true,
            }
        }
        // perf is starting up: now wait for the programs, loaded meanwhile.
        if !self.load_probes() {
            return;
        }
        if exe_triggers {
            self.arm_exe_triggers();
        }
    }

    /// Attaches the `--exe` triggers' uprobes and the exec tracepoint, and
    /// tracks the processes that already run the executables.
    fn arm_exe_triggers(&mut self) {
        for i in 0..self.setup.triggers.len() {
            if matches!(self.setup.triggers[i].watch, Watch::Exe { .. }) {
                let uprobes = self.setup.triggers[i].uprobes.clone();
                if let Err(f) = self.attach(&uprobes) {
                    self.fatal(f);
                    return;
                }
            }
        }
        let probes = self.probes.as_mut().expect("loaded");
        match probes.attach_exec_tracepoint() {
            Ok(()) => {}
            Err(f) => {
                self.fatal(f);
                return;
            }
        }
        match self.probes.as_mut().expect("loaded").take_execs() {
            Ok(r) => {
                let _ = self.epoll.add(r.as_fd(), Token::Execs.event());
                self.execs = Some(r);
            }
            Err(e) => {
                self.fatal(Failure::runtime(format!("EXECS ring buffer: {e:#}")));
                return;
            }
        }
        self.armed_now(None);
        for t in self
            .setup
            .triggers
            .iter()
            .filter(|t| matches!(t.watch, Watch::Exe { .. }))
        {
            let mut a = t.armed.clone();
            a.time_to_armed_ms = ms(self.setup.agent_started.elapsed());
            self.setup.printer.armed(&a);
        }
        // Processes that run the executables already: one scan of /proc.
        for pid in all_pids() {
            self.maybe_track(pid);
        }
    }

    /// Waits for the loader thread; takes the ring buffer, the counters and
    /// (at -v) the log reader. False (and a fatal failure) if loading failed.
    fn load_probes(&mut self) -> bool {
        let Some(loader) = self.setup.loader.take() else {
            return self.probes.is_some();
        };
        let loaded = loader
            .join()
            .unwrap_or_else(|_| Err(Failure::runtime("the eBPF loader thread panicked")));
        let mut probes = match loaded {
            Ok(p) => p,
            Err(f) => {
                self.fatal(f);
                return false;
            }
        };
        let taken = probes
            .take_ring()
            .and_then(|r| Ok((r, probes.take_counters()?)));
        match taken {
            Ok((ring, counters)) => {
                self.ring = Some(ring);
                let _ = self.counters.set(counters);
            }
            Err(e) => {
                self.fatal(Failure::runtime(format!("eBPF maps: {e:#}")));
                return false;
            }
        }
        if self.setup.verbose {
            self.logger = probes.take_logger();
            if let Some(l) = &self.logger {
                let _ = self.epoll.add(l.as_fd(), Token::Logger.event());
            }
        }
        self.probes = Some(probes);
        true
    }

    fn attach(&mut self, uprobes: &TriggerUprobes) -> Result<(), Failure> {
        match self.probes.as_mut() {
            Some(p) => p.attach(uprobes),
            None => Err(Failure::runtime("the eBPF programs are not loaded")),
        }
    }

    fn detach_trigger(&mut self, trigger: u32) {
        let links = self.take_for_detach(&[trigger]);
        self.drop_links(links);
        self.disarming.forget(trigger);
    }

    fn detach_all(&mut self) {
        let triggers: Vec<u32> = self.setup.triggers.iter().map(|t| t.index).collect();
        let links = self.take_for_detach(&triggers);
        if let Some(p) = self.probes.as_mut() {
            p.detach_tracepoints();
        }
        self.drop_links(links);
        for t in triggers {
            self.disarming.forget(t);
        }
    }

    /// Turns the triggers off in the programs (their calls stop counting
    /// now, whatever the detach waits for) and takes their uprobe links.
    fn take_for_detach(&mut self, triggers: &[u32]) -> Vec<UProbeLink> {
        let Some(p) = self.probes.as_mut() else {
            return Vec::new();
        };
        let mut links = Vec::new();
        for t in triggers {
            let _ = p.disable(*t);
            links.extend(p.take_trigger_links(*t));
        }
        links
    }

    /// Detaches uprobe links, the kernel's wait in a child
    /// ([`crate::probe::detach`]): the driver waits for it a bounded time.
    fn drop_links(&mut self, links: Vec<UProbeLink>) {
        if links.is_empty() {
            return;
        }
        if let Some(w) = detach::drop_and_wait(links) {
            self.setup.printer.warning(&w);
        }
    }

    fn armed_now(&mut self, _pid: Option<i32>) {
        if self.armed_at.is_none() {
            self.armed_at = Some(Instant::now());
            let _ = self.progress.send(Progress::Armed);
            if self.setup.reader_delay.is_none() {
                self.watch_ring();
            }
        }
    }

    fn start_recorder(&mut self, trigger: u32, pid: i32, dir: PathBuf) -> Result<(), Failure> {
        self.kallsyms_made();
        let t = self.trigger(trigger);
        let policy = t.policy;
        let spec = PerfSpec {
            off_cpu: t.off_cpu,
            ..self.setup.perf.clone()
        };
        let rec = Recorder::start(
            trigger,
            pid,
            dir,
            &spec,
            policy,
            Shared {
                printer: self.setup.printer.clone(),
                counters: self.counters.clone(),
                keeper: self.setup.keeper.clone(),
                disarm: self.disarming.board(),
                kallsyms: self.kallsyms.clone(),
            },
        )?;
        let slot = self
            .slots
            .iter()
            .position(Option::is_none)
            .unwrap_or_else(|| {
                self.slots.push(None);
                self.slots.len() - 1
            });
        for kind in RecorderFd::ALL {
            if let Some(fd) = rec.fd(kind) {
                let _ = self.epoll.add(fd, Token::Recorder(slot, kind).event());
            }
        }
        self.by_target.insert((trigger, pid), slot);
        self.slots[slot] = Some(rec);
        Ok(())
    }

    /// Waits for the copy of `/proc/kallsyms` the first time a perf is
    /// spawned (it was started with the set-up, and is made by now).
    fn kallsyms_made(&mut self) {
        let Some(making) = self.setup.kallsyms.take() else {
            return;
        };
        match making.join() {
            Ok(Ok(copy)) => self.kallsyms = Some(Arc::new(copy)),
            Ok(Err(e)) => self.kallsyms_fallback(&format!("cannot make its copy: {e}")),
            Err(_) => self.kallsyms_fallback("its copy's thread panicked"),
        }
    }

    /// perf reads the real `/proc/kallsyms`: said once per run.
    fn kallsyms_fallback(&mut self, why: &str) {
        if std::mem::replace(&mut self.kallsyms_warned, true) {
            return;
        }
        self.setup.printer.warning(&format!(
            "perf reads /proc/kallsyms itself ({why}): each snapshot costs perf ~50 ms more CPU \
             (docs/perf-kallsyms.md); run the agent with CAP_SYS_ADMIN and a writable /dev/shm or TMPDIR"
        ));
    }

    fn trigger(&self, index: u32) -> &TriggerSetup {
        self.setup
            .triggers
            .iter()
            .find(|t| t.index == index)
            .expect("known trigger")
    }

    /// Starts a recorder for `pid` under every `--exe` trigger whose
    /// executable it runs (up to `--max-targets` per trigger).
    /// The ready recorder of an ancestor of `key`'s process for the same
    /// trigger, remembered once found. `--exe` only: a `--pid` probe sees no
    /// other process.
    fn follower_slot(&mut self, key: (u32, i32)) -> Option<usize> {
        let (trigger, pid) = key;
        if let Watch::Pid(target) = self.trigger(trigger).watch {
            // A process forked from the target (the eBPF program keeps only
            // those, see `CFG_FOLLOW_FORKS`): the target's perf records it.
            let slot = *self.by_target.get(&(trigger, target))?;
            return (self.trigger(trigger).uprobes.follow_forks
                && self.slots[slot].as_ref().is_some_and(Recorder::ready))
            .then_some(slot);
        }
        let ancestor = match self.followers.get(&key) {
            Some(a) => *a,
            None => {
                let a = proc::ancestors(pid, MAX_FOLLOW_DEPTH)
                    .into_iter()
                    .find(|a| self.by_target.contains_key(&(trigger, *a)))?;
                self.followers.insert(key, a);
                a
            }
        };
        let slot = *self.by_target.get(&(trigger, ancestor))?;
        self.slots[slot]
            .as_ref()
            .is_some_and(Recorder::ready)
            .then_some(slot)
    }

    fn maybe_track(&mut self, pid: i32) {
        if self.stopping.is_some() {
            return;
        }
        let Some(id) = proc::exe_id(pid) else {
            return;
        };
        let matching: Vec<(u32, PathBuf)> = self
            .setup
            .triggers
            .iter()
            .filter_map(|t| match &t.watch {
                Watch::Exe { id: want, .. } if *want == id => Some((t.index, t.out.clone())),
                _ => None,
            })
            .collect();
        for (trigger, out) in matching {
            if self.by_target.contains_key(&(trigger, pid)) || self.done.contains(&(trigger, pid)) {
                continue;
            }
            // One limit for the whole agent, across its triggers: it bounds
            // the perf processes a host runs.
            if self.by_target.len() >= self.setup.max_targets {
                self.extra += 1;
                self.done.insert((trigger, pid));
                self.setup.printer.warning(&format!(
                    "pid {pid} runs the traced executable, but all --max-targets {} recorders \
                     are busy; it is not recorded",
                    self.setup.max_targets
                ));
                continue;
            }
            if let Err(f) = self.start_recorder(trigger, pid, out.join(pid.to_string())) {
                self.setup
                    .printer
                    .warning(&format!("pid {pid}: {}", f.message));
            }
        }
    }

    fn over(&self) -> bool {
        if !self.slots.iter().all(Option::is_none) {
            return false;
        }
        // No recorder runs. The run is over when stopping, when a fatal
        // failure happened, or when no trigger can start one any more.
        self.stopping.is_some()
            || self.fatal.is_some()
            || !self
                .setup
                .triggers
                .iter()
                .any(|t| matches!(t.watch, Watch::Exe { .. }))
    }

    fn timeout(&self) -> EpollTimeout {
        let now = Now::read();
        let mut next = now.at + Duration::from_millis(500);
        for r in self.slots.iter().flatten() {
            next = next.min(r.next_deadline(now));
        }
        if !self.ring_watched
            && let (Some(armed), Some(delay)) = (self.armed_at, self.setup.reader_delay)
        {
            next = next.min(armed + delay);
        }
        if let Some(at) = self.disarming.next_rearm() {
            next = next.min(now.at + Duration::from_nanos(at.saturating_sub(now.ns)));
        }
        let wait = next.saturating_duration_since(now.at);
        // Round up to whole ms so a deadline is never missed by a hair.
        let ms = wait.as_nanos().div_ceil(1_000_000) as u64;
        EpollTimeout::try_from(ms).unwrap_or(EpollTimeout::NONE)
    }

    fn timers(&mut self) {
        let now = Now::read();
        if !self.ring_watched
            && let Some(armed) = self.armed_at
            && now.at >= armed + self.setup.reader_delay.unwrap_or_default()
        {
            self.watch_ring();
        }
        self.rearm_due();
        for slot in 0..self.slots.len() {
            if let Some(r) = &mut self.slots[slot]
                && r.tick(now).limit_reached
            {
                self.limit_reached(slot);
            }
        }
    }

    fn watch_ring(&mut self) {
        if !self.ring_watched
            && let Some(ring) = &self.ring
        {
            if self.epoll.add(ring.as_fd(), Token::Ring.event()).is_ok() {
                self.ring_watched = true;
            }
            self.read_ring();
        }
    }

    fn recorder_event(&mut self, slot: usize, kind: RecorderFd) {
        if matches!(kind, RecorderFd::Stderr | RecorderFd::PerfExit) {
            // A Dump line (or perf's exit) may race hits already in the ring
            // buffer: deliver those first, so they land in the snapshot that
            // was being written when they happened.
            self.read_ring();
        }
        let Some(r) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let now = Now::read();
        let feedback = match kind {
            RecorderFd::Stderr => r.on_stderr(now),
            RecorderFd::Ack => r.on_ack(now),
            RecorderFd::PerfExit => {
                r.on_perf_exit();
                Feedback::default()
            }
            RecorderFd::TargetExit => {
                if let Some(fd) = r.fd(RecorderFd::TargetExit) {
                    let _ = self.epoll.delete(fd);
                }
                r.on_target_exit(now);
                Feedback::default()
            }
        };
        // Closed pipes stay readable; stop watching them. Once perf is
        // ready, its acks are drained with stderr instead of waking us.
        if let Some(r) = self.slots[slot].as_ref() {
            let (ack_closed, stderr_closed) = r.pipes_closed();
            if (ack_closed || (kind == RecorderFd::Ack && !r.watch_acks()))
                && let Some(fd) = r.fd(RecorderFd::Ack)
            {
                let _ = self.epoll.delete(fd);
            }
            if stderr_closed && let Some(fd) = r.fd(RecorderFd::Stderr) {
                let _ = self.epoll.delete(fd);
            }
        }
        if let Some(after) = feedback.perf_ready {
            self.recorder_ready(slot, after);
        }
        if feedback.limit_reached {
            self.limit_reached(slot);
        }
    }

    /// A recorder's perf is ready. For a `--pid` trigger, attach its probes now.
    fn recorder_ready(&mut self, slot: usize, ready_after: Duration) {
        let Some(r) = self.slots[slot].as_ref() else {
            return;
        };
        let (trigger, pid) = (r.trigger, r.tgid);
        let dir = r.dir.clone();
        if self.stopping.is_some() {
            return;
        }
        let t = self.trigger(trigger);
        if !matches!(t.watch, Watch::Pid(_)) {
            self.setup
                .printer
                .target(pid, trigger, "started", &dir, None);
            return;
        }
        let set_up = self
            .probes
            .as_ref()
            .is_some_and(|p| self.disarming.set_up(trigger, p));
        if set_up {
            self.pending_set_up
                .insert(trigger, (slot, pid, ready_after));
        } else {
            self.attach_and_report(slot, ready_after);
        }
    }

    /// Attaches a `--pid` trigger's probes with aya, and reports it armed.
    fn attach_and_report(&mut self, slot: usize, ready_after: Duration) {
        let Some(r) = self.slots[slot].as_ref() else {
            return;
        };
        let (trigger, pid) = (r.trigger, r.tgid);
        let uprobes = self.trigger(trigger).uprobes.clone();
        let attached = self
            .attach(&uprobes)
            .map(|()| self.probes.as_ref().map_or(0, |p| p.attached_for(trigger)));
        match attached {
            Ok(n) => self.report_armed(slot, ready_after, n),
            Err(f) => {
                self.detach_trigger(trigger);
                if let Some(r) = self.slots[slot].as_mut() {
                    if proc::is_alive(pid) {
                        r.fail(f, Now::read());
                    } else {
                        // The target exited while perf started (attach fails
                        // with ESRCH): a normal end, not a failure.
                        r.stop(EndReason::TargetExited, Now::read());
                    }
                }
            }
        }
    }

    /// A `--pid` trigger's `uprobes` are in: the `armed` event.
    fn report_armed(&mut self, slot: usize, ready_after: Duration, uprobes: usize) {
        let Some(r) = self.slots[slot].as_ref() else {
            return;
        };
        let (trigger, pid, perf_pid) = (r.trigger, r.tgid, r.perf_pid());
        let mut armed = self.trigger(trigger).armed.clone();
        armed.pid = Some(pid);
        armed.perf_pid = Some(perf_pid);
        armed.uprobes = uprobes;
        armed.perf_ready_ms = ms(ready_after);
        armed.time_to_armed_ms = ms(self.setup.agent_started.elapsed());
        armed.perf_kallsyms = if r.kallsyms_copied() { "copy" } else { "proc" };
        if self.kallsyms.is_some() && armed.perf_kallsyms == "proc" {
            self.kallsyms_fallback("the copy could not be bind-mounted in perf's mount namespace");
        }
        self.setup.printer.armed(&armed);
        self.armed_now(Some(pid));
    }

    fn limit_reached(&mut self, slot: usize) {
        let Some(r) = self.slots[slot].as_ref() else {
            return;
        };
        let trigger = r.trigger;
        if matches!(self.trigger(trigger).watch, Watch::Pid(_)) {
            self.detach_trigger(trigger);
        }
        if let Some(r) = self.slots[slot].as_mut() {
            r.stop(EndReason::MaxSnapshots, Now::read());
        }
    }

    fn read_ring(&mut self) {
        loop {
            let hit: Hit = {
                let Some(item) = self.ring.as_mut().and_then(RingBuf::next) else {
                    break;
                };
                if item.len() < std::mem::size_of::<Hit>() {
                    continue;
                }
                // SAFETY: the record is a Hit written by our eBPF program; the
                // ring buffer gives no alignment guarantee, hence read_unaligned.
                unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) }
            };
            let now = Now::read();
            self.next_seq += 1;
            let at_return = hit.flags & HIT_AT_RETURN != 0;
            let ih = IndexedHit {
                seq: self.next_seq,
                tgid: hit.tgid,
                tid: hit.tid,
                cpu: hit.cpu,
                ktime_ns: hit.ktime_ns,
                args: hit.args,
                duration_ns: at_return.then_some(hit.duration_ns),
                retval: at_return.then_some(hit.retval),
                pending_return: (at_return && hit.entry_sp != 0).then_some(PendingReturn {
                    entry_sp: hit.entry_sp,
                    return_address: hit.return_address,
                }),
                merged: false,
                starts_before_samples: false,
                off_cpu: None,
            };
            let key = (hit.trigger, hit.tgid as i32);
            let delivered = match self.by_target.get(&key).copied() {
                // Ready: the state machine takes it (while stopping, it goes
                // into the tail).
                Some(slot) if self.slots[slot].as_ref().is_some_and(Recorder::ready) => {
                    self.deliver(slot, &ih, now);
                    true
                }
                // perf is starting: nothing records this process yet.
                Some(_) => {
                    self.hit_before_recording(hit.tgid);
                    false
                }
                // A process forked (without exec) from a recorded one: the
                // ancestor's perf follows it already (`perf record -p`
                // inherits into children), so its hit switches that perf,
                // and the process gets no perf of its own.
                None if let Some(slot) = self.follower_slot(key) => {
                    self.deliver(slot, &ih, now);
                    true
                }
                _ => {
                    // A process of a traced executable that we did not see
                    // exec (or whose exec is not read yet), with no recorded
                    // ancestor: record it from now on.
                    self.maybe_track(hit.tgid as i32);
                    if self.by_target.contains_key(&key) {
                        self.hit_before_recording(hit.tgid);
                    } else {
                        self.unrecorded += 1;
                    }
                    false
                }
            };
            // perf has its signal: now the probes may go, before the hit's
            // line is written (a reader that the write wakes could take this
            // CPU, with the probes still in: docs/disarming.md).
            self.disarming
                .after_hit(hit.trigger, hit.ktime_ns, self.probes.as_mut());
            if delivered {
                self.setup.printer.hit(&ih);
            }
        }
    }

    /// A hit of a process whose perf is not recording yet: counted, and
    /// the first of the run named in a warning.
    fn hit_before_recording(&mut self, tgid: u32) {
        self.before_recording += 1;
        if self.before_recording == 1 {
            self.setup.printer.warning(&format!(
                "pid {tgid}: a hit came before its perf was recording (perf starts at the \
                 process's exec and records once ready), so it has no snapshot; such hits \
                 are counted in the summary (hits_before_recording)"
            ));
        }
    }

    /// Hands a hit to a ready recorder, which signals perf; the caller
    /// reports it.
    fn deliver(&mut self, slot: usize, ih: &IndexedHit, now: Now) {
        let feedback = self.slots[slot]
            .as_mut()
            .map(|r| r.on_hit(ih.clone(), now))
            .unwrap_or_default();
        if feedback.limit_reached {
            self.limit_reached(slot);
        }
    }

    fn read_execs(&mut self) {
        let mut pids = Vec::new();
        if let Some(execs) = &mut self.execs {
            while let Some(item) = execs.next() {
                if item.len() >= std::mem::size_of::<Exec>() {
                    // SAFETY: an Exec record written by mt_exec.
                    let e: Exec = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                    pids.push(e.tgid as i32);
                }
            }
        }
        for pid in pids {
            self.maybe_track(pid);
        }
    }

    fn requests(&mut self) {
        let _ = self.wake.read();
        while let Ok(cmd) = self.rx.try_recv() {
            match cmd {
                Request::Stop(reason) => self.stop_all(reason),
            }
        }
    }

    fn stop_all(&mut self, reason: EndReason) {
        self.stopping.get_or_insert(reason.clone());
        // No more hits are wanted.
        self.detach_all();
        let now = Now::read();
        for r in self.slots.iter_mut().flatten() {
            r.stop(reason.clone(), now);
        }
    }

    fn fatal(&mut self, f: Failure) {
        if self.fatal.is_none() {
            self.fatal = Some(f);
        }
        self.stop_all(EndReason::Failed);
    }

    /// Finishes recorders whose perf exited.
    fn reap(&mut self) {
        for slot in 0..self.slots.len() {
            if !self.slots[slot].as_ref().is_some_and(Recorder::exited) {
                continue;
            }
            // Deliver what is still in the ring buffer first: this recorder's
            // hits end in its tail (or unsnapshotted).
            self.read_ring();
            let r = self.slots[slot].take().expect("exited recorder");
            for fd in RecorderFd::ALL.into_iter().filter_map(|k| r.fd(k)) {
                let _ = self.epoll.delete(fd);
            }
            let (trigger, pid) = (r.trigger, r.tgid);
            self.by_target.remove(&(trigger, pid));
            let is_pid = matches!(self.trigger(trigger).watch, Watch::Pid(_));
            if is_pid {
                self.detach_trigger(trigger);
            }
            let outcome = r.finish(Now::read());
            if let Some(f) = &outcome.failure {
                if outcome.reason == EndReason::DiskFull || self.setup.single_pid_run {
                    if self.fatal.is_none() {
                        self.fatal = Some(f.clone());
                    }
                    if outcome.reason == EndReason::DiskFull {
                        self.stop_all(EndReason::DiskFull);
                    }
                } else {
                    self.setup
                        .printer
                        .warning(&format!("pid {pid}: {}", f.message));
                }
            }
            if !is_pid {
                self.setup.printer.target(
                    pid,
                    trigger,
                    "finished",
                    &outcome.dir,
                    Some(&outcome.reason.describe()),
                );
                if proc::is_alive(pid) {
                    self.done.insert((trigger, pid));
                }
            }
            self.finished.push(outcome);
        }
    }

    /// After detaching: drains the ring buffer until the counters account
    /// for every hit (`seen = Σ dropped + accepted + open calls` and
    /// `accepted = read + lost`), for at most 100 ms. A program that was
    /// running when its probe went away may still be between its counter
    /// bump and its ring-buffer submit.
    fn settle_counters(&mut self) {
        let deadline = Instant::now() + Duration::from_millis(100);
        loop {
            self.read_ring();
            let Some(c) = self.counters.get() else {
                return;
            };
            let (mut seen, mut accounted, mut accepted, mut lost) = (0, 0, 0, 0);
            for t in &self.setup.triggers {
                let v = c.read(t.index);
                seen += v.seen;
                accounted += v.dropped.total() + v.accepted + c.open_calls(t.index);
                accepted += v.accepted;
                lost += v.lost;
            }
            if (seen == accounted && accepted == self.next_seq + lost) || Instant::now() >= deadline
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Takes the arming thread's answers, then asks for the attach of the
    /// disarmed triggers whose cooldown is about to end.
    fn rearm_due(&mut self) {
        let notices = self
            .disarming
            .answers(self.probes.as_mut(), &self.setup.printer);
        for n in notices {
            match n {
                Notice::SetUp { trigger, result } => self.set_up_answer(trigger, result),
                Notice::RearmFailed { trigger, message } => self.rearm_failed(trigger, message),
            }
        }
        let (triggers, by_target, slots) = (&self.setup.triggers, &self.by_target, &self.slots);
        let recording = |trigger: u32| {
            let watch = triggers
                .iter()
                .find(|t| t.index == trigger)
                .map(|t| &t.watch);
            let Some(Watch::Pid(pid)) = watch else {
                return false;
            };
            by_target
                .get(&(trigger, *pid))
                .and_then(|s| slots[*s].as_ref())
                .is_some_and(Recorder::recording)
        };
        self.disarming.rearm_due(self.probes.as_ref(), recording);
    }

    /// The arming thread made (or failed to make) a trigger's event
    /// uprobes: report it armed, or attach with aya.
    fn set_up_answer(&mut self, trigger: u32, result: Result<usize, String>) {
        let Some((slot, pid, ready_after)) = self.pending_set_up.remove(&trigger) else {
            return;
        };
        let live = self.stopping.is_none()
            && !self.disarming.is_gone(trigger)
            && self.slots[slot]
                .as_ref()
                .is_some_and(|r| r.trigger == trigger && r.tgid == pid && r.recording());
        match result {
            // The first arm follows the keepers' registration, which leaves
            // the kernel's grace period just passed: faster than a re-arm,
            // so it does not count among the attach times.
            Ok(n) if live => {
                self.disarming.set_up_done(trigger);
                self.report_armed(slot, ready_after, n);
            }
            // The recording ended meanwhile: the thread drops them.
            Ok(_) => self.disarming.drop_set_up(trigger),
            Err(e) => {
                self.disarming.no_events(&self.setup.printer, &e);
                if live {
                    self.attach_and_report(slot, ready_after);
                }
            }
        }
    }

    /// A trigger's uprobes could not be put back: its recorder fails, or
    /// ends normally if the target exited while disarmed.
    fn rearm_failed(&mut self, trigger: u32, message: String) {
        let Watch::Pid(pid) = self.trigger(trigger).watch else {
            return;
        };
        let now = Now::read();
        if let Some(r) = self
            .by_target
            .get(&(trigger, pid))
            .copied()
            .and_then(|s| self.slots[s].as_mut())
        {
            if proc::is_alive(pid) {
                r.fail(Failure::runtime(message), now);
            } else {
                r.stop(EndReason::TargetExited, now);
            }
        }
    }

    fn outcome(&mut self) -> Outcome {
        self.detach_all();
        for w in self.disarming.finish() {
            self.setup.printer.warning(&w);
        }
        self.settle_counters();
        let mut counters = crate::output::counters::CounterValues::default();
        let mut open_calls = 0;
        if let Some(c) = self.counters.get() {
            for t in &self.setup.triggers {
                counters.add(&c.read(t.index));
                open_calls += c.open_calls(t.index);
            }
        }
        let mut stats = crate::output::events::Stats::default();
        let mut perf_cpu: Option<Duration> = None;
        for o in &self.finished {
            stats.add(&o.stats);
            if let Some(c) = o.perf_cpu {
                perf_cpu = Some(perf_cpu.unwrap_or_default() + c);
            }
        }
        let single = self
            .setup
            .single_pid_run
            .then(|| self.finished.first())
            .flatten();
        let (reason, failure) = run_end(
            self.stopping.as_ref(),
            self.fatal.take(),
            single.map(|o| (&o.reason, o.failure.as_ref())),
        );
        Outcome {
            reason,
            failure,
            counters,
            stats,
            open_calls,
            perf_exit: single.and_then(|o| o.perf_exit.clone()),
            perf_cpu,
            recorders: self
                .finished
                .iter()
                .map(crate::output::events::RecorderSummary::from)
                .collect(),
            unrecorded_hits: self.unrecorded,
            hits_before_recording: self.before_recording,
            extra_processes: self.extra,
            disarm: self.disarming.summary(crate::sys::clock::monotonic_ns()),
        }
    }
}

/// Every process id in /proc.
fn all_pids() -> Vec<i32> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Puts the reader under SCHED_FIFO at `prio` (perf, spawned from this
/// thread, starts at normal priority: [`crate::sys::sched::set_fifo`]).
fn set_fifo(prio: i32, printer: &Printer) {
    if let Err(e) = crate::sys::sched::set_fifo(prio) {
        printer.warning(&format!(
            "--rt-priority {prio}: sched_setscheduler failed ({e}); the reader runs at normal priority"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_token_reads_back_as_itself() {
        let mut tokens = vec![Token::Ring, Token::Execs, Token::Wake, Token::Logger];
        for slot in [0, 1, 7, 1000] {
            tokens.extend(RecorderFd::ALL.map(|fd| Token::Recorder(slot, fd)));
        }
        let mut seen = HashSet::new();
        for t in tokens {
            assert!(seen.insert(t.encode()), "{t:?} shares its number");
            assert_eq!(Token::decode(t.encode()), Some(t));
        }
        assert_eq!(Token::decode(0), None);
    }
}
