//! One perf recorder: a `perf record -p PID` process, the snapshot state
//! machine that drives it, and the index of its output directory, which an
//! index thread of its own writes ([`Indexing`]): a snapshot's parse, its
//! build-id copies and `--max-disk` wait on the disk, never the driver.
//!
//! The driver thread owns the recorders and feeds them events (acks, stderr
//! lines, hits) with the time they happened; a recorder never blocks and
//! never reads the clock. Its life is one [`Phase`]: starting (perf spawned)
//! → recording (first `ping` acked; switching on hits) → stopping (`stop`,
//! then SIGTERM after 10 s, then SIGKILL after 10 s more) → exited (perf's
//! pidfd fired). [`Recorder::finish`] then indexes every file perf left and
//! asks [`crate::capture::end::recorder_end`] how the recorder ended.

use std::{
    collections::HashSet,
    fs,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::PathBuf,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use nix::sys::signal::Signal;

use crate::{
    capture::{
        disk_budget::Keeper,
        end::{RecorderFacts, recorder_end},
        outcome::{EndReason, RecorderOutcome},
        snapshot::{Action, Policy, SnapshotMachine},
    },
    error::Failure,
    output::{
        events::{Printer, SnapshotEvent},
        index::{Index, IndexedHit, OutputDir, Snapshot, SnapshotKind},
    },
    perf,
    perf::{
        data, offcpu,
        offcpu::OffCpu,
        record::{PerfLine, PerfProcess, PerfSpec, Recording, SpinDetector},
    },
    probe::counters::Counters,
    sys::{clock::Now, proc},
};

/// Between `stop` and SIGTERM, and between SIGTERM and SIGKILL (perf's own
/// `perf daemon` uses the same).
pub const ESCALATE_AFTER: Duration = Duration::from_secs(10);
/// How long perf may take to answer its first `ping`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often perf's CPU use is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// What the driver must act on after feeding a recorder an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Feedback {
    /// perf just became ready, this long after it was spawned.
    pub perf_ready: Option<Duration>,
    /// `--max-snapshots` was reached: this recorder wants no more hits.
    pub limit_reached: bool,
}

/// The fds of a recorder that the driver waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecorderFd {
    /// perf's stderr: `Dump` lines, warnings, and the acks once perf is ready.
    Stderr,
    /// perf's ack pipe, watched until perf's first ack.
    Ack,
    /// perf's pidfd: readable when perf exits.
    PerfExit,
    /// The target's pidfd: readable when the target exits.
    TargetExit,
}

impl RecorderFd {
    pub const ALL: [RecorderFd; 4] = [
        RecorderFd::Stderr,
        RecorderFd::Ack,
        RecorderFd::PerfExit,
        RecorderFd::TargetExit,
    ];
}

/// Signals sent to perf while it is ending, in escalation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Sent {
    Nothing,
    Term,
    Kill,
}

/// Why, and since when, a recorder is ending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    /// The first reason given.
    pub reason: EndReason,
    /// The first failure recorded.
    pub failure: Option<Failure>,
    /// When the escalation clock started.
    pub since: Instant,
    pub sent: Sent,
}

/// Where a recorder is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// perf spawned; its first ack not seen yet (it would ignore SIGUSR2).
    Starting,
    /// perf acked its first `ping`: hits go to the state machine.
    Recording,
    /// Asked to end.
    Stopping {
        perf_was_ready: bool,
        ending: Ending,
    },
    /// perf exited; `ending` is None if nobody asked it to end.
    Exited {
        perf_was_ready: bool,
        ending: Option<Ending>,
    },
}

impl Phase {
    /// Whether perf acked its first `ping` (from then on, hits go to the
    /// state machine; while stopping, into the tail).
    pub fn perf_was_ready(&self) -> bool {
        match self {
            Phase::Starting => false,
            Phase::Recording => true,
            Phase::Stopping { perf_was_ready, .. } | Phase::Exited { perf_was_ready, .. } => {
                *perf_was_ready
            }
        }
    }

    pub fn ending(&self) -> Option<&Ending> {
        match self {
            Phase::Stopping { ending, .. } => Some(ending),
            Phase::Exited { ending, .. } => ending.as_ref(),
            Phase::Starting | Phase::Recording => None,
        }
    }

    fn failure(&self) -> Option<&Failure> {
        self.ending().and_then(|e| e.failure.as_ref())
    }

    /// perf acked its first `ping`.
    pub fn perf_ready(&mut self) {
        match self {
            Phase::Starting => *self = Phase::Recording,
            Phase::Stopping { perf_was_ready, .. } | Phase::Exited { perf_was_ready, .. } => {
                *perf_was_ready = true
            }
            Phase::Recording => {}
        }
    }

    /// perf's pidfd fired.
    pub fn perf_exited(&mut self) {
        let perf_was_ready = self.perf_was_ready();
        let ending = match std::mem::replace(self, Phase::Starting) {
            Phase::Stopping { ending, .. } => Some(ending),
            Phase::Exited { ending, .. } => ending,
            Phase::Starting | Phase::Recording => None,
        };
        *self = Phase::Exited {
            perf_was_ready,
            ending,
        };
    }

    /// Starts ending for `reason` at `now`; an ending already under way
    /// keeps its first reason and its clock. Returns the ending.
    pub fn end(&mut self, reason: EndReason, now: Instant) -> &mut Ending {
        let fresh = Ending {
            reason,
            failure: None,
            since: now,
            sent: Sent::Nothing,
        };
        match self {
            Phase::Starting | Phase::Recording => {
                *self = Phase::Stopping {
                    perf_was_ready: self.perf_was_ready(),
                    ending: fresh,
                }
            }
            Phase::Exited { ending, .. } if ending.is_none() => *ending = Some(fresh),
            Phase::Stopping { .. } | Phase::Exited { .. } => {}
        }
        match self {
            Phase::Stopping { ending, .. }
            | Phase::Exited {
                ending: Some(ending),
                ..
            } => ending,
            _ => unreachable!("an ending was set above"),
        }
    }

