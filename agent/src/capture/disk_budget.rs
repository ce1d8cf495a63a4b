//! `--max-disk` (and a config file's `max_disk`): a bound on what mt-agent
//! keeps on disk. When a new snapshot makes the total exceed the budget, the
//! oldest snapshots are deleted and indexed as `deleted`.
//!
//! Only files that an mt-agent index (`snapshots.jsonl`) lists as a snapshot
//! and does not list as deleted are ever counted or deleted, so files that
//! mt-agent did not write are never touched. The file perf is writing
//! (`perf.data`) counts towards the total but is never deleted, and neither
//! is the snapshot that was just completed, nor the newest hit snapshot of
//! its directory (a tail never pushes out the last hit). A budget too small
//! for those is reported once ([`Keeper::enforce`] returns the overrun).
//!
//! With the [`BudgetScope::OutputRoot`] scope (config runs), the older runs
//! under the output root are bounded as well: their snapshots go first,
//! oldest first, and the run in progress loses its own oldest snapshots only
//! when nothing older is left.

use std::{
    collections::HashSet,
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    time::SystemTime,
};

use crate::output::index::INDEX_FILE;

/// A disk budget and what it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskBudget {
    /// Most bytes kept, counting listed snapshots and perf's open file.
    pub bytes: u64,
    pub scope: BudgetScope,
}

/// What a budget covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetScope {
    /// The run's own output directory (`--max-disk`).
    Run,
    /// The run's parent directory: this run and older runs under it
    /// (`max_disk` in a config file, whose runs each get `<output>/<time>/`).
    OutputRoot,
}

/// A snapshot file that the budget may delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Directory holding the file and its index.
    pub dir: PathBuf,
    pub file: String,
    pub bytes: u64,
    /// Modification time, for oldest-first order.
    pub mtime: SystemTime,
    /// From an older run (deleted before any file of this run).
    pub older_run: bool,
}

/// Which candidates to delete so that `used` bytes fit in `budget`: older
/// runs first, then oldest first; never one that `protected` names.
/// Returns indexes into `candidates`. Pure.
pub fn choose(
    candidates: &[Candidate],
    used: u64,
    budget: u64,
    protected: impl Fn(&Candidate) -> bool,
) -> Vec<usize> {
    let mut order: Vec<usize> = (0..candidates.len())
        .filter(|&i| !protected(&candidates[i]))
        .collect();
    order.sort_by_key(|&i| {
        let c = &candidates[i];
        (!c.older_run, c.mtime, c.file.clone())
    });
    let mut used = used;
    let mut out = Vec::new();
    for i in order {
        if used <= budget {
            break;
        }
        used = used.saturating_sub(candidates[i].bytes);
        out.push(i);
    }
    out
}

/// Keeps one run's output within its budget.
#[derive(Debug)]
pub struct Keeper {
    budget: DiskBudget,
    run_dir: PathBuf,
    /// Snapshots of older runs (root scope), read once at start.
    older: Vec<Candidate>,
    /// Bytes of older runs that the budget cannot delete (their perf.data).
    older_fixed: u64,
    /// Directories whose index a running recorder owns.
    live: HashSet<PathBuf>,
    /// The newest hit snapshot of each directory, never deleted.
    newest_hit: std::collections::HashMap<PathBuf, String>,
}

impl Keeper {
    /// A keeper for the run writing into `run_dir`. With the root scope, the
    /// older runs beside it are inventoried now.
    pub fn new(budget: DiskBudget, run_dir: &Path) -> Self {
        let mut older = Vec::new();
        let mut older_fixed = 0;
        if budget.scope == BudgetScope::OutputRoot
            && let Some(root) = run_dir.parent()
        {
            for dir in index_dirs(root, 4) {
                if dir.starts_with(run_dir) {
                    continue;
                }
                let (files, fixed) = listed_snapshots(&dir, true);
                older.extend(files);
                older_fixed += fixed;
            }
        }
        Self {
            budget,
            run_dir: run_dir.to_path_buf(),
            older,
            older_fixed,
            live: HashSet::new(),
            newest_hit: Default::default(),
        }
    }

    /// A recorder now owns the index in `dir` (until [`Keeper::release`]).
    pub fn own(&mut self, dir: &Path) {
        self.live.insert(dir.to_path_buf());
    }

    /// The recorder of `dir` has ended.
    pub fn release(&mut self, dir: &Path) {
        self.live.remove(dir);
    }

