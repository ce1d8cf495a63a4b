//! The clock of a run: CLOCK_MONOTONIC, the clock of the eBPF programs'
//! `bpf_ktime_get_ns`. The driver reads it; the recorder and the snapshot
//! state machine are given the time, so that their logic can be tested
//! without waiting.

use std::time::Instant;

use nix::{
    sys::time::TimeSpec,
    time::{ClockId, clock_gettime},
};

/// CLOCK_MONOTONIC now, in ns: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let ts: TimeSpec = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// One reading of the clock, in both forms: an [`Instant`] for timeouts and
/// CLOCK_MONOTONIC ns for comparing with hits' `ktime_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub at: Instant,
    /// CLOCK_MONOTONIC, ns.
    pub ns: u64,
}

impl Now {
    /// Reads the clock.
    pub fn read() -> Self {
        Self {
            at: Instant::now(),
            ns: monotonic_ns(),
        }
    }
}
