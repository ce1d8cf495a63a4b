//! `mt-agent check`: a preflight for fleet operators. Each line says PASS,
//! FAIL (and how to fix it) or INFO (something missing that mt-agent does
//! without). Exit code 0 only when mt-agent can run here, else 3.
//!
//! The checks do the real thing where they can: the eBPF object is loaded
//! (BPF syscall, ring buffer, verifier), a uprobe is attached to a function
//! of this very process and hit (uprobe PMU, privileges), and perf is started
//! and pinged on its control fd.

use std::os::unix::fs::DirBuilderExt;
use std::{
    fs,
    hint::black_box,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use agent_common::{CFG_ENABLED, TriggerConfig};

use crate::{
    capture::target,
    error::{ExitCode, Failure},
    flags::defs::CheckArgs,
    perf,
    perf::record::PerfSpec,
    probe::{LoadOptions, Probes, detach, uprobes::TriggerUprobes},
    symbols::maps,
    sys::caps,
};

/// What a line found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    Pass,
    /// Absent, and mt-agent does without it.
    Info,
    Fail,
}

/// One line of the report.
#[derive(Debug)]
struct Line {
    mark: Mark,
    what: &'static str,
    detail: String,
    fix: Option<String>,
}

#[derive(Default)]
struct Checklist {
    lines: Vec<Line>,
}

impl Checklist {
    fn pass(&mut self, what: &'static str, detail: impl Into<String>) {
        self.lines.push(Line {
            mark: Mark::Pass,
            what,
            detail: detail.into(),
            fix: None,
        });
    }

    fn info(&mut self, what: &'static str, detail: impl Into<String>) {
        self.lines.push(Line {
            mark: Mark::Info,
            what,
            detail: detail.into(),
            fix: None,
        });
    }

    fn fail(&mut self, what: &'static str, detail: impl Into<String>, fix: impl Into<String>) {
        self.lines.push(Line {
            mark: Mark::Fail,
            what,
            detail: detail.into(),
            fix: Some(fix.into()),
        });
    }
}

/// The function the self-test probes and calls.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn mt_agent_selftest(x: u64) -> u64 {
    black_box(x).wrapping_add(1)
}

/// Runs every check and prints the report.
pub fn run(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let mut r = Checklist::default();
    kernel(&mut r);
    btf(&mut r);
    privileges(&mut r, args.pid);
    bpf_and_uprobes(&mut r);
    perf_checks(&mut r, args.perf.as_deref());
    pmu(
        &mut r,
        perf::binary::has_hardware_pmu(),
        Path::new(INTEL_PT).exists(),
    );
    paranoid(
        &mut r,
        fs::read_to_string(PARANOID).map_err(|e| e.to_string()),
        caps::perfmon_capable(),
    );
    lockdown(&mut r);
    free_space(&mut r, args.output.as_deref().unwrap_or(Path::new(".")));
    if let Some(pid) = args.pid {
        target_check(&mut r, pid);
    }
    if let Some(url) = &args.upload {
        upload_check(&mut r, url);
    }
    let mut ok = true;
    for l in &r.lines {
        let mark = match l.mark {
            Mark::Pass => "PASS",
            Mark::Info => "INFO",
            Mark::Fail => "FAIL",
        };
        println!("{mark}  {:<20} {}", l.what, l.detail);
        if let Some(fix) = &l.fix {
            println!("      {:<20} fix: {fix}", "");
            ok = false;
        }
    }
    if ok {
        println!("mt-agent can run here.");
        Ok(ExitCode::Ok)
    } else {
        println!("mt-agent cannot run here until the FAIL lines are fixed.");
        Ok(ExitCode::Environment)
    }
}

/// The oldest kernel mt-agent runs on: 5.15 has the BPF ring buffer (5.8)
/// and attach cookies for uprobes (5.15).
pub const MIN_KERNEL: (u32, u32) = (5, 15);

/// The running kernel's release string and its (major, minor), from
/// `/proc/sys/kernel/osrelease`; (0, 0) if it cannot be read.
pub fn kernel_version() -> (String, (u32, u32)) {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let release = release.trim().to_string();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (release, version)
}

