//! Empty library target. The programs are in the `mt-agent-ebpf` binary
//! (`src/main.rs`) and the bench's floor in `mt-agent-bench-ebpf`
//! (`src/bench.rs`); `agent/build.rs` builds both for `bpfel-unknown-none`.
#![no_std]
