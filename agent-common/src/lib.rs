//! Types shared by the mt-agent eBPF programs (`agent-ebpf`) and userspace
//! (`agent`).
//!
//! Every type here is `#[repr(C)]`, `Copy`, and has no implicit padding, so
//! the two sides agree on its layout byte for byte. The eBPF side writes
//! [`Hit`] records into the `HITS` ring buffer and bumps [`Counter`] slots in
//! the per-CPU `COUNTERS` array; userspace writes one [`TriggerConfig`] per
//! trigger into the `CONFIG` array before it attaches any probe.
#![no_std]

/// Most triggers one loaded object serves. A trigger's index is the uprobe's
/// attach cookie (`bpf_get_attach_cookie`), and the index into `CONFIG`,
/// `STATE` and `COUNTERS`.
pub const MAX_TRIGGERS: u32 = 64;

/// Most `--when` conditions per trigger.
pub const MAX_CONDS: usize = 8;

/// Most `--tid` values per trigger.
pub const MAX_TIDS: usize = 8;

/// How many nested, still-running calls of a `--slower-than` function one
/// thread (or Go goroutine) can have before the oldest entry is forgotten.
pub const MAX_DEPTH: usize = 16;

/// Most threads (Go: goroutines) that can be inside a `--slower-than` call
/// at once, over all triggers: entries of the `FRAMES` map.
pub const MAX_FRAME_STACKS: u32 = 16384;

/// Number of argument registers captured per hit.
pub const NARGS: usize = 6;

/// Default size of the `HITS` ring buffer, in bytes. A [`Hit`] takes
/// `size_of::<Hit>()` plus an 8-byte ring-buffer header, so this holds about
/// 2,000 records.
pub const DEFAULT_RING_BYTES: u32 = 256 * 1024;

/// One accepted hit, as the eBPF program pushes it into the `HITS` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hit {
    /// `bpf_ktime_get_ns()` when the hit was accepted: CLOCK_MONOTONIC, in ns.
    /// For a `--slower-than` trigger this is the time of the return.
    pub ktime_ns: u64,
    /// Thread-group id (the process id, as userspace calls it).
    pub tgid: u32,
    /// Thread id (the kernel's pid).
    pub tid: u32,
    /// CPU the hit ran on (`bpf_get_smp_processor_id`).
    pub cpu: u32,
    /// Trigger index: the attach cookie.
    pub trigger: u32,
    /// The probed function's first six integer arguments, read at entry from
    /// the registers of the target's ABI (SysV, or Go's register ABI).
    pub args: [u64; NARGS],
    /// For a `--slower-than` trigger: how long the call lasted, in ns; else 0.
    pub duration_ns: u64,
    /// For a `--slower-than` trigger: the return value (RAX); else 0.
    pub retval: u64,
    /// [`HIT_AT_RETURN`] and friends.
    pub flags: u64,
    /// For a `--slower-than` trigger on a SysV function: the stack pointer
    /// at entry, the address of the slot that holds the call's return
    /// address while it runs (a pending uretprobe replaces it there with
    /// the kernel's trampoline); else 0.
    pub entry_sp: u64,
    /// For a `--slower-than` trigger on a SysV function: the return
    /// address read from that slot at entry, before any uretprobe replaced
    /// it; else 0. The report puts it back into the DWARF stack copies
    /// taken during the call (report/pending_returns.rs).
    pub return_address: u64,
}

/// [`Hit::flags`]: the hit was taken at the function's return, so
/// `duration_ns` and `retval` are set.
pub const HIT_AT_RETURN: u64 = 1;

/// Comparison operators of a `--when` condition.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CondOp {
    /// `==`
    Eq = 0,
    /// `!=`
    Ne = 1,
    /// `<`
    Lt = 2,
    /// `<=`
    Le = 3,
    /// `>`
    Gt = 4,
    /// `>=`
    Ge = 5,
    /// `&`: true when `(arg & value) != 0`.
    Mask = 6,
}

