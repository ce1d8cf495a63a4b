//! What a run writes: its events on stdout, the index of its snapshots, and `run.json`.

pub mod counters;
pub mod events;
pub mod index;
pub mod jit_kept;
pub mod run_file;
pub mod runs;
pub mod write;
