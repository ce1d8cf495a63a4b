//! The kernel-side filters, tested the way aya tests itself: a uprobe on a
//! `#[no_mangle] #[inline(never)]` function of this test process, the
//! function called N times, then the counters and the ring buffer checked
//! exactly. No perf, no other process, no sleep: a uprobe's eBPF program
//! runs in the calling thread, inside the trap, so when a call returns its
//! hit is already counted (and, if accepted, in the ring buffer).
//!
//! The filters with a clock (`--max-rate`, `--cooldown`) are made exact by
//! choosing intervals far longer than the test: the first call takes the
//! gate, every later one finds it closed.
//!
//! These tests need root (BPF and the uprobe PMU). `cargo xtask test` runs
//! them in its privileged stage (`cargo test -p mt-agent --test kernel --
//! --ignored`); without root they fail and
//! say so, they never skip.

use std::{
    hint::black_box,
    path::PathBuf,
    sync::{Mutex, MutexGuard, mpsc},
    time::Duration,
};

use agent_common::{DEFAULT_RING_BYTES, HIT_AT_RETURN, Hit};
use aya::maps::{MapData, RingBuf};

use mt_agent::{
    disarm::{event_uprobes::EventUprobes, tracefs_events::UprobeEvents},
    probe::{
        LoadOptions, Probes,
        uprobes::{Program, ProgramFds, TriggerUprobes, Uprobe},
    },
};
use mt_agent::{output::counters::CounterValues, probe::counters::Counters};
use mt_agent::{
    plan::conditions::{Filters, trigger_config},
    symbols::maps::parse_maps,
};

const ROOT: &str = "needs root: run by cargo xtask test's privileged stage";

/// The probed function. `extern "C"`, so its arguments are in RDI, RSI and
/// RDX, where the eBPF program reads arg0..arg2 (SysV).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn mt_kernel_test_first(a0: u64, a1: u64, a2: u64) -> u64 {
    black_box(a0).wrapping_add(black_box(a1)) ^ black_box(a2)
}

/// A second probed function (a different body, so the two cannot be merged).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn mt_kernel_test_second(a0: u64, a1: u64, a2: u64) -> u64 {
    black_box(a0).wrapping_mul(black_box(a1)) | black_box(a2)
}

/// A probed function whose calls last at least `ms` milliseconds (the
/// workload of the `--slower-than` test); returns `2 * tag`.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn mt_kernel_test_timed(ms: u64, tag: u64, _unused: u64) -> u64 {
    if black_box(ms) > 0 {
        std::thread::sleep(Duration::from_millis(ms));
    }
    black_box(tag).wrapping_mul(2)
}

type Probed = extern "C" fn(u64, u64, u64) -> u64;

/// Calls `f` through an opaque pointer, so the call cannot be optimized out.
fn call(f: Probed, a0: u64, a1: u64, a2: u64) {
    black_box(black_box(f)(a0, a1, a2));
}

/// One test at a time: they all probe the same functions of this process.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The file and file offset the kernel needs for a uprobe on `f`, from
/// /proc/self/maps.
fn location(f: Probed) -> (PathBuf, u64) {
    let addr = f as usize as u64;
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    let m = parse_maps(&maps)
        .into_iter()
        .find(|m| m.start <= addr && addr < m.end)
        .unwrap_or_else(|| panic!("{addr:#x} is in no file mapping of /proc/self/maps"));
    (m.path, addr - m.start + m.offset)
}

/// The loaded programs with triggers attached to functions of this process.
/// Dropping it detaches the uprobes and unloads the programs.
struct Traced {
    probes: Probes,
    counters: Counters,
    ring: RingBuf<MapData>,
}