    /// Call after a snapshot `newest` was indexed in `dir` (`hit`: it was
    /// caused by a hit): deletes what the budget requires. Files of `dir` are
    /// only removed from disk (its recorder indexes them as deleted, as it
    /// does for `--keep`); files of other directories are also indexed as
    /// deleted there, unless a recorder still owns that index (it then
    /// indexes them itself, at its next snapshot or its end). Returns the
    /// bytes still above the budget when only what is never deleted is left
    /// (perf's open file, `newest`, the newest hit).
    pub fn enforce(&mut self, dir: &Path, newest: &str, hit: bool) -> Option<u64> {
        if hit {
            self.newest_hit
                .insert(dir.to_path_buf(), newest.to_string());
        }
        let mut candidates = self.older.clone();
        let mut used = self.older_fixed;
        for d in index_dirs(&self.run_dir, 3) {
            let (files, fixed) = listed_snapshots(&d, false);
            candidates.extend(files);
            used += fixed;
        }
        used += candidates.iter().map(|c| c.bytes).sum::<u64>();
        let kept_hit = self.newest_hit.get(dir).cloned();
        let protected = |c: &Candidate| {
            c.dir == dir && (c.file == newest || kept_hit.as_deref() == Some(c.file.as_str()))
        };
        let doomed = choose(&candidates, used, self.budget.bytes, protected);
        let freed: u64 = doomed.iter().map(|&i| candidates[i].bytes).sum();
        let over = used.saturating_sub(freed).saturating_sub(self.budget.bytes);
        let mut gone = HashSet::new();
        for i in doomed {
            let c = &candidates[i];
            match fs::remove_file(c.dir.join(&c.file)) {
                Ok(()) => {
                    log::debug!(
                        "--max-disk: deleted {} ({} bytes)",
                        c.dir.join(&c.file).display(),
                        c.bytes
                    );
                    if c.dir != dir && !self.live.contains(&c.dir) {
                        append_deleted(&c.dir, &c.file);
                    }
                    gone.insert((c.dir.clone(), c.file.clone()));
                }
                Err(e) => log::debug!("--max-disk: cannot delete {}: {e}", c.file),
            }
        }
        self.older
            .retain(|c| !gone.contains(&(c.dir.clone(), c.file.clone())));
        (over > 0).then_some(over)
    }
}

/// Directories at most `depth` levels below `root` (itself included) that
/// hold an index; symlinks are not followed.
fn index_dirs(root: &Path, depth: usize) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if root.join(INDEX_FILE).is_file() {
        out.push(root.to_path_buf());
    }
    if depth == 0 {
        return out;
    }
    let Ok(entries) = fs::read_dir(root) else {
        return out;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(index_dirs(&e.path(), depth - 1));
        }
    }
    out
}

/// The snapshots `dir`'s index lists and does not list as deleted, that are
/// still regular files there; and the size of perf's open file.
fn listed_snapshots(dir: &Path, older_run: bool) -> (Vec<Candidate>, u64) {
    let mut listed: Vec<String> = Vec::new();
    if let Ok(f) = fs::File::open(dir.join(INDEX_FILE)) {
        for line in BufReader::new(f).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let (Some(kind), Some(file)) = (v["kind"].as_str(), v["file"].as_str()) else {
                continue;
            };
            listed.retain(|f| f != file);
            if kind != "deleted" && is_snapshot_name(file) {
                listed.push(file.to_string());
            }
        }
    }
    let files = listed
        .into_iter()
        .filter_map(|file| {
            let m = fs::symlink_metadata(dir.join(&file)).ok()?;
            m.is_file().then(|| Candidate {
                dir: dir.to_path_buf(),
                file,
                bytes: m.len(),
                mtime: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                older_run,
            })
        })
        .collect();
    let open = fs::symlink_metadata(dir.join("perf.data"))
        .ok()
        .filter(|m| m.is_file())
        .map_or(0, |m| m.len());
    (files, open)
}

/// perf's rotated names: `perf.data.<digits>`, nothing with a path in it.
fn is_snapshot_name(file: &str) -> bool {
    file.strip_prefix("perf.data.")
        .is_some_and(|ts| !ts.is_empty() && ts.bytes().all(|b| b.is_ascii_digit()))
}

