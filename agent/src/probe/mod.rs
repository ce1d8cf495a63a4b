//! Loading the eBPF programs and attaching them as uprobes (aya).
//!
//! The object is built by `build.rs` and embedded in the binary. Programs:
//! `mt_entry` (uprobe at the trigger), `mt_return` (plain uprobes on `ret`
//! instructions, for `--slower-than`), `mt_uretprobe` (`--use-uretprobe`).
//! Each link carries the trigger index as its attach cookie.
//!
//! Everything is released when [`Probes`] is dropped: links are closed and
//! programs unloaded. If the agent dies, the kernel does the same when it
//! closes our fds.

pub mod btf;
pub mod counters;
pub mod detach;
pub mod uprobes;

use std::{io, num::NonZeroU32};

use crate::{error::Failure, probe::counters::Counters};
use agent_common::TriggerConfig;
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        RawTracePoint, UProbe,
        raw_trace_point::RawTracePointLinkId,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeLinkId, UProbeScope},
    },
};
use uprobes::{Program, TriggerUprobes};

static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/mt-agent-ebpf"));

/// Load-time settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Load `mt_return` (`--slower-than` with `ret` probes).
    pub returns: bool,
    /// Load `mt_uretprobe` (`--use-uretprobe`).
    pub uretprobe: bool,
    /// Size of the HITS ring buffer, bytes (power of two, at least a page).
    pub ring_bytes: u32,
    /// Enable the programs' aya-log records.
    pub verbose: bool,
    /// The only trigger of the run, if there is one (skips reading the
    /// attach cookie on every hit).
    pub single_trigger: Option<u32>,
    /// A trigger follows forks: find `task_struct.tgid` in the kernel's BTF
    /// for `mt_fork`.
    pub follow_forks: bool,
}

/// The running kernel's BTF.
const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// The loaded programs and their links.
pub struct Probes {
    ebpf: Ebpf,
    /// (program, trigger, link).
    links: Vec<(&'static str, u32, UProbeLinkId)>,
    exec_link: Option<RawTracePointLinkId>,
    /// `mt_fork` and `mt_exit`, when a trigger follows forks.
    fork_links: Vec<(&'static str, RawTracePointLinkId)>,
}

/// An `EbpfLoader` made without parsing the kernel's BTF.
///
/// aya 0.14's `EbpfLoader::new()` parses all of `/sys/kernel/btf/vmlinux`
/// at once (`btf: Btf::from_sys_fs().ok()` in its `bpf` module), for CO-RE
/// relocations, before `.btf(None)` can say none are wanted: 18.7 MiB of
/// peak RSS for a 5.5 MB file on this kernel (docs/memory.md). The agent's
/// programs have no CO-RE relocations (`mt_fork` takes `task_struct.tgid`'s
/// offset from [`btf::task_tgid_offset`]), so the loader is made on a
/// thread of its own that sees `/dev/null` at that path, in a mount
/// namespace of its own (gone with the thread): aya's parse fails, and the
/// loader has no BTF. Where that namespace cannot be made, the loader is
/// made as usual and its BTF dropped.
fn loader_without_kernel_btf() -> EbpfLoader<'static> {
    let hidden = std::thread::scope(|s| {
        s.spawn(|| {
            crate::sys::mount_ns::bind_in_private_namespace(
                c"/dev/null",
                c"/sys/kernel/btf/vmlinux",
            )
            .then(EbpfLoader::new)
        })
        .join()
        .ok()
        .flatten()
    });
    hidden.unwrap_or_else(|| {
        log::debug!("the kernel's BTF could not be hidden from aya's loader: it parses it");
        EbpfLoader::new()
    })
}

impl Probes {
    /// Creates the maps and loads the programs the run needs into the kernel
    /// (the verifier runs here: ~40 ms per program on our machines). Errors:
    /// exit code 3 without the privileges.
    pub fn load(opts: LoadOptions) -> Result<Self, Failure> {
        // aya-log level: 0 turns every log statement off in the kernel.
        let level: u8 = if opts.verbose { 0xff } else { 0 };
        let tgid_offset = if opts.follow_forks {
            btf::task_tgid_offset(std::path::Path::new(VMLINUX_BTF)).map_err(|e| {
                Failure::environment(format!(
                    "following the forks of a --pid target needs the kernel's BTF: {e}; \
                     pass --no-follow-forks to do without"
                ))
            })?
        } else {
            0
        };
        let mut ebpf = loader_without_kernel_btf()
            .btf(None)
            .override_global("MT_TASK_TGID_OFFSET", &tgid_offset, true)
            .map_max_entries("HITS", opts.ring_bytes)
            .override_global("AYA_LOG_LEVEL", &level, true)
            .override_global(
                "MT_SINGLE_TRIGGER",
                &opts.single_trigger.unwrap_or(u32::MAX),
                true,
            )
            .load(EBPF_OBJECT)
            .map_err(|e| classify(&e, "loading the eBPF programs"))?;
        let wanted = [
            ("mt_entry", true),
            ("mt_return", opts.returns),
            ("mt_uretprobe", opts.uretprobe),
        ];
        for name in wanted.iter().filter(|(_, w)| *w).map(|(n, _)| *n) {
            let prog: &mut UProbe = ebpf
                .program_mut(name)
                .ok_or_else(|| Failure::runtime(format!("program {name} missing from the object")))?
                .try_into()
                .map_err(|e| Failure::runtime(format!("program {name}: {e}")))?;
            // EACCES from BPF_PROG_LOAD is the verifier refusing the
            // program; only EPERM means missing privileges.
            prog.load().map_err(|e| {
                classify_with(&e, &format!("loading program {name}"), &[libc::EPERM])
            })?;
        }
        Ok(Self {
            ebpf,
            links: Vec::new(),
            exec_link: None,
            fork_links: Vec::new(),
        })
    }