    /// Whether perf missed its start-up deadline: not ready `READY_TIMEOUT`
    /// after `spawned`, and no failure recorded yet.
    pub fn ready_overdue(&self, spawned: Instant, now: Instant) -> bool {
        !self.perf_was_ready()
            && self.failure().is_none()
            && now.duration_since(spawned) > READY_TIMEOUT
    }

    /// The next escalation signal due at `now`, if any: SIGTERM
    /// [`ESCALATE_AFTER`] after the ending began, SIGKILL as long again
    /// after that. Records it as sent.
    pub fn escalate(&mut self, now: Instant) -> Option<Signal> {
        let e = match self {
            Phase::Stopping { ending, .. } => ending,
            Phase::Exited {
                ending: Some(ending),
                ..
            } => ending,
            _ => return None,
        };
        match e.sent {
            Sent::Nothing if now >= e.since + ESCALATE_AFTER => {
                e.sent = Sent::Term;
                Some(Signal::SIGTERM)
            }
            Sent::Term if now >= e.since + 2 * ESCALATE_AFTER => {
                e.sent = Sent::Kill;
                Some(Signal::SIGKILL)
            }
            _ => None,
        }
    }

    /// When [`Phase::escalate`] or the start-up deadline next has something
    /// to do.
    pub fn next_deadline(&self, spawned: Instant) -> Option<Instant> {
        let escalation = self.ending().and_then(|e| match e.sent {
            Sent::Nothing => Some(e.since + ESCALATE_AFTER),
            Sent::Term => Some(e.since + 2 * ESCALATE_AFTER),
            Sent::Kill => None,
        });
        let ready =
            (!self.perf_was_ready() && self.failure().is_none()).then_some(spawned + READY_TIMEOUT);
        match (escalation, ready) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A running recorder.
pub struct Recorder {
    pub trigger: u32,
    pub tgid: i32,
    pub dir: PathBuf,
    perf: PerfProcess,
    spawned: Instant,
    phase: Phase,
    /// perf or the index hit a full file system (perf's messages say so, or
    /// a write failed with ENOSPC).
    disk_full: bool,
    machine: SnapshotMachine,
    /// The index thread, which writes the index off the driver thread.
    indexer: Indexer,
    /// `OUT/snapshots.jsonl`, for messages.
    index_path: PathBuf,
    printer: Arc<Printer>,
    counters: Arc<OnceLock<Counters>>,
    /// Switch-outputs asked of perf (SIGUSR2s sent), for the busy-perf warning.
    switches: u64,
    /// The newest completed file, which also has a hidden name
    /// ([`Recorder::keep_newest`]).
    kept: Option<String>,
    /// Whether [`OPEN_LINK`] names the file perf writes now, the next
    /// `Dump`'s ([`Recorder::link_open_file`]).
    open_linked: bool,
    /// A snapshot whose name perf's later file had taken before its `Dump`
    /// line was read: (the name, where the later file went). That later
    /// file's own `Dump` names the first.
    moved: Option<(String, String)>,
    target_pidfd: Option<OwnedFd>,
    exe_id: Option<(u64, u64)>,
    spin: SpinDetector,
    next_sample: Instant,
    /// `--max-disk`, shared by every recorder of the run.
    keeper: Option<Arc<Mutex<Keeper>>>,
    /// How perf keeps samples.
    spec_recording: Recording,
    disarm: Arc<crate::disarm::cycle::Board>,
}

/// What every recorder of a run shares.
#[derive(Clone)]
pub struct Shared {
    pub printer: Arc<Printer>,
    /// The kernel's counters, once the programs are loaded.
    pub counters: Arc<OnceLock<Counters>>,
    /// `--max-disk`.
    pub keeper: Option<Arc<Mutex<Keeper>>>,
    /// Each trigger's disarming so far, for the index.
    pub disarm: Arc<crate::disarm::cycle::Board>,
    /// What perf reads as `/proc/kallsyms` (perf/kallsyms.rs); `None`: the
    /// real file.
    pub kallsyms: Option<Arc<crate::perf::kallsyms::KallsymsCopy>>,
}

impl Recorder {
    /// Creates the output directory and its index, spawns perf and pings it.
    ///
    /// Must run on a thread that lives as long as the agent (the driver
    /// thread): perf's `PR_SET_PDEATHSIG` fires when the spawning thread ends.
    pub fn start(
        trigger: u32,
        tgid: i32,
        dir: PathBuf,
        spec: &PerfSpec,
        policy: Policy,
        shared: Shared,
    ) -> Result<Self, Failure> {
        let Shared {
            printer,
            counters,
            keeper,
            disarm,
            kallsyms,
        } = shared;
        let output = OutputDir::prepare(&dir)?;
        let dir = output.path.clone();
        let output_dir = dir.clone();
        let jit_dir = dir.clone();
        let index = Index::create(&dir).map_err(|e| {
            Failure::usage(format!(
                "cannot create {} in {}: {e}; give a writable --output",
                crate::output::index::INDEX_FILE,
                dir.display()
            ))
        })?;
        let spec = PerfSpec {
            pid: tgid,
            output: dir.join("perf.data"),
            ..spec.clone()
        };
        let spawned = Instant::now();
        let mut perf = crate::perf::record::PerfProcess::spawn(&spec, kallsyms.as_deref())
            .map_err(|e| Failure::runtime(format!("starting perf: {e:#}")))?;
        // perf answers only from its main loop: an ack means SIGUSR2 works.
        let _ = perf.ping();
        if let Some(k) = &keeper {
            lock(k).own(&dir);
        }
        Ok(Self {
            trigger,
            tgid,
            dir,
            perf,
            spawned,
            phase: Phase::Starting,
            disk_full: false,
            machine: SnapshotMachine::new(policy),
            index_path: index.path().to_path_buf(),
            indexer: Indexer::start(Indexing {
                dir: output_dir,
                tgid,
                off_cpu: spec.off_cpu,
                ring_bytes: spec.recording.ring_bytes(),
                index,
                output,
                printer: printer.clone(),
                keeper: keeper.clone(),
                listed: Vec::new(),
                indexed: HashSet::new(),
                snapshots: 0,
                warned_budget: false,
                failed: None,
                jit: crate::capture::jit_maps::JitKeeper::new(jit_dir),
            }),
            printer,
            counters,
            switches: 0,
            kept: None,
            open_linked: false,
            moved: None,
            target_pidfd: crate::sys::pidfd::pidfd_open(tgid).ok(),
            exe_id: proc::exe_id(tgid),
            spin: crate::perf::record::SpinDetector::new(Duration::from_secs(2), 0.9),
            next_sample: spawned + SAMPLE_EVERY,
            keeper,
            spec_recording: spec.recording,
            disarm,
        })
    }

    /// One of the fds to wait on.
    pub fn fd(&self, kind: RecorderFd) -> Option<BorrowedFd<'_>> {
        match kind {
            RecorderFd::Stderr => Some(self.perf.stderr_fd()),
            RecorderFd::Ack => Some(self.perf.ack_fd()),
            RecorderFd::PerfExit => Some(self.perf.pidfd()),
            RecorderFd::TargetExit => self.target_pidfd.as_ref().map(|f| f.as_fd()),
        }
    }

    /// perf's pid.
    pub fn perf_pid(&self) -> i32 {
        self.perf.pid().as_raw()
    }

    /// Whether this recorder's perf reads the small copy of
    /// `/proc/kallsyms` (perf/kallsyms.rs).
    pub fn kallsyms_copied(&self) -> bool {
        self.perf.kallsyms_copied()
    }

    /// Whether perf is ready: from then on, hits go to the state machine
    /// (before, a SIGUSR2 would be ignored by perf).
    pub fn ready(&self) -> bool {
        self.phase.perf_was_ready()
    }

    /// Whether perf is ready and the recorder is not stopping.
    pub fn recording(&self) -> bool {
        matches!(self.phase, Phase::Recording)
    }

    /// Whether perf has exited (the recorder can be finished).
    pub fn exited(&self) -> bool {
        matches!(self.phase, Phase::Exited { .. })
    }

    /// perf's ack pipe is readable.
    pub fn on_ack(&mut self, now: Now) -> Feedback {
        self.take_acks(now)
    }

    /// Reads pending acks; the first one means perf is ready.
    fn take_acks(&mut self, now: Now) -> Feedback {
        let acked = self.perf.read_acks().unwrap_or(0) > 0;
        if !acked || self.phase.perf_was_ready() {
            return Feedback::default();
        }
        self.phase.perf_ready();
        self.link_open_file();
        // perf records now: keep the objects the target maps. The flight
        // recorder writes nothing until a hit, so neither does the cache: it
        // holds the files open, and copies them at the first hit.
        if self.spec_recording == crate::perf::record::Recording::Continuous {
            crate::capture::build_id_cache::scan(self.tgid);
        } else {
            crate::capture::build_id_cache::hold(self.tgid);
        }
        if self.phase.ending().is_some() {
            // Asked to stop before it was ready: it can read `stop` now.
            let actions = self.machine.on_stop_request(now.ns);
            self.apply(actions, now);
        }
        Feedback {
            perf_ready: Some(now.at.duration_since(self.spawned)),
            ..Feedback::default()
        }
    }

    /// Whether the ack pipe still needs watching: only until perf's first ack
    /// (readiness). Later acks are drained with stderr.
    pub fn watch_acks(&self) -> bool {
        !self.phase.perf_was_ready()
    }

    /// Whether perf closed its ack pipe or stderr (it is exiting).
    pub fn pipes_closed(&self) -> (bool, bool) {
        (self.perf.ack_closed(), self.perf.stderr_closed())
    }

    /// perf's stderr is readable.
    pub fn on_stderr(&mut self, now: Now) -> Feedback {
        // Acks of the pings sent with each SIGUSR2 are drained here, not
        // waited on: a wakeup per ack, in the middle of perf's switch, would
        // compete with perf for the CPU (see `Recorder::watch_acks`). perf
        // may also write warnings before its first ack: that one still
        // counts as readiness.
        let mut feedback = self.take_acks(now);
        let lines = self.perf.read_stderr().unwrap_or_default();
        feedback.limit_reached |= self.perf_lines(lines, now).limit_reached;
        feedback
    }

    /// perf's pidfd is readable: it exited.
    pub fn on_perf_exit(&mut self) {
        self.phase.perf_exited();
    }

    /// The target's pidfd is readable: it exited. perf finalizes and exits by
    /// itself; the escalation starts in case it does not.
    pub fn on_target_exit(&mut self, now: Now) {
        self.target_pidfd = None;
        self.phase.end(EndReason::TargetExited, now.at);
    }

    /// An accepted hit for this recorder.
    pub fn on_hit(&mut self, hit: IndexedHit, now: Now) -> Feedback {
        let tgid = hit.tgid as i32;
        let actions = self.machine.on_hit(hit, now.ns);
        let feedback = self.apply(actions, now);
        if self.spec_recording != crate::perf::record::Recording::Continuous {
            // The flight recorder's cache is written from its first hit on
            // (after perf was signalled): what perf-ready held, and what the
            // hitting process maps now, while it surely runs.
            crate::capture::build_id_cache::hold(tgid);
            crate::capture::build_id_cache::commit();
        }
        feedback
    }

    /// End this recorder for `reason`: finish the switch in flight, then stop
    /// perf (or SIGTERM it if it is not ready yet).
    pub fn stop(&mut self, reason: EndReason, now: Now) {
        // The escalation clock starts now, whatever the state machine does
        // (it may still wait for a switch in flight).
        let ready = self.phase.perf_was_ready();
        let ending = self.phase.end(reason, now.at);
        if !ready {
            // perf is not in its main loop yet; it would not read `stop`.
            self.perf.signal(Signal::SIGTERM);
            ending.sent = ending.sent.max(Sent::Term);
            return;
        }
        let actions = self.machine.on_stop_request(now.ns);
        self.apply(actions, now);
    }

    /// Records a failure and stops.
    pub fn fail(&mut self, f: Failure, now: Now) {
        self.phase
            .end(EndReason::Failed, now.at)
            .failure
            .get_or_insert(f);
        self.stop(EndReason::Failed, now);
    }

    /// Time passed: fire what is due, escalate, sample perf's CPU, watch for
    /// an exec of the target.
    pub fn tick(&mut self, now: Now) -> Feedback {
        let due = self.machine.on_tick(now.ns);
        let feedback = self.apply(due, now);
        self.take_index_failure(now);
        if self.phase.ready_overdue(self.spawned, now.at) {
            self.phase.end(EndReason::Failed, now.at).failure = Some(Failure::runtime(format!(
                "perf did not become ready within {} s; see perf's messages below",
                READY_TIMEOUT.as_secs()
            )));
            self.perf.signal(Signal::SIGTERM);
        }
        match self.phase.escalate(now.at) {
            Some(Signal::SIGTERM) => {
                self.printer.warning(&format!(
                    "perf (pid {}) did not exit 10 s after stop; sending SIGTERM",
                    self.perf_pid()
                ));
                self.perf.signal(Signal::SIGTERM);
            }
            Some(signal) => {
                self.printer.warning(&format!(
                    "perf (pid {}) did not exit 10 s after SIGTERM; sending SIGKILL",
                    self.perf_pid()
                ));
                self.perf.signal(signal);
            }
            None => {}
        }
        if now.at >= self.next_sample {
            self.next_sample = now.at + SAMPLE_EVERY;
            self.sample_perf_cpu(now);
            self.watch_for_exec(now);
        }
        feedback
    }

    fn sample_perf_cpu(&mut self, now: Now) {
        if let Some(cpu) = self.perf.cpu_time()
            && let Some(busy) =
                self.spin
                    .sample(now.at.duration_since(self.spawned), cpu, self.switches)
        {
            self.printer.warning(&busy.warning(self.perf_pid()));
        }
    }

    /// Exec: the probe is bound to the old file and no longer fires.
    fn watch_for_exec(&mut self, now: Now) {
        if self.phase.ending().is_none()
            && let (Some(was), Some(now_id)) = (self.exe_id, proc::exe_id(self.tgid))
            && was != now_id
        {
            self.printer.warning(&format!(
                "pid {} exec'd a new image ({}); the probe was bound to the old file and no \
                 longer fires; ending its recording",
                self.tgid,
                fs::read_link(format!("/proc/{}/exe", self.tgid))
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ));
            self.stop(EndReason::Exec, now);
        }
    }

    /// The next moment [`Recorder::tick`] has something to do.
    pub fn next_deadline(&self, now: Now) -> Instant {
        let mut next = self.next_sample;
        if let Some(ns) = self.machine.next_deadline() {
            let wait = Duration::from_nanos(ns.saturating_sub(now.ns));
            next = next.min(now.at + wait);
        }
        if let Some(at) = self.phase.next_deadline(self.spawned) {
            next = next.min(at);
        }
        next
    }

    fn perf_lines(&mut self, lines: Vec<PerfLine>, now: Now) -> Feedback {
        let mut feedback = Feedback::default();
        for line in lines {
            match line {
                crate::perf::record::PerfLine::Dump(path) => {
                    let name = path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| path.display().to_string());
                    let name = self.keep_newest(&name);
                    // Every Dump is a switch perf finished, even one that
                    // reused a name (see `index`): the state machine counts it.
                    let actions = self.machine.on_dump(name, now.ns);
                    feedback.limit_reached |= self.apply(actions, now).limit_reached;
                }
                crate::perf::record::PerfLine::Other(l) => {
                    if l.contains("No space left on device") {
                        self.disk_full = true;
                    }
                    self.printer
                        .verbose(&format!("perf[{}]: {l}", self.perf_pid()));
                }
            }
        }
        feedback
    }

