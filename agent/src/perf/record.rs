//! Spawning and driving `perf record --switch-output=signal`.
//!
//! Facts used here come from perf's `tools/perf/builtin-record.c` (Linux 6.1)
//! and from `docs/perf-switch-output.md`:
//! * Until perf installs its SIGUSR2 handler, SIGUSR2 kills it. We spawn it
//!   with SIGUSR2 ignored (SIG_IGN survives `execve`; perf's own `signal()`
//!   call replaces it later).
//! * perf answers control commands only in its main loop, so an acked `ping`
//!   on `--control fd:CTL,ACK` means the next SIGUSR2 will rotate. An ack is
//!   the 5 bytes `ack\n\0`.
//! * A SIGUSR2 that lands just before perf enters `poll()` waits for the next
//!   wakeup; a `ping` right after the signal makes perf act on it at once.
//! * After each rotation perf prints `[ perf record: Dump <path>.<ts> ]` on
//!   stderr, after the rename, so the named file is complete.
//! * `stop` on the control fd makes perf rename its last file and exit 0.

use std::{
    collections::VecDeque,
    ffi::OsString,
    fs::File,
    io::{self, Read, Write},
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd},
        unix::process::{CommandExt, ExitStatusExt},
    },
    path::PathBuf,
    process::{Child, ChildStderr, Command, ExitStatus, Stdio},
    time::Duration,
};

use anyhow::Context as _;

use super::kallsyms::KallsymsCopy;
use nix::{
    fcntl::{FcntlArg, OFlag, fcntl},
    sys::signal::{Signal, kill},
    unistd::{Pid, pipe2},
};

/// How many of perf's last stderr lines are kept for error reports.
const KEEP_LINES: usize = 20;

/// What `perf record` is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerfSpec {
    /// Absolute path of the perf binary, resolved once.
    pub perf: PathBuf,
    /// Process to record (`-p`).
    pub pid: i32,
    /// perf's `-o` path: `OUT/perf.data`. Rotated files are `OUT/perf.data.<ts>`.
    pub output: PathBuf,
    /// Event to sample (`-e`).
    pub event: String,
    /// Sampling frequency in Hz (`-F`).
    pub freq: u32,
    /// `--switch-max-files`: keep only the newest N rotated files.
    pub keep: Option<u32>,
    /// Keep perf's default of recording BPF program events (`false` adds
    /// `--no-bpf-event`).
    pub bpf_events: bool,
    /// How perf keeps its samples: all of them, or a flight recorder.
    pub recording: Recording,
    /// How stacks are unwound: `--call-graph fp|dwarf,SIZE`, or nothing
    /// when the extra arguments choose ([`crate::perf::unwind::Unwinding::perf_args`]).
    pub call_graph: Vec<String>,
    /// The off-CPU breakdown (docs/off-cpu.md): when set, perf also records
    /// the target threads' context switches and a `sched:sched_switch`
    /// sample, with its stack, at each switch-out. The value is the window
    /// before a hit that has no call duration.
    pub off_cpu: Option<Duration>,
    /// Extra arguments, already checked by [`crate::perf::args::check_perf_args`].
    pub extra: Vec<String>,
}

/// How perf keeps samples between snapshots (docs/flight-recorder.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recording {
    /// Every sample goes to the open file; a snapshot holds everything since
    /// the previous one.
    Continuous,
    /// perf's flight recorder (`--overwrite`): samples stay in overwritable
    /// rings, one per CPU, and only what the rings hold when a snapshot is
    /// taken is written.
    FlightRecorder {
        /// Size of each ring, in 4 KiB pages (a power of two, `-m`).
        ring_pages: u64,
    },
}

impl Recording {
    /// perf's arguments for this mode.
    fn args(self) -> Vec<OsString> {
        match self {
            Recording::Continuous => Vec::new(),
            Recording::FlightRecorder { ring_pages } => {
                vec![
                    "--overwrite".into(),
                    "-m".into(),
                    ring_pages.to_string().into(),
                ]
            }
        }
    }

    /// Bytes of each flight-recorder ring.
    pub fn ring_bytes(self) -> Option<u64> {
        match self {
            Recording::Continuous => None,
            Recording::FlightRecorder { ring_pages } => Some(ring_pages * 4096),
        }
    }

