//! The driver thread: the data path of a run.
//!
//! One thread owns the probes, the ring buffer, perf's pipes, the trigger
//! state machine and the index, and waits in `epoll` on all of them. A hit
//! goes from the ring buffer to `kill(perf, SIGUSR2)` on this thread with no
//! hop to another thread. The main thread (tokio) handles the lifecycle:
//! signals, `--duration`, exec detection; it talks to the driver through
//! [`Command`]s and hears back through [`Event`]s.
//!
//! Order of a run: wait for perf's first `ping` ack, attach the probes, print
//! `armed`, then loop. At the end: detach the probes, let perf finish (stop it
//! if needed, then SIGTERM after 10 s and SIGKILL after 10 s more), drain the
//! ring buffer, index every file perf left, read the final counters.

use std::{
    collections::HashSet,
    fs,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::PathBuf,
    sync::{Arc, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use agent_common::Hit;
use aya::maps::{MapData, RingBuf};
use nix::{
    sys::{
        epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout},
        eventfd::{EfdFlags, EventFd},
        signal::Signal,
        time::TimeSpec,
    },
    time::{ClockId, clock_gettime},
};
use tokio::sync::mpsc::UnboundedSender;

use crate::{
    error::Failure,
    index::Index,
    perf::{self, PerfLine, PerfProcess, SpinDetector},
    probe::{AttachPlan, CounterValues, Counters, Probes},
    report::{Armed, Reporter, SnapshotEvent},
    target,
    trigger::{Action, IndexedHit, Policy, Stats, Trigger},
};

/// CLOCK_MONOTONIC now, in ns: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let ts: TimeSpec = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// Why a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndReason {
    /// `--max-snapshots` reached.
    MaxSnapshots,
    /// `--duration` passed.
    Duration,
    /// SIGINT, SIGTERM or SIGHUP.
    Signal(&'static str),
    /// The target exited.
    TargetExited,
    /// The target exec'd a new image; the probe no longer fires.
    Exec,
    /// perf ended on its own (a failure).
    PerfEnded,
    /// The output file system is full (a failure).
    DiskFull,
    /// Some other failure.
    Failed,
}

impl EndReason {
    /// Text for the summary.
    pub fn describe(&self) -> String {
        match self {
            EndReason::MaxSnapshots => "--max-snapshots reached".into(),
            EndReason::Duration => "--duration passed".into(),
            EndReason::Signal(s) => format!("{s} received"),
            EndReason::TargetExited => "the target exited".into(),
            EndReason::Exec => "the target exec'd a new image".into(),
            EndReason::PerfEnded => "perf ended unexpectedly".into(),
            EndReason::DiskFull => "the output file system is full".into(),
            EndReason::Failed => "a failure".into(),
        }
    }
}

/// From the main thread to the driver.
#[derive(Debug)]
pub enum Command {
    /// End the run for this reason (the first reason wins).
    Stop(EndReason),
}

/// From the driver to the main thread.
#[derive(Debug)]
pub enum Event {
    /// perf is ready and the probes are attached.
    Armed,
    /// The run is over.
    Finished(Box<Outcome>),
}

/// How a run ended.
#[derive(Debug)]
pub struct Outcome {
    pub reason: EndReason,
    /// Set when the run failed (exit code 3 or 4).
    pub failure: Option<Failure>,
    pub stats: Stats,
    pub counters: CounterValues,
    pub open_calls: u64,
    pub perf_exit: Option<String>,
    pub perf_cpu: Option<Duration>,
}

/// Everything the driver needs.
pub struct Setup {
    pub trigger: u32,
    pub policy: Policy,
    pub plan: AttachPlan,
    pub probes: Probes,
    pub perf: PerfProcess,
    pub perf_spawned: Instant,
    pub agent_started: Instant,
    pub index: Index,
    pub out_dir: PathBuf,
    pub reporter: Arc<Reporter>,
    /// Filled in with perf's pid and timings when armed.
    pub armed: Armed,
    pub verbose: bool,
    pub rt_priority: Option<i32>,
    pub reader_delay: Option<Duration>,
}

/// The main thread's handle on the driver.
pub struct Handle {
    tx: mpsc::Sender<Command>,
    wake: Arc<EventFd>,
    thread: Option<JoinHandle<()>>,
}

impl Handle {
    /// Sends a command and wakes the driver.
    pub fn send(&self, cmd: Command) {
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

/// How long perf may take to answer its first `ping`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Between `stop` and SIGTERM, and between SIGTERM and SIGKILL (perf's own
/// `perf daemon` uses the same).
const ESCALATE_AFTER: Duration = Duration::from_secs(10);
/// How often perf's CPU use is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);

const T_RING: u64 = 1;
const T_STDERR: u64 = 2;
const T_ACK: u64 = 3;
const T_PERF_EXIT: u64 = 4;
const T_TARGET_EXIT: u64 = 5;
const T_WAKE: u64 = 6;
const T_LOGGER: u64 = 7;

/// Starts the driver thread.
pub fn spawn(setup: Setup, events: UnboundedSender<Event>) -> anyhow::Result<Handle> {
    let (tx, rx) = mpsc::channel();
    let wake = Arc::new(EventFd::from_flags(
        EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK,
    )?);
    let thread_wake = wake.clone();
    let thread = std::thread::Builder::new()
        .name("mt-agent-driver".into())
        .spawn(move || {
            let outcome = Driver::new(setup, rx, thread_wake, events.clone()).map(|mut d| d.run());
            let outcome = outcome.unwrap_or_else(|e| Outcome {
                reason: EndReason::Failed,
                failure: Some(
                    crate::error::failure_of(&e)
                        .cloned()
                        .unwrap_or_else(|| Failure::runtime(format!("{e:#}"))),
                ),
                stats: Stats::default(),
                counters: CounterValues::default(),
                open_calls: 0,
                perf_exit: None,
                perf_cpu: None,
            });
            let _ = events.send(Event::Finished(Box::new(outcome)));
        })?;
    Ok(Handle {
        tx,
        wake,
        thread: Some(thread),
    })
}

struct Driver {
    s: Setup,
    events: UnboundedSender<Event>,
    epoll: Epoll,
    rx: mpsc::Receiver<Command>,
    wake: Arc<EventFd>,
    ring: RingBuf<MapData>,
    ring_watched: bool,
    counters: Counters,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    target_pidfd: Option<OwnedFd>,
    trigger: Trigger,
    next_seq: u64,
    snapshots: u64,
    /// Files indexed and still on disk.
    listed: Vec<String>,
    /// Files indexed (on disk or deleted by --keep).
    indexed: HashSet<String>,
    ready_at: Option<Instant>,
    armed_at: Option<Instant>,
    reason: Option<EndReason>,
    failure: Option<Failure>,
    /// When `stop` was written or the target exited; SIGTERM and SIGKILL follow.
    stopping_since: Option<Instant>,
    sent_term: bool,
    sent_kill: bool,
    perf_exited: bool,
    stderr_open: bool,
    ack_open: bool,
    disk_full: bool,
    spin: SpinDetector,
    next_sample: Instant,
}

impl Driver {
    fn new(
        mut s: Setup,
        rx: mpsc::Receiver<Command>,
        wake: Arc<EventFd>,
        events: UnboundedSender<Event>,
    ) -> anyhow::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        let ring = s.probes.take_ring()?;
        let counters = s.probes.take_counters()?;
        let logger = if s.verbose {
            s.probes.take_logger()
        } else {
            None
        };
        let watch = |fd: BorrowedFd<'_>, token: u64| {
            epoll.add(fd, EpollEvent::new(EpollFlags::EPOLLIN, token))
        };
        watch(s.perf.stderr_fd(), T_STDERR)?;
        watch(s.perf.ack_fd(), T_ACK)?;
        watch(s.perf.pidfd(), T_PERF_EXIT)?;
        watch(wake.as_fd(), T_WAKE)?;
        if let Some(l) = &logger {
            watch(l.as_fd(), T_LOGGER)?;
        }
        let target_pidfd = perf::pidfd_open(s.plan.pid.unwrap_or(0)).ok();
        if let Some(fd) = &target_pidfd {
            watch(fd.as_fd(), T_TARGET_EXIT)?;
        }
        // perf answers only from its main loop: an ack means SIGUSR2 works.
        let _ = s.perf.ping();
        if let Some(prio) = s.rt_priority {
            set_fifo(prio, &s.reporter);
        }
        let policy = s.policy;
        Ok(Self {
            s,
            events,
            epoll,
            rx,
            wake,
            ring,
            ring_watched: false,
            counters,
            logger,
            target_pidfd,
            trigger: Trigger::new(policy),
            next_seq: 0,
            snapshots: 0,
            listed: Vec::new(),
            indexed: HashSet::new(),
            ready_at: None,
            armed_at: None,
            reason: None,
            failure: None,
            stopping_since: None,
            sent_term: false,
            sent_kill: false,
            perf_exited: false,
            stderr_open: true,
            ack_open: true,
            disk_full: false,
            spin: SpinDetector::new(Duration::from_secs(2), 0.9),
            next_sample: Instant::now() + SAMPLE_EVERY,
        })
    }

    fn run(&mut self) -> Outcome {
        let mut events = [EpollEvent::empty(); 16];
        while !self.perf_exited {
            let timeout = self.timeout();
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(e) => {
                    self.fail(Failure::runtime(format!("epoll_wait: {e}")));
                    break;
                }
            };
            for ev in &events[..n] {
                match ev.data() {
                    T_RING => self.read_ring(),
                    T_STDERR => self.read_stderr(),
                    T_ACK => self.read_acks(),
                    T_PERF_EXIT => self.perf_exited = true,
                    T_TARGET_EXIT => self.target_exited(),
                    T_WAKE => self.commands(),
                    T_LOGGER => {
                        if let Some(l) = &mut self.logger {
                            l.flush();
                        }
                    }
                    _ => {}
                }
            }
            self.timers();
        }
        self.finish()
    }

    /// Until the next state-machine deadline, escalation step, sample, or
    /// delayed reader start; at most 500 ms.
    fn timeout(&self) -> EpollTimeout {
        let now_ns = monotonic_ns();
        let mut wait = SAMPLE_EVERY;
        if let Some(deadline) = self.trigger.next_deadline() {
            wait = wait.min(Duration::from_nanos(deadline.saturating_sub(now_ns)));
        }
        let now = Instant::now();
        if let Some(since) = self.stopping_since {
            let next = if self.sent_term {
                since + 2 * ESCALATE_AFTER
            } else {
                since + ESCALATE_AFTER
            };
            wait = wait.min(next.saturating_duration_since(now));
        }
        if !self.ring_watched
            && let (Some(armed), Some(delay)) = (self.armed_at, self.s.reader_delay)
        {
            wait = wait.min((armed + delay).saturating_duration_since(now));
        }
        wait = wait.min(self.next_sample.saturating_duration_since(now));
        // Round up to whole ms so a deadline is never missed by a hair.
        let ms = wait.as_nanos().div_ceil(1_000_000) as u64;
        EpollTimeout::try_from(ms).unwrap_or(EpollTimeout::NONE)
    }

    fn timers(&mut self) {
        let now = Instant::now();
        // The delayed reader (tests of ring-buffer overflow).
        if !self.ring_watched
            && let Some(armed) = self.armed_at
            && now >= armed + self.s.reader_delay.unwrap_or_default()
        {
            self.watch_ring();
        }
        let actions = self.trigger.on_tick(monotonic_ns());
        self.apply(actions);
        if self.ready_at.is_none()
            && now.duration_since(self.s.perf_spawned) > READY_TIMEOUT
            && self.failure.is_none()
        {
            self.fail(Failure::runtime(format!(
                "perf did not become ready within {} s; see perf's messages below",
                READY_TIMEOUT.as_secs()
            )));
            self.s.perf.signal(Signal::SIGTERM);
            self.stopping_since.get_or_insert(now);
        }
        if let Some(since) = self.stopping_since {
            if !self.sent_term && now >= since + ESCALATE_AFTER {
                self.s
                    .reporter
                    .warning("perf did not exit 10 s after stop; sending SIGTERM");
                self.s.perf.signal(Signal::SIGTERM);
                self.sent_term = true;
            } else if self.sent_term && !self.sent_kill && now >= since + 2 * ESCALATE_AFTER {
                self.s
                    .reporter
                    .warning("perf did not exit 10 s after SIGTERM; sending SIGKILL");
                self.s.perf.signal(Signal::SIGKILL);
                self.sent_kill = true;
            }
        }
        if now >= self.next_sample {
            self.next_sample = now + SAMPLE_EVERY;
            if let Some(cpu) = self.s.perf.cpu_time()
                && let Some(frac) = self
                    .spin
                    .sample(now.duration_since(self.s.perf_spawned), cpu)
            {
                self.s.reporter.warning(&format!(
                    "perf is using {:.0}% of a core (for 2 s or more); perf 6.1 can spin when \
                     threads of the target exit (fixed upstream in 2026)",
                    frac * 100.0
                ));
            }
        }
    }

    fn watch_ring(&mut self) {
        if !self.ring_watched {
            let token = EpollEvent::new(EpollFlags::EPOLLIN, T_RING);
            if self.epoll.add(self.ring.as_fd(), token).is_ok() {
                self.ring_watched = true;
            }
            self.read_ring();
        }
    }

    fn read_acks(&mut self) {
        match self.s.perf.read_acks() {
            Ok(n) if n > 0 && self.ready_at.is_none() => self.perf_ready(),
            Ok(_) => {}
            Err(_) => self.ack_open = false,
        }
        if self.ack_open && self.s.perf.ack_closed() {
            self.ack_open = false;
            let _ = self.epoll.delete(self.s.perf.ack_fd());
        }
    }

    /// perf answered its first ping: attach and announce.
    fn perf_ready(&mut self) {
        let now = Instant::now();
        self.ready_at = Some(now);
        if self.reason.is_some() {
            // Asked to stop before we were armed.
            let actions = self.trigger.on_stop_request(monotonic_ns());
            self.apply(actions);
            return;
        }
        if let Err(f) = self.s.probes.attach(&self.s.plan) {
            self.s.probes.detach_all();
            self.fail(f);
            return;
        }
        let armed_at = Instant::now();
        self.armed_at = Some(armed_at);
        if self.s.reader_delay.is_none() {
            self.watch_ring();
        }
        let a = &mut self.s.armed;
        a.perf_pid = self.s.perf.pid().as_raw();
        a.uprobes = self.s.probes.attached();
        a.perf_ready_ms = ms(now.duration_since(self.s.perf_spawned));
        a.time_to_armed_ms = ms(armed_at.duration_since(self.s.agent_started));
        self.s.reporter.armed(a);
        // `armed` is on stdout before the main thread hears of it.
        let _ = self.events.send(Event::Armed);
    }

    fn read_ring(&mut self) {
        loop {
            let hit: Hit = {
                let Some(item) = self.ring.next() else { break };
                if item.len() < std::mem::size_of::<Hit>() {
                    continue;
                }
                // SAFETY: the record is a Hit written by our eBPF program; the
                // ring buffer gives no alignment guarantee, hence read_unaligned.
                unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) }
            };
            let now = monotonic_ns();
            self.next_seq += 1;
            let ih = IndexedHit {
                seq: self.next_seq,
                tgid: hit.tgid,
                tid: hit.tid,
                cpu: hit.cpu,
                ktime_ns: hit.ktime_ns,
                args: hit.args,
                duration_ns: (hit.flags & agent_common::HIT_AT_RETURN != 0)
                    .then_some(hit.duration_ns),
                retval: (hit.flags & agent_common::HIT_AT_RETURN != 0).then_some(hit.retval),
                merged: false,
            };
            let actions = self.trigger.on_hit(ih.clone(), now);
            // Signal perf first; report after.
            self.apply(actions);
            self.s.reporter.hit(&ih);
        }
    }

    fn read_stderr(&mut self) {
        let lines = self.s.perf.read_stderr().unwrap_or_default();
        self.perf_lines(lines);
        if self.stderr_open && self.s.perf.stderr_closed() {
            self.stderr_open = false;
            let _ = self.epoll.delete(self.s.perf.stderr_fd());
        }
    }

    fn perf_lines(&mut self, lines: Vec<PerfLine>) {
        for line in lines {
            match line {
                PerfLine::Dump(path) => {
                    let name = path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| path.display().to_string());
                    if !self.indexed.contains(&name) {
                        let actions = self.trigger.on_dump(name, monotonic_ns());
                        self.apply(actions);
                    }
                }
                PerfLine::Other(l) => {
                    if l.contains("No space left on device") {
                        self.disk_full = true;
                    }
                    self.s.reporter.verbose(&format!("perf: {l}"));
                }
            }
        }
    }

    fn commands(&mut self) {
        let _ = self.wake.read();
        while let Ok(cmd) = self.rx.try_recv() {
            match cmd {
                Command::Stop(reason) => self.request_stop(reason),
            }
        }
    }

    fn request_stop(&mut self, reason: EndReason) {
        if self.reason.is_none() {
            self.reason = Some(reason);
        }
        // No more hits are wanted.
        self.s.probes.detach_all();
        if self.ready_at.is_none() {
            // perf is not in its main loop yet; it would not read `stop`.
            self.s.perf.signal(Signal::SIGTERM);
            self.stopping_since.get_or_insert_with(Instant::now);
            return;
        }
        let actions = self.trigger.on_stop_request(monotonic_ns());
        self.apply(actions);
    }

    fn target_exited(&mut self) {
        if let Some(fd) = self.target_pidfd.take() {
            let _ = self.epoll.delete(fd.as_fd());
        }
        if self.reason.is_none() {
            self.reason = Some(EndReason::TargetExited);
        }
        self.s.probes.detach_all();
        // perf finalizes and exits by itself; escalate if it does not.
        self.stopping_since.get_or_insert_with(Instant::now);
    }

    fn fail(&mut self, f: Failure) {
        if self.failure.is_none() {
            self.failure = Some(f);
        }
        if self.reason.is_none() {
            self.reason = Some(EndReason::Failed);
        }
        self.s.probes.detach_all();
        if self.ready_at.is_some() {
            let actions = self.trigger.on_stop_request(monotonic_ns());
            self.apply(actions);
        } else {
            self.s.perf.signal(Signal::SIGTERM);
            self.stopping_since.get_or_insert_with(Instant::now);
        }
    }

    fn apply(&mut self, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Switch => {
                    let _ = self.s.perf.switch();
                }
                Action::Stop => {
                    let _ = self.s.perf.stop();
                    self.stopping_since.get_or_insert_with(Instant::now);
                }
                Action::LimitReached => {
                    if self.reason.is_none() {
                        self.reason = Some(EndReason::MaxSnapshots);
                    }
                    self.s.probes.detach_all();
                }
                Action::Index(snap) => self.index(snap),
            }
        }
    }

    fn index(&mut self, snap: crate::trigger::Snapshot) {
        let path = self.s.out_dir.join(&snap.file);
        let bytes = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let counters = self.counters.read(self.s.trigger);
        let merged = self.trigger.stats().merged;
        if let Err(e) = self.s.index.snapshot(&snap, bytes, counters, merged) {
            self.index_failed(e);
        }
        self.indexed.insert(snap.file.clone());
        self.listed.push(snap.file.clone());
        self.snapshots += 1;
        self.s.reporter.snapshot(&SnapshotEvent {
            n: self.snapshots,
            kind: snap.kind,
            file: &snap.file,
            bytes,
            hits: &snap.hits,
            hit_to_kill_ns: snap.hit_to_kill_ns,
            unlisted_hits: snap.unlisted_hits,
        });
        // perf's --switch-max-files (from --keep) deletes the oldest files.
        let out = &self.s.out_dir;
        let (kept, gone): (Vec<String>, Vec<String>) = std::mem::take(&mut self.listed)
            .into_iter()
            .partition(|f| out.join(f).exists());
        self.listed = kept;
        for f in gone {
            if let Err(e) = self.s.index.deleted(&f) {
                self.index_failed(e);
            }
        }
    }

    fn index_failed(&mut self, e: std::io::Error) {
        if e.raw_os_error() == Some(libc::ENOSPC) {
            self.disk_full = true;
        }
        let f = if self.disk_full {
            Failure::runtime(format!(
                "the output file system is full (writing {}): stopping; completed snapshots \
                 are kept and listed",
                self.s.index.path().display()
            ))
        } else {
            Failure::runtime(format!("writing {}: {e}", self.s.index.path().display()))
        };
        self.fail(f);
    }

    /// perf has exited: index what it left and collect the outcome.
    fn finish(&mut self) -> Outcome {
        self.s.probes.detach_all();
        let status = self.s.perf.try_wait().ok().flatten();
        let perf_cpu = self.s.perf.last_cpu_time();
        self.read_ring();
        let lines = self.s.perf.flush_stderr();
        self.perf_lines(lines);
        // Files perf completed without a Dump line (it was killed, or it
        // printed `<timestamp>` literally on SIGTERM): the tail.
        let mut left: Vec<String> = fs::read_dir(&self.s.out_dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("perf.data.") && !self.indexed.contains(n))
            .collect();
        left.sort();
        for name in left {
            let actions = self.trigger.on_dump(name, monotonic_ns());
            let actions = actions
                .into_iter()
                .filter(|a| matches!(a, Action::Index(_)))
                .collect();
            self.apply(actions);
        }
        let unsnapshotted = self.trigger.on_perf_exit();
        if unsnapshotted > 0 {
            self.s.reporter.warning(&format!(
                "{unsnapshotted} accepted hit(s) got no snapshot: perf ended before writing it"
            ));
        }
        let target_alive = self.s.plan.pid.is_some_and(target::is_alive);
        if !target_alive && self.reason.is_none() {
            self.reason = Some(EndReason::TargetExited);
        }
        let we_ended_it = self.trigger.stop_sent() || self.sent_term || self.sent_kill;
        if self.ready_at.is_none()
            && self.failure.is_none()
            && target_alive
            && self.reason.is_none()
        {
            self.failure = Some(perf_start_failure(status, &self.s.perf.last_lines()));
        } else if self.disk_full && self.failure.is_none() {
            self.failure = Some(Failure::runtime(
                "the output file system is full: perf could not write; completed snapshots are \
                 kept and listed",
            ));
        } else if self.failure.is_none() && target_alive && !we_ended_it {
            let how = status
                .map(perf::describe_status)
                .unwrap_or_else(|| "unknown status".into());
            self.failure = Some(
                Failure::runtime(format!(
                    "perf ended unexpectedly ({how}) while the target still runs"
                ))
                .with_detail(
                    self.s
                        .perf
                        .last_lines()
                        .into_iter()
                        .map(|l| format!("perf: {l}")),
                ),
            );
            self.reason = Some(EndReason::PerfEnded);
        }
        if self.disk_full {
            self.reason = Some(EndReason::DiskFull);
        }
        Outcome {
            reason: self.reason.clone().unwrap_or(EndReason::PerfEnded),
            failure: self.failure.take(),
            stats: self.trigger.stats(),
            counters: self.counters.read(self.s.trigger),
            open_calls: self.counters.open_calls(self.s.trigger),
            perf_exit: status.map(perf::describe_status),
            perf_cpu,
        }
    }
}