    fn apply(&mut self, actions: Vec<Action>, now: Now) -> Feedback {
        let mut feedback = Feedback::default();
        for a in actions {
            match a {
                Action::Switch => {
                    self.switches += 1;
                    let _ = self.perf.switch();
                }
                // The state machine asks for `stop` only once the recorder
                // is ending: the escalation clock already runs.
                Action::Stop => {
                    let _ = self.perf.stop();
                }
                // The driver stops the recorder (and detaches a `--pid`
                // trigger's probes) for `--max-snapshots`.
                Action::LimitReached => feedback.limit_reached = true,
                Action::Index(snap) => self.index(snap, now),
            }
        }
        feedback
    }
    /// perf names files by centisecond and its last file, written when the
    /// target exits, can come within 10 ms of the newest snapshot and take
    /// its name (`rename()` replaces it), even before that snapshot's `Dump`
    /// line is read. The newest completed file keeps a second, hidden name
    /// (`.NAME.kept`, a hard link) until the next one, so
    /// [`take_back_name`](Self::take_back_name) can put it back: the link
    /// perf's open file got when perf opened it ([`OPEN_LINK`]), so it is the
    /// right file whatever holds the name by now.
    fn keep_newest(&mut self, name: &str) -> String {
        let name = match (&self.moved, self.kept.as_deref() == Some(name)) {
            (Some((from, to)), _) if from == name => to.clone(),
            // perf's last file came with a Dump line and took the name.
            (_, true) => self.take_back_name().unwrap_or_else(|| name.to_string()),
            _ => name.to_string(),
        };
        self.moved = None;
        if let Some(old) = self.kept.take() {
            let _ = fs::remove_file(self.dir.join(kept_name(&old)));
        }
        let kept = self.dir.join(kept_name(&name));
        let open = self.dir.join(OPEN_LINK);
        let linked = (std::mem::take(&mut self.open_linked) && fs::rename(&open, &kept).is_ok())
            || fs::hard_link(self.dir.join(&name), &kept).is_ok();
        if linked {
            self.kept = Some(name.clone());
        }
        // A later file already took the name: the snapshot gets it back.
        if linked
            && !same_file(&self.dir.join(&name), &kept)
            && let Some(next) = self.take_back_name()
        {
            self.moved = Some((name.clone(), next));
        }
        self.link_open_file();
        name
    }

