//! Reading the kernel's counters of a trigger (the `COUNTERS` and `FRAMES` maps), summed over CPUs.

use crate::output::counters::{CounterValues, DROP_REASONS, Dropped};
use agent_common::{Counter, FrameKey, FrameStack, NCOUNTERS};
use aya::maps::{HashMap, MapData, PerCpuArray};

/// Reads the per-CPU counters (and open `--slower-than` calls).
pub struct Counters {
    counters: PerCpuArray<MapData, u64>,
    frames: HashMap<MapData, FrameKey, FrameStack>,
}

impl Counters {
    /// The reader of the COUNTERS and FRAMES maps.
    pub fn new(
        counters: PerCpuArray<MapData, u64>,
        frames: HashMap<MapData, FrameKey, FrameStack>,
    ) -> Self {
        Self { counters, frames }
    }

    /// One trigger's counters, summed over CPUs.
    pub fn read(&self, trigger: u32) -> CounterValues {
        let get = |c: Counter| -> u64 {
            self.counters
                .get(&(trigger * NCOUNTERS + c as u32), 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0)
        };
        CounterValues {
            seen: get(Counter::Seen),
            dropped: Dropped(DROP_REASONS.map(|r| get(r.counter))),
            accepted: get(Counter::Accepted),
            lost: get(Counter::Lost),
        }
    }

    /// `--slower-than` calls of a trigger that were entered and have not
    /// returned (still running, or left in a way no probe saw).
    pub fn open_calls(&self, trigger: u32) -> u64 {
        self.frames
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, _)| k.trigger == trigger)
            .map(|(_, v)| u64::from(v.depth))
            .sum()
    }
}
