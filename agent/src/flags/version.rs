//! `--version`: the version, the git commit, the target triple and the aya
//! version, all fixed at build time by build.rs.

/// `0.1.0`.
pub const SHORT: &str = env!("CARGO_PKG_VERSION");

/// The long form printed by `--version`.
pub const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncommit: ",
    env!("MT_AGENT_GIT_COMMIT"),
    "\ntarget: ",
    env!("MT_AGENT_TARGET"),
    "\naya: ",
    env!("MT_AGENT_AYA_VERSION"),
);