/// The highest sampling frequency the kernel allows, Hz:
/// `kernel.perf_event_max_sample_rate` (/proc/sys/kernel/, see
/// kernel/events/core.c); None if it cannot be read.
pub fn max_sample_rate() -> Option<u32> {
    fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Refuses a `--freq` above the kernel's limit (exit code 2): perf would
/// lower it to the limit, and the banner and `armed` event would show a rate
/// that is not the one in use.
pub fn sample_rate(freq: u32, limit: Option<u32>) -> Result<(), Failure> {
    if freq == 0 {
        return Err(Failure::usage(
            "--freq 0: give a sampling frequency of at least 1 Hz",
        ));
    }
    match limit {
        Some(max) if freq > max => Err(Failure::usage(format!(
            "--freq {freq} is above the kernel's limit of {max} Hz \
             (kernel.perf_event_max_sample_rate); give --freq {max} or less"
        ))),
        _ => Ok(()),
    }
}

fn kernel(r: &mut Checklist) {
    let (release, version) = kernel_version();
    if version >= MIN_KERNEL {
        r.pass(
            "kernel",
            format!("{release} (needs 5.15+: BPF ring buffer, uprobe attach cookies)"),
        );
    } else {
        r.fail(
            "kernel",
            release,
            "mt-agent needs Linux 5.15 or later (attach cookies)",
        );
    }
}

fn btf(r: &mut Checklist) {
    if Path::new("/sys/kernel/btf/vmlinux").exists() {
        r.pass("BTF", "/sys/kernel/btf/vmlinux present");
    } else {
        r.fail(
            "BTF",
            "/sys/kernel/btf/vmlinux missing",
            "use a kernel built with CONFIG_DEBUG_INFO_BTF=y",
        );
    }
}

fn privileges(r: &mut Checklist, pid: Option<i32>) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let other_user = pid.and_then(caps::owner).is_none_or(|uid| uid != euid);
    let missing = caps::missing(&caps::has, other_user);
    let held: Vec<&str> = caps::REQUIREMENTS
        .iter()
        .filter(|req| req.caps.iter().any(|c| caps::has(*c)))
        .map(|req| req.name)
        .collect();
    if missing.is_empty() {
        r.pass(
            "privileges",
            if euid == 0 {
                "root".to_string()
            } else {
                format!("uid {euid} with {}", held.join(", "))
            },
        );
    } else {
        let names: Vec<&str> = missing.iter().map(|m| m.name).collect();
        let why: Vec<String> = missing
            .iter()
            .map(|m| format!("{}: {}", m.name, m.why))
            .collect();
        r.fail(
            "privileges",
            format!("missing {} ({})", names.join(", "), why.join("; ")),
            format!(
                "run as root, or grant {} (systemd: AmbientCapabilities=; setpriv --ambient-caps). \
                 The uprobe PMU needs CAP_SYS_ADMIN since the fix for CVE-2025-38466",
                caps::LEAST_SET
            ),
        );
    }
}

/// Loads the programs, then attaches a uprobe to [`mt_agent_selftest`] in
/// this process, calls it three times and reads the kernel's hit counter.
fn bpf_and_uprobes(r: &mut Checklist) {
    let pmu = Path::new("/sys/bus/event_source/devices/uprobe/type");
    if !pmu.exists() {
        r.fail(
            "uprobe PMU",
            "/sys/bus/event_source/devices/uprobe missing",
            "use a kernel with CONFIG_UPROBE_EVENTS=y",
        );
        return;
    }
    let Some(probes) = load_programs(r) else {
        return;
    };
    fire_selftest_uprobe(r, probes);
}

/// Loads the programs and maps, and says whether that worked.
fn load_programs(r: &mut Checklist) -> Option<Probes> {
    match Probes::load(LoadOptions {
        ring_bytes: 4096,
        verbose: false,
        returns: false,
        uretprobe: false,
        single_trigger: Some(0),
        follow_forks: false,
    }) {
        Ok(p) => {
            r.pass(
                "BPF",
                "programs and maps (ring buffer, per-CPU array, LRU hash) load and verify",
            );
            Some(p)
        }
        Err(f) => {
            r.fail("BPF", f.message, "run as root or grant the capabilities above; check kernel.unprivileged_bpf_disabled is not the cause");
            None
        }
    }
}

