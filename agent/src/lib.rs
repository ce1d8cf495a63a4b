//! mt-agent: profile the moment a function is called. DEVELOPERS.md maps the stages below.

// The stages, in the order of the data path: each imports only those after
// it (`cargo xtask layout` checks it).
pub mod capture;
pub mod commands;
pub mod disarm;
pub mod error;
pub mod flags;
pub mod output;
pub mod perf;
pub mod plan;
pub mod probe;
pub mod report;
pub mod symbols;
pub mod sys;
