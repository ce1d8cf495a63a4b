//! Finding a run's snapshots: the directories of OUT that hold an index
//! (`snapshots.jsonl`), and the index's lines.
//!
//! A `--pid` run has its index in OUT; an `--exe` run in `OUT/<pid>/`; a
//! `--config` run in `OUT/<trigger>/` or `OUT/<trigger>/<pid>/` (OUT being
//! the run's dated directory, or the `output` above it). So the walk goes
//! down to four levels, never through a symlink, and skips the report's own
//! files and perf's build-id cache (`.debug`).

use std::{
    collections::HashSet,
    fs::{File, OpenOptions},
    io::{self, BufRead, BufReader},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use crate::output::index::INDEX_FILE;

/// How deep under OUT an index is looked for (`<time>/<trigger>/<pid>/`).
const MAX_DEPTH: usize = 4;

/// One hit, as `snapshots.jsonl` lists it (see the README's "Output").
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Hit {
    pub seq: u64,
    pub tgid: u32,
    pub tid: u32,
    #[serde(default)]
    pub cpu: u32,
    /// CLOCK_MONOTONIC, ns: the clock of perf's sample times here.
    pub ktime_ns: u64,
    #[serde(default)]
    pub args: Vec<u64>,
    /// `--slower-than`: the call's duration, ns.
    pub duration_ns: Option<u64>,
    pub retval: Option<u64>,
    #[serde(default)]
    pub merged: bool,
    /// Off-CPU breakdown (`--off-cpu`): the window is `[off_cpu_from_ns,
    /// ktime_ns]`, CLOCK_MONOTONIC ns, and the hit's thread spent it on
    /// CPU, runnable and blocked (ns, adding up to the window's length).
    pub off_cpu_from_ns: Option<u64>,
    pub on_cpu_ns: Option<u64>,
    pub runnable_ns: Option<u64>,
    pub blocked_ns: Option<u64>,
}

/// One `hit` or `tail` line of the index.
#[derive(Debug, Clone, Deserialize)]
pub struct Entry {
    pub kind: String,
    pub file: String,
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub hits: Vec<Hit>,
    pub hit_to_kill_ns: Option<u64>,
    #[serde(default)]
    pub unlisted_hits: u64,
    #[serde(default)]
    pub counters: serde_json::Value,
}

/// A directory of OUT with an index: one perf's snapshots.
#[derive(Debug)]
pub struct RunDir {
    /// Path relative to OUT ("" for OUT itself).
    pub rel: PathBuf,
    pub path: PathBuf,
    /// `hit` and `tail` lines, in index order.
    pub entries: Vec<Entry>,
    /// Files a `deleted` line names (`--keep`).
    pub deleted: HashSet<String>,
    /// Index lines that are not JSON of the expected shape.
    pub bad_lines: usize,
    /// perf's build-id cache for these snapshots: the nearest `.debug`
    /// between this directory and OUT, if any.
    pub buildid_dir: Option<PathBuf>,
}

/// Opens a file for reading without following a symlink and without
/// blocking on a FIFO, and checks that it is a regular file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    Ok(f)
}

/// Every directory under `out` (itself included) that holds an index.
pub fn discover(out: &Path) -> io::Result<Vec<RunDir>> {
    let mut dirs = Vec::new();
    walk(out, Path::new(""), 0, &mut dirs)?;
    dirs.sort();
    let mut runs = Vec::new();
    for rel in dirs {
        let path = out.join(&rel);
        let mut run = read_index(&path.join(INDEX_FILE))?;
        run.buildid_dir = nearest_debug(out, &rel);
        run.rel = rel;
        run.path = path;
        runs.push(run);
    }
    Ok(runs)
}

