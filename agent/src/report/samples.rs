//! A snapshot's samples, read through `perf script`.
//!
//! Every perf command the report runs goes through [`perf_command`], which
//! points perf at the run's build-id cache (`--buildid-dir OUT/.debug`)
//! when the run kept one. Why `perf script` rather than a Rust reader of
//! perf.data: see docs/report.md. A snapshot with JIT maps kept
//! (capture/jit_maps.rs) is read by a perf that sees them at
//! `/tmp/perf-PID.map` (docs/jit-maps.md).

use std::{
    collections::HashMap,
    fs::File,
    io::{self, BufRead, BufReader, Read},
    os::{fd::AsRawFd, unix::process::CommandExt},
    path::Path,
    process::{Command, Stdio},
};

use crate::{
    capture::jit_maps,
    output::run_file::StackDonors,
    report::{cfa, jitdump, pending_returns},
};

/// The fields asked of `perf script`: thread, time (ns with `--ns`), the
/// event's name and a tracepoint's fields (`trace`), and the call chain as
/// address, symbol and object. With `--show-switch-events` perf also prints
/// the `PERF_RECORD_SWITCH` records (off-CPU breakdown runs record them).
const FIELDS: &str = "tid,time,event,trace,ip,sym,dso";

/// The tracepoint an off-CPU breakdown run records beside the sampling
/// event: one sample per switch-out of a target thread.
pub const SCHED_SWITCH: &str = "sched:sched_switch";

/// One sample: a thread, a time and a call chain.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub tid: u32,
    /// perf's sample time: CLOCK_MONOTONIC (`-k CLOCK_MONOTONIC`), ns.
    pub time_ns: u64,
    /// Range in [`Samples::frames`], leaf first.
    pub(super) start: u32,
    pub(super) len: u32,
    /// The stack is whole by its frames' addresses: unwound again from
    /// its copy, the unwinder found the stack's end, and perf's frames are
    /// those ([`Samples::attach_cfas`]).
    pub reached_end: bool,
    /// The user stack pointer, where its copy starts; 0 where not known.
    pub user_sp: u64,
}

impl Sample {
    /// Where its frames are in [`Samples`]' per-frame vectors.
    pub(super) fn range(&self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}

/// A `sched:sched_switch` sample: taken in the thread's context just
/// before it leaves the CPU, with its call chain (kernel frames, then user
/// frames) and the thread's state (`prev_state`: `S`, `D`, `R`, `R+`...).
#[derive(Debug, Clone)]
pub struct SchedSwitchSample {
    pub sample: Sample,
    pub prev_state: String,
}

/// A `PERF_RECORD_SWITCH` record of a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextSwitchLine {
    pub tid: u32,
    /// CLOCK_MONOTONIC, ns.
    pub time_ns: u64,
    /// `OUT` (the thread leaves the CPU) or `IN`.
    pub out: bool,
    /// `OUT preempt`: the thread was preempted, it stays runnable.
    pub preempt: bool,
}

/// The samples of one snapshot file, with interned frame names.
#[derive(Debug, Default, Clone)]
pub struct Samples {
    /// The sampling event's samples (the CPU flame graphs' input).
    pub samples: Vec<Sample>,
    /// `sched:sched_switch` samples, in file order.
    pub sched_switch_samples: Vec<SchedSwitchSample>,
    /// `PERF_RECORD_SWITCH` records, in file order.
    pub context_switches: Vec<ContextSwitchLine>,
    /// Frame ids of every call chain, leaf first, back to back.
    pub(super) frames: Vec<u32>,
    pub(super) names: Vec<String>,
    pub(super) ids: HashMap<String, u32>,
    /// Each frame's object (perf's `dso`), as an index in `objects`;
    /// parallel to `frames`.
    pub(super) frame_objects: Vec<u32>,
    pub(super) objects: Vec<String>,
    /// Each frame's address as perf printed it; parallel to `frames`.
    pub(super) frame_ips: Vec<u64>,
    /// Each frame's CFA, its place on the stack (report/cfa.rs), 0 where
    /// not known; parallel to `frames`.
    pub(super) frame_cfas: Vec<u64>,
    /// Where each frame's function starts in its object (report/cfa.rs),
    /// 0 where not known; parallel to `frames`.
    pub(super) frame_functions: Vec<u64>,
    /// perf's command line, from the header (`# cmdline : ...`).
    pub cmdline: Option<String>,
    /// Cut DWARF stacks completed from complete ones of their thread
    /// ([`Samples::graft_cut_stacks`]).
    pub grafted: usize,
    /// Kept jitdump files the JIT code was named from (docs/jit-maps.md).
    pub jitdumps: usize,
    /// Why the kept jitdump files could not be read: the snapshot is then
    /// read without them.
    pub jitdump_error: Option<String>,
    /// Return addresses of the hits' calls written back into DWARF stack
    /// copies that a uretprobe left holding its trampoline's address
    /// (report/pending_returns.rs), and why that could not be done, if so.
    pub returns_restored: usize,
    pub returns_error: Option<String>,
}