impl Traced {
    /// Loads the eBPF object, then configures and attaches one trigger per
    /// `(function, filters)`, trigger `i` for the `i`th. Panics (never
    /// skips) when the kernel refuses.
    /// With `uretprobe`, each trigger also gets a uretprobe
    /// (`--use-uretprobe`), for `--slower-than`.
    fn new(triggers: &[(Probed, Filters)], ring_bytes: u32, uretprobe: bool) -> Self {
        let mut probes = Probes::load(LoadOptions {
            returns: false,
            uretprobe,
            ring_bytes,
            verbose: false,
            single_trigger: (triggers.len() == 1).then_some(0),
            follow_forks: false,
        })
        .unwrap_or_else(|e| panic!("{e} ({ROOT})"));
        for (i, (f, filters)) in triggers.iter().enumerate() {
            let trigger = i as u32;
            let cfg = trigger_config(filters, false).expect("valid filters");
            probes
                .configure(trigger, &cfg)
                .unwrap_or_else(|e| panic!("writing CONFIG: {e} ({ROOT})"));
            let (path, entry_offset) = location(*f);
            probes
                .attach(&TriggerUprobes::new(
                    trigger,
                    path,
                    Some(std::process::id() as i32),
                    false,
                    entry_offset,
                    uretprobe
                        .then_some(Uprobe {
                            program: Program::Uretprobe,
                            offset: entry_offset,
                        })
                        .into_iter()
                        .collect(),
                ))
                .unwrap_or_else(|e| panic!("{e} ({ROOT})"));
            assert_eq!(probes.attached_for(trigger), 1 + usize::from(uretprobe));
        }
        let counters = probes.take_counters().expect("COUNTERS map");
        let ring = probes.take_ring().expect("HITS ring buffer");
        Self {
            probes,
            counters,
            ring,
        }
    }

    /// Triggers 0 and 1 on the first and second functions, without
    /// filters: two triggers, so the program reads the attach cookie.
    fn two() -> Self {
        Self::new(
            &[
                (mt_kernel_test_first, Filters::default()),
                (mt_kernel_test_second, Filters::default()),
            ],
            DEFAULT_RING_BYTES,
            false,
        )
    }

    /// One trigger on `f` with the default ring buffer.
    fn one(f: Probed, filters: Filters) -> Self {
        Self::new(&[(f, filters)], DEFAULT_RING_BYTES, false)
    }

    fn counts(&self, trigger: u32) -> CounterValues {
        self.counters.read(trigger)
    }

    /// Every record in the ring buffer now, oldest first.
    fn hits(&mut self) -> Vec<Hit> {
        let mut hits = Vec::new();
        while let Some(item) = self.ring.next() {
            assert_eq!(item.len(), size_of::<Hit>(), "record size");
            // SAFETY: the record is a `Hit` written by the eBPF program
            // (checked size; `Hit` is `repr(C)` plain data).
            hits.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<Hit>()) });
        }
        hits
    }
}

/// This process's fds for BPF objects and perf events (uprobe links), as
/// `/proc/self/fd` names them: `anon_inode:bpf-prog`, `anon_inode:bpf-map`,
/// `anon_inode:bpf_link`, `anon_inode:[perf_event]`.
fn bpf_fds() -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|target| target.display().to_string())
        .filter(|t| t.contains("bpf") || t.contains("perf_event"))
        .collect()
}

fn own_tid() -> u32 {
    nix::unistd::gettid().as_raw() as u32
}