    /// Writes a trigger's settings into CONFIG. Must happen before attach.
    pub fn configure(&mut self, trigger: u32, cfg: &TriggerConfig) -> anyhow::Result<()> {
        self.set("CONFIG", trigger, *cfg)
    }

    /// Turns a trigger off in the programs (`CFG_ENABLED` cleared): its
    /// calls are no longer counted nor accepted. Done before its uprobes
    /// go, which can take the kernel a while ([`crate::probe::detach`]).
    pub fn disable(&mut self, trigger: u32) -> anyhow::Result<()> {
        let mut cfg: TriggerConfig = self.get("CONFIG", trigger)?;
        cfg.flags &= !agent_common::CFG_ENABLED;
        self.set("CONFIG", trigger, cfg)
    }

    /// Reads entry `index` of the array map `name`.
    fn get<T: aya::Pod>(&self, name: &str, index: u32) -> anyhow::Result<T> {
        let map = self
            .ebpf
            .map(name)
            .ok_or_else(|| anyhow::anyhow!("{name} map missing"))?;
        Ok(Array::<_, T>::try_from(map)?.get(&index, 0)?)
    }

    /// Writes entry `index` of the array map `name`.
    fn set<T: aya::Pod>(&mut self, name: &str, index: u32, value: T) -> anyhow::Result<()> {
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or_else(|| anyhow::anyhow!("{name} map missing"))?;
        Array::<_, T>::try_from(map)?.set(index, value, 0)?;
        Ok(())
    }

    /// Attaches a trigger's uprobes, the entry first.
    /// Errors: exit code 3 without privileges, 4 for other kernel refusals.
    pub fn attach(&mut self, uprobes: &TriggerUprobes) -> Result<(), Failure> {
        let scope = match uprobes.pid {
            Some(_) if uprobes.follow_forks => UProbeScope::AllProcesses,
            Some(pid) => UProbeScope::OneProcess(
                NonZeroU32::new(pid as u32).ok_or_else(|| Failure::usage("pid 0"))?,
            ),
            None => UProbeScope::AllProcesses,
        };
        for u in &uprobes.uprobes {
            self.attach_one(u.program, uprobes, u.offset, scope)?;
        }
        Ok(())
    }