impl Samples {
    /// A sample's call chain, leaf first, as frame ids.
    pub fn stack(&self, s: &Sample) -> &[u32] {
        &self.frames[s.range()]
    }

    /// A frame id's name.
    pub fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }

    /// The objects of a sample's call chain, parallel to [`Self::stack`]:
    /// the file perf names for each frame (`/usr/lib/libc.so.6`,
    /// `[kernel.kallsyms]`, `[unknown]`).
    pub fn objects(&self, s: &Sample) -> impl Iterator<Item = &str> {
        self.frame_objects[s.range()]
            .iter()
            .map(|&i| self.objects[i as usize].as_str())
    }

    /// Interns an object name (a run maps a few dozen).
    pub(super) fn object(&mut self, dso: &str) -> u32 {
        match self.objects.iter().position(|o| o == dso) {
            Some(i) => i as u32,
            None => {
                self.objects.push(dso.to_string());
                (self.objects.len() - 1) as u32
            }
        }
    }

    pub(super) fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }

    /// Files a finished sample where its event belongs.
    fn finish(&mut self, open: Option<Open>) {
        match open {
            Some(Open::Cpu(s)) => self.samples.push(s),
            Some(Open::Switch(s)) => self.sched_switch_samples.push(s),
            None => {}
        }
    }
}

/// A sample whose frames are being read.
enum Open {
    Cpu(Sample),
    Switch(SchedSwitchSample),
}

impl Open {
    fn sample(&mut self) -> &mut Sample {
        match self {
            Open::Cpu(s) => s,
            Open::Switch(s) => &mut s.sample,
        }
    }
}

/// A perf command for the report: perf's top-level `--buildid-dir` is set
/// to the run's build-id cache when there is one, so that symbols come from
/// the objects the run kept, not from whatever is at their paths now.
pub fn perf_command(perf: &Path, buildid_dir: Option<&Path>) -> Command {
    let mut cmd = crate::perf::binary::command(perf);
    if let Some(home) = std::env::var_os("HOME") {
        // perf's default cache, ~/.debug, when the run kept none.
        cmd.env("HOME", home);
    }
    if let Some(dir) = buildid_dir {
        cmd.arg("--buildid-dir").arg(dir);
    }
    cmd
}