    /// The name used in the `armed` event and the README.
    pub fn name(self) -> &'static str {
        match self {
            Recording::Continuous => "continuous",
            Recording::FlightRecorder { .. } => "flight-recorder",
        }
    }
}

/// Pages of a ring of at least `bytes`: perf's `-m` takes a power of two.
pub fn ring_pages(bytes: u64) -> u64 {
    bytes.div_ceil(4096).max(1).next_power_of_two()
}

impl PerfSpec {
    /// The argument list after the program name, with the control fds perf
    /// will see.
    pub fn args(&self, ctl_fd: RawFd, ack_fd: RawFd) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "record".into(),
            "-p".into(),
            self.pid.to_string().into(),
            "--switch-output=signal".into(),
            "-o".into(),
            self.output.clone().into(),
        ];
        args.extend(self.event_args());
        args.extend(self.call_graph.iter().map(OsString::from));
        args.extend([
            // Sample times on the clock of bpf_ktime_get_ns, so a hit can be
            // found inside a snapshot (`perf report --time`).
            "-k".into(),
            "CLOCK_MONOTONIC".into(),
            "--control".into(),
            format!("fd:{ctl_fd},{ack_fd}").into(),
            // Build-ids in the MMAP2 events (kernel 5.12+): --switch-output
            // turns off perf's own build-id collection, and the report finds
            // each object by build-id in OUT/.debug (see capture/build_id_cache.rs).
            "--buildid-mmap".into(),
        ]);
        if let Some(n) = self.keep {
            args.push(format!("--switch-max-files={n}").into());
        }
        args.extend(self.recording.args());
        if !self.bpf_events {
            // perf writes the info (and BTF) of every BPF program it has
            // seen into the header of every file it switches to: on a host
            // with many programs, that slows each switch and fattens each
            // snapshot.
            args.push("--no-bpf-event".into());
        }
        args.extend(self.extra.iter().map(OsString::from));
        args
    }
}

impl PerfSpec {
    /// The events. With the off-CPU breakdown, the frequency goes into the
    /// sampling event's own terms: perf's `-F` would also turn the
    /// tracepoint into frequency sampling, where a tracepoint alone keeps
    /// period 1, one sample per switch (tools/perf/util/evsel.c,
    /// `evsel__config`).
    fn event_args(&self) -> Vec<OsString> {
        if self.off_cpu.is_none() {
            return ["-e", &self.event, "-F", &self.freq.to_string()]
                .map(OsString::from)
                .to_vec();
        }
        let switch = if self.frame_pointer_stacks() {
            format!("sched:sched_switch/call-graph=dwarf,stack-size={SWITCH_STACK_BYTES}/")
        } else {
            "sched:sched_switch".into()
        };
        let mut args: Vec<OsString> = [
            "-e",
            &with_freq(&self.event, self.freq),
            "-e",
            &switch,
            "--switch-events",
            // Each record's CPU: a loss record says which ring lost records,
            // so the stretch it hides starts at that ring's previous record
            // (perf/data.rs).
            "--sample-cpu",
        ]
        .map(OsString::from)
        .to_vec();
        if self.frame_pointer_stacks() {
            // perf script unwinds the copies only when the file has the data
            // mappings too (`-d` sets `mmap_data`; measured with perf 6.1,
            // docs/off-cpu.md).
            args.push("-d".into());
        }
        args
    }

    /// Stacks are unwound with frame pointers (`--call-graph fp`).
    fn frame_pointer_stacks(&self) -> bool {
        self.call_graph
            .iter()
            .map(String::as_str)
            .eq(["--call-graph", "fp"])
    }
}

/// Bytes of user stack each `sched:sched_switch` sample copies when the CPU
/// samples use frame pointers: enough to unwind through libc's waits (which
/// have no frame pointers on Debian) to the program's caller. The figures
/// it comes from are in docs/off-cpu.md ("Blocked stacks through libc").
pub const SWITCH_STACK_BYTES: u32 = 1024;