    /// Gives the file perf writes now a hidden name, [`OPEN_LINK`]: done at
    /// perf's first ack and at each `Dump`, before another switch can be
    /// asked for, so it is the file the next `Dump` will name.
    fn link_open_file(&mut self) {
        let open = self.dir.join(OPEN_LINK);
        let _ = fs::remove_file(&open);
        self.open_linked = fs::hard_link(self.dir.join("perf.data"), &open).is_ok();
    }

    /// perf has exited: its last file may have taken the newest snapshot's
    /// name without a Dump line.
    fn restore_newest(&mut self) {
        self.take_back_name();
        let _ = fs::remove_file(self.dir.join(OPEN_LINK));
        self.open_linked = false;
    }

    /// If perf's newest file took the name of the newest snapshot, that
    /// file moves to the next centisecond's name (returned) and the snapshot
    /// gets its name back; the hidden name goes either way.
    fn take_back_name(&mut self) -> Option<String> {
        let name = self.kept.take()?;
        let next = reclaim_name(&self.dir, &name)?;
        self.printer.verbose(&format!(
            "perf's last file took the name of snapshot {name}: moved to {next}"
        ));
        Some(next)
    }

    /// Hands a completed snapshot to the index thread with the kernel's
    /// counters of this trigger, the merged hits and the disarming as they
    /// are at its `Dump` (read here, so the line is exact for that moment).
    fn index(&mut self, snap: Snapshot, now: Now) {
        let counters = self
            .counters
            .get()
            .map(|c| c.read(self.trigger))
            .unwrap_or_default();
        let disarm = self
            .disarm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&self.trigger)
            .copied();
        let job = Job {
            snap,
            counters,
            merged: self.machine.stats().merged,
            disarm,
        };
        self.indexer.send(job);
        self.take_index_failure(now);
    }

    /// A write of the index thread failed: the recorder fails with it.
    fn take_index_failure(&mut self, now: Now) {
        if let Some(e) = self.indexer.take_failure() {
            self.index_failed(e, now);
        }
    }

    fn index_failed(&mut self, e: std::io::Error, now: Now) {
        if e.raw_os_error() == Some(libc::ENOSPC) {
            self.disk_full = true;
        }
        let f = if self.disk_full {
            Failure::runtime(format!(
                "the output file system is full (writing {}): stopping; completed snapshots are \
                 kept and listed",
                self.index_path.display()
            ))
        } else {
            Failure::runtime(format!("writing {}: {e}", self.index_path.display()))
        };
        self.fail(f, now);
    }

    /// Call once perf's pidfd fired and the ring buffer was drained: indexes
    /// every file perf left and returns the outcome.
    pub fn finish(mut self, now: Now) -> RecorderOutcome {
        let status = self.perf.try_wait().ok().flatten();
        let perf_cpu = self.perf.last_cpu_time();
        let lines = self.perf.flush_stderr();
        self.perf_lines(lines, now);
        // perf's last file, found below, may have taken a snapshot's name.
        self.restore_newest();
        // What the index thread was given is indexed before the leftovers,
        // which are indexed in place.
        self.indexer.finish();
        self.index_leftovers(now);
        self.take_index_failure(now);
        if let Some(k) = &self.keeper {
            lock(k).release(&self.dir);
        }
        let perf_was_ready = self.phase.perf_was_ready();
        let snapshots = self.indexer.state().map_or(0, |s| s.snapshots);
        if !perf_was_ready && snapshots == 0 {
            // perf never started recording: its half-made perf.data is not a
            // snapshot, and the directory is tidied away with it.
            let _ = fs::remove_file(self.dir.join("perf.data"));
        }
        let unsnapshotted = self.machine.on_perf_exit();
        if unsnapshotted > 0 {
            self.printer.warning(&format!(
                "{unsnapshotted} accepted hit(s) of pid {} got no snapshot: perf ended before writing it",
                self.tgid
            ));
        }
        let ending = self.phase.ending().cloned();
        let requested = ending.as_ref().map(|e| e.reason.clone());
        let target_alive = requested != Some(EndReason::TargetExited) && proc::is_alive(self.tgid);
        let perf_exit = status.map(perf::record::describe_status);
        let (reason, failure) = recorder_end(RecorderFacts {
            tgid: self.tgid,
            perf_was_ready,
            failure: ending.as_ref().and_then(|e| e.failure.clone()),
            requested,
            disk_full: self.disk_full,
            target_alive,
            we_ended_perf: self.machine.stop_sent()
                || ending.is_some_and(|e| e.sent != Sent::Nothing),
            perf_exit: perf_exit.clone(),
            perf_lines: &self.perf.last_lines(),
        });
        RecorderOutcome {
            trigger: self.trigger,
            tgid: self.tgid,
            dir: self.dir.clone(),
            reason,
            failure,
            stats: self.machine.stats(),
            perf_exit,
            perf_cpu,
        }
    }

    /// Indexes files perf completed without a Dump line (it was killed, or
    /// it printed `<timestamp>` literally on SIGTERM): the tail.
    fn index_leftovers(&mut self, now: Now) {
        let mut left: Vec<String> = fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| {
                n.starts_with("perf.data.")
                    && self.indexer.state().is_none_or(|s| !s.indexed.contains(n))
            })
            .collect();
        left.sort();
        for name in left {
            let actions = self.machine.on_dump(name, now.ns);
            let actions = actions
                .into_iter()
                .filter(|a| matches!(a, Action::Index(_)))
                .collect();
            self.apply(actions, now);
        }
    }
}