/// `seen = Σ dropped + accepted` (no `--slower-than` calls are open), and
/// every accepted hit is delivered or lost.
fn assert_balanced(c: &CounterValues, delivered: usize) {
    assert_eq!(c.seen, c.dropped.total() + c.accepted, "{c:?}");
    assert_eq!(c.accepted, delivered as u64 + c.lost, "{c:?}");
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn without_filters_every_call_is_accepted_with_its_arguments() {
    let _one = serial();
    let mut t = Traced::one(mt_kernel_test_first, Filters::default());
    for i in 0..25 {
        call(mt_kernel_test_first, i, 2 * i, u64::MAX - i);
    }
    let c = t.counts(0);
    assert_eq!(
        c,
        CounterValues {
            seen: 25,
            accepted: 25,
            ..Default::default()
        }
    );
    let hits = t.hits();
    assert_balanced(&c, hits.len());
    let (pid, tid) = (std::process::id(), own_tid());
    for (i, h) in (0..).zip(&hits) {
        assert_eq!(h.args[..3], [i, 2 * i, u64::MAX - i], "hit {i}");
        assert_eq!((h.tgid, h.tid, h.trigger, h.flags), (pid, tid, 0, 0));
        assert_eq!(h.duration_ns, 0);
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn when_keeps_the_calls_whose_arguments_match_every_condition() {
    let _one = serial();
    let when = vec!["arg0 >= 10".into(), "arg1 & 1".into()];
    let mut t = Traced::one(
        mt_kernel_test_first,
        Filters {
            when,
            ..Default::default()
        },
    );
    for i in 0..30 {
        call(mt_kernel_test_first, i, i, 0);
    }
    let c = t.counts(0);
    // i in 10..30 and odd: 11, 13, ..., 29.
    assert_eq!(
        (c.seen, c.accepted, c.dropped.get("when")),
        (30, 10, 20),
        "{c:?}"
    );
    let got: Vec<u64> = t.hits().iter().map(|h| h.args[0]).collect();
    assert_eq!(got, (11..30).step_by(2).collect::<Vec<_>>());
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn when_compares_sarg_as_signed_and_arg_as_unsigned() {
    let _one = serial();
    let when = vec!["sarg2 < 0".into(), "arg2 > 100".into()];
    let mut t = Traced::one(
        mt_kernel_test_first,
        Filters {
            when,
            ..Default::default()
        },
    );
    // -5..5: negative values pass both (as unsigned they are huge).
    for v in -5i64..5 {
        call(mt_kernel_test_first, 0, 0, v as u64);
    }
    let c = t.counts(0);
    assert_eq!(
        (c.seen, c.accepted, c.dropped.get("when")),
        (10, 5, 5),
        "{c:?}"
    );
    let got: Vec<i64> = t.hits().iter().map(|h| h.args[2] as i64).collect();
    assert_eq!(got, vec![-5, -4, -3, -2, -1]);
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn every_3_accepts_each_third_call() {
    let _one = serial();
    let mut t = Traced::one(
        mt_kernel_test_first,
        Filters {
            every: Some(3),
            ..Default::default()
        },
    );
    for i in 1..=30 {
        call(mt_kernel_test_first, i, 0, 0);
    }
    let c = t.counts(0);
    assert_eq!(
        (c.seen, c.accepted, c.dropped.get("every")),
        (30, 10, 20),
        "{c:?}"
    );
    let got: Vec<u64> = t.hits().iter().map(|h| h.args[0]).collect();
    assert_eq!(got, (3..=30).step_by(3).collect::<Vec<_>>());
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn cooldown_of_an_hour_accepts_only_the_first_call() {
    let _one = serial();
    let mut t = Traced::one(
        mt_kernel_test_first,
        Filters {
            cooldown: Duration::from_secs(3600),
            ..Default::default()
        },
    );
    for i in 0..50 {
        call(mt_kernel_test_first, i, 0, 0);
    }
    let c = t.counts(0);
    assert_eq!(
        (c.seen, c.accepted, c.dropped.get("cooldown")),
        (50, 1, 49),
        "{c:?}"
    );
    let hits = t.hits();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].args[0], 0, "the first call is the one accepted");
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn max_rate_of_one_an_hour_accepts_only_the_first_call() {
    let _one = serial();
    let mut t = Traced::one(
        mt_kernel_test_first,
        Filters {
            max_rate: Some(1.0 / 3600.0),
            ..Default::default()
        },
    );
    for i in 0..50 {
        call(mt_kernel_test_first, i, 0, 0);
    }
    let c = t.counts(0);
    assert_eq!(
        (c.seen, c.accepted, c.dropped.get("rate")),
        (50, 1, 49),
        "{c:?}"
    );
    assert_eq!(t.hits().iter().map(|h| h.args[0]).collect::<Vec<_>>(), [0]);
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn filters_run_in_order_when_every_rate_cooldown() {
    let _one = serial();
    let mut t = Traced::one(
        mt_kernel_test_first,
        Filters {
            when: vec!["arg0 >= 10".into()],
            every: Some(3),
            max_rate: Some(1.0 / 3600.0),
            cooldown: Duration::from_secs(3600),
            ..Default::default()
        },
    );
    for i in 0..40 {
        call(mt_kernel_test_first, i, 0, 0);
    }
    let c = t.counts(0);
    // 10 fail `when`; of the 30 left, `every` keeps 10; the rate gate takes
    // the first of those and drops 9; the cooldown sees only that one.
    let dropped = mt_agent::output::counters::Dropped::from_fields(&[
        ("when", 10),
        ("every", 20),
        ("rate", 9),
    ]);
    assert_eq!(
        c,
        CounterValues {
            seen: 40,
            dropped,
            accepted: 1,
            lost: 0
        }
    );
    let hits = t.hits();
    assert_balanced(&c, hits.len());
    assert_eq!(hits[0].args[0], 12, "the third call with arg0 >= 10");
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn tid_keeps_only_the_calls_of_the_listed_thread() {
    let _one = serial();
    let (tid_tx, tid_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        tid_tx.send(own_tid()).expect("send tid");
        go_rx.recv().expect("go");
        for i in 100..107 {
            call(mt_kernel_test_first, i, 0, 0);
        }
    });
    let other_tid = tid_rx.recv().expect("the thread's tid");
    let mut t = Traced::one(
        mt_kernel_test_first,
        Filters {
            tids: vec![other_tid],
            ..Default::default()
        },
    );
    for i in 0..20 {
        call(mt_kernel_test_first, i, 0, 0);
    }
    go_tx.send(()).expect("start the thread");
    other.join().expect("the thread");
    let c = t.counts(0);
    assert_eq!(
        (c.seen, c.accepted, c.dropped.get("tid")),
        (27, 7, 20),
        "{c:?}"
    );
    let hits = t.hits();
    assert_balanced(&c, hits.len());
    assert!(hits.iter().all(|h| h.tid == other_tid));
    assert!(hits.iter().all(|h| h.tgid == std::process::id()));
    let got: Vec<u64> = hits.iter().map(|h| h.args[0]).collect();
    assert_eq!(got, (100..107).collect::<Vec<_>>());
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn a_full_ring_buffer_counts_the_accepted_hits_it_lost() {
    let _one = serial();
    // One page holds about 39 records of 104 bytes (header included).
    let mut t = Traced::new(&[(mt_kernel_test_first, Filters::default())], 4096, false);
    for i in 0..100 {
        call(mt_kernel_test_first, i, 0, 0);
    }
    let c = t.counts(0);
    let hits = t.hits();
    assert_eq!((c.seen, c.accepted), (100, 100), "{c:?}");
    assert!(c.lost > 0 && !hits.is_empty(), "{c:?}, {} read", hits.len());
    assert_balanced(&c, hits.len());
    let got: Vec<u64> = hits.iter().map(|h| h.args[0]).collect();
    assert_eq!(
        got,
        (0..hits.len() as u64).collect::<Vec<_>>(),
        "the first ones fit"
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn each_trigger_has_its_own_settings_and_counters() {
    let _one = serial();
    let every_2 = Filters {
        every: Some(2),
        ..Default::default()
    };
    let mut t = Traced::new(
        &[
            (mt_kernel_test_first, every_2),
            (mt_kernel_test_second, Filters::default()),
        ],
        DEFAULT_RING_BYTES,
        false,
    );
    for i in 0..20 {
        call(mt_kernel_test_first, i, 1, 0);
    }
    for i in 0..7 {
        call(mt_kernel_test_second, i, 1, 0);
    }
    let (first, second) = (t.counts(0), t.counts(1));
    assert_eq!(
        (first.seen, first.accepted, first.dropped.get("every")),
        (20, 10, 10)
    );
    assert_eq!(
        second,
        CounterValues {
            seen: 7,
            accepted: 7,
            ..Default::default()
        }
    );
    let hits = t.hits();
    assert_eq!(hits.iter().filter(|h| h.trigger == 0).count(), 10);
    assert_eq!(hits.iter().filter(|h| h.trigger == 1).count(), 7);
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn a_detached_trigger_sees_no_more_calls() {
    let _one = serial();
    let mut t = Traced::one(mt_kernel_test_first, Filters::default());
    for i in 0..5 {
        call(mt_kernel_test_first, i, 0, 0);
    }
    t.probes.detach_trigger(0);
    assert_eq!(t.probes.attached_for(0), 0);
    for i in 5..10 {
        call(mt_kernel_test_first, i, 0, 0);
    }
    let c = t.counts(0);
    assert_eq!((c.seen, c.accepted), (5, 5), "{c:?}");
    assert_eq!(t.hits().len(), 5);
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn dropping_the_probes_closes_every_bpf_and_perf_fd() {
    let _one = serial();
    let before = bpf_fds();
    let t = Traced::one(mt_kernel_test_first, Filters::default());
    call(mt_kernel_test_first, 1, 2, 3);
    assert_eq!(t.counts(0).accepted, 1);
    assert!(bpf_fds().len() > before.len(), "{:?}", bpf_fds());
    drop(t);
    assert_eq!(bpf_fds(), before, "left open after drop");
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn slower_than_accepts_the_slow_calls_at_their_return() {
    let _one = serial();
    let threshold = Duration::from_millis(100);
    let mut t = Traced::new(
        &[(
            mt_kernel_test_timed,
            Filters {
                slower_than: Some(threshold),
                cooldown: Duration::ZERO,
                ..Default::default()
            },
        )],
        DEFAULT_RING_BYTES,
        true,
    );
    // Tags 0..10 return at once; tags 10..13 last at least 150 ms each.
    for tag in 0..10 {
        call(mt_kernel_test_timed, 0, tag, 0);
    }
    for tag in 10..13 {
        call(mt_kernel_test_timed, 150, tag, 0);
    }
    let c = t.counts(0);
    let hits = t.hits();
    assert_balanced(&c, hits.len());
    assert_eq!(t.counters.open_calls(0), 0, "every call returned");
    assert_eq!(c.seen, 13, "{c:?}");
    // A fast call counts as slow only if this thread was descheduled for
    // 100 ms inside it; whichever way, each accepted hit is a call that
    // lasted at least the threshold, and every slow call is accepted.
    assert_eq!(c.accepted + c.dropped.get("duration"), 13, "{c:?}");
    let slow: Vec<u64> = hits
        .iter()
        .map(|h| h.args[1])
        .filter(|&tag| tag >= 10)
        .collect();
    assert_eq!(slow, [10, 11, 12], "{hits:?}");
    for h in &hits {
        assert!(h.duration_ns >= threshold.as_nanos() as u64, "{h:?}");
        assert_eq!(h.flags & HIT_AT_RETURN, HIT_AT_RETURN, "{h:?}");
        assert_eq!(h.retval, 2 * h.args[1], "the return value (RAX): {h:?}");
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn taken_links_detach_on_drop_and_a_raw_attach_counts_for_its_cookie() {
    let _one = serial();
    // Two triggers, so the program reads the attach cookie.
    let mut t = Traced::two();
    call(mt_kernel_test_second, 1, 0, 0);
    // Disarm trigger 1 the way the driver does: take its links, drop them.
    let links = t.probes.take_trigger_links(1);
    assert_eq!(links.len(), 1);
    assert_eq!(t.probes.attached_for(1), 0);
    drop(links);
    call(mt_kernel_test_second, 2, 0, 0);
    assert_eq!(t.counts(1).seen, 1, "a call while disarmed was seen");
    // Re-arm it the way the arming thread does.
    let prog = t.probes.program_fd(Program::Entry).expect("mt_entry fd");
    let (path, offset) = location(mt_kernel_test_second);
    let pid = std::process::id() as i32;
    let link = mt_agent::sys::perf_event::attach(
        std::os::fd::AsFd::as_fd(&prog),
        &path,
        offset,
        false,
        pid,
        1,
    )
    .unwrap_or_else(|e| panic!("raw attach: {e} ({ROOT})"));
    for i in 3..6 {
        call(mt_kernel_test_second, i, 0, 0);
    }
    drop(link);
    call(mt_kernel_test_second, 6, 0, 0);
    let c = t.counts(1);
    assert_eq!((c.seen, c.accepted), (4, 4), "{c:?}");
    assert_eq!(t.counts(0).seen, 0);
    let args: Vec<u64> = t
        .hits()
        .iter()
        .filter(|h| h.trigger == 1)
        .map(|h| h.args[0])
        .collect();
    assert_eq!(args, vec![1, 3, 4, 5]);
}

/// Trigger 0 on `mt_kernel_test_first`, following forks from this process
/// (its uprobe file-wide), with `target_tgid` in its settings if given;
/// the loaded programs and those settings.
fn following(target_tgid: Option<u32>) -> (Probes, agent_common::TriggerConfig) {
    let mut probes = Probes::load(LoadOptions {
        returns: false,
        uretprobe: false,
        ring_bytes: DEFAULT_RING_BYTES,
        verbose: false,
        single_trigger: Some(0),
        follow_forks: true,
    })
    .unwrap_or_else(|e| panic!("{e} ({ROOT})"));
    let mut cfg = trigger_config(&Filters::default(), false).expect("valid filters");
    cfg.flags |= agent_common::CFG_FOLLOW_FORKS;
    if let Some(t) = target_tgid {
        cfg.target_tgid = t;
    }
    probes.configure(0, &cfg).expect("writing CONFIG");
    let (path, entry_offset) = location(mt_kernel_test_first);
    probes
        .attach(&TriggerUprobes::new(
            0,
            path,
            Some(std::process::id() as i32),
            true,
            entry_offset,
            Vec::new(),
        ))
        .unwrap_or_else(|e| panic!("{e} ({ROOT})"));
    (probes, cfg)
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn following_forks_counts_the_followed_process_and_its_children_only() {
    let _one = serial();
    let me = std::process::id() as i32;
    let (mut probes, _) = following(None);
    let counters = probes.take_counters().expect("COUNTERS map");
    let mut ring = probes.take_ring().expect("HITS ring buffer");
    // Not followed yet: the file-wide uprobe fires, the call counts nowhere.
    call(mt_kernel_test_first, 1, 2, 3);
    assert_eq!(counters.read(0).seen, 0);
    probes.follow(me).unwrap_or_else(|e| panic!("{e} ({ROOT})"));
    call(mt_kernel_test_first, 1, 2, 3);
    assert_eq!(counters.read(0).seen, 1);
    // A child forked now is followed from its first instruction.
    // SAFETY: the child only calls a plain function and `_exit`s.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
    if child == 0 {
        for i in 0..3 {
            call(mt_kernel_test_first, i, 0, 0);
        }
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    let c = counters.read(0);
    assert_eq!((c.seen, c.accepted), (4, 4), "{c:?}");
    let mut tgids = Vec::new();
    while let Some(item) = ring.next() {
        // SAFETY: a `Hit` record written by the eBPF program.
        let hit: Hit = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
        tgids.push(hit.tgid as i32);
    }
    assert_eq!(tgids, [me, child, child, child]);
    // The child has exited: mt_exit forgot it; this process stays.
    assert!(!probes.is_followed(child));
    assert!(probes.is_followed(me));
}

/// The run's tracefs uprobe events (this process's group).
fn new_events() -> std::sync::Arc<UprobeEvents> {
    let dir = mt_agent::disarm::tracefs_events::tracefs().expect("tracefs ({ROOT})");
    std::sync::Arc::new(UprobeEvents::new(dir))
}

/// The first byte of a function of this process.
fn first_byte(f: Probed) -> u8 {
    let code = f as usize as *const u8;
    // SAFETY: the first byte of a function of this process, mapped and
    // readable; read volatile, since the kernel rewrites the page.
    unsafe { std::ptr::read_volatile(code) }
}

/// Event uprobes on `f`'s entry in this process, with `t`'s entry program
/// and `trigger`'s cookie, armed.
fn own_event_uprobes(
    t: &Traced,
    events: &std::sync::Arc<UprobeEvents>,
    trigger: u32,
    f: Probed,
) -> EventUprobes {
    let (path, offset) = location(f);
    let uprobes = TriggerUprobes::new(
        trigger,
        path,
        Some(std::process::id() as i32),
        false,
        offset,
        Vec::new(),
    );
    let programs = ProgramFds::of(&t.probes, &uprobes).expect("mt_entry fd");
    EventUprobes::build(events.clone(), &uprobes, &programs, &mut Vec::new())
        .unwrap_or_else(|e| panic!("{e} ({ROOT})"))
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn event_uprobes_put_the_breakpoint_in_and_take_it_out_and_count_for_their_cookie() {
    let _one = serial();
    // Two triggers, so the program reads the attach cookie; trigger 1's
    // uprobe is an event uprobe, not an aya link.
    let mut t = Traced::two();
    drop(t.probes.take_trigger_links(1));
    let events = new_events();
    let byte = || first_byte(mt_kernel_test_second);
    let original = byte();
    let mut event_uprobes = own_event_uprobes(&t, &events, 1, mt_kernel_test_second);
    assert_eq!(event_uprobes.len(), 1);
    assert_eq!(byte(), 0xcc, "armed: an int3 at the function");
    call(mt_kernel_test_second, 1, 0, 0);
    event_uprobes.disarm();
    assert_eq!(byte(), original, "disarmed: the function's own byte");
    call(mt_kernel_test_second, 2, 0, 0);
    event_uprobes.arm().unwrap_or_else(|e| panic!("arm: {e}"));
    assert_eq!(byte(), 0xcc, "armed again");
    call(mt_kernel_test_second, 3, 0, 0);
    let listing = || std::fs::read_to_string(events.uprobe_events()).expect("read uprobe_events");
    assert!(listing().contains(&format!("{}/", events.group())));
    drop(event_uprobes);
    assert_eq!(byte(), original, "dropped");
    assert!(
        !listing().contains(&format!("{}/", events.group())),
        "the event uprobe's event is deleted: {}",
        listing()
    );
    let c = t.counts(1);
    assert_eq!((c.seen, c.accepted), (2, 2), "{c:?}");
    let args: Vec<u64> = t.hits().iter().map(|h| h.args[0]).collect();
    assert_eq!(args, vec![1, 3]);
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn a_warm_up_changes_no_code_and_its_event_goes_with_it() {
    use mt_agent::disarm::rcu_warmup::RcuWarmup;
    let _one = serial();
    let mut t = Traced::one(mt_kernel_test_second, Filters::default());
    // The event uprobe is the function's only uprobe.
    drop(t.probes.take_trigger_links(0));
    let events = new_events();
    let listing = || std::fs::read_to_string(events.uprobe_events()).expect("read uprobe_events");
    let mut warmer = RcuWarmup::new(events.clone()).unwrap_or_else(|e| panic!("{e} ({ROOT})"));
    let memfd = format!("/proc/{}/fd/", std::process::id());
    assert!(
        listing().contains(&format!("{}/", events.group())) && listing().contains(&memfd),
        "the warm-up event is on the agent's memfd: {}",
        listing()
    );
    let byte = || first_byte(mt_kernel_test_second);
    let original = byte();
    let mut event_uprobes = own_event_uprobes(&t, &events, 0, mt_kernel_test_second);
    warmer.warm().unwrap_or_else(|e| panic!("warm-up: {e}"));
    assert_eq!(byte(), 0xcc, "a warm-up leaves armed event uprobes in");
    event_uprobes.disarm();
    assert_ne!(byte(), 0xcc, "disarmed");
    warmer.warm().unwrap_or_else(|e| panic!("warm-up: {e}"));
    assert_eq!(byte(), original, "a warm-up puts no breakpoint in");
    event_uprobes
        .arm()
        .unwrap_or_else(|e| panic!("arm after a warm-up: {e}"));
    assert_eq!(byte(), 0xcc, "armed after a warm-up");
    drop(event_uprobes);
    drop(warmer);
    assert!(
        !listing().contains(&format!("{}/", events.group())),
        "the warm-up event is deleted with it: {}",
        listing()
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn the_target_counts_without_a_followed_entry_until_it_exits() {
    let _one = serial();
    let me = std::process::id() as i32;
    let (mut probes, mut cfg) = following(Some(me as u32));
    let counters = probes.take_counters().expect("COUNTERS map");
    // The target's calls count with FOLLOWED empty.
    call(mt_kernel_test_first, 1, 2, 3);
    assert!(!probes.is_followed(me));
    assert_eq!(counters.read(0).seen, 1);
    // A child that waits on a pipe, then calls twice and exits; it becomes
    // the trigger's target (and is followed, which attaches mt_exit).
    let mut fds = [0; 2];
    // SAFETY: a plain pipe(2) into a 2-int array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only reads a pipe, calls a plain function and `_exit`s.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork: {}", std::io::Error::last_os_error());
    if child == 0 {
        let mut byte = 0u8;
        // SAFETY: reads one byte into a local.
        unsafe { libc::read(fds[0], (&raw mut byte).cast(), 1) };
        call(mt_kernel_test_first, 4, 0, 0);
        call(mt_kernel_test_first, 5, 0, 0);
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    cfg.target_tgid = child as u32;
    probes.configure(0, &cfg).expect("writing CONFIG");
    probes
        .follow(child)
        .unwrap_or_else(|e| panic!("{e} ({ROOT})"));
    // SAFETY: writes one byte from a local.
    assert_eq!(unsafe { libc::write(fds[1], [1u8].as_ptr().cast(), 1) }, 1);
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    // SAFETY: closes the pipe this test opened.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    assert_eq!(counters.read(0).seen, 3);
    // The child has exited: mt_exit took it out of the settings too, so a
    // process that reuses its pid would go through FOLLOWED (and miss).
    assert_eq!(probes.config(0).target_tgid, 0);
    assert!(!probes.is_followed(child));
    // This process is no longer the target and was never followed.
    call(mt_kernel_test_first, 6, 0, 0);
    assert_eq!(counters.read(0).seen, 3);
}

#[test]
#[ignore = "needs root: run by cargo xtask test's privileged stage"]
fn a_link_dropped_with_a_holder_child_stays_until_the_child_lets_it_go() {
    use mt_agent::probe::detach::{Detacher, fork_holder};
    let _one = serial();
    let mut t = Traced::two();
    let code = mt_kernel_test_second as Probed as usize as *const u8;
    // SAFETY: as in the event uprobes test above.
    let byte = || unsafe { std::ptr::read_volatile(code) };
    assert_eq!(byte(), 0xcc, "attached: an int3 at the function");
    let links = t.probes.take_trigger_links(1);
    assert_eq!(links.len(), 1);
    let (pid, go) = fork_holder().unwrap_or_else(|e| panic!("fork: {e}"));
    // Not the last close: the uprobe stays registered, and fires.
    drop(links);
    assert_eq!(byte(), 0xcc, "the agent's close removed the uprobe");
    call(mt_kernel_test_second, 1, 0, 0);
    assert_eq!(t.counts(1).seen, 1);
    // The child's close is the last: the uprobe goes.
    drop(go);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    assert!(Detacher::of(pid).wait(deadline), "the child never ended");
    assert_ne!(byte(), 0xcc, "the child's close left the int3");
    call(mt_kernel_test_second, 2, 0, 0);
    let c = t.counts(1);
    assert_eq!((c.seen, c.accepted), (1, 1), "{c:?}");
    let args: Vec<u64> = t.hits().iter().map(|h| h.args[0]).collect();
    assert_eq!(args, vec![1]);
}
