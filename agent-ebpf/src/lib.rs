//! Empty library target. The programs are in the `mt-agent-ebpf` binary
//! (`src/main.rs`); `agent/build.rs` builds it for `bpfel-unknown-none`.
#![no_std]