fn walk(out: &Path, rel: &Path, depth: usize, found: &mut Vec<PathBuf>) -> io::Result<()> {
    let dir = out.join(rel);
    let mut subdirs = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let entry = entry?;
        // file_type() does not follow symlinks.
        let ft = entry.file_type()?;
        let name = entry.file_name();
        if ft.is_file() && name == INDEX_FILE {
            found.push(rel.to_path_buf());
        } else if ft.is_dir() && name != ".debug" && !(depth == 0 && name == "report") {
            subdirs.push(rel.join(name));
        }
    }
    if depth < MAX_DEPTH {
        for sub in subdirs {
            // A directory we may not read is not ours: skip it.
            let _ = walk(out, &sub, depth + 1, found);
        }
    }
    Ok(())
}

/// The nearest `.debug` directory (not a symlink) from `OUT/rel` up to OUT.
fn nearest_debug(out: &Path, rel: &Path) -> Option<PathBuf> {
    let mut cur = Some(rel);
    while let Some(r) = cur {
        let d = out.join(r).join(".debug");
        if std::fs::symlink_metadata(&d).is_ok_and(|m| m.is_dir()) {
            return Some(d);
        }
        cur = r.parent();
    }
    None
}

/// Reads one index. A line that is not JSON (a truncated copy, say) is
/// counted, not fatal.
pub fn read_index(path: &Path) -> io::Result<RunDir> {
    let reader = BufReader::new(open_regular(path)?);
    let mut run = RunDir {
        rel: PathBuf::new(),
        path: PathBuf::new(),
        entries: Vec::new(),
        deleted: HashSet::new(),
        bad_lines: 0,
        buildid_dir: None,
    };
    for line in reader.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(_) => {
                run.bad_lines += 1;
                continue;
            }
        };
        if value["kind"] == "deleted" {
            if let Some(f) = value["file"].as_str() {
                run.deleted.insert(f.to_string());
            }
            continue;
        }
        match serde_json::from_value::<Entry>(value) {
            Ok(e) if safe_name(&e.file) => run.entries.push(e),
            _ => run.bad_lines += 1,
        }
    }
    Ok(run)
}

/// A snapshot's name is a plain file name: an index naming `../x` or `/x`
/// is not followed out of OUT.
fn safe_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && name != "." && name != ".."
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_lines_and_layouts() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path();
        std::fs::create_dir_all(out.join("a/123")).unwrap();
        std::fs::create_dir_all(out.join(".debug")).unwrap();
        std::fs::write(
            out.join("a/123").join(INDEX_FILE),
            concat!(
                r#"{"kind":"hit","file":"perf.data.1","bytes":10,"hits":[{"seq":1,"tgid":5,"tid":6,"cpu":0,"ktime_ns":99,"args":[1,2,3,4,5,6],"duration_ns":7,"retval":0,"merged":false}],"hit_to_kill_ns":3,"counters":{},"merged":0}"#,
                "\n{\"kind\":\"hit\",\"file\":\"../../etc/passwd\",\"hits\":[]}\n",
                "{\"kind\":\"deleted\",\"file\":\"perf.data.1\"}\n",
                "{\"kind\":\"tail\",\"fi"
            ),
        )
        .unwrap();
        std::os::unix::fs::symlink("/", out.join("a/escape")).unwrap();
        let runs = discover(out).unwrap();
        assert_eq!(runs.len(), 1);
        let r = &runs[0];
        assert_eq!(r.rel, Path::new("a/123"));
        assert_eq!(r.entries.len(), 1);
        assert_eq!(r.entries[0].hits[0].duration_ns, Some(7));
        assert!(r.deleted.contains("perf.data.1"));
        assert_eq!(r.bad_lines, 2);
        assert_eq!(r.buildid_dir.as_deref(), Some(out.join(".debug").as_path()));
    }

    #[test]
    fn only_regular_files_are_opened() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(open_regular(&fifo).is_err());
        let f = tmp.path().join("f");
        std::fs::write(&f, "x").unwrap();
        std::os::unix::fs::symlink(&f, tmp.path().join("l")).unwrap();
        assert!(open_regular(&tmp.path().join("l")).is_err());
        assert!(open_regular(&f).is_ok());
    }
}