    fn attach_one(
        &mut self,
        program: Program,
        uprobes: &TriggerUprobes,
        offset: u64,
        scope: UProbeScope,
    ) -> Result<(), Failure> {
        let name = program.name();
        let prog: &mut UProbe = self
            .ebpf
            .program_mut(name)
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| Failure::runtime(format!("program {name} missing")))?;
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie: Some(u64::from(uprobes.trigger)),
        };
        let link = prog.attach(point, &uprobes.path, scope).map_err(|e| {
            classify(
                &e,
                &format!(
                    "attaching a uprobe to {}+{offset:#x}",
                    uprobes.path.display()
                ),
            )
        })?;
        self.links.push((name, uprobes.trigger, link));
        Ok(())
    }

    /// Loads and attaches `mt_exec` to the `sched_process_exec` raw
    /// tracepoint, which forwards every exec'ing pid into the EXECS ring
    /// buffer (`--exe`). A raw tracepoint is opened by name: no tracefs.
    pub fn attach_exec_tracepoint(&mut self) -> Result<(), Failure> {
        let prog: &mut RawTracePoint = self
            .ebpf
            .program_mut("mt_exec")
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| Failure::runtime("program mt_exec missing"))?;
        prog.load()
            .map_err(|e| classify_with(&e, "loading program mt_exec", &[libc::EPERM]))?;
        let link = prog
            .attach("sched_process_exec")
            .map_err(|e| classify(&e, "attaching to the sched_process_exec tracepoint"))?;
        self.exec_link = Some(link);
        Ok(())
    }

    /// Follows process `pid` and, from now on, every process forked from it
    /// or from one of its followed children: writes `pid` into `FOLLOWED`
    /// and, the first time, loads and attaches `mt_fork` and `mt_exit` to
    /// the `sched_process_fork` and `sched_process_exit` raw tracepoints.
    /// Needs [`LoadOptions::follow_forks`].
    pub fn follow(&mut self, pid: i32) -> Result<(), Failure> {
        let mut followed: HashMap<_, u32, u8> = HashMap::try_from(
            self.ebpf
                .map_mut("FOLLOWED")
                .ok_or_else(|| Failure::runtime("map FOLLOWED missing"))?,
        )
        .map_err(|e| Failure::runtime(format!("map FOLLOWED: {e}")))?;
        followed
            .insert(pid as u32, 1, 0)
            .map_err(|e| Failure::runtime(format!("writing map FOLLOWED: {e}")))?;
        if !self.fork_links.is_empty() {
            return Ok(());
        }
        for (name, tracepoint) in [
            ("mt_fork", "sched_process_fork"),
            ("mt_exit", "sched_process_exit"),
        ] {
            let prog: &mut RawTracePoint = self
                .ebpf
                .program_mut(name)
                .and_then(|p| p.try_into().ok())
                .ok_or_else(|| Failure::runtime(format!("program {name} missing")))?;
            prog.load().map_err(|e| {
                classify_with(&e, &format!("loading program {name}"), &[libc::EPERM])
            })?;
            let link = prog
                .attach(tracepoint)
                .map_err(|e| classify(&e, &format!("attaching to the {tracepoint} tracepoint")))?;
            self.fork_links.push((name, link));
        }
        Ok(())
    }

    /// The settings of `trigger` in CONFIG now (`mt_exit` writes them too).
    pub fn config(&self, trigger: u32) -> TriggerConfig {
        self.get("CONFIG", trigger).expect("CONFIG entry")
    }

    /// Whether process `pid` is in `FOLLOWED` now.
    pub fn is_followed(&self, pid: i32) -> bool {
        self.ebpf
            .map("FOLLOWED")
            .and_then(|m| HashMap::<_, u32, u8>::try_from(m).ok())
            .is_some_and(|m| m.get(&(pid as u32), 0).is_ok())
    }

    /// Detaches the probes of one trigger, waiting for the kernel.
    pub fn detach_trigger(&mut self, trigger: u32) {
        drop(self.take_trigger_links(trigger));
    }

    /// Takes the links of one trigger out of the programs, without
    /// detaching them: dropping a link detaches it, which can wait for RCU
    /// grace periods in the kernel, so the caller drops them on a thread
    /// that no hit waits for (`armer`).
    pub fn take_trigger_links(&mut self, trigger: u32) -> Vec<UProbeLink> {
        let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.links)
            .into_iter()
            .partition(|(_, t, _)| *t == trigger);
        self.links = others;
        let mut taken = Vec::new();
        for (program, _, link) in mine {
            if let Some(prog) = self
                .ebpf
                .program_mut(program)
                .and_then(|p| <&mut UProbe>::try_from(p).ok())
                && let Ok(l) = prog.take_link(link)
            {
                taken.push(l);
            }
        }
        taken
    }

    /// Detaches the exec, fork and exit tracepoints (no grace period is
    /// waited for: the kernel frees their probes after one, on its own).
    pub fn detach_tracepoints(&mut self) {
        if let Some(link) = self.exec_link.take()
            && let Some(prog) = self
                .ebpf
                .program_mut("mt_exec")
                .and_then(|p| <&mut RawTracePoint>::try_from(p).ok())
        {
            let _ = prog.detach(link);
        }
        for (name, link) in std::mem::take(&mut self.fork_links) {
            if let Some(prog) = self
                .ebpf
                .program_mut(name)
                .and_then(|p| <&mut RawTracePoint>::try_from(p).ok())
            {
                let _ = prog.detach(link);
            }
        }
    }

    /// A new fd of a loaded uprobe program, for attaching it elsewhere
    /// (the arming thread: [`uprobes::ProgramFds`]).
    pub fn program_fd(&self, program: Program) -> Option<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd;
        let prog: &UProbe = self.ebpf.program(program.name())?.try_into().ok()?;
        prog.fd().ok()?.as_fd().try_clone_to_owned().ok()
    }

    /// Number of uprobes attached for a trigger.
    pub fn attached_for(&self, trigger: u32) -> usize {
        self.links.iter().filter(|(_, t, _)| *t == trigger).count()
    }

    /// Takes the EXECS ring buffer (`--exe`).
    pub fn take_execs(&mut self) -> anyhow::Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map("EXECS")
            .ok_or_else(|| anyhow::anyhow!("EXECS map missing"))?;
        Ok(RingBuf::try_from(map)?)
    }

    /// Takes the HITS ring buffer, for the reader thread.
    pub fn take_ring(&mut self) -> anyhow::Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map("HITS")
            .ok_or_else(|| anyhow::anyhow!("HITS map missing"))?;
        Ok(RingBuf::try_from(map)?)
    }

    /// Takes the COUNTERS and FRAMES maps, for reading counts.
    pub fn take_counters(&mut self) -> anyhow::Result<Counters> {
        let counters = self
            .ebpf
            .take_map("COUNTERS")
            .ok_or_else(|| anyhow::anyhow!("COUNTERS map missing"))?;
        let frames = self
            .ebpf
            .take_map("FRAMES")
            .ok_or_else(|| anyhow::anyhow!("FRAMES map missing"))?;
        Ok(Counters::new(
            PerCpuArray::try_from(counters)?,
            HashMap::try_from(frames)?,
        ))
    }

    /// Takes the aya-log reader (only useful with `verbose`).
    pub fn take_logger(&mut self) -> Option<aya_log::EbpfLogger<&'static dyn log::Log>> {
        aya_log::EbpfLogger::init(&mut self.ebpf).ok()
    }
}

