//! `DIR/.jit/kept.jsonl`, the index of the JIT files a recorder keeps with
//! its snapshots (capture/jit_maps.rs, docs/jit-maps.md): one line type,
//! written by the recorder and read back by the report and the upload.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The directory, inside a recorder's output directory, of the kept files.
pub const DIR: &str = ".jit";
/// The index of what covers each snapshot, one [`KeptLine`] a line.
pub const INDEX: &str = "kept.jsonl";

/// Which JIT file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `/tmp/perf-<pid>.map`: `START SIZE NAME` lines, read by `perf script`.
    PerfMap,
    /// `jit-<pid>.dump`: read by `perf inject --jit`.
    Jitdump,
}

/// One line of `kept.jsonl`: a kept file's prefix that covers a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptLine {
    /// The snapshot's file name (`perf.data.<time>`).
    pub snapshot: String,
    /// The process, by its pid as perf.data names it (the agent's pid
    /// namespace).
    pub pid: i32,
    pub kind: Kind,
    /// The copy's name inside [`DIR`].
    pub file: String,
    /// How many bytes of the copy cover the snapshot.
    pub bytes: u64,
    /// Where the process wrote it, as the process names it.
    pub origin: PathBuf,
}

impl KeptLine {
    /// A line of the file, without its newline; None unless it is a
    /// [`KeptLine`] whose copy is one plain file name.
    pub fn parse(text: &str) -> Option<KeptLine> {
        let l: KeptLine = serde_json::from_str(text).ok()?;
        valid_name(&l.file).then_some(l)
    }
}

/// A copy's name as the recorder makes them: one plain file name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && name != "." && name != ".."
}
