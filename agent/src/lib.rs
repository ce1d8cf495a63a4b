//! mt-agent: profile the moment a function is called. DEVELOPERS.md maps the stages below.

// The stages, in the order of the data path: each imports only those after
// it (`cargo xtask layout` checks it). Blank lines keep rustfmt from sorting
// them.

pub mod commands;

pub mod report;

pub mod plan;

pub mod capture;

pub mod upload;

pub mod disarm;

pub mod probe;

pub mod output;

pub mod perf;

pub mod symbols;

pub mod flags;

pub mod sys;

pub mod error;