/// Runs `perf script` on an open snapshot file and parses its output.
/// perf reads the file through `/proc/self/fd/N`, the descriptor already
/// checked to be a regular file. Errors carry perf's last message.
///
/// `calls` are the snapshot's `--slower-than` calls: their return
/// addresses are first written back into a copy's stack copies
/// ([`pending_returns::repair`]), which perf then reads. Cut DWARF stacks
/// are then grafted, from the file's whole stacks and the run's `donors`
/// ([`Samples::graft_cut_stacks`]).
pub fn read(
    perf: &Path,
    buildid_dir: Option<&Path>,
    file: &File,
    calls: &[pending_returns::Call],
    donors: &StackDonors,
) -> Result<Samples, String> {
    let jit = JitView::of(file, buildid_dir);
    let repaired = pending_returns::repair(file, calls);
    let (file, restored) = match &repaired {
        Ok(Some((copy, n))) => (copy, *n),
        _ => (file, 0),
    };
    let injected = jit.as_ref().and_then(|j| j.inject(perf, file));
    let dumps = jit.as_ref().map_or(0, |j| j.dumps.len());
    let input = match &injected {
        Some(Ok(i)) => &i.data,
        _ => file,
    };
    let run_dir = match &injected {
        // perf inject named the functions' ELF files `./jitted-...`.
        Some(Ok(i)) => Some(i.dir()),
        _ => None,
    };
    let mut cmd = script_command(perf, buildid_dir, jit, run_dir, input.as_raw_fd());
    let mut samples = run_script(perf, &mut cmd)?;
    let cmdline = match &injected {
        Some(Ok(i)) => i.cmdline.as_deref(),
        _ => samples.cmdline.as_deref(),
    };
    // Without their places on the stack, cut stacks are completed by names
    // alone: a file that cannot be read again is not an error.
    let unwinds = cmdline
        .is_some_and(|c| dwarf_copies(c).1)
        .then(|| cfa::unwind(input, buildid_dir).ok())
        .flatten();
    match injected {
        Some(Ok(i)) => {
            samples.cmdline = i.cmdline;
            samples.jitdumps = dumps;
        }
        Some(Err(e)) => samples.jitdump_error = Some(e),
        None => {}
    }
    samples.returns_restored = restored;
    samples.returns_error = repaired.err();
    if let Some(u) = unwinds {
        samples.attach_cfas(u);
    }
    samples.graft_cut_stacks(donors);
    Ok(samples)
}

/// `perf script` of the snapshot open as `fd`, with the JIT code's view
/// (`jit`) where the snapshot kept maps or jitdump files, run in `run_dir`
/// where perf inject wrote the functions' ELF files.
fn script_command(
    perf: &Path,
    buildid_dir: Option<&Path>,
    jit: Option<JitView>,
    run_dir: Option<&Path>,
    fd: i32,
) -> Command {
    let buildid_dir = jit
        .as_ref()
        .map_or(buildid_dir, |j| j.buildid_dir.as_deref());
    let mut cmd = perf_command(perf, buildid_dir);
    if let Some(dir) = run_dir {
        cmd.current_dir(dir);
    }
    cmd.args([
        "script",
        "--header",
        "--ns",
        "--show-switch-events",
        "-F",
        FIELDS,
    ]);
    if jit.is_some() {
        // A JIT runtime's own binary is large and has little DWARF, and
        // perf 6.1 spends seconds per hundred frames asking addr2line for
        // inlined functions in it (docs/jit-maps.md, "Inlined frames").
        cmd.arg("--no-inline");
    }
    cmd.arg("-i")
        .arg(format!("/proc/self/fd/{fd}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let keep_fds = [Some(fd), jit.as_ref().and_then(|j| j.dir_fd())];
    // SAFETY: fcntl, and JitView::enter's mount calls, are async-signal-safe;
    // fcntl clears FD_CLOEXEC on the child's copy of the descriptor only.
    unsafe {
        cmd.pre_exec(move || {
            for fd in keep_fds.into_iter().flatten() {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(j) = &jit {
                // Without CAP_SYS_ADMIN perf reads the host's /tmp.
                j.enter();
            }
            Ok(())
        });
    }
    cmd
}

/// The samples of a perf.data file as the report reads them (the same
/// fields and frame names), without JIT code, repair or graft: the
/// stacks of `auto`'s measurement (report/stack_need.rs).
pub fn read_plain(perf: &Path, file: &Path) -> Result<Samples, String> {
    let mut cmd = perf_command(perf, None);
    cmd.args(["script", "--header", "--ns", "-F", FIELDS, "-i"])
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    run_script(perf, &mut cmd)
}

/// Which samples perf's command line gives DWARF stack copies: (the CPU
/// samples, with `--call-graph dwarf`; the `sched_switch` ones, then and
/// when their event has its own, `sched:sched_switch/call-graph=dwarf,...`,
/// the off-CPU breakdown of a frame-pointer run).
pub fn dwarf_copies(cmdline: &str) -> (bool, bool) {
    let cpu = ["--call-graph dwarf", "--call-graph=dwarf"]
        .iter()
        .any(|o| cmdline.contains(o));
    (
        cpu,
        cpu || cmdline.contains("sched_switch/call-graph=dwarf"),
    )
}

/// Runs the `perf script` command `cmd` (stdout and stderr piped) and
/// parses what it prints. Errors carry perf's last message.
fn run_script(perf: &Path, cmd: &mut Command) -> Result<Samples, String> {
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", perf.display()))?;
    let stderr = child.stderr.take().expect("piped");
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut s);
        s
    });
    let parsed = parse(BufReader::with_capacity(
        1 << 20,
        child.stdout.take().expect("piped"),
    ));
    let status = child.wait().map_err(|e| e.to_string())?;
    let errs = errs.join().unwrap_or_default();
    let samples = parsed.map_err(|e| format!("reading perf script's output: {e}"))?;
    if !status.success() {
        let last = crate::perf::binary::last_message(&errs);
        return Err(format!("perf script failed ({status}): {last}"));
    }
    Ok(samples)
}