/// Appends a `deleted` line to the index of a directory no recorder owns.
fn append_deleted(dir: &Path, file: &str) {
    if let Err(e) = crate::output::index::append_deleted(dir, file) {
        log::debug!("--max-disk: cannot index {file} as deleted: {e}");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn cand(dir: &str, file: &str, bytes: u64, age_s: u64, older_run: bool) -> Candidate {
        Candidate {
            dir: dir.into(),
            file: file.into(),
            bytes,
            mtime: SystemTime::UNIX_EPOCH + Duration::from_secs(1000 - age_s),
            older_run,
        }
    }

    #[test]
    fn nothing_is_deleted_within_the_budget() {
        let c = [cand("a", "perf.data.1", 10, 5, false)];
        assert!(choose(&c, 10, 10, |_| false).is_empty());
    }

    #[test]
    fn the_oldest_go_first_until_the_rest_fits() {
        let c = [
            cand("a", "perf.data.3", 10, 1, false),
            cand("a", "perf.data.1", 10, 3, false),
            cand("a", "perf.data.2", 10, 2, false),
        ];
        assert_eq!(choose(&c, 30, 15, |_| false), vec![1, 2]);
    }

    #[test]
    fn older_runs_go_before_the_run_in_progress() {
        let c = [
            cand("run", "perf.data.1", 10, 100, false),
            cand("old", "perf.data.9", 10, 1, true),
        ];
        assert_eq!(choose(&c, 20, 10, |_| false), vec![1]);
    }

    #[test]
    fn the_newest_snapshot_is_never_deleted() {
        let c = [cand("a", "perf.data.1", 100, 1, false)];
        assert!(choose(&c, 100, 10, |c| c.file == "perf.data.1").is_empty());
    }

    #[test]
    fn only_listed_snapshot_files_count() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        for f in ["perf.data.01", "perf.data.02", "notes.txt", "perf.data"] {
            fs::write(d.join(f), vec![0u8; 100]).unwrap();
        }
        fs::write(
            d.join(INDEX_FILE),
            "{\"kind\":\"hit\",\"file\":\"perf.data.01\"}\n\
             {\"kind\":\"hit\",\"file\":\"perf.data.02\"}\n\
             {\"kind\":\"hit\",\"file\":\"../escape\"}\n\
             {\"kind\":\"deleted\",\"file\":\"perf.data.01\"}\n",
        )
        .unwrap();
        let (files, open) = listed_snapshots(d, false);
        let names: Vec<&str> = files.iter().map(|c| c.file.as_str()).collect();
        assert_eq!(names, ["perf.data.02"]);
        assert_eq!(open, 100);
    }

    #[test]
    fn the_keeper_deletes_the_oldest_and_indexes_them_where_no_recorder_lives() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let old = root.join("20260101-000000");
        let run = root.join("20260102-000000");
        for (d, files) in [
            (&old, ["perf.data.01", "perf.data.02"]),
            (&run, ["perf.data.03", "perf.data.04"]),
        ] {
            fs::create_dir_all(d).unwrap();
            let mut index = String::new();
            for f in files {
                fs::write(d.join(f), vec![0u8; 1000]).unwrap();
                index.push_str(&format!("{{\"kind\":\"hit\",\"file\":\"{f}\"}}\n"));
            }
            fs::write(d.join(INDEX_FILE), index).unwrap();
        }
        let mut k = Keeper::new(
            DiskBudget {
                bytes: 2500,
                scope: BudgetScope::OutputRoot,
            },
            &run,
        );
        k.own(&run);
        assert_eq!(k.enforce(&run, "perf.data.04", true), None);
        // 4000 bytes over a 2500 budget: both older snapshots go.
        assert!(!old.join("perf.data.01").exists());
        assert!(!old.join("perf.data.02").exists());
        assert!(run.join("perf.data.03").exists());
        let index = fs::read_to_string(old.join(INDEX_FILE)).unwrap();
        assert_eq!(index.matches("\"deleted\"").count(), 2);
        // A smaller budget reaches this run, but never its newest file.
        k.budget.bytes = 500;
        assert_eq!(k.enforce(&run, "perf.data.04", true), Some(500));
        assert!(!run.join("perf.data.03").exists());
        assert!(run.join("perf.data.04").exists());
        // The live recorder indexes its own deletions.
        let index = fs::read_to_string(run.join(INDEX_FILE)).unwrap();
        assert!(!index.contains("deleted"));
    }

    #[test]
    fn a_tail_never_pushes_out_the_newest_hit() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let mut index = String::new();
        let mut k = Keeper::new(
            DiskBudget {
                bytes: 1,
                scope: BudgetScope::Run,
            },
            d,
        );
        k.own(d);
        for (f, kind) in [
            ("perf.data.01", "hit"),
            ("perf.data.02", "hit"),
            ("perf.data.03", "tail"),
        ] {
            fs::write(d.join(f), vec![0u8; 1000]).unwrap();
            index.push_str(&format!("{{\"kind\":\"{kind}\",\"file\":\"{f}\"}}\n"));
            fs::write(d.join(INDEX_FILE), &index).unwrap();
            let over = k.enforce(d, f, kind == "hit");
            // A 1-byte budget holds nothing: the overrun is reported.
            assert!(over.is_some_and(|b| b >= 999), "{f}: {over:?}");
        }
        // The older hit went; the newest hit stayed beside the tail.
        assert!(!d.join("perf.data.01").exists());
        assert!(d.join("perf.data.02").exists());
        assert!(d.join("perf.data.03").exists());
    }
}
