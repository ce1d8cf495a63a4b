//! `OUT/run.json`: what the report needs to know of a run that the
//! snapshots do not say: each trigger's function and object. Written by a
//! capture run when it ends (if it wrote any snapshot), read by the report.
//!
//! ```text
//! {"triggers":[{"dir":"","symbol":"handle_request","object":"/srv/app",
//!               "pid":4242,"exe":null,"event":"cpu-clock","freq":999}]}
//! ```
//!
//! `dir` is the trigger's output directory relative to the file's own
//! directory, so the file stays right when OUT is copied elsewhere. A run
//! whose `--call-graph auto` measured its DWARF copy also keeps the
//! measurement's whole stacks there (`stack_donors`, [`StackDonors`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::runs::RunDir;
use crate::output::events::Armed;
use crate::sys::safe_open::{Dir, Scope};

/// The file's name in OUT.
pub const RUN_FILE: &str = "run.json";

/// The most of a `run.json` read, bytes: a few hundred per trigger.
const MAX_RUN_FILE: u64 = 1 << 20;

/// One trigger of the run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Trigger {
    pub dir: PathBuf,
    pub symbol: String,
    pub object: PathBuf,
    pub pid: Option<i32>,
    pub exe: Option<PathBuf>,
    pub event: String,
    pub freq: u32,
    /// The object is a Go binary (absent, false, in older files).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub go: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct RunFile {
    triggers: Vec<Trigger>,
    /// Absent in older files and in runs that did not measure one.
    #[serde(default, skip_serializing_if = "StackDonors::is_empty")]
    stack_donors: StackDonors,
}

/// Whole stacks of the traced threads, unwound from the 32 KiB copies of
/// `--call-graph auto`'s measurement before the run
/// (`report::stack_need`): the report grafts a snapshot's cut DWARF stacks
/// from them as well as from the snapshot's own whole ones
/// (`report::samples`, docs/unwinding.md, "What `auto` measures"). Each
/// distinct (thread, stack) once.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackDonors {
    /// The frames' objects (perf's `dso`), which `frames` name by index.
    pub objects: Vec<String>,
    pub stacks: Vec<DonorStack>,
}

/// One whole stack of one thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DonorStack {
    pub tid: u32,
    /// Leaf first: (symbol as the report names it, index in `objects`).
    pub frames: Vec<(String, u32)>,
    /// Each frame's CFA, its place on the stack (`report::cfa`), 0 where
    /// not known; parallel to `frames`, or empty (a run.json written
    /// before they were kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cfas: Vec<u64>,
    /// Each frame's address as perf printed it; parallel to `frames`, or
    /// empty (as `cfas`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<u64>,
    /// Where each frame's function starts in its object (0: not known);
    /// parallel to `frames`, or empty (as `cfas`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub functions: Vec<u64>,
    /// Unwound again from its copy, the stack reached its end: its last
    /// frame is the thread's first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reached_end: bool,
}

impl StackDonors {
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }
}

/// Writes `out/run.json` when the run left snapshots in `out`; a failure
/// is a warning (the report then names no trigger function).
pub fn write(out: &Path, armed: &[Armed], donors: &StackDonors) -> Result<(), String> {
    let has_snapshots =
        super::runs::discover(out).is_ok_and(|runs| runs.iter().any(|r| !r.entries.is_empty()));
    if !has_snapshots {
        return Ok(());
    }
    let triggers = armed
        .iter()
        .map(|a| Trigger {
            dir: a
                .output
                .strip_prefix(out)
                .unwrap_or(Path::new(""))
                .to_path_buf(),
            symbol: a.symbol.clone(),
            object: a.object.clone(),
            pid: a.pid,
            exe: a.exe.clone(),
            event: a.event.clone(),
            freq: a.freq,
            go: a.go,
        })
        .collect();
    let file = RunFile {
        triggers,
        stack_donors: donors.clone(),
    };
    let text = serde_json::to_vec(&file).map_err(|e| e.to_string())?;
    super::write::replace(&out.join(RUN_FILE), &text).map_err(|e| e.to_string())
}