/// One `--when` condition, evaluated in the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cond {
    /// Argument index, 0 to 5.
    pub arg: u8,
    /// A [`CondOp`] as `u8`.
    pub op: u8,
    /// 1 when the argument and `value` compare as signed 64-bit integers.
    pub signed: u8,
    pub _pad: [u8; 5],
    /// The constant, as a 64-bit pattern.
    pub value: u64,
}

impl Cond {
    /// Whether the condition holds for these arguments. The eBPF program
    /// calls this in the kernel; userspace tests call the same code.
    #[inline(always)]
    pub fn holds(&self, args: &[u64; NARGS]) -> bool {
        // Constant indices only: the BPF verifier refuses a stack read at a
        // variable offset.
        let a = match self.arg {
            0 => args[0],
            1 => args[1],
            2 => args[2],
            3 => args[3],
            4 => args[4],
            _ => args[5],
        };
        let v = self.value;
        let (lt, eq) = if self.signed != 0 {
            ((a as i64) < (v as i64), a == v)
        } else {
            (a < v, a == v)
        };
        match self.op {
            op if op == CondOp::Eq as u8 => eq,
            op if op == CondOp::Ne as u8 => !eq,
            op if op == CondOp::Lt as u8 => lt,
            op if op == CondOp::Le as u8 => lt || eq,
            op if op == CondOp::Gt as u8 => !lt && !eq,
            op if op == CondOp::Ge as u8 => !lt,
            op if op == CondOp::Mask as u8 => a & v != 0,
            _ => false,
        }
    }
}

/// [`TriggerConfig::flags`]: read arguments with Go's register ABI
/// (RAX, RBX, RCX, RDI, RSI, R8) instead of SysV (RDI, RSI, RDX, RCX, R8, R9).
pub const CFG_GO_ABI: u32 = 1;
/// [`TriggerConfig::flags`]: the entry probe only records the call; the
/// decision is taken by the return probes (`--slower-than`).
pub const CFG_AT_RETURN: u32 = 2;
/// [`TriggerConfig::flags`]: keep filter state per process (an `--exe`
/// trigger fires in many processes); else one state per trigger.
pub const CFG_PER_PROCESS: u32 = 8;
/// [`TriggerConfig::flags`]: the trigger is in use. A hit whose cookie points
/// at a slot without this flag is ignored.
pub const CFG_ENABLED: u32 = 4;
/// [`TriggerConfig::flags`]: the uprobes are attached file-wide and a call
/// counts only in a process listed in the `FOLLOWED` map (a `--pid` target
/// and the processes forked from it since the agent attached).
pub const CFG_FOLLOW_FORKS: u32 = 16;

/// Most processes in the `FOLLOWED` map (an LRU hash: beyond this the least
/// recently used is forgotten).
pub const MAX_FOLLOWED: u32 = 16384;

/// Settings of one trigger, written by userspace into `CONFIG[cookie]` before
/// the probe is attached. All durations are in ns; 0 disables a filter.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TriggerConfig {
    /// `CFG_*` bits.
    pub flags: u32,
    /// How many entries of `tids` are used; 0 means every thread.
    pub n_tids: u32,
    /// Only these thread ids count (`--tid`).
    pub tids: [u32; MAX_TIDS],
    /// How many entries of `conds` are used.
    pub n_conds: u32,
    /// With [`CFG_FOLLOW_FORKS`]: the `--pid` target's tgid, whose calls
    /// count without a `FOLLOWED` lookup (the hot path's largest cost
    /// otherwise). `mt_exit` sets it to 0 when that process exits, so a
    /// new process that reuses the pid goes through `FOLLOWED` like any
    /// other. 0 for other triggers.
    pub target_tgid: u32,
    /// All must hold (`--when`).
    pub conds: [Cond; MAX_CONDS],
    /// `--slower-than`, in ns.
    pub slower_than_ns: u64,
    /// `--every N`: accept one hit in N; 0 or 1 accepts all.
    pub every: u64,
    /// `--max-rate`: least time between two hits passing the rate filter, ns.
    pub rate_interval_ns: u64,
    /// `--cooldown`: least time between two accepted hits, ns.
    pub cooldown_ns: u64,
    /// The kernel tick (the resolution of CLOCK_MONOTONIC_COARSE), ns; 0
    /// turns off the jiffies fast path of the rate and cooldown gates.
    pub tick_ns: u64,
}

