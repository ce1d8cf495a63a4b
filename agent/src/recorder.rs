//! One perf recorder: a `perf record -p PID` process, the trigger state
//! machine that drives it, and the index of its output directory.
//!
//! The driver thread owns the recorders and feeds them events (acks, stderr
//! lines, hits, time); a recorder never blocks. Its life: spawned → ready
//! (first `ping` acked) → switching on hits → stopping (`stop`, then SIGTERM
//! after 10 s, then SIGKILL after 10 s more) → finished (perf reaped, every
//! file it left indexed).

use std::{
    collections::HashSet,
    fs,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::PathBuf,
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use nix::sys::signal::Signal;

use crate::{
    error::Failure,
    index::{Index, OutputDir},
    output::{Reporter, SnapshotEvent},
    perf::{self, PerfLine, PerfProcess, PerfSpec, SpinDetector},
    probe::{CounterValues, Counters},
    target,
    trigger::{Action, IndexedHit, Policy, Snapshot, Stats, Trigger},
};

/// Between `stop` and SIGTERM, and between SIGTERM and SIGKILL (perf's own
/// `perf daemon` uses the same).
pub const ESCALATE_AFTER: Duration = Duration::from_secs(10);
/// How long perf may take to answer its first `ping`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often perf's CPU use is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// Why a recorder (or the whole run) ended.
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

/// What the driver should do after feeding a recorder an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Notes {
    /// perf just became ready.
    pub ready: bool,
    /// `--max-snapshots` was reached: this recorder wants no more hits.
    pub limit_reached: bool,
}

/// How a recorder ended.
#[derive(Debug, Clone)]
pub struct RecorderOutcome {
    pub trigger: u32,
    pub tgid: i32,
    pub dir: PathBuf,
    pub reason: EndReason,
    pub failure: Option<Failure>,
    pub stats: Stats,
    pub perf_exit: Option<String>,
    pub perf_cpu: Option<Duration>,
}