/// `event` with a `freq=` term: `cpu-clock` → `cpu-clock/freq=999/`,
/// `cycles:u` → `cycles/freq=999/u`, `cpu/cycles/` → `cpu/cycles,freq=999/`.
pub fn with_freq(event: &str, freq: u32) -> String {
    if let Some(body) = event.strip_suffix('/')
        && body.contains('/')
    {
        return format!("{body},freq={freq}/");
    }
    const MODIFIERS: &str = "ukhpPGHISDWe";
    if let Some((name, mods)) = event.rsplit_once(':')
        && !mods.is_empty()
        && mods.chars().all(|c| MODIFIERS.contains(c))
    {
        return format!("{name}/freq={freq}/{mods}");
    }
    format!("{event}/freq={freq}/")
}

/// One line perf printed on stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PerfLine {
    /// `[ perf record: Dump <path> ]`: a snapshot file is complete.
    Dump(PathBuf),
    /// Anything else.
    Other(String),
}

/// Recognizes `[ perf record: Dump <path> ]` and returns the path.
pub fn parse_dump_line(line: &str) -> Option<&str> {
    line.trim()
        .strip_prefix("[ perf record: Dump ")?
        .strip_suffix(" ]")
}

/// A running `perf record`.
pub struct PerfProcess {
    child: Child,
    pidfd: OwnedFd,
    ctl: File,
    ack: File,
    stderr: ChildStderr,
    partial: Vec<u8>,
    last_lines: VecDeque<String>,
    status: Option<ExitStatus>,
    stderr_eof: bool,
    ack_eof: bool,
    last_cpu: Option<Duration>,
}