/// Key of the `STATE` map: filter state is kept per trigger and per process,
/// so that with `--exe` each process has its own cooldown, rate and count.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StateKey {
    pub trigger: u32,
    pub tgid: u32,
}

/// Most (trigger, process) pairs with filter state; the least recently used
/// is forgotten beyond this.
pub const MAX_STATES: u32 = 16384;

/// A record of the `EXECS` ring buffer: a process that called execve (from
/// the `sched_process_exec` tracepoint). Userspace decides whether its new
/// executable is one to trace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exec {
    pub tgid: u32,
    pub _pad: u32,
}

/// Mutable filter state of one trigger in one process, kept by the eBPF
/// program in `STATE` and updated with atomic operations (BPF CPU v3), so it
/// is exact across CPUs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TriggerState {
    /// Hits that reached the `--every` filter so far.
    pub every_count: u64,
    /// Earliest `bpf_ktime_get_ns` at which the rate filter passes again.
    pub rate_next_ns: u64,
    /// Earliest `bpf_ktime_get_ns` at which the cooldown passes again.
    pub cooldown_next_ns: u64,
    /// While `jiffies` is below this, the rate gate is surely closed (0:
    /// unknown). Set two ticks short of `rate_next_ns`, so a hit checked
    /// this way would also fail the precise check; see `claim` in agent-ebpf.
    pub rate_closed_until_jiffies: u64,
    /// The same for the cooldown.
    pub cooldown_closed_until_jiffies: u64,
}

/// One call of a `--slower-than` function that has been entered and not yet
/// seen to return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// Identifies the frame: the stack pointer at entry, or for Go, the
    /// distance from the goroutine stack's top, which survives stack moves.
    pub sp: u64,
    /// `bpf_ktime_get_ns` at entry.
    pub entry_ns: u64,
    /// Arguments at entry.
    pub args: [u64; NARGS],
    /// The return address at entry (`[rsp]`, SysV only; else 0): see
    /// [`Hit::return_address`].
    pub return_address: u64,
}

/// The open calls of one thread (or goroutine) for one trigger.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameStack {
    /// Number of used entries of `frames`; the innermost call is last.
    pub depth: u32,
    pub _pad: u32,
    pub frames: [Frame; MAX_DEPTH],
}

/// Key of the `FRAMES` map: one frame stack per trigger and thread (SysV) or
/// goroutine (Go: the `g` pointer in R14).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FrameKey {
    pub id: u64,
    pub trigger: u32,
    pub _pad: u32,
}