/// What perf sees of a snapshot's kept JIT maps: a /tmp of its own, a
/// tmpfs in a private mount namespace that holds only them, at the names
/// perf looks for (`/tmp/perf-PID.map`, tools/perf/util/symbol.c
/// `dso__find_perf_map`). The build-id cache is then given as the
/// descriptor of its directory, which stays reachable were it under /tmp.
///
/// A snapshot with kept jitdump files is first given to `perf inject
/// --jit` ([`jitdump::inject`]), and `perf script` reads what it wrote.
struct JitView {
    files: Vec<(std::ffi::CString, Vec<u8>)>,
    dumps: Vec<jit_maps::KeptDump>,
    dir: Option<File>,
    buildid_dir: Option<std::path::PathBuf>,
}

impl JitView {
    /// `None` when the snapshot has no kept maps or jitdump files.
    fn of(file: &File, buildid_dir: Option<&Path>) -> Option<Self> {
        let (dir, name) = jit_maps::snapshot_of(file)?;
        let maps = jit_maps::maps_for(&dir, &name);
        let dumps = jit_maps::dumps_for(&dir, &name);
        if maps.is_empty() && dumps.is_empty() {
            return None;
        }
        let files = maps
            .into_iter()
            .filter_map(|m| {
                let path = std::ffi::CString::new(format!("/tmp/perf-{}.map", m.pid)).ok()?;
                Some((path, m.content))
            })
            .collect();
        let dir = buildid_dir.and_then(|d| File::open(d).ok());
        let buildid_dir = dir
            .as_ref()
            .map(|d| format!("/proc/self/fd/{}", d.as_raw_fd()).into());
        Some(Self {
            files,
            dumps,
            dir,
            buildid_dir,
        })
    }

    /// The snapshot injected with the kept jitdump files; `None` without.
    fn inject(&self, perf: &Path, file: &File) -> Option<Result<jitdump::Injected, String>> {
        (!self.dumps.is_empty()).then(|| jitdump::inject(perf, file, &self.dumps))
    }

    fn dir_fd(&self) -> Option<i32> {
        self.dir.as_ref().map(|d| d.as_raw_fd())
    }

    /// In perf's child, before exec.
    fn enter(&self) -> bool {
        crate::sys::mount_ns::tmpfs_with_files(c"/tmp", &self.files)
    }
}

