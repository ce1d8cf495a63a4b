//! `cargo xtask fuzz [--seconds N] [--seed S]`: the long run of the
//! malformed-input harness (agent/fuzz/src/lib.rs). It mutates the
//! malformed-ELF corpus with a seeded RNG for N seconds and feeds each input
//! to the agent's ELF, symbol, demangling and instruction-decoding code, in
//! a debug build so that arithmetic overflow panics too. An input that
//! panics is saved under target/fuzz/; the same seed repeats the run. The
//! corpus and a short run are its tests (agent/fuzz/tests/corpus.rs), in
//! `cargo xtask test`.

use crate::util::{cargo, run, target_dir};

/// Runs the mutation loop for `seconds` from `seed`.
pub fn fuzz(seconds: u64, seed: u64) -> anyhow::Result<()> {
    let crash_dir = target_dir().join("fuzz");
    run(cargo()
        .args(["run", "-p", "mt-agent-fuzz", "--"])
        .arg(seconds.to_string())
        .arg(seed.to_string())
        .arg(&crash_dir))
}
