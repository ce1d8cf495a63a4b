//! A capture run's data path: the driver thread, one perf recorder per traced process, and the snapshot state machine.

pub mod build_id_cache;
pub mod disk_budget;
pub mod driver;
pub mod end;
pub mod jit_maps;
pub mod keep_debug;
pub mod outcome;
pub mod recorder;
pub mod snapshot;
pub mod target;