/// Attaches a uprobe to [`mt_agent_selftest`] in this process, calls it
/// three times and reads the kernel's hit counter.
fn fire_selftest_uprobe(r: &mut Checklist, mut probes: Probes) {
    let me = std::process::id() as i32;
    let addr = mt_agent_selftest as *const () as u64;
    let offset = maps::read_objects(me).ok().and_then(|objs| {
        objs.iter()
            .flat_map(|o| o.mappings.iter())
            .find(|m| addr >= m.start && addr < m.end)
            .map(|m| addr - m.start + m.offset)
    });
    let Some(offset) = offset else {
        r.fail(
            "uprobe PMU",
            "cannot find this binary's own code in /proc/self/maps",
            "report a bug",
        );
        return;
    };
    let cfg = TriggerConfig {
        flags: CFG_ENABLED,
        ..TriggerConfig::default()
    };
    if let Err(e) = probes.configure(0, &cfg) {
        r.fail("uprobe PMU", format!("{e:#}"), "report a bug");
        return;
    }
    let uprobes = TriggerUprobes::new(
        0,
        PathBuf::from("/proc/self/exe"),
        Some(me),
        false,
        offset,
        Vec::new(),
    );
    if let Err(f) = probes.attach(&uprobes) {
        r.fail(
            "uprobe PMU",
            f.message,
            format!("run as root or grant {}", caps::LEAST_SET),
        );
        return;
    }
    for i in 0..3 {
        black_box(mt_agent_selftest(black_box(i)));
    }
    // The last close in a child, waited for 5 s at most: a held-up grace
    // period must not hang `check` (docs/disarming.md).
    let _ = detach::drop_and_wait(probes.take_trigger_links(0));
    let seen = probes.take_counters().map(|c| c.read(0).seen).unwrap_or(0);
    if seen == 3 {
        r.pass(
            "uprobe PMU",
            "a uprobe on this process fired 3 times out of 3 calls",
        );
    } else {
        r.fail(
            "uprobe PMU",
            format!("a uprobe on this process fired {seen} times out of 3 calls"),
            "check the kernel's uprobe support",
        );
    }
}

