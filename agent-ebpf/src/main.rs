//! mt-agent's eBPF programs (the benchmark's floor is apart, in
//! `src/bench.rs`).
//!
//! * `mt_entry`: a uprobe on the trigger function's entry (or `--offset`).
//! * `mt_return`: a plain uprobe on each `ret` instruction of a
//!   `--slower-than` trigger.
//! * `mt_uretprobe`: a uretprobe on the function instead
//!   (`--use-uretprobe`).
//! * `mt_exec`: the `sched_process_exec` raw tracepoint, which forwards each
//!   exec'ing pid into `EXECS` (`--exe` triggers find new processes so).
//! * `mt_fork`: the `sched_process_fork` raw tracepoint, which adds the
//!   children of followed processes to `FOLLOWED` (`--pid` triggers
//!   following forks), and `mt_exit` on `sched_process_exit`, which removes
//!   them when they end.
//!
//! The uprobes find their trigger's settings through the attach cookie,
//! which is the trigger's index into `CONFIG`, `STATE` and `COUNTERS`.
//! Filters run in a fixed order: tid, when, duration, every, rate,
//! cooldown. A hit that passes them all is pushed into the `HITS` ring
//! buffer; a hit that fails one only bumps that filter's counter, so it
//! costs no wakeup and no userspace work.
//!
//! Shared state is updated with BPF atomics (fetch-add, compare-exchange),
//! which need BPF CPU v3; `agent/build.rs` builds this crate with
//! `-C target-cpu=v3`. Counters are per-CPU slots bumped with atomic adds,
//! because a uprobe program can be preempted on this kernel.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// Stable `AtomicU64` has no read-modify-write methods on the BPF target
// (`target_has_atomic = "64"` is off there), so use the intrinsics directly.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod prog {
    use core::intrinsics::{
        AtomicOrdering::{Relaxed, SeqCst},
        atomic_cxchg, atomic_xadd,
    };

    use agent_common::{
        CFG_AT_RETURN, CFG_ENABLED, CFG_FOLLOW_FORKS, CFG_GO_ABI, CFG_PER_PROCESS, Counter,
        DEFAULT_RING_BYTES, Exec, Frame, FrameKey, FrameStack, HIT_AT_RETURN, Hit, MAX_CONDS,
        MAX_DEPTH, MAX_FOLLOWED, MAX_FRAME_STACKS, MAX_STATES, MAX_TIDS, MAX_TRIGGERS, NARGS,
        NCOUNTERS, StateKey, TriggerConfig, TriggerState,
    };
    use aya_ebpf::{
        EbpfContext, Global,
        bindings::{BPF_NOEXIST, pt_regs},
        helpers::{
            bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_jiffies64, bpf_ktime_get_ns,
            bpf_probe_read_kernel, bpf_probe_read_user, generated::bpf_get_attach_cookie,
        },
        macros::{map, raw_tracepoint, uprobe, uretprobe},
        maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
        programs::{ProbeContext, RawTracePointContext, RetProbeContext},
    };
    use aya_log_ebpf::{debug, warn};

    /// Settings per trigger, written by userspace before attaching.
    #[map]
    static CONFIG: Array<TriggerConfig> = Array::with_max_entries(MAX_TRIGGERS, 0);

    /// Mutable filter state per trigger (`--every`, `--max-rate`, cooldown)
    /// for triggers that trace one process.
    #[map]
    static ONE_STATE: Array<TriggerState> = Array::with_max_entries(MAX_TRIGGERS, 0);

    /// The same, per trigger and process, for `--exe` triggers.
    #[map]
    static STATE: LruHashMap<StateKey, TriggerState> = LruHashMap::with_max_entries(MAX_STATES, 0);

    /// Processes that exec'd, for `--exe` (read by the agent).
    #[map]
    static EXECS: RingBuf = RingBuf::with_byte_size(16 * 1024, 0);

    /// Processes whose calls count for a `CFG_FOLLOW_FORKS` trigger: the
    /// `--pid` targets (written by userspace) and every process forked from
    /// one of them since (added by `mt_fork`). Keyed by tgid; LRU, so it
    /// stays bounded however many processes fork.
    #[map]
    static FOLLOWED: LruHashMap<u32, u8> = LruHashMap::with_max_entries(MAX_FOLLOWED, 0);

    /// `Counter` slots, `NCOUNTERS` per trigger, per CPU.
    #[map]
    static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_TRIGGERS * NCOUNTERS, 0);

    /// Accepted hits, read by the agent. Userspace may resize it at load time.
    #[map]
    static HITS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

    /// Open `--slower-than` calls per trigger and thread (or goroutine). A
    /// plain hash, not LRU: an LRU map would evict the stack of a thread
    /// whose call is still open and lose it without a count. An entry is
    /// removed when its stack empties, so only threads inside a call hold
    /// one; when the map is full, the new call counts as `DropError`.
    #[map]
    static FRAMES: HashMap<FrameKey, FrameStack> = HashMap::with_max_entries(MAX_FRAME_STACKS, 0);

    /// An all-zero `FrameStack` to insert from: it is too large for the
    /// 512-byte BPF stack.
    #[map]
    static EMPTY_FRAMES: PerCpuArray<FrameStack> = PerCpuArray::with_max_entries(1, 0);

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        // The verifier rejects loops and unreachable code alike; every index
        // here is bounds-checked by hand, so no panic path survives.
        // SAFETY: no code path reaches a panic (see above).
        unsafe { core::hint::unreachable_unchecked() }
    }

    #[uprobe]
    pub fn mt_entry(ctx: ProbeContext) -> u32 {
        on_entry(&ctx, ctx.regs);
        0
    }

    #[uprobe]
    pub fn mt_return(ctx: ProbeContext) -> u32 {
        on_return(&ctx, ctx.regs, false);
        0
    }

    #[uretprobe]
    pub fn mt_uretprobe(ctx: RetProbeContext) -> u32 {
        on_return(&ctx, ctx.regs, true);
        0
    }

    /// Atomic add that returns the previous value (BPF_ATOMIC | BPF_FETCH).
    ///
    /// SeqCst, not Relaxed: with Relaxed, LLVM 22's BPF backend emits the
    /// non-fetch `lock add` (no BPF_FETCH flag) even when the result is used,
    /// and the "previous value" is then whatever the operand register held.
    ///
    /// # Safety
    /// `slot` must point at a live, 8-byte aligned map value.
    #[inline(always)]
    unsafe fn fetch_add(slot: *mut u64, value: u64) -> u64 {
        unsafe { atomic_xadd::<u64, u64, { SeqCst }>(slot, value) }
    }

    /// Atomic add whose result is not needed (BPF_ATOMIC, `lock add`).
    ///
    /// # Safety
    /// As for [`fetch_add`].
    #[inline(always)]
    unsafe fn add(slot: *mut u64, value: u64) {
        unsafe { atomic_xadd::<u64, u64, { Relaxed }>(slot, value) };
    }

    /// Atomic compare-exchange (BPF_CMPXCHG); true when `new` was stored.
    ///
    /// # Safety
    /// As for [`fetch_add`].
    #[inline(always)]
    unsafe fn compare_exchange(slot: *mut u64, old: u64, new: u64) -> bool {
        unsafe { atomic_cxchg::<u64, { Relaxed }, { Relaxed }>(slot, old, new) }.1
    }

    /// The `sched_process_exec` raw tracepoint (no tracefs needed): forward
    /// the pid; userspace compares its new executable with the `--exe`
    /// paths. Attached only in `--exe` mode.
    #[raw_tracepoint(tracepoint = "sched_process_exec")]
    pub fn mt_exec(_ctx: RawTracePointContext) -> i32 {
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        let _ = EXECS.output::<Exec>(Exec { tgid, _pad: 0 }, 0);
        0
    }

    /// Offset of `tgid` in the kernel's `struct task_struct`, from the
    /// running kernel's BTF (set at load time by the agent; 0 when no
    /// trigger follows forks, and then `mt_fork` is not attached).
    #[unsafe(no_mangle)]
    static MT_TASK_TGID_OFFSET: Global<u32> = Global::new(0);

    /// The `sched_process_fork` raw tracepoint (no tracefs needed;
    /// `TP_PROTO(struct task_struct *parent, struct task_struct *child)`):
    /// the current task is the forking parent; when its process is
    /// followed, follow the child too. One hash lookup for every other fork
    /// on the machine. Attached only when a trigger follows forks.
    #[raw_tracepoint(tracepoint = "sched_process_fork")]
    pub fn mt_fork(ctx: RawTracePointContext) -> i32 {
        let parent = (bpf_get_current_pid_tgid() >> 32) as u32;
        if FOLLOWED.get_ptr(parent).is_none() {
            return 0;
        }
        let child: u64 = ctx.arg(1);
        let at = child.wrapping_add(u64::from(MT_TASK_TGID_OFFSET.load()));
        // SAFETY: bpf_probe_read_kernel copes with any address.
        if let Ok(tgid) = unsafe { bpf_probe_read_kernel(at as *const i32) } {
            let _ = FOLLOWED.insert(&(tgid as u32), &1, 0);
        }
        0
    }

    /// The `sched_process_exit` raw tracepoint (every exiting thread;
    /// `TP_PROTO(struct task_struct *p, bool group_dead)` on kernel 6.18):
    /// when the last thread of a process exits, forget the process, so that
    /// a new process that reuses its pid is not followed. Nothing for a
    /// thread exit; a hash delete (a lookup when absent) for every process
    /// exit. Attached with `mt_fork`.
    #[raw_tracepoint(tracepoint = "sched_process_exit")]
    pub fn mt_exit(ctx: RawTracePointContext) -> i32 {
        let group_dead: u64 = ctx.arg(1);
        if group_dead & 0xff != 0 {
            let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
            let _ = FOLLOWED.remove(&tgid);
            forget_target(tgid);
        }
        0
    }

    /// A `--pid` target has exited: its tgid no longer takes the fast path
    /// of [`in_scope`]. One CONFIG entry with a single trigger, each of them
    /// otherwise (array lookups, which the verifier inlines).
    #[inline(always)]
    fn forget_target(tgid: u32) {
        let single = MT_SINGLE_TRIGGER.load();
        let (first, end) = if single != u32::MAX {
            (single, single.saturating_add(1))
        } else {
            (0, MAX_TRIGGERS)
        };
        let mut i = first;
        while i < end && i < MAX_TRIGGERS {
            if let Some(cfg) = CONFIG.get_ptr_mut(i) {
                // SAFETY: a map value lives as long as the map. Only an
                // exit of this tgid writes its slot, and exits of one
                // process do not overlap.
                unsafe {
                    let slot = &raw mut (*cfg).target_tgid;
                    if core::ptr::read_volatile(slot) == tgid {
                        core::ptr::write_volatile(slot, 0);
                    }
                }
            }
            i += 1;
        }
    }

    /// False when the trigger follows forks and the calling process is not
    /// followed: such a call is not in the traced scope and counts nowhere.
    /// The `--pid` target itself is recognized by its tgid in the trigger's
    /// settings, without the `FOLLOWED` lookup (a hash of the key, a bucket
    /// walk and a key compare: about 30 ns a hit here, docs/always-armed-cost.md).
    #[inline(always)]
    fn in_scope(cfg: &TriggerConfig, pid_tgid: u64) -> bool {
        if cfg.flags & CFG_FOLLOW_FORKS == 0 {
            return true;
        }
        let tgid = (pid_tgid >> 32) as u32;
        // SAFETY: `cfg` is a map value; `mt_exit` may zero this field.
        if tgid == unsafe { core::ptr::read_volatile(&raw const cfg.target_tgid) } {
            return true;
        }
        FOLLOWED.get_ptr(tgid).is_some()
    }

    #[inline(always)]
    fn bump(trigger: u32, counter: Counter) {
        if let Some(slot) = COUNTERS.get_ptr_mut(trigger * NCOUNTERS + counter as u32) {
            // SAFETY: a map value lives as long as the map; the atomic add
            // keeps the count exact when the program is preempted.
            unsafe { add(slot, 1) };
        }
    }

    /// Set at load time when the run has one trigger: its index, so the
    /// programs skip `bpf_get_attach_cookie`. `u32::MAX` (several triggers):
    /// read the cookie. A load-time constant, so the verifier prunes the
    /// branch not taken.
    #[unsafe(no_mangle)]
    static MT_SINGLE_TRIGGER: Global<u32> = Global::new(u32::MAX);

    #[inline(always)]
    fn trigger_of<C: EbpfContext>(ctx: &C) -> Option<(u32, &'static TriggerConfig)> {
        let single = MT_SINGLE_TRIGGER.load();
        let trigger = if single != u32::MAX {
            single
        } else {
            // SAFETY: the helper only reads the attach cookie of the link.
            unsafe { bpf_get_attach_cookie(ctx.as_ptr()) as u32 }
        };
        if trigger >= MAX_TRIGGERS {
            return None;
        }
        let cfg = CONFIG.get(trigger)?;
        if cfg.flags & CFG_ENABLED == 0 {
            return None;
        }
        Some((trigger, cfg))
    }

    /// The registers mt-agent reads, each loaded at a constant offset of
    /// the context: the verifier refuses a context access at a computed
    /// offset, which is what the compiler makes of a register chosen by ABI.
    #[derive(Clone, Copy)]
    struct Regs {
        rdi: u64,
        rsi: u64,
        rdx: u64,
        rcx: u64,
        r8: u64,
        r9: u64,
        rax: u64,
        rbx: u64,
        r14: u64,
        rsp: u64,
    }

    #[inline(always)]
    fn load_regs(regs: *const pt_regs) -> Regs {
        // SAFETY: the kernel hands uprobe programs a valid pt_regs; volatile
        // reads keep each load at its own constant offset.
        unsafe {
            Regs {
                rdi: core::ptr::read_volatile(&raw const (*regs).rdi),
                rsi: core::ptr::read_volatile(&raw const (*regs).rsi),
                rdx: core::ptr::read_volatile(&raw const (*regs).rdx),
                rcx: core::ptr::read_volatile(&raw const (*regs).rcx),
                r8: core::ptr::read_volatile(&raw const (*regs).r8),
                r9: core::ptr::read_volatile(&raw const (*regs).r9),
                rax: core::ptr::read_volatile(&raw const (*regs).rax),
                rbx: core::ptr::read_volatile(&raw const (*regs).rbx),
                r14: core::ptr::read_volatile(&raw const (*regs).r14),
                rsp: core::ptr::read_volatile(&raw const (*regs).rsp),
            }
        }
    }

    #[inline(always)]
    fn read_args(regs: &Regs, go_abi: bool) -> [u64; NARGS] {
        if go_abi {
            // Go's internal register ABI: RAX, RBX, RCX, RDI, RSI, R8, ...
            [regs.rax, regs.rbx, regs.rcx, regs.rdi, regs.rsi, regs.r8]
        } else {
            // x86-64 SysV: RDI, RSI, RDX, RCX, R8, R9.
            [regs.rdi, regs.rsi, regs.rdx, regs.rcx, regs.r8, regs.r9]
        }
    }

    #[inline(always)]
    fn tid_ok(cfg: &TriggerConfig, tid: u32) -> bool {
        let n = cfg.n_tids as usize;
        if n == 0 {
            return true;
        }
        let mut i = 0;
        while i < MAX_TIDS {
            if i >= n {
                break;
            }
            if cfg.tids[i] == tid {
                return true;
            }
            i += 1;
        }
        false
    }

    #[inline(always)]
    fn when_ok(cfg: &TriggerConfig, args: &[u64; NARGS]) -> bool {
        let n = cfg.n_conds as usize;
        let mut i = 0;
        while i < MAX_CONDS {
            if i >= n {
                break;
            }
            if !cfg.conds[i].holds(args) {
                return false;
            }
            i += 1;
        }
        true
    }

    /// The filter state of a trigger: one slot per trigger for a `--pid`
    /// trigger (an array lookup, which the verifier inlines), or one per
    /// trigger and process for an `--exe` trigger (LRU hash).
    #[inline(always)]
    fn state_of(trigger: u32, cfg: &TriggerConfig, tgid: u32) -> Option<*mut TriggerState> {
        if cfg.flags & CFG_PER_PROCESS == 0 {
            return ONE_STATE.get_ptr_mut(trigger);
        }
        let key = StateKey { trigger, tgid };
        if let Some(s) = STATE.get_ptr_mut(&key) {
            return Some(s);
        }
        // Two CPUs may race to create it: NOEXIST lets one win, and both then
        // use the same slot.
        let _ = STATE.insert(&key, &TriggerState::default(), BPF_NOEXIST as u64);
        STATE.get_ptr_mut(&key)
    }

    /// CLOCK_MONOTONIC and jiffies, each read at most once per hit and only
    /// when needed. Reading the precise clock (TSC) is the largest cost of a
    /// dropped hit; jiffies is a plain load. (`bpf_ktime_get_coarse_ns`
    /// would do too, but uprobe programs may not call it.)
    ///
    /// When the jiffies fast path is on (`tick_ns > 0`), jiffies is always
    /// read before the precise clock, so the jiffies a claim records is never
    /// later than its nanoseconds (see [`claim`]).
    struct Clock {
        ns: u64,
        jiffies: u64,
        use_jiffies: bool,
    }

    impl Clock {
        #[inline(always)]
        fn new(tick_ns: u64) -> Self {
            Self {
                ns: 0,
                jiffies: 0,
                use_jiffies: tick_ns > 0,
            }
        }

        #[inline(always)]
        fn now(&mut self) -> u64 {
            if self.ns == 0 {
                if self.use_jiffies {
                    self.jiffies();
                }
                // SAFETY: helper without arguments.
                self.ns = unsafe { bpf_ktime_get_ns() };
            }
            self.ns
        }

        #[inline(always)]
        fn jiffies(&mut self) -> u64 {
            if self.jiffies == 0 {
                // SAFETY: helper without arguments.
                self.jiffies = unsafe { bpf_jiffies64() };
            }
            self.jiffies
        }
    }

    /// Ticks kept off the jiffies fast path at the end of an interval (see
    /// [`claim`]): 1 because the claim's jiffies may be just before a tick,
    /// plus how far jiffies may trail the clock. The kernel lets a stalled
    /// jiffies update lag up to `MAX_STALLED_JIFFIES` = 5 ticks before
    /// another CPU takes it over (kernel/time/tick-sched.c), plus 1 for a
    /// tick in flight.
    const JIFFIES_MARGIN: u64 = 7;

    /// Takes the gate if the time is at or past its deadline `*next_ns`,
    /// moving the deadline to `now + interval_ns`. A compare-exchange makes
    /// this exact when two CPUs try at the same instant: only one wins.
    ///
    /// Fast path: while `jiffies < *closed_until`, the gate is surely closed
    /// and the precise clock is not read. The winner sets `closed_until` to
    /// `j0 + interval / tick - JIFFIES_MARGIN`, where `j0` is the jiffies it
    /// read before its precise clock. A later hit that sees jiffies `j` below
    /// that comes at most `(j - j0 + 1 + lag) * tick` after the claim, where
    /// lag is how many ticks jiffies may trail the clock; with the margin
    /// covering that, the precise check would drop the hit too. Hits near
    /// the end of the interval take the precise path.
    #[inline(always)]
    fn claim(
        next_ns: *mut u64,
        closed_until: *mut u64,
        clock: &mut Clock,
        interval_ns: u64,
        tick_ns: u64,
    ) -> bool {
        if tick_ns > 0 {
            // SAFETY: map value pointers that live as long as the map.
            let until = unsafe { core::ptr::read_volatile(closed_until) };
            if until != 0 && clock.jiffies() < until {
                return false;
            }
        }
        // SAFETY: as above.
        let next = unsafe { core::ptr::read_volatile(next_ns) };
        let now = clock.now();
        if now < next {
            return false;
        }
        // SAFETY: as above.
        if !unsafe { compare_exchange(next_ns, next, now + interval_ns) } {
            return false;
        }
        if tick_ns > 0 {
            let ticks = interval_ns / tick_ns;
            let until = if ticks > JIFFIES_MARGIN {
                clock.jiffies() + ticks - JIFFIES_MARGIN
            } else {
                0
            };
            // SAFETY: as above. Only the CAS winner writes it.
            unsafe { core::ptr::write_volatile(closed_until, until) };
        }
        true
    }

    /// The filters shared by entry and return, in order: every, rate,
    /// cooldown. Bumps the counter of the filter that drops the hit.
    #[inline(always)]
    fn gates(trigger: u32, cfg: &TriggerConfig, tgid: u32, clock: &mut Clock) -> bool {
        if cfg.every <= 1 && cfg.rate_interval_ns == 0 && cfg.cooldown_ns == 0 {
            return true;
        }
        let Some(state) = state_of(trigger, cfg, tgid) else {
            bump(trigger, Counter::DropError);
            return false;
        };
        if cfg.every > 1 {
            // SAFETY: `state` is a valid map value pointer.
            let n = unsafe { fetch_add(&raw mut (*state).every_count, 1) } + 1;
            if n % cfg.every != 0 {
                bump(trigger, Counter::DropEvery);
                return false;
            }
        }
        // SAFETY: `state` is a valid map value pointer.
        if cfg.rate_interval_ns > 0
            && !claim(
                unsafe { &raw mut (*state).rate_next_ns },
                unsafe { &raw mut (*state).rate_closed_until_jiffies },
                clock,
                cfg.rate_interval_ns,
                cfg.tick_ns,
            )
        {
            bump(trigger, Counter::DropRate);
            return false;
        }
        // SAFETY: `state` is a valid map value pointer.
        if cfg.cooldown_ns > 0
            && !claim(
                unsafe { &raw mut (*state).cooldown_next_ns },
                unsafe { &raw mut (*state).cooldown_closed_until_jiffies },
                clock,
                cfg.cooldown_ns,
                cfg.tick_ns,
            )
        {
            bump(trigger, Counter::DropCooldown);
            return false;
        }
        true
    }

    /// An accepted hit: written straight into a ring-buffer reservation, so
    /// nothing is built for hits the filters drop.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn emit<C: EbpfContext>(
        ctx: &C,
        trigger: u32,
        pid_tgid: u64,
        now: u64,
        args: &[u64; NARGS],
        duration_ns: u64,
        retval: u64,
        flags: u64,
        (entry_sp, return_address): (u64, u64),
    ) {
        bump(trigger, Counter::Accepted);
        match HITS.reserve::<Hit>(0) {
            Some(mut entry) => {
                entry.write(Hit {
                    ktime_ns: now,
                    tgid: (pid_tgid >> 32) as u32,
                    tid: pid_tgid as u32,
                    // SAFETY: helper without arguments.
                    cpu: unsafe { bpf_get_smp_processor_id() },
                    trigger,
                    args: *args,
                    duration_ns,
                    retval,
                    flags,
                    entry_sp,
                    return_address,
                });
                entry.submit(0);
                debug!(
                    ctx,
                    "mt-agent: hit accepted, trigger {} tid {}", trigger, pid_tgid as u32
                );
            }
            None => {
                bump(trigger, Counter::Lost);
                warn!(
                    ctx,
                    "mt-agent: ring buffer full, hit lost, trigger {}", trigger
                );
            }
        }
    }

    /// The frame stack of `key`, created empty if it has none.
    #[inline(always)]
    fn frame_stack(key: &FrameKey) -> Option<*mut FrameStack> {
        if let Some(stack) = FRAMES.get_ptr_mut(key) {
            return Some(stack);
        }
        let empty = EMPTY_FRAMES.get_ptr(0)?;
        // SAFETY: `empty` is a valid per-CPU map value. NOEXIST: only this
        // thread (goroutine) uses this key, so nothing else creates it.
        FRAMES
            .insert(key, unsafe { &*empty }, BPF_NOEXIST as u64)
            .ok()?;
        FRAMES.get_ptr_mut(key)
    }

    /// Identity of the current thread (SysV) or goroutine (Go), and the
    /// position of the current frame on its stack, as a number that grows
    /// with depth: for SysV `!rsp`; for Go, `g.stack.hi - rsp`, which stays
    /// the same when the runtime moves the goroutine's stack.
    #[inline(always)]
    fn frame_position(regs: &Regs, go_abi: bool, pid_tgid: u64) -> Option<(u64, u64)> {
        if go_abi {
            let g = regs.r14;
            // runtime.g starts with `stack struct { lo, hi uintptr }`.
            // SAFETY: bpf_probe_read_user copes with any address.
            let hi: u64 = unsafe { bpf_probe_read_user((g + 8) as *const u64) }.ok()?;
            Some((g, hi.wrapping_sub(regs.rsp)))
        } else {
            Some((pid_tgid, !regs.rsp))
        }
    }

    fn on_entry<C: EbpfContext>(ctx: &C, regs: *mut pt_regs) -> Option<()> {
        let (trigger, cfg) = trigger_of(ctx)?;
        let pid_tgid = bpf_get_current_pid_tgid();
        if !in_scope(cfg, pid_tgid) {
            return None;
        }
        bump(trigger, Counter::Seen);
        if !tid_ok(cfg, pid_tgid as u32) {
            bump(trigger, Counter::DropTid);
            return None;
        }
        let go_abi = cfg.flags & CFG_GO_ABI != 0;
        if cfg.flags & CFG_AT_RETURN != 0 {
            return remember_call(trigger, cfg, pid_tgid, &load_regs(regs), go_abi);
        }
        // The registers are read only when a condition needs them; a hit the
        // cooldown drops reads none.
        let mut args = [0u64; NARGS];
        if cfg.n_conds > 0 {
            args = read_args(&load_regs(regs), go_abi);
            if !when_ok(cfg, &args) {
                bump(trigger, Counter::DropWhen);
                return None;
            }
        }
        let mut clock = Clock::new(cfg.tick_ns);
        if !gates(trigger, cfg, (pid_tgid >> 32) as u32, &mut clock) {
            return None;
        }
        if cfg.n_conds == 0 {
            args = read_args(&load_regs(regs), go_abi);
        }
        emit(ctx, trigger, pid_tgid, clock.now(), &args, 0, 0, 0, (0, 0));
        Some(())
    }

    /// `--slower-than`, at entry: check `--when`, then remember the call on
    /// the thread's (goroutine's) frame stack; the return probe decides.
    #[inline(always)]
    fn remember_call(
        trigger: u32,
        cfg: &TriggerConfig,
        pid_tgid: u64,
        regs: &Regs,
        go_abi: bool,
    ) -> Option<()> {
        let args = read_args(regs, go_abi);
        if !when_ok(cfg, &args) {
            bump(trigger, Counter::DropWhen);
            return None;
        }
        // SAFETY: helper without arguments.
        let now = unsafe { bpf_ktime_get_ns() };
        let Some((id, pos)) = frame_position(regs, go_abi, pid_tgid) else {
            bump(trigger, Counter::DropError);
            return None;
        };
        let key = FrameKey {
            id,
            trigger,
            _pad: 0,
        };
        let Some(stack) = frame_stack(&key) else {
            bump(trigger, Counter::DropError);
            return None;
        };
        // SAFETY: map value pointer, only this thread (goroutine) touches it.
        let stack = unsafe { &mut *stack };
        // Frames at this depth or deeper belong to calls that have already
        // left without passing a probed `ret`.
        let mut i = 0;
        while i < MAX_DEPTH {
            let depth = stack.depth as usize;
            if depth == 0 || depth > MAX_DEPTH {
                break;
            }
            if stack.frames[depth - 1].sp < pos {
                break;
            }
            stack.depth -= 1;
            bump(trigger, Counter::DropNoReturn);
            i += 1;
        }
        let depth = stack.depth as usize;
        if depth >= MAX_DEPTH {
            bump(trigger, Counter::DropNoReturn);
            return None;
        }
        // The return address, read before any uretprobe of this uprobe
        // replaces it: the kernel runs every consumer's handler first, then
        // hijacks the return (`handler_chain`, kernel/events/uprobes.c).
        let return_address = if go_abi {
            0
        } else {
            // SAFETY: bpf_probe_read_user copes with any address.
            unsafe { bpf_probe_read_user(regs.rsp as *const u64) }.unwrap_or(0)
        };
        stack.frames[depth] = Frame {
            sp: pos,
            entry_ns: now,
            args,
            return_address,
        };
        stack.depth += 1;
        Some(())
    }

    fn on_return<C: EbpfContext>(ctx: &C, regs: *mut pt_regs, after_ret: bool) -> Option<()> {
        let (trigger, cfg) = trigger_of(ctx)?;
        let regs = load_regs(regs);
        let go_abi = cfg.flags & CFG_GO_ABI != 0;
        let pid_tgid = bpf_get_current_pid_tgid();
        if !in_scope(cfg, pid_tgid) {
            return None;
        }
        let (id, mut pos) = frame_position(&regs, go_abi, pid_tgid)?;
        // A uretprobe runs after the return: the stack pointer has moved up
        // past the return address, one slot above where the entry saw it.
        // A plain uprobe on `ret` sees the same value as the entry did.
        if after_ret {
            // SysV position is !rsp, Go's is hi - rsp: both shrink by 8 when
            // the `ret` pops the return address, so the entry saw pos + 8.
            pos = pos.wrapping_add(8);
        }
        let key = FrameKey {
            id,
            trigger,
            _pad: 0,
        };
        let stack = FRAMES.get_ptr_mut(&key)?;
        // SAFETY: as in `on_entry`.
        let stack = unsafe { &mut *stack };
        let mut i = 0;
        let mut found: Option<Frame> = None;
        while i < MAX_DEPTH {
            let depth = stack.depth as usize;
            if depth == 0 || depth > MAX_DEPTH {
                break;
            }
            let top = stack.frames[depth - 1];
            if top.sp < pos {
                // An outer call: this return is not one we saw enter.
                break;
            }
            stack.depth -= 1;
            if top.sp == pos {
                found = Some(top);
                break;
            }
            // Deeper than us: that call left without a probed `ret`.
            bump(trigger, Counter::DropNoReturn);
            i += 1;
        }
        if stack.depth == 0 {
            // No open call left on this thread: free its slot. `found` is a
            // copy, so the frame outlives the entry.
            let _ = FRAMES.remove(&key);
        }
        // A `--slower-than` trigger is never disarmed, so every return of a
        // call seen entering is seen too (docs/disarming.md).
        let frame = found?;
        let mut clock = Clock::new(cfg.tick_ns);
        let now = clock.now();
        let duration_ns = now.saturating_sub(frame.entry_ns);
        if duration_ns < cfg.slower_than_ns {
            bump(trigger, Counter::DropDuration);
            return None;
        }
        if !gates(trigger, cfg, (pid_tgid >> 32) as u32, &mut clock) {
            return None;
        }
        emit(
            ctx,
            trigger,
            pid_tgid,
            now,
            &frame.args,
            duration_ns,
            regs.rax,
            HIT_AT_RETURN,
            // SysV's position is !rsp at entry: the return address's slot.
            if go_abi {
                (0, 0)
            } else {
                (!frame.sp, frame.return_address)
            },
        );
        Some(())
    }
}

#[cfg(not(target_arch = "bpf"))]
fn main() {
    // Only meaningful for the BPF target; see agent/build.rs.
}
