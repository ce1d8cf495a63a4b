//! Finding a run's snapshots: the directories of OUT that hold an index
//! (`snapshots.jsonl`), and the index's lines.
//!
//! A `--pid` run has its index in OUT; an `--exe` run in `OUT/<pid>/`; a
//! `--config` run in `OUT/<trigger>/` or `OUT/<trigger>/<pid>/` (OUT being
//! the run's dated directory, or the `output` above it). So the walk goes
//! down to four levels, never through a symlink, and skips the report's own
//! files, perf's build-id cache (`.debug`) and a fleet report's cache
//! (`.store`).

use std::{
    collections::HashSet,
    fs::File,
    io::{self, BufRead, BufReader},
    path::{Path, PathBuf},
};

use crate::{
    output::index::{INDEX_FILE, IndexLine, SnapshotLine},
    sys::safe_open::{self, Dir, Scope},
};

/// How deep under OUT an index is looked for (`<time>/<trigger>/<pid>/`;
/// a fleet report's `<host>/<run>/<trigger>/<pid>/`).
const MAX_DEPTH: usize = 4;

/// A fleet report's cache of fetched objects in its directory
/// (`report::fleet::fetch`), never an index.
pub const STORE_DIR: &str = ".store";

/// A directory of OUT with an index: one perf's snapshots.
#[derive(Debug)]
pub struct RunDir {
    /// Path relative to OUT ("" for OUT itself).
    pub rel: PathBuf,
    pub path: PathBuf,
    /// OUT itself, which every file of the run is opened beneath.
    pub out: PathBuf,
    /// `hit` and `tail` lines, in index order.
    pub entries: Vec<SnapshotLine<'static>>,
    /// Files a `deleted` line names (`--keep`).
    pub deleted: HashSet<String>,
    /// Index lines that are not JSON of the expected shape.
    pub bad_lines: usize,
    /// perf's build-id cache for these snapshots: the nearest `.debug`
    /// between this directory and OUT, if any.
    pub buildid_dir: Option<PathBuf>,
}

/// Opens the regular file `rel` beneath `out` for reading: no symlink and
/// no `..` on the way, no FIFO or device ([`Scope::Beneath`]).
pub fn open_in(out: &Path, rel: &Path) -> io::Result<File> {
    let refused = |e: safe_open::Refused| io::Error::other(e.to_string());
    let dir = Dir::open(out).map_err(refused)?;
    Ok(dir.open_file(rel, Scope::Beneath).map_err(refused)?.file)
}

/// The directories under `out` (itself included, relative to it) that hold
/// an index, sorted; without reading the indexes.
pub fn index_dirs(out: &Path) -> io::Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    walk(out, Path::new(""), 0, &mut dirs)?;
    dirs.sort();
    Ok(dirs)
}

/// Every directory under `out` (itself included) that holds an index.
pub fn discover(out: &Path) -> io::Result<Vec<RunDir>> {
    let mut runs = Vec::new();
    for rel in index_dirs(out)? {
        let mut run = read_index(out, &rel)?;
        run.buildid_dir = nearest_debug(out, &rel);
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
        } else if ft.is_dir()
            && name != ".debug"
            && name != ".upload"
            && !(depth == 0 && (name == "report" || name == STORE_DIR))
        {
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

/// Reads the index of `OUT/rel`. A line that is not an index line (a
/// truncated copy, say) is counted, not fatal.
pub fn read_index(out: &Path, rel: &Path) -> io::Result<RunDir> {
    let reader = BufReader::new(open_in(out, &rel.join(INDEX_FILE))?);
    let mut run = RunDir {
        rel: rel.to_path_buf(),
        path: out.join(rel),
        out: out.to_path_buf(),
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
        match IndexLine::parse(&line) {
            Some(IndexLine::Deleted(d)) => {
                run.deleted.insert(d.file);
            }
            Some(IndexLine::Snapshot(s)) if safe_name(&s.snapshot.file) => run.entries.push(*s),
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
        assert_eq!(r.entries[0].snapshot.hits[0].duration_ns, Some(7));
        assert!(r.deleted.contains("perf.data.1"));
        assert_eq!(r.bad_lines, 2);
        assert_eq!(r.buildid_dir.as_deref(), Some(out.join(".debug").as_path()));
    }

    #[test]
    fn only_regular_files_are_opened() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(open_in(tmp.path(), Path::new("fifo")).is_err());
        let f = tmp.path().join("f");
        std::fs::write(&f, "x").unwrap();
        std::os::unix::fs::symlink(&f, tmp.path().join("l")).unwrap();
        assert!(open_in(tmp.path(), Path::new("l")).is_err());
        std::fs::create_dir(tmp.path().join("d")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), tmp.path().join("d/up")).unwrap();
        assert!(open_in(tmp.path(), Path::new("d/up/f")).is_err());
        assert!(open_in(tmp.path(), Path::new("../f")).is_err());
        assert!(open_in(tmp.path(), Path::new("f")).is_ok());
    }
}