/// The failure for a perf that exited before it was ready: bad arguments
/// (exit code 2) or anything else (4), with its last stderr lines.
fn perf_start_failure(status: Option<std::process::ExitStatus>, lines: &[String]) -> Failure {
    let how = status
        .map(perf::describe_status)
        .unwrap_or_else(|| "unknown status".into());
    let usage = lines.iter().any(|l| {
        l.contains("event syntax error")
            || l.contains("unknown tracepoint")
            || l.contains("Usage:")
            || l.contains("unknown option")
            || l.contains("unknown switch")
            || l.contains("invalid or unsupported event")
    });
    let first = lines.first().cloned().unwrap_or_default();
    let detail = lines.iter().map(|l| format!("perf: {l}"));
    if usage {
        Failure::usage(format!(
            "perf rejected its arguments ({how}): {first}; fix --event or the extra perf arguments"
        ))
        .with_detail(detail)
    } else {
        Failure::runtime(format!(
            "perf exited at start ({how}); see its messages below"
        ))
        .with_detail(detail)
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Puts the calling thread under SCHED_FIFO at `prio`.
fn set_fifo(prio: i32, reporter: &Reporter) {
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: pid 0 is the calling thread; `param` is valid.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        reporter.warning(&format!(
            "--rt-priority {prio}: sched_setscheduler failed ({}); the reader runs at normal priority",
            std::io::Error::last_os_error()
        ));
    }
}
