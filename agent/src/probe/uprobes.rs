//! A trigger's uprobes, the one description that planning, attaching (aya), arming (tracefs events) and detaching share.

use std::{
    os::fd::{BorrowedFd, OwnedFd},
    path::PathBuf,
    sync::Arc,
};

/// The eBPF program a uprobe runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Program {
    /// `mt_entry`: the trigger's entry (or `--offset`).
    Entry,
    /// `mt_return`: a plain uprobe on one `ret` instruction
    /// (`--slower-than`).
    Return,
    /// `mt_uretprobe`: a uretprobe on the function (`--use-uretprobe`).
    Uretprobe,
}

impl Program {
    pub const ALL: [Program; 3] = [Program::Entry, Program::Return, Program::Uretprobe];

    /// The program's name in the eBPF object.
    pub fn name(self) -> &'static str {
        match self {
            Program::Entry => "mt_entry",
            Program::Return => "mt_return",
            Program::Uretprobe => "mt_uretprobe",
        }
    }
}

/// One uprobe: a program at a file offset of the trigger's object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uprobe {
    pub program: Program,
    /// File offset of the probed instruction (of the function's entry, for
    /// a uretprobe).
    pub offset: u64,
}

impl Uprobe {
    /// Whether the kernel places it as a uretprobe.
    pub fn is_uretprobe(&self) -> bool {
        self.program == Program::Uretprobe
    }
}

/// A trigger's uprobes: the entry first, then its return probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerUprobes {
    /// Trigger index: the attach cookie.
    pub trigger: u32,
    /// File the uprobes are placed in (the kernel resolves it to an inode).
    pub path: PathBuf,
    /// Only this process fires the probes; None means every process.
    pub pid: Option<i32>,
    /// The `--pid` trigger follows forks: its uprobes are placed file-wide
    /// and the eBPF programs keep the calls of the processes in `FOLLOWED`
    /// (the target and its children), see [`crate::probe::Probes::follow`].
    pub follow_forks: bool,
    /// The entry, then the return probes (`--slower-than`).
    pub uprobes: Vec<Uprobe>,
}

impl TriggerUprobes {
    /// A trigger's uprobes: its entry at `entry_offset`, then `returns`.
    pub fn new(
        trigger: u32,
        path: PathBuf,
        pid: Option<i32>,
        follow_forks: bool,
        entry_offset: u64,
        returns: Vec<Uprobe>,
    ) -> Self {
        let mut uprobes = vec![Uprobe {
            program: Program::Entry,
            offset: entry_offset,
        }];
        uprobes.extend(returns);
        Self {
            trigger,
            path,
            pid,
            follow_forks,
            uprobes,
        }
    }

    /// The entry probe's file offset.
    pub fn entry_offset(&self) -> u64 {
        self.uprobes[0].offset
    }

    /// Whether one of the uprobes runs `program`.
    pub fn uses(&self, program: Program) -> bool {
        self.uprobes.iter().any(|u| u.program == program)
    }

    /// The pid a perf event for these uprobes is opened on: the target, or
    /// -1 (every process) for a trigger that follows forks or has no pid.
    pub fn perf_pid(&self) -> i32 {
        match self.pid {
            Some(pid) if !self.follow_forks => pid,
            _ => -1,
        }
    }
}

/// The loaded programs' fds, for attaching uprobes off the driver thread
/// (the arming thread) without aya's `&mut` handle.
#[derive(Debug, Default)]
pub struct ProgramFds(Vec<(Program, OwnedFd)>);

impl ProgramFds {
    /// The programs `uprobes` need, from the loaded object.
    pub fn of(probes: &super::Probes, uprobes: &TriggerUprobes) -> Option<Arc<Self>> {
        let mut fds = Vec::new();
        for p in Program::ALL.into_iter().filter(|p| uprobes.uses(*p)) {
            fds.push((p, probes.program_fd(p)?));
        }
        Some(Arc::new(Self(fds)))
    }

    /// The fd of `program`, if it was taken.
    pub fn get(&self, program: Program) -> Option<BorrowedFd<'_>> {
        use std::os::fd::AsFd as _;
        self.0
            .iter()
            .find(|(p, _)| *p == program)
            .map(|(_, fd)| fd.as_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_comes_first_and_the_perf_pid_follows_the_scope() {
        let ret = |offset| Uprobe {
            program: Program::Return,
            offset,
        };
        let u = TriggerUprobes::new(3, "/bin/x".into(), Some(42), false, 0x10, vec![ret(0x20)]);
        assert_eq!(u.entry_offset(), 0x10);
        assert_eq!(u.uprobes[1], ret(0x20));
        assert!(u.uses(Program::Return) && !u.uses(Program::Uretprobe));
        assert_eq!(u.perf_pid(), 42);
        let follows = TriggerUprobes {
            follow_forks: true,
            ..u.clone()
        };
        assert_eq!(follows.perf_pid(), -1);
        assert_eq!(TriggerUprobes { pid: None, ..u }.perf_pid(), -1);
    }
}