/// The perf command of [`PerfProcess::spawn`]: its arguments, a cleared
/// environment, its own process group, and between fork and exec the
/// control fds kept open, SIGUSR2 ignored, `PR_SET_PDEATHSIG` and
/// `SCHED_BATCH` ([`batch`]), and `/proc/kallsyms` replaced by `kallsyms`
/// in a mount namespace of perf's own.
fn perf_command(
    spec: &PerfSpec,
    ctl_child: RawFd,
    ack_child: RawFd,
    kallsyms: Option<std::ffi::CString>,
) -> Command {
    let parent = nix::unistd::getpid();
    let mut cmd = super::binary::command(&spec.perf);
    cmd.args(spec.args(ctl_child, ack_child))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    for key in ["LANG", "HOME"] {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    // SAFETY: only async-signal-safe calls (fcntl, signal,
    // sched_setscheduler, prctl, getppid) run between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            for fd in [ctl_child, ack_child] {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            libc::signal(libc::SIGUSR2, libc::SIG_IGN);
            if let Some(copy) = &kallsyms {
                // perf reads the small copy as /proc/kallsyms
                // (perf/kallsyms.rs); best effort, checked after the spawn.
                crate::sys::mount_ns::bind_in_private_namespace(copy, c"/proc/kallsyms");
            }
            // perf (and its threads) under `SCHED_BATCH`: the same share of
            // the CPU, but its wake-ups do not preempt the running task
            // (`check_preempt_wakeup_fair()` in kernel/sched/fair.c;
            // sched(7)). perf wakes at each hit's SIGUSR2, and it used to
            // take the driver's CPU for its switch-output work right after
            // the `kill()`, before the driver could have the trigger's
            // probes taken out: the target trapped meanwhile
            // (docs/disarming.md, "Handing the disarm over at once"). A
            // hit's wake-up of the driver still preempts perf. Best effort.
            crate::sys::sched::set_batch();
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) == -1 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before the prctl took effect.
            if libc::getppid() != parent.as_raw() {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    cmd
}

impl PerfProcess {
    /// Spawns perf: SIGUSR2 ignored, in its own process group, with a
    /// cleared environment, `PR_SET_PDEATHSIG` so it dies with the spawning
    /// thread, and the control pipes on `--control fd:CTL,ACK`.
    ///
    /// With `kallsyms`, perf reads that copy as `/proc/kallsyms`
    /// ([`super::kallsyms`]); [`kallsyms_copied`](Self::kallsyms_copied)
    /// says whether it does.
    ///
    /// Must be called from a thread that lives as long as the agent (the
    /// driver thread, or `check`'s main thread): the death signal fires when
    /// the spawning *thread* exits.
    pub fn spawn(spec: &PerfSpec, kallsyms: Option<&KallsymsCopy>) -> anyhow::Result<Self> {
        // ctl: we write, perf reads. ack: perf writes, we read.
        let (ctl_r, ctl_w) = pipe2(OFlag::O_CLOEXEC).context("pipe")?;
        let (ack_r, ack_w) = pipe2(OFlag::O_CLOEXEC).context("pipe")?;
        let (ctl_child, ack_child) = (ctl_r.as_raw_fd(), ack_w.as_raw_fd());
        // The copy's name lives only until perf has bound it (pre_exec).
        let linked = kallsyms.and_then(|k| k.link().ok());
        let source = linked
            .as_ref()
            .and_then(|l| std::ffi::CString::new(l.path().as_os_str().as_encoded_bytes()).ok());
        let mut cmd = perf_command(spec, ctl_child, ack_child, source);
        let spawned = cmd.spawn();
        drop(linked);
        let mut child = spawned.with_context(|| format!("starting {}", spec.perf.display()))?;
        drop((ctl_r, ack_w));
        let stderr = child.stderr.take().expect("stderr is piped");
        let setup = || -> anyhow::Result<OwnedFd> {
            set_nonblocking(stderr.as_fd())?;
            set_nonblocking(ack_r.as_fd())?;
            crate::sys::pidfd::pidfd_open(child.id() as i32).context("pidfd_open(perf)")
        };
        let pidfd = match setup() {
            Ok(fd) => fd,
            Err(e) => {
                // Nothing would watch this perf: end it now.
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        Ok(Self {
            child,
            pidfd,
            ctl: File::from(ctl_w),
            ack: File::from(ack_r),
            stderr,
            partial: Vec::new(),
            last_lines: VecDeque::new(),
            status: None,
            stderr_eof: false,
            ack_eof: false,
            last_cpu: None,
        })
    }

    /// Whether perf reads the copy as `/proc/kallsyms` (a mount there in
    /// its namespace).
    pub fn kallsyms_copied(&self) -> bool {
        crate::sys::mount_ns::has_mount_at(self.child.id() as i32, "/proc/kallsyms")
    }

    /// perf's pid.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Readable when perf has exited.
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// Readable when perf wrote to stderr (or closed it).
    pub fn stderr_fd(&self) -> BorrowedFd<'_> {
        self.stderr.as_fd()
    }

    /// Readable when perf acked a control command.
    pub fn ack_fd(&self) -> BorrowedFd<'_> {
        self.ack.as_fd()
    }

    /// Writes `ping` on the control fd; perf acks it from its main loop.
    pub fn ping(&mut self) -> io::Result<()> {
        self.ctl.write_all(b"ping\n")
    }

    /// Closes the current snapshot: SIGUSR2, then `ping` so that perf acts on
    /// the signal even if it landed just before perf entered `poll()`.
    pub fn switch(&mut self) -> io::Result<()> {
        kill(self.pid(), Signal::SIGUSR2).map_err(io::Error::from)?;
        self.ping()
    }

    /// Asks perf to stop: it renames its last file and exits 0.
    pub fn stop(&mut self) -> io::Result<()> {
        self.ctl.write_all(b"stop\n")
    }

    /// Sends `signal` to perf (unless it has been reaped).
    pub fn signal(&self, signal: Signal) {
        if self.status.is_none() {
            let _ = kill(self.pid(), signal);
        }
    }

    /// Reads pending acks; returns how many arrived. Ok(0) when none.
    pub fn read_acks(&mut self) -> io::Result<usize> {
        let mut buf = [0u8; 256];
        let mut total = 0;
        loop {
            match self.ack.read(&mut buf) {
                Ok(0) => {
                    self.ack_eof = true;
                    return Ok(total / 5);
                }
                Ok(n) => total += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(total / 5),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads what perf wrote on stderr and returns the complete lines.
    pub fn read_stderr(&mut self) -> io::Result<Vec<PerfLine>> {
        let mut buf = [0u8; 4096];
        loop {
            match self.stderr.read(&mut buf) {
                Ok(0) => {
                    self.stderr_eof = true;
                    break;
                }
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let mut lines = Vec::new();
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let raw: Vec<u8> = self.partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&raw).trim_end().to_string();
            if line.is_empty() {
                continue;
            }
            self.remember(&line);
            lines.push(match parse_dump_line(&line) {
                Some(p) => PerfLine::Dump(PathBuf::from(p)),
                None => PerfLine::Other(line),
            });
        }
        Ok(lines)
    }

    /// After perf exited: whatever it wrote without a final newline.
    pub fn flush_stderr(&mut self) -> Vec<PerfLine> {
        let mut lines = self.read_stderr().unwrap_or_default();
        if !self.partial.is_empty() {
            let line = String::from_utf8_lossy(&self.partial).trim().to_string();
            self.partial.clear();
            if !line.is_empty() {
                self.remember(&line);
                lines.push(PerfLine::Other(line));
            }
        }
        lines
    }

    fn remember(&mut self, line: &str) {
        if self.last_lines.len() == KEEP_LINES {
            self.last_lines.pop_front();
        }
        self.last_lines.push_back(line.to_string());
    }

    /// perf's last stderr lines that are not `Dump` or progress lines.
    pub fn last_lines(&self) -> Vec<String> {
        self.last_lines
            .iter()
            .filter(|l| !l.starts_with("[ perf record:"))
            .cloned()
            .collect()
    }

    /// Whether perf closed its stderr.
    pub fn stderr_closed(&self) -> bool {
        self.stderr_eof
    }

    /// Whether perf closed its end of the ack pipe.
    pub fn ack_closed(&self) -> bool {
        self.ack_eof
    }

    /// Reaps perf if it has exited. Its CPU time is read just before, while
    /// /proc/PID/stat of the exited (zombie) process still holds it.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            if let Some(cpu) = crate::sys::proc::cpu_time(self.pid().as_raw()) {
                self.last_cpu = Some(cpu);
            }
            self.status = self.child.try_wait()?;
        }
        Ok(self.status)
    }

    /// perf's CPU time (user + system) as last read, including after exit.
    pub fn last_cpu_time(&self) -> Option<Duration> {
        self.last_cpu
    }

    /// CPU time perf has used so far (user + system), from /proc/PID/stat.
    pub fn cpu_time(&self) -> Option<Duration> {
        if self.status.is_some() {
            return None;
        }
        crate::sys::proc::cpu_time(self.pid().as_raw())
    }
}

impl Drop for PerfProcess {
    /// Never leave perf behind: if it still runs, kill it and reap it.
    fn drop(&mut self) {
        if matches!(self.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Detects a perf that keeps a core busy: over a sliding window (2 s), the
/// CPU time perf used divided by the wall time passed, and the switch-outputs
/// it was asked for in that time. Two causes are known
/// (docs/perf-switch-output.md): perf's own work at each switch-output, and
/// perf 6.1 spinning when threads of a `-p` target exit.
#[derive(Debug)]
pub struct SpinDetector {
    window: Duration,
    threshold: f64,
    /// (wall time, perf's CPU time, switch-outputs asked for so far).
    samples: VecDeque<(Duration, Duration, u64)>,
    spinning: bool,
}

/// A busy perf, as [`SpinDetector`] saw it over its window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Busy {
    /// perf's CPU time over wall time (1.0 is a whole core).
    pub cpu_frac: f64,
    /// Switch-outputs asked of perf per second of wall time.
    pub switches_per_s: f64,
}

/// perf 6.1's CPU work per switch-output, seconds: it re-reads
/// `/proc/kallsyms` at every switch (docs/disarming.md has the measurement).
pub const PERF_CPU_PER_SWITCH_S: f64 = 0.045;

impl Busy {
    /// Whether the switch-outputs account for at least half of perf's CPU.
    pub fn from_switches(&self) -> bool {
        self.switches_per_s * PERF_CPU_PER_SWITCH_S >= self.cpu_frac / 2.0
    }

    /// The warning: perf's share of a core, and the cause with what to do.
    pub fn warning(&self, perf_pid: i32) -> String {
        let head = format!(
            "perf (pid {perf_pid}) is using {:.0}% of a core (for 2 s or more)",
            self.cpu_frac * 100.0
        );
        if self.from_switches() {
            format!(
                "{head}: {:.0} switch-outputs a second, and perf 6.1 re-reads /proc/kallsyms at \
                 every one (~40-50 ms of CPU each); hits that come while it works are merged \
                 into one snapshot. Ask for fewer hits a second: a longer --cooldown, --max-rate \
                 or --every",
                self.switches_per_s
            )
        } else {
            format!(
                "{head}; perf 6.1 can spin when threads of the target exit (fixed upstream in 2026)"
            )
        }
    }
}

impl SpinDetector {
    /// Warn when perf used more than `threshold` (0..1) of a core over `window`.
    pub fn new(window: Duration, threshold: f64) -> Self {
        Self {
            window,
            threshold,
            samples: VecDeque::new(),
            spinning: false,
        }
    }

    /// Feeds one sample: wall time, perf's total CPU time and the
    /// switch-outputs asked of it so far. Returns what perf did over the
    /// window when a busy episode starts (once per episode).
    pub fn sample(&mut self, wall: Duration, cpu: Duration, switches: u64) -> Option<Busy> {
        self.samples.push_back((wall, cpu, switches));
        // Keep the newest sample that is at least `window` old, and after.
        while self.samples.len() > 2 && wall.saturating_sub(self.samples[1].0) >= self.window {
            self.samples.pop_front();
        }
        let (w0, c0, s0) = *self.samples.front()?;
        let span = wall.saturating_sub(w0);
        if span < self.window {
            return None;
        }
        let frac = cpu.saturating_sub(c0).as_secs_f64() / span.as_secs_f64();
        if frac > self.threshold {
            if !self.spinning {
                self.spinning = true;
                return Some(Busy {
                    cpu_frac: frac,
                    switches_per_s: switches.saturating_sub(s0) as f64 / span.as_secs_f64(),
                });
            }
        } else {
            self.spinning = false;
        }
        None
    }
}

/// Describes how perf ended, for messages: "exit status 0" or "signal 9".
pub fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => match Signal::try_from(sig) {
            Ok(s) => format!("signal {sig} ({s})"),
            Err(_) => format!("signal {sig}"),
        },
        _ => format!("{status}"),
    }
}

fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dump_lines_are_recognized() {
        assert_eq!(
            parse_dump_line("[ perf record: Dump /o/perf.data.2026113008291121 ]"),
            Some("/o/perf.data.2026113008291121")
        );
        assert_eq!(
            parse_dump_line("[ perf record: dump data: Woken up 2 times ]"),
            None
        );
        assert_eq!(
            parse_dump_line(
                "[ perf record: Captured and wrote 0.001 MB /o/perf.data.<timestamp> ]"
            ),
            None
        );
    }

    /// A spec for argument tests: `cpu-clock` at 999 Hz on pid 42.
    fn spec(recording: Recording, off_cpu: Option<Duration>) -> PerfSpec {
        PerfSpec {
            perf: "/usr/bin/perf".into(),
            pid: 42,
            output: "/out/perf.data".into(),
            event: "cpu-clock".into(),
            freq: 999,
            keep: None,
            bpf_events: true,
            recording,
            call_graph: vec![],
            off_cpu,
            extra: vec![],
        }
    }

    fn args_text(spec: &PerfSpec) -> String {
        let args: Vec<String> = spec
            .args(5, 7)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        args.join(" ")
    }

    #[test]
    fn perf_command_line() {
        let spec = PerfSpec {
            keep: Some(3),
            bpf_events: false,
            call_graph: vec!["--call-graph".into(), "fp".into()],
            extra: vec!["--call-graph".into(), "dwarf".into()],
            ..spec(Recording::FlightRecorder { ring_pages: 512 }, None)
        };
        assert_eq!(
            args_text(&spec),
            "record -p 42 --switch-output=signal -o /out/perf.data -e cpu-clock -F 999 \
             --call-graph fp -k CLOCK_MONOTONIC --control fd:5,7 --buildid-mmap \
             --switch-max-files=3 --overwrite -m 512 --no-bpf-event --call-graph dwarf"
        );
    }

    #[test]
    fn the_off_cpu_breakdown_adds_the_switch_events_and_moves_the_frequency_into_the_event() {
        let args = args_text(&spec(Recording::Continuous, Some(Duration::from_secs(1))));
        assert!(
            args.contains(
                " -e cpu-clock/freq=999/ -e sched:sched_switch --switch-events --sample-cpu "
            ),
            "{args}"
        );
        assert!(!args.contains(" -F "), "{args}");
        assert!(!args.contains(" -d "), "{args}");
    }

    #[test]
    fn with_frame_pointers_the_context_switch_sample_copies_a_small_stack() {
        let fp = PerfSpec {
            call_graph: vec!["--call-graph".into(), "fp".into()],
            ..spec(Recording::Continuous, Some(Duration::from_secs(1)))
        };
        let args = args_text(&fp);
        assert!(
            args.contains(
                " -e cpu-clock/freq=999/ -e sched:sched_switch/call-graph=dwarf,stack-size=1024/ \
                 --switch-events --sample-cpu -d --call-graph fp "
            ),
            "{args}"
        );
        // DWARF already copies the stack at every sample.
        let dwarf = PerfSpec {
            call_graph: vec!["--call-graph".into(), "dwarf,8192".into()],
            ..fp.clone()
        };
        let args = args_text(&dwarf);
        assert!(
            args.contains(
                " -e sched:sched_switch --switch-events --sample-cpu --call-graph dwarf,8192 "
            ),
            "{args}"
        );
        // Without the breakdown, nothing is added.
        let off = PerfSpec {
            off_cpu: None,
            ..fp
        };
        assert!(!args_text(&off).contains("sched_switch"));
    }

    #[test]
    fn a_frequency_term_fits_every_event_spelling() {
        assert_eq!(with_freq("cpu-clock", 99), "cpu-clock/freq=99/");
        assert_eq!(with_freq("cycles:u", 99), "cycles/freq=99/u");
        assert_eq!(with_freq("cpu/cycles/", 99), "cpu/cycles,freq=99/");
        assert_eq!(
            with_freq("sched:sched_wakeup", 1),
            "sched:sched_wakeup/freq=1/"
        );
    }

    #[test]
    fn spin_detector_warns_once_per_episode() {
        let ms = Duration::from_millis;
        let mut d = SpinDetector::new(ms(2000), 0.9);
        // Idle for 3 s: no warning.
        for t in 0..=6 {
            assert_eq!(d.sample(ms(t * 500), ms(t * 10), 0), None);
        }
        // Then spinning at 100%: no warning until 2 s of it have passed.
        let base = ms(60);
        let mut warned = Vec::new();
        for i in 1..=8 {
            let t = ms(3000 + i * 500);
            if let Some(f) = d.sample(t, base + ms(i * 500), 0) {
                warned.push((i, f.cpu_frac));
            }
        }
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert_eq!(warned[0].0, 4);
        assert!(warned[0].1 > 0.99);
        // 50% for a while clears the episode; a later spin warns again.
        let mut cpu = base + ms(4000);
        for i in 1..=8 {
            cpu += ms(250);
            assert_eq!(d.sample(ms(7000 + i * 500), cpu, 0), None);
        }
        let mut again = 0;
        for i in 1..=6 {
            cpu += ms(500);
            again += usize::from(d.sample(ms(11000 + i * 500), cpu, 0).is_some());
        }
        assert_eq!(again, 1);
    }

    #[test]
    fn a_busy_perf_is_blamed_on_what_it_was_asked_to_do() {
        let s = Duration::from_secs;
        let mut d = SpinDetector::new(s(2), 0.9);
        assert_eq!(d.sample(s(0), s(0), 0), None);
        // 33 switch-outputs a second for 2 s, perf at 100%: the switches.
        let busy = d.sample(s(2), s(2), 66).expect("busy");
        assert!((busy.switches_per_s - 33.0).abs() < 1e-9, "{busy:?}");
        assert!(busy.from_switches());
        let w = busy.warning(7);
        assert!(w.contains("33 switch-outputs a second"), "{w}");
        assert!(
            w.contains("/proc/kallsyms") && w.contains("--cooldown"),
            "{w}"
        );
        assert!(!w.contains("threads"), "{w}");
        // The same CPU with one switch in 2 s: not the switches.
        let quiet = Busy {
            cpu_frac: 1.0,
            switches_per_s: 0.5,
        };
        assert!(!quiet.from_switches());
        assert!(quiet.warning(7).contains("threads of the target exit"));
    }
}