/// The triggers of a `run.json`'s text; None if it is not one.
pub fn parse_triggers(text: &[u8]) -> Option<Vec<Trigger>> {
    serde_json::from_slice::<RunFile>(text)
        .ok()
        .map(|f| f.triggers)
}

/// The trigger of an index directory, from the nearest `run.json` at or
/// above it (up to OUT): the trigger whose directory is the index's, or
/// its parent (`--exe`: `<trigger dir>/<pid>`).
pub fn trigger_of(out: &Path, run: &RunDir) -> Option<Trigger> {
    let (file, rel) = nearest(out, run)?;
    file.triggers
        .into_iter()
        .find(|t| t.dir == rel || Some(t.dir.as_path()) == rel.parent())
}

/// The stack donors of an index directory's run, from the nearest
/// `run.json` at or above it; none when there is no such file.
pub fn donors_of(out: &Path, run: &RunDir) -> StackDonors {
    nearest(out, run)
        .map(|(f, _)| f.stack_donors)
        .unwrap_or_default()
}

/// The nearest `run.json` at or above an index directory (up to OUT), and
/// the directory's path relative to the file's.
fn nearest(out: &Path, run: &RunDir) -> Option<(RunFile, PathBuf)> {
    let mut base = Some(run.rel.as_path());
    while let Some(b) = base {
        let opened = Dir::open(out).and_then(|d| d.open_file(&b.join(RUN_FILE), Scope::Beneath));
        if let Ok(f) = opened {
            let file: RunFile = serde_json::from_slice(&f.read_all(MAX_RUN_FILE).ok()?).ok()?;
            return Some((file, run.rel.strip_prefix(b).ok()?.to_path_buf()));
        }
        base = b.parent();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn armed(output: PathBuf, symbol: &str) -> Armed {
        Armed {
            pid: None,
            perf_pid: None,
            exe: Some("/bin/x".into()),
            trigger: 0,
            event: "cpu-clock".into(),
            freq: 999,
            symbol: symbol.into(),
            object: "/bin/x".into(),
            attach_offset: 0,
            uprobes: 1,
            returns: None,
            returns_why: None,
            cost: None,
            output,
            time_to_armed_ms: 0.0,
            perf_ready_ms: 0.0,
            perf_kallsyms: "proc",
            recording: "continuous",
            flight_ring_bytes: None,
            unwinding: crate::perf::unwind::Unwinding {
                mode: "fp".into(),
                reason: "test".into(),
                measure_copy: false,
                copy_measured: None,
            },
            off_cpu: false,
            go: false,
        }
    }

    #[test]
    fn triggers_are_found_from_their_index_directories() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path();
        let mut a = [armed(out.join("api"), "f"), armed(out.join("db"), "g")];
        a[0].go = true;
        // No snapshot: no file.
        write(out, &a, &StackDonors::default()).unwrap();
        assert!(!out.join(RUN_FILE).exists());
        std::fs::create_dir_all(out.join("api/42")).unwrap();
        std::fs::write(
            out.join("api/42/snapshots.jsonl"),
            "{\"kind\":\"tail\",\"file\":\"perf.data.1\"}\n",
        )
        .unwrap();
        let donors = StackDonors {
            objects: vec!["/bin/x".into()],
            stacks: vec![DonorStack {
                tid: 42,
                frames: vec![("f".into(), 0), ("main".into(), 0)],
                cfas: vec![0x7ff0, 0x7ff8],
                ips: vec![0x1234, 0x1300],
                functions: vec![0x1200, 0x12f0],
                reached_end: true,
            }],
        };
        write(out, &a, &donors).unwrap();
        let runs = crate::output::runs::discover(out).unwrap();
        let t = trigger_of(out, &runs[0]).unwrap();
        assert_eq!((t.symbol.as_str(), t.go), ("f", true));
        assert_eq!(donors_of(out, &runs[0]), donors);
        // From a copy, given the trigger's directory as OUT: no run.json
        // at or above it.
        let sub = out.join("api");
        let runs = crate::output::runs::discover(&sub).unwrap();
        assert!(trigger_of(&sub, &runs[0]).is_none());
        assert!(donors_of(&sub, &runs[0]).is_empty());
    }
}