/// What a recorder's index thread owns: the output directory's index and
/// what it lists. Parsing a snapshot file, keeping its objects by build-id
/// and enforcing `--max-disk` wait on the disk, so they run here, off the
/// driver thread; one thread per recorder keeps the index in `Dump` order.
struct Indexing {
    dir: PathBuf,
    tgid: i32,
    /// The off-CPU breakdown's window before a hit without a duration.
    off_cpu: Option<Duration>,
    /// The flight recorder's ring per CPU, bytes (`None`: continuous).
    ring_bytes: Option<u64>,
    index: Index,
    output: OutputDir,
    printer: Arc<Printer>,
    keeper: Option<Arc<Mutex<Keeper>>>,
    /// Files indexed and still on disk.
    listed: Vec<String>,
    /// Files indexed (on disk or deleted by --keep).
    indexed: HashSet<String>,
    snapshots: u64,
    /// The `--max-disk` overrun was reported (once per recorder).
    warned_budget: bool,
    /// The first write that failed, for the recorder to take.
    failed: Option<Arc<Mutex<Option<std::io::Error>>>>,
    /// The JIT symbol files kept with each snapshot (capture/jit_maps.rs).
    jit: crate::capture::jit_maps::JitKeeper,
}

/// A completed snapshot and what the driver read at its `Dump`.
struct Job {
    snap: Snapshot,
    counters: crate::output::counters::CounterValues,
    merged: u64,
    disarm: Option<crate::output::index::DisarmCounters>,
}