fn perf_checks(r: &mut Checklist, explicit: Option<&Path>) {
    let found = perf::binary::find_perf(explicit)
        .and_then(|p| perf::binary::perf_version(&p).map(|v| (p, v)));
    let (path, version) = match found {
        Ok(pv) => pv,
        Err(f) => {
            r.fail(
                "perf",
                f.message,
                "install perf (Debian: apt install linux-perf) or pass --perf PATH",
            );
            return;
        }
    };
    let missing = missing_record_options(&path);
    if !missing.is_empty() {
        r.fail(
            "perf",
            format!(
                "{} ({version}) lacks {}",
                path.display(),
                missing.join(", ")
            ),
            "install perf 5.12 or later",
        );
        return;
    }
    // The real handshake: record this process, ping, stop.
    let tmp = std::env::temp_dir().join(format!("mt-agent-check-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    if let Err(e) = fs::DirBuilder::new().mode(0o700).create(&tmp) {
        r.fail(
            "perf",
            format!("cannot create {}: {e}", tmp.display()),
            "make the temporary directory writable",
        );
        return;
    }
    let spec = PerfSpec {
        perf: path.clone(),
        pid: std::process::id() as i32,
        output: tmp.join("perf.data"),
        event: perf::binary::default_event().to_string(),
        freq: 99,
        keep: None,
        bpf_events: false,
        recording: perf::record::Recording::Continuous,
        call_graph: Vec::new(),
        off_cpu: None,
        extra: Vec::new(),
    };
    let result = ping_perf(&spec);
    let _ = fs::remove_dir_all(&tmp);
    match result {
        Ok((ms, kallsyms)) => r.pass(
            "perf",
            format!(
                "{} ({version}): --switch-output, --control and ping work (ready in {ms} ms, {kallsyms})",
                path.display()
            ),
        ),
        Err(e) => r.fail(
            "perf",
            format!("{} ({version}): {e}", path.display()),
            "check that perf record works as this user",
        ),
    }
}

/// The `perf record` options mt-agent needs that `path`'s help lacks.
fn missing_record_options(path: &Path) -> Vec<&'static str> {
    let help = perf::binary::command(path)
        .args(["record", "-h"])
        .output()
        .map(|o| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .unwrap_or_default();
    ["--switch-output", "--control"]
        .into_iter()
        .filter(|o| !help.contains(o))
        .collect()
}

/// perf's time to answer a ping (ms), and what it reads as /proc/kallsyms.
fn ping_perf(spec: &PerfSpec) -> Result<(u128, String), String> {
    caps::raise_ambient();
    let copy = perf::kallsyms::KallsymsCopy::start()
        .and_then(|t| t.join().ok())
        .and_then(Result::ok);
    let started = Instant::now();
    let mut p = crate::perf::record::PerfProcess::spawn(spec, copy.as_ref())
        .map_err(|e| format!("{e:#}"))?;
    let kallsyms = match (&copy, p.kallsyms_copied()) {
        (Some(c), true) => format!("reading a {}-line copy of /proc/kallsyms", c.lines),
        (Some(_), false) => "reading /proc/kallsyms: the copy could not be bound".to_string(),
        (None, _) => format!(
            "reading /proc/kallsyms (no copy: {}=proc, or a chroot)",
            perf::kallsyms::ENV
        ),
    };
    let _ = p.ping();
    let deadline = started + Duration::from_secs(15);
    loop {
        if p.read_acks().unwrap_or(0) > 0 {
            break;
        }
        if let Ok(Some(status)) = p.try_wait() {
            let _ = p.read_stderr();
            return Err(format!(
                "perf exited before answering ping ({}): {}",
                perf::record::describe_status(status),
                p.last_lines().join(" | ")
            ));
        }
        if Instant::now() > deadline {
            return Err("perf did not answer `ping` on its control fd within 15 s".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let ms = started.elapsed().as_millis();
    let _ = p.stop();
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end && matches!(p.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok((ms, kallsyms))
}

/// Where the kernel lists the Intel PT PMU when the CPU has one.
const INTEL_PT: &str = "/sys/bus/event_source/devices/intel_pt";

/// The hardware PMU (`perf::binary::has_hardware_pmu`) and Intel PT lines:
/// PASS when present, INFO when absent (mt-agent does without either).
fn pmu(r: &mut Checklist, hardware: bool, intel_pt: bool) {
    if hardware {
        r.pass("hardware PMU", "present: the default event is cycles");
    } else {
        r.info(
            "hardware PMU",
            "none (a VM?): the default event is cpu-clock; hardware events such as cycles are not available",
        );
    }
    if intel_pt {
        r.pass("Intel PT", "available (not needed by mt-agent)");
    } else {
        r.info("Intel PT", "not available (not needed by mt-agent)");
    }
}

/// The kernel's perf_event_paranoid setting.
const PARANOID: &str = "/proc/sys/kernel/perf_event_paranoid";

/// The perf_event_paranoid line, from the file's text and whether this
/// process holds CAP_PERFMON or CAP_SYS_ADMIN, which override the setting.
/// Without them, 2 and above keep perf from sampling kernel code, and 3 and
/// above (a Debian patch) from any perf_event_open (the kernel's
/// Documentation/admin-guide/perf-security.rst and sysctl/kernel.rst).
fn paranoid(r: &mut Checklist, text: Result<String, String>, privileged: bool) {
    const WHAT: &str = "perf_event_paranoid";
    let v = match text {
        Ok(t) => match t.trim().parse::<i32>() {
            Ok(v) => v,
            Err(_) => {
                return r.fail(
                    WHAT,
                    format!("{PARANOID} holds {:?}, not a number", t.trim()),
                    "check the kernel's procfs",
                );
            }
        },
        Err(e) => {
            return r.fail(
                WHAT,
                format!("cannot read {PARANOID}: {e}"),
                "use a kernel built with CONFIG_PERF_EVENTS=y",
            );
        }
    };
    if privileged {
        r.pass(
            WHAT,
            format!("{v} (does not matter: CAP_PERFMON or CAP_SYS_ADMIN overrides it)"),
        );
    } else if v <= 1 {
        r.pass(WHAT, format!("{v}: perf may sample user and kernel code"));
    } else {
        r.fail(
            WHAT,
            format!(
                "{v}, and neither CAP_PERFMON nor CAP_SYS_ADMIN: perf may not sample kernel code"
            ),
            format!(
                "grant {} (which mt-agent needs anyway), or sysctl kernel.perf_event_paranoid=1",
                caps::LEAST_SET
            ),
        );
    }
}

fn lockdown(r: &mut Checklist) {
    let text = fs::read_to_string("/sys/kernel/security/lockdown").unwrap_or_default();
    let mode = text
        .split_whitespace()
        .find(|w| w.starts_with('['))
        .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
        .unwrap_or_else(|| "none".into());
    if mode == "confidentiality" {
        r.fail(
            "lockdown",
            "confidentiality: BPF and perf may not read memory",
            "boot with lockdown=integrity or none (lockdown= on the kernel command line)",
        );
    } else {
        r.pass("lockdown", mode);
    }
}

fn free_space(r: &mut Checklist, dir: &Path) {
    const NEED: u64 = 64 << 20;
    match nix::sys::statvfs::statvfs(dir) {
        Ok(s) => {
            let free = s.blocks_available() * s.fragment_size();
            let mib = free >> 20;
            if free >= NEED {
                r.pass("free space", format!("{mib} MiB free in {}", dir.display()));
            } else {
                r.fail(
                    "free space",
                    format!("{mib} MiB free in {}", dir.display()),
                    "free space or choose another --output; snapshots take ~50 KiB to MiBs each",
                );
            }
        }
        Err(e) => r.fail(
            "free space",
            format!("{}: {e}", dir.display()),
            "give an existing directory with --output",
        ),
    }
}

/// `--upload URL`: the store can be written (docs/upload.md).
fn upload_check(r: &mut Checklist, url: &str) {
    use crate::upload::store::{self, Refusal};
    let store = match store::open(url) {
        Ok(s) => s,
        Err(f) => return r.fail("upload", url.to_string(), f.message),
    };
    let host = crate::sys::proc::host_name();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let answer = match rt {
        Ok(rt) => rt.block_on(store::preflight(&store, &host)),
        Err(e) => return r.fail("upload", format!("no runtime: {e}"), "report this as a bug"),
    };
    match answer {
        Ok(text) => r.pass("upload", text),
        Err(e) => {
            let kind = Refusal::of(&e);
            r.fail(
                "upload",
                format!("{url}: {}", store::short(&e)),
                kind.advice(),
            )
        }
    }
}

fn target_check(r: &mut Checklist, pid: i32) {
    match target::check(pid) {
        Ok(t) => match maps::read_objects(pid) {
            Ok(objs) => r.pass(
                "target",
                format!(
                    "pid {pid} ({}) maps {} objects; main executable {}",
                    t.comm,
                    objs.len(),
                    t.exe.display()
                ),
            ),
            Err(e) => r.fail(
                "target",
                format!("cannot read /proc/{pid}/maps: {e}"),
                format!("grant {}", caps::LEAST_SET),
            ),
        },
        Err(f) => r.fail(
            "target",
            f.message,
            "give the pid of a running user process",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(f: impl FnOnce(&mut Checklist)) -> Vec<(Mark, &'static str, String)> {
        let mut r = Checklist::default();
        f(&mut r);
        r.lines
            .into_iter()
            .map(|l| (l.mark, l.what, l.detail))
            .collect()
    }

    #[test]
    fn pmu_lines_say_what_is_there() {
        let marks =
            |hw, pt| -> Vec<Mark> { lines(|r| pmu(r, hw, pt)).into_iter().map(|l| l.0).collect() };
        assert_eq!(marks(true, true), vec![Mark::Pass, Mark::Pass]);
        assert_eq!(marks(false, false), vec![Mark::Info, Mark::Info]);
        assert_eq!(marks(true, false), vec![Mark::Pass, Mark::Info]);
        let none = lines(|r| pmu(r, false, false));
        assert!(none[0].2.contains("cpu-clock"), "{none:?}");
        assert!(none[1].2.contains("not available"), "{none:?}");
    }

    #[test]
    fn paranoid_fails_only_when_it_limits_perf() {
        let one = |text: Result<&str, &str>, privileged| {
            let text = text.map(str::to_string).map_err(str::to_string);
            lines(|r| paranoid(r, text, privileged)).remove(0)
        };
        assert_eq!(one(Ok("2\n"), true).0, Mark::Pass);
        assert!(one(Ok("2\n"), true).2.starts_with("2 "));
        assert_eq!(one(Ok("4\n"), true).0, Mark::Pass);
        assert_eq!(one(Ok("-1\n"), false).0, Mark::Pass);
        assert_eq!(one(Ok("1\n"), false).0, Mark::Pass);
        let f = one(Ok("2\n"), false);
        assert_eq!(f.0, Mark::Fail);
        assert!(f.2.starts_with("2, and neither"), "{f:?}");
        assert_eq!(one(Ok("3\n"), false).0, Mark::Fail);
        assert_eq!(one(Ok("x"), true).0, Mark::Fail);
        let missing = one(Err("No such file or directory"), true);
        assert_eq!(missing.0, Mark::Fail);
        assert!(missing.2.contains("No such file"), "{missing:?}");
    }

    #[test]
    fn a_frequency_above_the_kernel_limit_is_refused_with_the_limit() {
        assert!(sample_rate(999, Some(100_000)).is_ok());
        assert!(sample_rate(100_000, Some(100_000)).is_ok());
        assert!(sample_rate(999_999_999, None).is_ok());
        let e = sample_rate(999_999_999, Some(100_000)).unwrap_err();
        assert_eq!(e.code, ExitCode::Usage);
        assert!(e.message.contains("100000 Hz"), "{}", e.message);
        assert_eq!(
            sample_rate(0, Some(100_000)).unwrap_err().code,
            ExitCode::Usage
        );
    }
}