/// Defines [`Counter`] and, from the same list, [`Counter::ALL`] and
/// [`NCOUNTERS`], so that the slot count cannot drift from the enum.
macro_rules! counters {
    ($(#[$doc:meta])* pub enum Counter { $($(#[$vdoc:meta])* $name:ident = $slot:literal,)* }) => {
        $(#[$doc])*
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Counter {
            $($(#[$vdoc])* $name = $slot,)*
        }

        impl Counter {
            /// Every counter, in slot order.
            pub const ALL: &'static [Counter] = &[$(Counter::$name,)*];
        }

        /// Number of [`Counter`] slots per trigger.
        pub const NCOUNTERS: u32 = Counter::ALL.len() as u32;
    };
}

counters! {
    /// Slots of the per-CPU `COUNTERS` array. Trigger `t` uses slots
    /// `t * NCOUNTERS ..= t * NCOUNTERS + NCOUNTERS - 1`. Each per-CPU slot is
    /// bumped with an atomic add, because a uprobe program can be preempted on
    /// this kernel; userspace sums over CPUs.
    ///
    /// The identity `Seen = Σ Drop* + Accepted (+ calls still open)` holds
    /// exactly, and so does `Accepted = delivered + Lost`.
    pub enum Counter {
        /// Every entry of the probed function in the traced scope.
        Seen = 0,
        /// Dropped: the thread is not one of `--tid`.
        DropTid = 1,
        /// Dropped: a `--when` condition failed.
        DropWhen = 2,
        /// Dropped: the call was faster than `--slower-than`.
        DropDuration = 3,
        /// Dropped by `--every`.
        DropEvery = 4,
        /// Dropped by `--max-rate`.
        DropRate = 5,
        /// Dropped by `--cooldown`.
        DropCooldown = 6,
        /// Dropped: a `--slower-than` call left without passing a probed `ret`
        /// (tail jump, exception, longjmp), or its frame stack overflowed.
        DropNoReturn = 7,
        /// Passed every filter.
        Accepted = 8,
        /// Accepted, but the ring buffer was full, so the record was lost.
        Lost = 9,
        /// Dropped because a map operation failed: the `FRAMES` map was full
        /// ([`MAX_FRAME_STACKS`] threads inside `--slower-than` calls), a Go
        /// goroutine's stack bounds could not be read, or the per-process state
        /// map could not take a new process.
        DropError = 10,
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: all of these are repr(C), Copy, with explicit padding fields.
    unsafe impl aya::Pod for Hit {}
    unsafe impl aya::Pod for TriggerConfig {}
    unsafe impl aya::Pod for TriggerState {}
    unsafe impl aya::Pod for StateKey {}
    unsafe impl aya::Pod for Exec {}
    unsafe impl aya::Pod for FrameKey {}
    unsafe impl aya::Pod for FrameStack {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<Hit>(), 8 + 4 * 4 + 8 * NARGS + 8 * 5);
        assert_eq!(size_of::<Cond>(), 16);
        assert_eq!(
            size_of::<TriggerConfig>(),
            4 + 4 + 4 * MAX_TIDS + 4 + 4 + 16 * MAX_CONDS + 8 * 5
        );
        assert_eq!(size_of::<Frame>(), 24 + 8 * NARGS);
        assert_eq!(size_of::<FrameStack>(), 8 + size_of::<Frame>() * MAX_DEPTH);
    }

    #[test]
    fn counters_fill_their_slots_in_order() {
        assert_eq!(NCOUNTERS, 11);
        for (slot, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, slot);
        }
    }

    #[test]
    fn each_condition_operator_compares_as_its_name_says() {
        let cond = |op: CondOp, signed: u8, value: u64| Cond {
            arg: 1,
            op: op as u8,
            signed,
            value,
            ..Cond::default()
        };
        let args = |a1: u64| [0, a1, 0, 0, 0, 0];
        assert!(cond(CondOp::Eq, 0, 7).holds(&args(7)));
        assert!(!cond(CondOp::Ne, 0, 7).holds(&args(7)));
        assert!(cond(CondOp::Lt, 0, 7).holds(&args(6)));
        assert!(cond(CondOp::Le, 0, 7).holds(&args(7)));
        assert!(cond(CondOp::Gt, 0, 7).holds(&args(8)));
        assert!(!cond(CondOp::Ge, 0, 7).holds(&args(6)));
        assert!(cond(CondOp::Mask, 0, 4).holds(&args(6)));
        assert!(!cond(CondOp::Mask, 0, 8).holds(&args(6)));
        // -1 is below 0 when signed, above it when not.
        assert!(cond(CondOp::Lt, 1, 0).holds(&args(u64::MAX)));
        assert!(!cond(CondOp::Lt, 0, 0).holds(&args(u64::MAX)));
        assert!(
            !Cond {
                op: 99,
                ..cond(CondOp::Eq, 0, 0)
            }
            .holds(&args(0))
        );
    }
}