impl Indexing {
    /// Writes a completed snapshot to the index.
    fn index(&mut self, job: Job) {
        let Job {
            mut snap,
            counters,
            merged,
            disarm,
        } = job;
        if self.indexed.contains(&snap.file) {
            // perf names files by wall-clock time, so a clock stepped back
            // (NTP, an operator) can reuse a name; `rename()` then replaced
            // the earlier snapshot.
            self.printer.warning(&format!(
                "perf reused the file name {} (the wall clock stepped back?): the earlier \
                 snapshot with that name was overwritten",
                snap.file
            ));
            self.listed.retain(|f| f != &snap.file);
            if let Err(e) = self.index.deleted(&snap.file) {
                self.failed(e);
            }
        }
        match open_completed(&self.dir, &snap.file) {
            Some(file) => {
                snap.bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
                read_facts(file, &mut snap, self.off_cpu, self.ring_bytes);
            }
            None => log::debug!("{} is gone before it was read", snap.file),
        }
        mark_calls_before(&mut snap);
        // JIT code has no file: its names are kept before the index lists
        // the snapshot, for a report that reads it at once.
        self.keep_jit(&snap.file);
        if let Err(e) = self.index.snapshot(&snap, counters, merged, disarm) {
            self.failed(e);
        }
        self.output.keep();
        // Objects mapped since (dlopen): kept before the report needs them.
        crate::capture::build_id_cache::scan(self.tgid);
        self.indexed.insert(snap.file.clone());
        self.listed.push(snap.file.clone());
        self.snapshots += 1;
        self.printer.snapshot(&SnapshotEvent {
            pid: self.tgid,
            n: self.snapshots,
            snapshot: &snap,
        });
        if let Some(k) = &self.keeper {
            let over = lock(k).enforce(&self.dir, &snap.file, snap.kind == SnapshotKind::Hit);
            if let Some(over) = over
                && !self.warned_budget
            {
                self.warned_budget = true;
                self.printer.warning(&format!(
                    "--max-disk is {over} bytes short of what must stay: perf's open file, the \
                     newest snapshot ({} bytes) and the newest hit snapshot are never deleted. \
                     Raise --max-disk above a few snapshots",
                    snap.bytes
                ));
            }
        }
        // perf's --switch-max-files (from --keep) and --max-disk delete the
        // oldest files.
        let dir = &self.dir;
        let (kept, gone): (Vec<String>, Vec<String>) = std::mem::take(&mut self.listed)
            .into_iter()
            .partition(|f| dir.join(f).exists());
        self.listed = kept;
        for f in gone {
            if let Err(e) = self.index.deleted(&f) {
                self.failed(e);
            }
        }
    }

    /// Keeps the JIT files that cover snapshot `file`; says what could
    /// not be kept, and, with `-v`, what was.
    fn keep_jit(&mut self, file: &str) {
        let before = self.jit.bytes;
        self.jit.keep(self.tgid, file);
        for f in std::mem::take(&mut self.jit.failed) {
            self.printer.warning(&format!(
                "JIT symbols of pid {} not kept for {file} and later snapshots: {f}",
                self.tgid
            ));
        }
        if self.jit.bytes > before {
            self.printer.verbose(&format!(
                "{file}: kept {} bytes of JIT symbol files ({} in all) in {}",
                self.jit.bytes - before,
                self.jit.bytes,
                self.dir.join(crate::capture::jit_maps::DIR).display()
            ));
        }
    }

    /// Keeps the first failed write for the recorder.
    fn failed(&mut self, e: std::io::Error) {
        if let Some(slot) = &self.failed {
            slot.lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert(e);
        }
    }
}