/// The kernel's internal `ENOTSUPP` (include/linux/errno.h), which
/// `perf_event_open` returns for a uprobe on an instruction that
/// arch/x86/kernel/uprobes.c refuses. libc has no name for it.
const ENOTSUPP: i32 = 524;

/// Maps an aya error to a failure: permission problems are exit code 3,
/// an instruction the kernel cannot probe (`ENOTSUPP`) exit code 2.
fn classify(err: &(dyn std::error::Error + 'static), doing: &str) -> Failure {
    classify_with(err, doing, &[libc::EPERM, libc::EACCES])
}

/// Like [`classify`], with the errno values that mean "not permitted".
fn classify_with(err: &(dyn std::error::Error + 'static), doing: &str, denied: &[i32]) -> Failure {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    let mut detail = Vec::new();
    while let Some(e) = source {
        detail.push(e.to_string());
        if let Some(io) = e.downcast_ref::<io::Error>()
            && io.raw_os_error() == Some(ENOTSUPP)
        {
            return Failure::usage(format!(
                "{doing}: the kernel cannot place a uprobe on the instruction there (ENOTSUPP, \
                 error 524: an instruction its uprobe decoder refuses, such as int3); probe \
                 another instruction with --offset"
            ));
        }
        if let Some(io) = e.downcast_ref::<io::Error>()
            && io.raw_os_error().is_some_and(|n| denied.contains(&n))
        {
            return Failure::environment(format!(
                "{doing}: permission denied; run as root, or with {} (the uprobe PMU needs \
                 CAP_SYS_ADMIN since the fix for CVE-2025-38466); `mt-agent check` shows what \
                 is missing",
                crate::sys::caps::LEAST_SET
            ));
        }
        source = e.source();
    }
    Failure::runtime(format!("{doing}: {}", detail.join(": ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ExitCode;

    #[test]
    fn enotsupp_from_the_kernel_is_explained() {
        let e = io::Error::from_raw_os_error(ENOTSUPP);
        let f = classify(&e, "attaching a uprobe to /bin/x+0x10");
        assert_eq!(f.code, ExitCode::Usage);
        assert!(f.message.contains("ENOTSUPP"), "{}", f.message);
        assert!(f.message.contains("--offset"), "{}", f.message);
        assert!(!f.message.contains("Unknown error"), "{}", f.message);
        let f = classify(&io::Error::from_raw_os_error(libc::EPERM), "x");
        assert_eq!(f.code, ExitCode::Environment);
    }
}