/// Parses `perf script -F tid,time,event,trace,ip,sym,dso --ns
/// --show-switch-events` output: a header line per sample
/// (`  TID SECONDS.NANOS: EVENT: [TRACE]`), then one line per frame
/// (`\tADDR SYM (DSO)`), leaf first, then a blank line; and a line per
/// switch record (`TID SECONDS.NANOS: PERF_RECORD_SWITCH OUT preempt`).
/// A header without an event (`-F tid,time,...`) is a sampling event's.
pub fn parse(mut reader: impl BufRead) -> io::Result<Samples> {
    let mut out = Samples::default();
    let mut line = Vec::new();
    let mut current: Option<Open> = None;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        if let Some(h) = text.strip_prefix('#') {
            if let Some(c) = h.trim_start().strip_prefix("cmdline :") {
                out.cmdline = Some(c.trim().to_string());
            }
            continue;
        }
        if text.trim().is_empty() {
            out.finish(current.take());
            continue;
        }
        if text.starts_with('\t') {
            if let Some(s) = current.as_mut() {
                let line = text.trim_start();
                let (name, dso) = frame_name(line);
                let id = out.intern(&name);
                out.frames.push(id);
                let ip = line
                    .split(' ')
                    .next()
                    .and_then(|a| u64::from_str_radix(a, 16).ok());
                out.frame_ips.push(ip.unwrap_or(u64::MAX));
                out.frame_cfas.push(0);
                out.frame_functions.push(0);
                let object = out.object(dso);
                out.frame_objects.push(object);
                s.sample().len += 1;
            }
            continue;
        }
        out.finish(current.take());
        current = start_line(&mut out, text);
    }
    out.finish(current.take());
    Ok(out)
}

/// A line that starts a sample (returned, its frames follow) or is a
/// switch record (kept in `out`).
fn start_line(out: &mut Samples, text: &str) -> Option<Open> {
    let (tid, time_ns, rest) = header(text)?;
    if rest.starts_with("PERF_RECORD_") {
        // A side-band record, not a sample: only switches are kept.
        if let Some((out_, preempt)) = context_switch_record(rest) {
            out.context_switches.push(ContextSwitchLine {
                tid,
                time_ns,
                out: out_,
                preempt,
            });
        }
        return None;
    }
    let sample = Sample {
        tid,
        time_ns,
        start: out.frames.len() as u32,
        len: 0,
        reached_end: false,
        user_sp: 0,
    };
    let (event, trace) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    if event.strip_suffix(':') == Some(SCHED_SWITCH) {
        return Some(Open::Switch(SchedSwitchSample {
            sample,
            prev_state: prev_state(trace).unwrap_or("?").to_string(),
        }));
    }
    Some(Open::Cpu(sample))
}

/// `PERF_RECORD_SWITCH OUT preempt` → (out, preempt); `IN` → (false,
/// false). perf prints `PERF_RECORD_SWITCH_CPU_WIDE` for system-wide runs,
/// with the other task's ids after it.
fn context_switch_record(rest: &str) -> Option<(bool, bool)> {
    let mut it = rest.split_whitespace();
    let kind = it.next()?;
    if kind != "PERF_RECORD_SWITCH" && kind != "PERF_RECORD_SWITCH_CPU_WIDE" {
        return None;
    }
    match it.next()? {
        "IN" => Some((false, false)),
        "OUT" => Some((true, it.next() == Some("preempt"))),
        _ => None,
    }
}

/// `prev_comm=x prev_pid=1 prev_prio=120 prev_state=S ==> ...` → `S`.
fn prev_state(trace: &str) -> Option<&str> {
    trace
        .split_whitespace()
        .find_map(|w| w.strip_prefix("prev_state="))
}

