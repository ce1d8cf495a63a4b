//! The options: their definitions (clap, the one source of `--help` and the README's table), and the values they take.

pub mod defs;
pub mod doc;
pub mod parse;
pub mod version;
