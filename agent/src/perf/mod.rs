//! perf, the profiler mt-agent drives: its binary, `perf record` with switch-output, and what its files hold.

pub mod args;
pub mod binary;
pub mod data;
pub mod kallsyms;
pub mod offcpu;
pub mod record;
pub mod unwind;