/// `  4243 330734.672679123: REST` → (4243, 330734672679123, REST).
fn header(text: &str) -> Option<(u32, u64, &str)> {
    let text = text.trim_start();
    let (tid, rest) = text.split_once(char::is_whitespace)?;
    let tid = tid.parse().ok()?;
    let rest = rest.trim_start();
    let (time, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let time = time.strip_suffix(':')?;
    Some((tid, parse_ns(time)?, rest.trim()))
}

/// `SECONDS.NANOS` → ns.
fn parse_ns(t: &str) -> Option<u64> {
    let (s, frac) = t.split_once('.').unwrap_or((t, "0"));
    let mut ns: u64 = frac.parse().ok()?;
    for _ in frac.len()..9 {
        ns *= 10;
    }
    s.parse::<u64>()
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(ns)
}

/// `55d0c3a1b139 slow_part (/path/t)` → (`slow_part`, `/path/t`); an
/// unknown symbol is named by its object, as inferno's collapse-perf does:
/// `[libc.so.6]`. An object perf does not print is `[unknown]`.
fn frame_name(line: &str) -> (String, &str) {
    let rest = line.split_once(' ').map_or("", |(_, r)| r.trim());
    let (sym, dso) = match rest.rfind(" (") {
        Some(i) if rest.ends_with(')') => (&rest[..i], &rest[i + 2..rest.len() - 1]),
        _ => (rest, ""),
    };
    let dso = if dso.is_empty() { "[unknown]" } else { dso };
    // `;` separates frames in the folded format.
    let sym = sym.replace(';', ":");
    if sym.is_empty() || sym == "[unknown]" {
        let base = dso.rsplit('/').next().unwrap_or("");
        if base.is_empty() || base == "[unknown]" {
            return ("[unknown]".into(), dso);
        }
        return (format!("[{}]", base.trim_matches(['[', ']'])), dso);
    }
    (sym, dso)
}

/// perf script's output of a DWARF run made of `samples`, (tid, frames
/// leaf first with `;` between), each frame in `/srv` (`[unknown]` in no
/// object), read by [`parse`]: for the tests of the stacks' completion.
#[cfg(test)]
pub(super) fn dwarf_run(samples: &[(u32, &str)]) -> Samples {
    let mut text = String::from("# cmdline : perf record --call-graph dwarf,1024\n");
    for (k, (tid, frames)) in samples.iter().enumerate() {
        text.push_str(&format!(" {tid} 1.{k:09}: \n"));
        for f in frames.split(';') {
            let object = if f == "[unknown]" {
                "[unknown]"
            } else {
                "/srv"
            };
            text.push_str(&format!("\t1 {f} ({object})\n"));
        }
        text.push('\n');
    }
    parse(text.as_bytes()).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::run_file::DonorStack;

    const OUT: &str = "# ========\n# cmdline : /usr/bin/perf record -p 42 -e cpu-clock -F 999 -g\n# ========\n#\n  4243 330734.672679123: \n\t    55d0c3a1b139 slow_part (/t/target)\n\t    55d0c3a1b1f0 ns::f(int) const (/t/target)\n\t    7f00 [unknown] (/usr/lib/libc.so.6)\n\t    7f01 [unknown] ([unknown])\n\n     7 1.5: \n\t    ffffffff81000000 do_syscall_64 ([kernel.kallsyms])\n\n";

    #[test]
    fn perf_script_output_is_parsed() {
        let s = parse(OUT.as_bytes()).unwrap();
        assert_eq!(
            s.cmdline.as_deref(),
            Some("/usr/bin/perf record -p 42 -e cpu-clock -F 999 -g")
        );
        assert_eq!(s.samples.len(), 2);
        let a = s.samples[0];
        assert_eq!((a.tid, a.time_ns), (4243, 330_734_672_679_123));
        let names: Vec<&str> = s.stack(&a).iter().map(|&i| s.name(i)).collect();
        assert_eq!(
            names,
            ["slow_part", "ns::f(int) const", "[libc.so.6]", "[unknown]"]
        );
        let objects: Vec<&str> = s.objects(&a).collect();
        assert_eq!(
            objects,
            ["/t/target", "/t/target", "/usr/lib/libc.so.6", "[unknown]"]
        );
        let b = s.samples[1];
        assert_eq!((b.tid, b.time_ns), (7, 1_500_000_000));
        assert_eq!(s.name(s.stack(&b)[0]), "do_syscall_64");
    }

    /// Captured from perf 6.1: `perf record -e cpu-clock/freq=999/ -e
    /// sched:sched_switch --switch-events --call-graph dwarf,8192 -k
    /// CLOCK_MONOTONIC` of two threads ping-ponging through pipes, then
    /// `perf script --header --ns --show-switch-events -F` [`FIELDS`].
    const SCHED_SWITCH_RUN: &str = include_str!("testdata/sched_switch.script");

    #[test]
    fn sched_switch_samples_and_switch_records_stay_apart() {
        let s = parse(SCHED_SWITCH_RUN.as_bytes()).unwrap();
        assert!(s.cmdline.as_deref().unwrap().contains("--switch-events"));
        // Only the sampling event's samples feed the CPU flame graphs.
        assert_eq!(s.samples.len(), 6);
        let names = |x: &Sample| -> Vec<&str> { s.stack(x).iter().map(|&i| s.name(i)).collect() };
        assert!(s.samples.iter().all(|x| names(x)[0] == "compute_part"));
        assert_eq!(s.sched_switch_samples.len(), 5);
        let first = &s.sched_switch_samples[0];
        assert_eq!((first.sample.tid, first.prev_state.as_str()), (30139, "R"));
        let blocked = &s.sched_switch_samples[1];
        assert_eq!(blocked.sample.time_ns, 13_735_891_410_053);
        assert_eq!(blocked.prev_state, "S");
        let chain = names(&blocked.sample);
        // Kernel frames, then the DWARF-unwound user frames.
        assert_eq!(chain[..3], ["__schedule", "schedule", "anon_pipe_read"]);
        assert!(chain.ends_with(&[
            "wait_part",
            "main",
            "__libc_start_call_main",
            "__libc_start_main_impl",
            "_start"
        ]));
        assert_eq!(s.context_switches.len(), 10);
        assert_eq!(
            s.context_switches[..3],
            [
                ContextSwitchLine {
                    tid: 30139,
                    time_ns: 13_735_890_726_969,
                    out: true,
                    preempt: true
                },
                ContextSwitchLine {
                    tid: 30139,
                    time_ns: 13_735_890_800_448,
                    out: false,
                    preempt: false
                },
                ContextSwitchLine {
                    tid: 30139,
                    time_ns: 13_735_891_421_650,
                    out: true,
                    preempt: false
                },
            ]
        );
    }

    /// A DWARF run: thread 7's second sample and its switch-out were cut
    /// where the copy ended (a junk frame last); thread 8 has no complete
    /// stack.
    const CUT_RUN: &str = "# cmdline : /usr/bin/perf record --call-graph dwarf,1536 -p 7\n\
        \x20 7 1.000000001: \n\t1 work (/srv)\n\t2 serve (/srv)\n\t3 loop (/srv)\n\t4 main (/srv)\n\t5 _start (/srv)\n\n\
        \x20 7 1.000000002: \n\t6 other (/srv)\n\t2 serve (/srv)\n\t3 loop (/srv)\n\t9 [unknown] ([unknown])\n\n\
        \x20 7 1.000000003: sched:sched_switch: prev_comm=srv prev_pid=7 prev_prio=120 prev_state=S ==> next_comm=x\n\
        \tffff schedule ([kernel.kallsyms])\n\t7 read (/libc.so)\n\t2 serve (/srv)\n\t3 loop (/srv)\n\n\
        \x20 8 1.000000004: \n\t6 other (/srv)\n\t2 serve (/srv)\n\t3 loop (/srv)\n\n";

    #[test]
    fn cut_dwarf_stacks_are_completed_from_their_threads_complete_ones() {
        let names = |s: &Samples, x: &Sample| -> String {
            let n: Vec<&str> = s.stack(x).iter().map(|&i| s.name(i)).collect();
            n.join(";")
        };
        let mut s = parse(CUT_RUN.as_bytes()).unwrap();
        s.graft_cut_stacks(&StackDonors::default());
        assert_eq!(s.grafted, 2);
        assert_eq!(names(&s, &s.samples[1]), "other;serve;loop;main;_start");
        let objects: Vec<&str> = s.objects(&s.samples[1]).collect();
        assert_eq!(objects, ["/srv"; 5]);
        let blocked = &s.sched_switch_samples[0].sample;
        assert_eq!(names(&s, blocked), "schedule;read;serve;loop;main;_start");
        // Another thread's complete stack is not used.
        assert_eq!(names(&s, &s.samples[2]), "other;serve;loop");
        assert_eq!(names(&s, &s.samples[0]), "work;serve;loop;main;_start");

        // A frame-pointer run is left as it is.
        let fp = CUT_RUN.replace("--call-graph dwarf,1536", "--call-graph fp");
        let mut s = parse(fp.as_bytes()).unwrap();
        s.graft_cut_stacks(&StackDonors::default());
        assert_eq!(
            (s.grafted, names(&s, &s.samples[1]).as_str()),
            (0, "other;serve;loop;[unknown]")
        );
        // With the off-CPU breakdown's DWARF copies, only its samples are.
        let breakdown = CUT_RUN.replace(
            "--call-graph dwarf,1536",
            "--call-graph fp -e sched:sched_switch/call-graph=dwarf,stack-size=1024/",
        );
        let mut s = parse(breakdown.as_bytes()).unwrap();
        s.graft_cut_stacks(&StackDonors::default());
        assert_eq!(s.grafted, 1);
        assert_eq!(names(&s, &s.samples[1]), "other;serve;loop;[unknown]");
        let blocked = &s.sched_switch_samples[0].sample;
        assert_eq!(names(&s, blocked), "schedule;read;serve;loop;main;_start");
    }

    #[test]
    fn cut_stacks_are_completed_from_the_runs_donors_after_the_files_own() {
        let names = |s: &Samples, x: &Sample| -> String {
            let n: Vec<&str> = s.stack(x).iter().map(|&i| s.name(i)).collect();
            n.join(";")
        };
        // The measurement's whole stacks, as the report reads them: thread
        // 7's is kept, each distinct stack once.
        let whole = parse(CUT_RUN.as_bytes()).unwrap();
        let mut donors = whole.whole_stacks(1 << 20);
        assert_eq!(donors.stacks.len(), 1);
        assert_eq!(donors.stacks[0].tid, 7);
        // Thread 8 has none of its own: a donor of its own thread
        // completes it, with the donor's objects.
        let srv = donors.objects.iter().position(|o| o == "/srv").unwrap() as u32;
        let lib = donors.objects.len() as u32;
        donors.objects.push("/lib/start.so".into());
        // A stack naming an object the donors lack is left out.
        donors.stacks.push(DonorStack {
            tid: 8,
            frames: vec![("serve".into(), srv), ("loop".into(), lib + 1)],
            cfas: Vec::new(),
            ips: Vec::new(),
            functions: Vec::new(),
            reached_end: false,
        });
        donors.stacks.push(DonorStack {
            tid: 8,
            frames: vec![
                ("serve".into(), srv),
                ("loop".into(), srv),
                ("main".into(), srv),
                ("__libc_start_main".into(), lib),
            ],
            cfas: Vec::new(),
            ips: Vec::new(),
            functions: Vec::new(),
            reached_end: false,
        });
        let mut s = parse(CUT_RUN.as_bytes()).unwrap();
        s.graft_cut_stacks(&donors);
        assert_eq!(s.grafted, 3);
        let eight = &s.samples[2];
        assert_eq!(names(&s, eight), "other;serve;loop;main;__libc_start_main");
        let objects: Vec<&str> = s.objects(eight).collect();
        assert_eq!(objects, ["/srv", "/srv", "/srv", "/srv", "/lib/start.so"]);
        // Thread 7's own complete stack comes first.
        assert_eq!(names(&s, &s.samples[1]), "other;serve;loop;main;_start");
        // A byte budget keeps fewer.
        assert!(whole.whole_stacks(10).is_empty());
    }

    #[test]
    fn odd_switch_lines() {
        let text = "  9 2.000000001: sched:sched_switch: prev_comm=a b prev_pid=9 prev_prio=120 prev_state=D ==> next_comm=c\n\tffff io_schedule ([kernel.kallsyms])\n\n\
                    9 2.5: PERF_RECORD_SWITCH_CPU_WIDE OUT preempt  next pid/tid:    1/1\n\
                    9 3: PERF_RECORD_SWITCH SIDEWAYS\n\
                    9 4.0: sched:sched_switch: no state here\n\n";
        let s = parse(text.as_bytes()).unwrap();
        assert_eq!(s.sched_switch_samples.len(), 2);
        assert_eq!(s.sched_switch_samples[0].prev_state, "D");
        assert_eq!(s.sched_switch_samples[1].prev_state, "?");
        assert!(s.samples.is_empty());
        assert_eq!(
            s.context_switches,
            [ContextSwitchLine {
                tid: 9,
                time_ns: 2_500_000_000,
                out: true,
                preempt: true
            }]
        );
    }
}