/// A running recorder.
pub struct Recorder {
    pub trigger: u32,
    pub tgid: i32,
    pub dir: PathBuf,
    perf: PerfProcess,
    spawned: Instant,
    ready_at: Option<Instant>,
    machine: Trigger,
    index: Index,
    output: OutputDir,
    reporter: Arc<Reporter>,
    counters: Arc<OnceLock<Counters>>,
    /// Files indexed and still on disk.
    listed: Vec<String>,
    /// Files indexed (on disk or deleted by --keep).
    indexed: HashSet<String>,
    snapshots: u64,
    target_pidfd: Option<OwnedFd>,
    exe_id: Option<(u64, u64)>,
    reason: Option<EndReason>,
    failure: Option<Failure>,
    stopping_since: Option<Instant>,
    sent_term: bool,
    sent_kill: bool,
    disk_full: bool,
    spin: SpinDetector,
    next_sample: Instant,
    exited: bool,
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
        reporter: Arc<Reporter>,
        counters: Arc<OnceLock<Counters>>,
    ) -> Result<Self, Failure> {
        let output = OutputDir::prepare(&dir)?;
        let dir = output.path.clone();
        let index = Index::create(&dir).map_err(|e| {
            Failure::usage(format!(
                "cannot create {} in {}: {e}; give a writable --output",
                crate::index::INDEX_FILE,
                dir.display()
            ))
        })?;
        let spec = PerfSpec {
            pid: tgid,
            output: dir.join("perf.data"),
            ..spec.clone()
        };
        let spawned = Instant::now();
        let mut perf = PerfProcess::spawn(&spec)
            .map_err(|e| Failure::runtime(format!("starting perf: {e:#}")))?;
        // perf answers only from its main loop: an ack means SIGUSR2 works.
        let _ = perf.ping();
        Ok(Self {
            trigger,
            tgid,
            dir,
            perf,
            spawned,
            ready_at: None,
            machine: Trigger::new(policy),
            index,
            output,
            reporter,
            counters,
            listed: Vec::new(),
            indexed: HashSet::new(),
            snapshots: 0,
            target_pidfd: perf::pidfd_open(tgid).ok(),
            exe_id: target::exe_id(tgid),
            reason: None,
            failure: None,
            stopping_since: None,
            sent_term: false,
            sent_kill: false,
            disk_full: false,
            spin: SpinDetector::new(Duration::from_secs(2), 0.9),
            next_sample: spawned + SAMPLE_EVERY,
            exited: false,
        })
    }

    /// The fds to wait on: stderr, ack pipe, perf's pidfd, the target's pidfd.
    pub fn fds(&self) -> [Option<BorrowedFd<'_>>; 4] {
        [
            Some(self.perf.stderr_fd()),
            Some(self.perf.ack_fd()),
            Some(self.perf.pidfd()),
            self.target_pidfd.as_ref().map(|f| f.as_fd()),
        ]
    }

    /// perf's pid.
    pub fn perf_pid(&self) -> i32 {
        self.perf.pid().as_raw()
    }

    /// Since spawning perf, until its first ack.
    pub fn ready_after(&self) -> Option<Duration> {
        self.ready_at.map(|r| r.duration_since(self.spawned))
    }

    /// Whether perf is ready: from then on, hits go to the state machine
    /// (before, a SIGUSR2 would be ignored by perf).
    pub fn ready(&self) -> bool {
        self.ready_at.is_some()
    }

    /// Whether perf has exited (the recorder can be finished).
    pub fn exited(&self) -> bool {
        self.exited
    }

    /// perf's ack pipe is readable.
    pub fn on_ack(&mut self) -> Notes {
        self.take_acks()
    }

    /// Reads pending acks; the first one means perf is ready.
    fn take_acks(&mut self) -> Notes {
        let acked = self.perf.read_acks().unwrap_or(0) > 0;
        if acked && self.ready_at.is_none() {
            self.ready_at = Some(Instant::now());
            // perf records now: keep the objects the target maps.
            crate::symcache::scan(self.tgid);
            if self.reason.is_some() {
                // Asked to stop before it was ready: it can read `stop` now.
                let actions = self.machine.on_stop_request(crate::driver::monotonic_ns());
                self.apply(actions);
            }
            return Notes {
                ready: true,
                ..Notes::default()
            };
        }
        Notes::default()
    }

    /// Whether the ack pipe still needs watching: only until perf's first ack
    /// (readiness). Later acks are drained with stderr.
    pub fn watch_acks(&self) -> bool {
        self.ready_at.is_none()
    }

    /// Whether perf closed its ack pipe or stderr (it is exiting).
    pub fn pipes_closed(&self) -> (bool, bool) {
        (self.perf.ack_closed(), self.perf.stderr_closed())
    }

    /// perf's stderr is readable.
    pub fn on_stderr(&mut self) -> Notes {
        // Acks of the pings sent with each SIGUSR2 are drained here, not
        // waited on: a wakeup per ack, in the middle of perf's switch, would
        // compete with perf for the CPU (see `Recorder::watch_acks`). perf
        // may also write warnings before its first ack: that one still
        // counts as readiness.
        let mut notes = self.take_acks();
        let lines = self.perf.read_stderr().unwrap_or_default();
        let more = self.perf_lines(lines);
        notes.limit_reached |= more.limit_reached;
        notes
    }

    /// perf's pidfd is readable: it exited.
    pub fn on_perf_exit(&mut self) {
        self.exited = true;
    }

    /// The target's pidfd is readable: it exited. perf finalizes and exits by
    /// itself; the escalation starts in case it does not.
    pub fn on_target_exit(&mut self) {
        self.target_pidfd = None;
        self.reason.get_or_insert(EndReason::TargetExited);
        self.stopping_since.get_or_insert_with(Instant::now);
    }

    /// An accepted hit for this recorder.
    pub fn on_hit(&mut self, hit: IndexedHit, now_ns: u64) -> Notes {
        let actions = self.machine.on_hit(hit, now_ns);
        self.apply(actions)
    }

    /// End this recorder for `reason`: finish the switch in flight, then stop
    /// perf (or SIGTERM it if it is not ready yet).
    pub fn stop(&mut self, reason: EndReason) {
        self.reason.get_or_insert(reason);
        // The escalation clock starts now, whatever the state machine does
        // (it may still wait for a switch in flight).
        self.stopping_since.get_or_insert_with(Instant::now);
        if self.ready_at.is_none() {
            // perf is not in its main loop yet; it would not read `stop`.
            self.perf.signal(Signal::SIGTERM);
            self.sent_term = true;
            self.stopping_since.get_or_insert_with(Instant::now);
            return;
        }
        let actions = self.machine.on_stop_request(crate::driver::monotonic_ns());
        self.apply(actions);
    }

    /// Records a failure and stops.
    pub fn fail(&mut self, f: Failure) {
        if self.failure.is_none() {
            self.failure = Some(f);
        }
        self.stop(EndReason::Failed);
    }

    /// Time passed: fire what is due, escalate, sample perf's CPU, watch for
    /// an exec of the target.
    pub fn tick(&mut self, now: Instant) -> Notes {
        let due = self.machine.on_tick(crate::driver::monotonic_ns());
        let notes = self.apply(due);
        if self.ready_at.is_none()
            && now.duration_since(self.spawned) > READY_TIMEOUT
            && self.failure.is_none()
        {
            self.failure = Some(Failure::runtime(format!(
                "perf did not become ready within {} s; see perf's messages below",
                READY_TIMEOUT.as_secs()
            )));
            self.reason.get_or_insert(EndReason::Failed);
            self.perf.signal(Signal::SIGTERM);
            self.stopping_since.get_or_insert(now);
        }
        if let Some(since) = self.stopping_since {
            if !self.sent_term && now >= since + ESCALATE_AFTER {
                self.reporter.warning(&format!(
                    "perf (pid {}) did not exit 10 s after stop; sending SIGTERM",
                    self.perf_pid()
                ));
                self.perf.signal(Signal::SIGTERM);
                self.sent_term = true;
            } else if self.sent_term && !self.sent_kill && now >= since + 2 * ESCALATE_AFTER {
                self.reporter.warning(&format!(
                    "perf (pid {}) did not exit 10 s after SIGTERM; sending SIGKILL",
                    self.perf_pid()
                ));
                self.perf.signal(Signal::SIGKILL);
                self.sent_kill = true;
            }
        }
        if now >= self.next_sample {
            self.next_sample = now + SAMPLE_EVERY;
            if let Some(cpu) = self.perf.cpu_time()
                && let Some(frac) = self.spin.sample(now.duration_since(self.spawned), cpu)
            {
                self.reporter.warning(&format!(
                    "perf (pid {}) is using {:.0}% of a core (for 2 s or more); perf 6.1 can spin \
                     when threads of the target exit (fixed upstream in 2026)",
                    self.perf_pid(),
                    frac * 100.0
                ));
            }
            // Exec: the probe is bound to the old file and no longer fires.
            if self.reason.is_none()
                && let (Some(was), Some(now_id)) = (self.exe_id, target::exe_id(self.tgid))
                && was != now_id
            {
                self.reporter.warning(&format!(
                    "pid {} exec'd a new image ({}); the probe was bound to the old file and no \
                     longer fires; ending its recording",
                    self.tgid,
                    fs::read_link(format!("/proc/{}/exe", self.tgid))
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                ));
                self.stop(EndReason::Exec);
            }
        }
        notes
    }

    /// The next moment [`Recorder::tick`] has something to do.
    pub fn next_deadline(&self, now: Instant) -> Instant {
        let mut next = self.next_sample;
        if let Some(ns) = self.machine.next_deadline() {
            let wait = Duration::from_nanos(ns.saturating_sub(crate::driver::monotonic_ns()));
            next = next.min(now + wait);
        }
        if let Some(since) = self.stopping_since
            && !self.sent_kill
        {
            next = next.min(if self.sent_term {
                since + 2 * ESCALATE_AFTER
            } else {
                since + ESCALATE_AFTER
            });
        }
        if self.ready_at.is_none() && self.failure.is_none() {
            next = next.min(self.spawned + READY_TIMEOUT);
        }
        next
    }

    fn perf_lines(&mut self, lines: Vec<PerfLine>) -> Notes {
        let mut notes = Notes::default();
        for line in lines {
            match line {
                PerfLine::Dump(path) => {
                    let name = path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_else(|| path.display().to_string());
                    // Every Dump is a switch perf finished, even one that
                    // reused a name (see `index`): the state machine counts it.
                    let actions = self.machine.on_dump(name, crate::driver::monotonic_ns());
                    let n = self.apply(actions);
                    notes.limit_reached |= n.limit_reached;
                }
                PerfLine::Other(l) => {
                    if l.contains("No space left on device") {
                        self.disk_full = true;
                    }
                    self.reporter
                        .verbose(&format!("perf[{}]: {l}", self.perf_pid()));
                }
            }
        }
        notes
    }

    fn apply(&mut self, actions: Vec<Action>) -> Notes {
        let mut notes = Notes::default();
        for a in actions {
            match a {
                Action::Switch => {
                    let _ = self.perf.switch();
                }
                Action::Stop => {
                    let _ = self.perf.stop();
                    self.stopping_since.get_or_insert_with(Instant::now);
                }
                Action::LimitReached => {
                    self.reason.get_or_insert(EndReason::MaxSnapshots);
                    notes.limit_reached = true;
                }
                Action::Index(snap) => self.index(snap),
            }
        }
        notes
    }

    /// Writes a completed snapshot to the index, with the kernel's counters
    /// of this trigger at that moment.
    fn index(&mut self, snap: Snapshot) {
        if self.indexed.contains(&snap.file) {
            // perf names files by wall-clock time, so a clock stepped back
            // (NTP, an operator) can reuse a name; `rename()` then replaced
            // the earlier snapshot.
            self.reporter.warning(&format!(
                "perf reused the file name {} (the wall clock stepped back?): the earlier \
                 snapshot with that name was overwritten",
                snap.file
            ));
            self.listed.retain(|f| f != &snap.file);
            if let Err(e) = self.index.deleted(&snap.file) {
                self.index_failed(e);
            }
        }
        let path = self.dir.join(&snap.file);
        let bytes = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let counters = self
            .counters
            .get()
            .map(|c| c.read(self.trigger))
            .unwrap_or_default();
        let merged = self.machine.stats().merged;
        if let Err(e) = self.index.snapshot(&snap, bytes, counters, merged) {
            self.index_failed(e);
        }
        self.output.keep();
        // Objects mapped since (dlopen): kept before the report needs them.
        crate::symcache::scan(self.tgid);
        self.indexed.insert(snap.file.clone());
        self.listed.push(snap.file.clone());
        self.snapshots += 1;
        self.reporter.snapshot(&SnapshotEvent {
            pid: self.tgid,
            n: self.snapshots,
            kind: snap.kind,
            file: &snap.file,
            bytes,
            hits: &snap.hits,
            hit_to_kill_ns: snap.hit_to_kill_ns,
            unlisted_hits: snap.unlisted_hits,
        });
        // perf's --switch-max-files (from --keep) deletes the oldest files.
        let dir = &self.dir;
        let (kept, gone): (Vec<String>, Vec<String>) = std::mem::take(&mut self.listed)
            .into_iter()
            .partition(|f| dir.join(f).exists());
        self.listed = kept;
        for f in gone {
            if let Err(e) = self.index.deleted(&f) {
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
                "the output file system is full (writing {}): stopping; completed snapshots are \
                 kept and listed",
                self.index.path().display()
            ))
        } else {
            Failure::runtime(format!("writing {}: {e}", self.index.path().display()))
        };
        self.fail(f);
    }

    /// Call once perf's pidfd fired and the ring buffer was drained: indexes
    /// every file perf left and returns the outcome.
    pub fn finish(mut self) -> RecorderOutcome {
        let status = self.perf.try_wait().ok().flatten();
        let perf_cpu = self.perf.last_cpu_time();
        let lines = self.perf.flush_stderr();
        self.perf_lines(lines);
        // Files perf completed without a Dump line (it was killed, or it
        // printed `<timestamp>` literally on SIGTERM): the tail.
        let mut left: Vec<String> = fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("perf.data.") && !self.indexed.contains(n))
            .collect();
        left.sort();
        for name in left {
            let actions = self.machine.on_dump(name, crate::driver::monotonic_ns());
            let actions = actions
                .into_iter()
                .filter(|a| matches!(a, Action::Index(_)))
                .collect();
            self.apply(actions);
        }
        if self.ready_at.is_none() && self.snapshots == 0 {
            // perf never started recording: its half-made perf.data is not a
            // snapshot, and the directory is tidied away with it.
            let _ = fs::remove_file(self.dir.join("perf.data"));
        }
        let unsnapshotted = self.machine.on_perf_exit();
        if unsnapshotted > 0 {
            self.reporter.warning(&format!(
                "{unsnapshotted} accepted hit(s) of pid {} got no snapshot: perf ended before writing it",
                self.tgid
            ));
        }
        let target_alive =
            !matches!(self.reason, Some(EndReason::TargetExited)) && target::is_alive(self.tgid);
        if !target_alive && self.reason.is_none() {
            self.reason = Some(EndReason::TargetExited);
        }
        let we_ended_it = self.machine.stop_sent() || self.sent_term || self.sent_kill;
        if self.ready_at.is_none()
            && self.failure.is_none()
            && target_alive
            && self.reason.is_none()
        {
            self.failure = Some(perf_start_failure(status, &self.perf.last_lines()));
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
                    "perf ended unexpectedly ({how}) while the target (pid {}) still runs",
                    self.tgid
                ))
                .with_detail(
                    self.perf
                        .last_lines()
                        .into_iter()
                        .map(|l| format!("perf: {l}")),
                ),
            );
            self.reason = Some(EndReason::PerfEnded);
        }
        if self.disk_full {
            self.reason = Some(EndReason::DiskFull);
            // perf's own words on the full disk, as for any runtime failure.
            if let Some(f) = self.failure.as_mut().filter(|f| f.detail.is_empty()) {
                f.detail.extend(
                    self.perf
                        .last_lines()
                        .into_iter()
                        .map(|l| format!("perf: {l}")),
                );
            }
        }
        RecorderOutcome {
            trigger: self.trigger,
            tgid: self.tgid,
            dir: self.dir.clone(),
            reason: self.reason.clone().unwrap_or(EndReason::PerfEnded),
            failure: self.failure.take(),
            stats: self.machine.stats(),
            perf_exit: status.map(perf::describe_status),
            perf_cpu,
        }
    }
}

