//! `cargo xtask fuzz [--seconds N] [--seed S]`: the long run of the
//! malformed-input harness (agent/src/symbols/fuzz.rs). It mutates the
//! malformed-ELF corpus with a seeded RNG for N seconds and feeds each input
//! to the agent's ELF, symbol, demangling and instruction-decoding code, in
//! a debug build so that arithmetic overflow panics too. An input that
//! panics is saved under target/fuzz/; the same seed repeats the run. The
//! short corpus runs with the unit tests in `cargo xtask test`.

use crate::util::{cargo, run, target_dir};

/// Runs the mutation loop for `seconds` from `seed`.
pub fn fuzz(seconds: u64, seed: u64) -> anyhow::Result<()> {
    let crash_dir = target_dir().join("fuzz");
    run(cargo()
        .args(["test", "-p", "mt-agent", "--lib", "fuzz_mutations"])
        .args(["--", "--ignored", "--nocapture", "--exact"])
        .arg("symbols::fuzz::tests::fuzz_mutations")
        .env("MT_FUZZ_SECONDS", seconds.to_string())
        .env("MT_FUZZ_SEED", seed.to_string())
        .env("MT_FUZZ_CRASH_DIR", &crash_dir))
}
