//! The subcommands: a capture run (the default), `symbols`, `check` and `report`.

pub mod check;
pub mod report;
pub mod run;
pub mod symbols;