/// The failure for a perf that exited before it was ready: bad arguments
/// (exit code 2), no permission to open perf events (3) or anything else
/// (4), with its last stderr lines.
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
    // perf's messages for EACCES/EPERM from perf_event_open
    // (tools/perf/util/evsel.c, evsel__open_strerror).
    let denied = lines.iter().find(|l| {
        l.contains("Permission denied")
            || l.contains("perf_event_paranoid")
            || l.contains("No permission")
    });
    let first = lines.first().cloned().unwrap_or_default();
    let detail = lines.iter().map(|l| format!("perf: {l}"));
    if let Some(why) = denied.filter(|_| !usage) {
        Failure::environment(format!(
            "perf may not open its events here ({how}): {why}; run as root or with \
             CAP_PERFMON/CAP_SYS_ADMIN, or lower kernel.perf_event_paranoid"
        ))
        .with_detail(detail)
    } else if usage {
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

/// Sums counter values (for a summary over several triggers).
pub fn add_counters(a: &mut CounterValues, b: &CounterValues) {
    a.seen += b.seen;
    a.accepted += b.accepted;
    a.lost += b.lost;
    let (x, y) = (&mut a.dropped, &b.dropped);
    x.tid += y.tid;
    x.when += y.when;
    x.duration += y.duration;
    x.every += y.every;
    x.rate += y.rate;
    x.cooldown += y.cooldown;
    x.no_return += y.no_return;
    x.error += y.error;
}

/// Sums state-machine counts.
pub fn add_stats(a: &mut Stats, b: &Stats) {
    a.delivered += b.delivered;
    a.merged += b.merged;
    a.hit_snapshots += b.hit_snapshots;
    a.tail_snapshots += b.tail_snapshots;
    a.unsnapshotted += b.unsnapshotted;
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;
    use crate::error::ExitCode;

    fn failure_for(lines: &[&str]) -> Failure {
        let lines: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        perf_start_failure(Some(std::process::ExitStatus::from_raw(255 << 8)), &lines)
    }

    #[test]
    fn perf_start_failures_get_the_documented_exit_code() {
        let bad_event = failure_for(&["event syntax error: 'nosuch'", "Run 'perf list'"]);
        assert_eq!(bad_event.code, ExitCode::Usage);
        let denied = failure_for(&[
            "Error:",
            "Access to performance monitoring and observability operations is limited.",
            "perf_event_paranoid setting is 4:",
        ]);
        assert_eq!(denied.code, ExitCode::Environment);
        assert!(denied.message.contains("paranoid"), "{}", denied.message);
        let other = failure_for(&["failed to mmap with 12 (Cannot allocate memory)"]);
        assert_eq!(other.code, ExitCode::Runtime);
        assert_eq!(other.detail.len(), 1);
    }
}