/// The index thread of a recorder ("mt-agent-index"), or, once the
/// recorder finishes (or if the thread could not start), the same work
/// done in place.
enum Indexer {
    Thread {
        tx: std::sync::mpsc::Sender<Job>,
        thread: std::thread::JoinHandle<Indexing>,
        failed: Arc<Mutex<Option<std::io::Error>>>,
    },
    InPlace(Box<Indexing>, Arc<Mutex<Option<std::io::Error>>>),
    /// The thread panicked: nothing more is indexed.
    Gone,
}

impl Indexer {
    fn start(mut state: Indexing) -> Indexer {
        let failed = Arc::new(Mutex::new(None));
        state.failed = Some(failed.clone());
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let shared = Arc::new(Mutex::new(Some(state)));
        let inner = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("mt-agent-index".into())
            .spawn(move || {
                let mut state = inner
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take()
                    .expect("the state is handed over once");
                for job in rx {
                    state.index(job);
                }
                state
            });
        match spawned {
            Ok(thread) => Indexer::Thread { tx, thread, failed },
            Err(_) => {
                let state = shared.lock().unwrap_or_else(|e| e.into_inner()).take();
                Indexer::InPlace(Box::new(state.expect("not taken")), failed)
            }
        }
    }

    fn send(&mut self, job: Job) {
        match self {
            Indexer::Thread { tx, .. } => {
                let _ = tx.send(job);
            }
            Indexer::InPlace(state, _) => state.index(job),
            Indexer::Gone => {}
        }
    }

    fn take_failure(&self) -> Option<std::io::Error> {
        match self {
            Indexer::Thread { failed, .. } | Indexer::InPlace(_, failed) => {
                failed.lock().unwrap_or_else(|e| e.into_inner()).take()
            }
            Indexer::Gone => None,
        }
    }

    /// Waits for the thread to index what it was given; later snapshots are
    /// indexed in place.
    fn finish(&mut self) {
        if let Indexer::Thread { .. } = self {
            let Indexer::Thread { tx, thread, failed } = std::mem::replace(self, Indexer::Gone)
            else {
                unreachable!()
            };
            drop(tx);
            if let Ok(state) = thread.join() {
                *self = Indexer::InPlace(Box::new(state), failed);
            }
        }
    }

    /// The index's state once [`finish`](Self::finish)ed.
    fn state(&self) -> Option<&Indexing> {
        match self {
            Indexer::InPlace(state, _) => Some(state),
            _ => None,
        }
    }
}

/// Whether two paths name one file (the same inode on the same device).
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// The hidden second name of the file perf writes now.
const OPEN_LINK: &str = ".perf.data.open";

/// The hidden second name of the newest completed file.
fn kept_name(name: &str) -> String {
    format!(".{name}.kept")
}

/// `perf.data.TS` with TS counted up by one centisecond until the name is
/// free: a name that sorts after `name`, as a later perf file would.
fn next_free_name(dir: &std::path::Path, name: &str) -> Option<String> {
    let stamp: u64 = name.strip_prefix("perf.data.")?.parse().ok()?;
    (1..100)
        .map(|k| format!("perf.data.{}", stamp + k))
        .find(|n| !dir.join(n).exists())
}

/// Opens the completed file `name` by its hidden name while it has one
/// ([`kept_name`]): perf's last file can hold `name` until the recorder
/// takes it back ([`reclaim_name`]).
fn open_completed(dir: &std::path::Path, name: &str) -> Option<fs::File> {
    fs::File::open(dir.join(kept_name(name)))
        .or_else(|_| fs::File::open(dir.join(name)))
        .ok()
}

/// If another file took `name` from the file under its hidden name
/// ([`kept_name`]), that file moves to the next free name (returned) and
/// `name` goes back to the hidden one; the hidden name goes either way.
///
/// `name` names a file at every instant (a link to the next name, then a
/// rename over `name`): the index thread drops from the index a listed
/// file it finds missing, and CI once caught it between the two renames
/// this did before (stop 40: the hit snapshot was listed as deleted).
fn reclaim_name(dir: &std::path::Path, name: &str) -> Option<String> {
    let (path, kept) = (dir.join(name), dir.join(kept_name(name)));
    let moved = if path.exists() && kept.exists() && !same_file(&path, &kept) {
        next_free_name(dir, name).and_then(|next| {
            // link() never replaces a file that took `next` meanwhile.
            fs::hard_link(&path, dir.join(&next)).ok()?;
            if fs::rename(&kept, &path).is_ok() {
                Some(next)
            } else {
                let _ = fs::remove_file(dir.join(&next));
                None
            }
        })
    } else {
        None
    };
    let _ = fs::remove_file(&kept);
    moved
}

/// Reads a completed snapshot file, open as `file`: its sample span, and with the off-CPU
/// breakdown (`off_cpu`, the window before a hit without a duration) what
/// the file does not show (`ring_bytes`: a flight recorder's ring) and each
/// hit's breakdown. Left unset, logged, when the file cannot be read.
fn read_facts(
    file: fs::File,
    snap: &mut Snapshot,
    off_cpu: Option<Duration>,
    ring_bytes: Option<u64>,
) {
    let tids: Vec<u32> = match off_cpu {
        Some(_) => snap.hits.iter().map(|h| h.tid).collect(),
        None => Vec::new(),
    };
    let facts = match data::read_facts(file, &tids) {
        Ok(f) => f,
        Err(e) => {
            log::debug!("reading the samples of {}: {e:#}", snap.file);
            return;
        }
    };
    snap.span = facts.span;
    let Some(window) = off_cpu else {
        return;
    };
    let gaps = facts.coverage.gaps(ring_bytes);
    snap.lost_records = facts.coverage.lost_records;
    // No timed record: the file shows nothing (gaps() says the same).
    snap.records_from_ns = Some(facts.coverage.start_ns(ring_bytes).unwrap_or(u64::MAX));
    snap.lost_ns = gaps[1..].to_vec();
    for h in &mut snap.hits {
        let back = h.duration_ns.unwrap_or(window.as_nanos() as u64);
        let from = h.ktime_ns.saturating_sub(back);
        let switches = facts
            .context_switches
            .get(&h.tid)
            .map_or(&[][..], Vec::as_slice);
        h.off_cpu = Some(OffCpu {
            off_cpu_from_ns: from,
            breakdown: offcpu::breakdown(switches, &gaps, from, h.ktime_ns),
            reaches_start: switches.iter().any(|s| s.time_ns <= from),
        });
    }
}

/// Marks the `--slower-than` hits whose call began before the file's oldest
/// sample, unless a switch record of the thread shows the file reaches back
/// to it (a call that began asleep leaves no sample at its start).
fn mark_calls_before(snap: &mut Snapshot) {
    let span = snap.span;
    for h in &mut snap.hits {
        if let Some(d) = h.duration_ns {
            let start = h.ktime_ns.saturating_sub(d);
            let reached = h.off_cpu.is_some_and(|o| o.reaches_start);
            h.starts_before_samples = !reached && span.is_none_or(|s| s.starts_after(start));
        }
    }
}

/// The budget keeper, even if a panic poisoned its lock.
fn lock(k: &Mutex<Keeper>) -> std::sync::MutexGuard<'_, Keeper> {
    k.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_recorder_starts_then_records_once_perf_acks() {
        let mut p = Phase::Starting;
        assert!(!p.perf_was_ready());
        p.perf_ready();
        assert_eq!(p, Phase::Recording);
        assert!(p.perf_was_ready());
    }

    #[test]
    fn the_first_end_reason_and_its_clock_are_kept() {
        let t0 = Instant::now();
        let mut p = Phase::Recording;
        p.end(EndReason::Signal("SIGINT"), t0);
        p.end(EndReason::Failed, t0 + S).failure = Some(Failure::runtime("x"));
        let e = p.ending().unwrap();
        assert_eq!(e.reason, EndReason::Signal("SIGINT"));
        assert_eq!(e.since, t0);
        assert!(e.failure.is_some());
        assert!(p.perf_was_ready());
    }

    #[test]
    fn a_perf_that_ignores_stop_gets_sigterm_then_sigkill() {
        let t0 = Instant::now();
        let mut p = Phase::Recording;
        p.end(EndReason::Duration, t0);
        assert_eq!(p.next_deadline(t0), Some(t0 + ESCALATE_AFTER));
        assert_eq!(p.escalate(t0 + 9 * S), None);
        assert_eq!(p.escalate(t0 + ESCALATE_AFTER), Some(Signal::SIGTERM));
        assert_eq!(p.escalate(t0 + ESCALATE_AFTER), None);
        assert_eq!(p.next_deadline(t0), Some(t0 + 2 * ESCALATE_AFTER));
        assert_eq!(p.escalate(t0 + 2 * ESCALATE_AFTER), Some(Signal::SIGKILL));
        assert_eq!(p.escalate(t0 + 60 * S), None);
        assert_eq!(p.next_deadline(t0), None);
    }

    #[test]
    fn a_perf_that_never_acks_is_overdue_after_the_ready_timeout() {
        let t0 = Instant::now();
        let mut p = Phase::Starting;
        assert_eq!(p.next_deadline(t0), Some(t0 + READY_TIMEOUT));
        assert!(!p.ready_overdue(t0, t0 + READY_TIMEOUT));
        assert!(p.ready_overdue(t0, t0 + READY_TIMEOUT + S));
        // Once the failure is recorded, it is not overdue twice.
        p.end(EndReason::Failed, t0 + READY_TIMEOUT + S).failure = Some(Failure::runtime("x"));
        assert!(!p.ready_overdue(t0, t0 + 2 * READY_TIMEOUT));
    }

    #[test]
    fn a_taken_name_goes_back_and_never_goes_missing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let name = "perf.data.2026120417382307";
        let (path, kept) = (dir.join(name), dir.join(kept_name(name)));
        fs::write(&path, "").unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // What the index thread does: a listed file it finds missing is
        // listed as deleted.
        let watcher = {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut missing = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    missing += usize::from(!path.exists());
                }
                missing
            })
        };
        for round in 0..500 {
            for f in dir.read_dir().unwrap() {
                let f = f.unwrap().path();
                if f != path {
                    fs::remove_file(f).unwrap();
                }
            }
            // The snapshot under its hidden name; perf's last file took
            // the name (rename() over it, as perf does).
            fs::write(&kept, format!("snapshot {round}")).unwrap();
            let last = dir.join("perf.data");
            fs::write(&last, "perf's last file").unwrap();
            fs::rename(&last, &path).unwrap();
            let next = reclaim_name(dir, name).unwrap();
            assert_eq!(next, "perf.data.2026120417382308");
            assert_eq!(
                fs::read_to_string(&path).unwrap(),
                format!("snapshot {round}")
            );
            assert_eq!(
                fs::read_to_string(dir.join(&next)).unwrap(),
                "perf's last file"
            );
            assert!(!kept.exists());
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(watcher.join().unwrap(), 0, "the name went missing");
        // Nothing took the name: the hidden name just goes.
        fs::hard_link(&path, &kept).unwrap();
        assert_eq!(reclaim_name(dir, name), None);
        assert!(!kept.exists() && path.exists());
    }

    #[test]
    fn perf_exiting_keeps_why_it_was_ending() {
        let t0 = Instant::now();
        let mut p = Phase::Starting;
        p.end(EndReason::TargetExited, t0);
        p.perf_exited();
        assert!(matches!(
            p,
            Phase::Exited {
                perf_was_ready: false,
                ..
            }
        ));
        assert_eq!(p.ending().unwrap().reason, EndReason::TargetExited);
        let mut q = Phase::Recording;
        q.perf_exited();
        assert_eq!(
            q,
            Phase::Exited {
                perf_was_ready: true,
                ending: None
            }
        );
    }
}
