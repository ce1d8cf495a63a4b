//! One run being uploaded: what of its OUT the store does not hold yet, in
//! the order docs/upload.md gives (clock, then per index line: the build-id
//! objects before it, what its snapshot needs of `.jit/`, its snapshot, the
//! line itself; `run.json` last), and
//! sending it. A round sends everything it finds or stops at the first
//! refusal; the next round starts again from what is not confirmed.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    io::{self, BufRead, BufReader, Seek, SeekFrom},
    path::{Path, PathBuf},
};

use super::{
    jit::{ForSnapshot, KeptCursor},
    journal::{Clock, Journal},
    keys::{self, RunKey},
    send::{self, Digest, SendError},
    store::Store,
};
use crate::output::{
    index::{INDEX_FILE, IndexLine},
    jit_kept,
    run_file::RUN_FILE,
    runs,
};

/// The most of `run.json` sent, bytes (its reader's own bound).
const MAX_RUN_FILE: u64 = 1 << 20;

/// What one sent object was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Snapshot,
    /// A build-id object the store already held (another host or run).
    Shared,
    /// A chunk of a kept JIT file (upload/jit.rs).
    Jit,
    Other,
}

/// Reports from a round, for the counters and the events.
pub trait Sink {
    /// `key` (of `file`, for a snapshot) is confirmed, `bytes` long.
    fn sent(&mut self, what: Sent, key: &str, file: &str, bytes: u64);
    /// A listed snapshot was gone from disk before it was sent.
    fn lost(&mut self, file: &str);
    /// A snapshot was deleted locally once the store confirmed it.
    fn deleted(&mut self, file: &str);
}

/// An index directory's progress: where its next unread line starts.
#[derive(Debug, Default)]
struct Cursor {
    offset: u64,
    /// Number of the next line, from 1.
    line: u64,
    /// Lines read whose objects are not all confirmed: (number, text).
    waiting: Vec<(u64, String)>,
}

/// One run's upload state.
pub struct RunState {
    pub out: PathBuf,
    pub key: RunKey,
    journal: Journal,
    clock: Clock,
    cursors: HashMap<PathBuf, Cursor>,
    /// Each index directory's `.jit/kept.jsonl`, read as it grows.
    jit: HashMap<PathBuf, KeptCursor>,
    /// `.debug/.../<id>/elf` files already handled.
    objects: HashSet<PathBuf>,
    /// A recorder may still write here: it indexes what we delete itself.
    pub live: bool,
    /// `--upload-delete`.
    delete: bool,
    /// A send of this run failed since its last confirmation: ask the store
    /// before sending again (its answer may have been lost).
    pub doubt: bool,
    /// The lock is held and the clock fixed.
    started: bool,
    /// Files `--upload-delete` removed while a recorder could index them.
    deleted_live: Vec<(PathBuf, String)>,
}

impl RunState {
    /// The state of the run in `out`. A live run (this agent's) takes its
    /// lock and writes its clock only once it has an index line, so a run
    /// that wrote nothing leaves nothing; an earlier run's lock is taken at
    /// once. None if another agent holds the run.
    pub fn open(
        out: &Path,
        key: RunKey,
        clock: Clock,
        delete: bool,
        live: bool,
    ) -> io::Result<Option<RunState>> {
        let mut r = RunState {
            out: out.to_path_buf(),
            key,
            journal: Journal::open(out),
            clock,
            cursors: HashMap::new(),
            jit: HashMap::new(),
            objects: HashSet::new(),
            live,
            delete,
            // A run from an earlier agent may have sends it did not journal.
            doubt: !live,
            started: false,
            deleted_live: Vec::new(),
        };
        if !live && !r.start()? {
            return Ok(None);
        }
        Ok(Some(r))
    }

    /// Takes the run's lock and fixes its clock; false if another agent
    /// holds it.
    fn start(&mut self) -> io::Result<bool> {
        if !self.journal.lock()? {
            return Ok(false);
        }
        let now = self.clock.clone();
        self.clock = self.journal.clock(|| now)?;
        self.started = true;
        Ok(true)
    }

    /// The run has begun uploading (lock held, clock fixed).
    pub fn started(&self) -> bool {
        self.started
    }

    /// Reads the index lines written since the last round without sending
    /// anything, so that [`Self::pending`] counts them (the end of a run
    /// whose store refused everything). A run with lines pending that never
    /// began uploading (the store was unreachable from the start) begins
    /// now, lock and clock, so that the next agent beside it resumes it.
    pub fn scan(&mut self) {
        for rel in runs::index_dirs(&self.out).unwrap_or_default() {
            let _ = self.read_lines(&rel);
        }
        if !self.started && self.pending() > 0 {
            let _ = self.start();
        }
    }

    /// Index lines read but not yet confirmed.
    pub fn pending(&self) -> u64 {
        self.cursors.values().map(|c| c.waiting.len() as u64).sum()
    }

    /// Everything the store must hold that it does not confirm yet: sent.
    pub async fn round(&mut self, store: &Store, sink: &mut dyn Sink) -> Result<(), SendError> {
        let dirs = runs::index_dirs(&self.out).map_err(SendError::Local)?;
        for rel in &dirs {
            self.read_lines(rel).map_err(SendError::Local)?;
        }
        if !self.started {
            if self.pending() == 0 {
                return Ok(());
            }
            if !self.start().map_err(SendError::Local)? {
                return Err(SendError::Local(io::Error::other(
                    "another agent holds this run's upload lock",
                )));
            }
        }
        let clock = serde_json::to_vec(&self.clock).expect("plain data");
        self.put_bytes(store, &self.key.clock(), &clock, sink)
            .await?;
        for rel in dirs {
            while let Some((n, text)) = self
                .cursors
                .get(&rel)
                .and_then(|c| c.waiting.first().cloned())
            {
                self.send_line(store, &rel, n, &text, sink).await?;
                self.cursors.get_mut(&rel).expect("read").waiting.remove(0);
            }
        }
        let run_file = self.out.join(RUN_FILE);
        if run_file.is_file() {
            let body = send::read_small(&run_file, MAX_RUN_FILE).map_err(SendError::Local)?;
            self.put_bytes(store, &self.key.run_file(), &body, sink)
                .await?;
        }
        Ok(())
    }

    /// Reads the complete lines added to `rel`'s index since the last read.
    fn read_lines(&mut self, rel: &Path) -> io::Result<()> {
        let c = self.cursors.entry(rel.to_path_buf()).or_insert(Cursor {
            line: 1,
            ..Default::default()
        });
        let mut f = File::open(self.out.join(rel).join(INDEX_FILE))?;
        f.seek(SeekFrom::Start(c.offset))?;
        let mut r = BufReader::new(f);
        let mut line = String::new();
        while r.read_line(&mut line)? > 0 && line.ends_with('\n') {
            c.offset += line.len() as u64;
            c.waiting.push((c.line, std::mem::take(&mut line)));
            c.line += 1;
        }
        Ok(())
    }

    /// One index line: the objects copied before it, what its snapshot
    /// needs of `.jit/`, its snapshot, itself.
    async fn send_line(
        &mut self,
        store: &Store,
        rel: &Path,
        n: u64,
        text: &str,
        sink: &mut dyn Sink,
    ) -> Result<(), SendError> {
        let rel_key = keys::rel_text(rel).unwrap_or_default();
        let key = self.key.index_line(&rel_key, n);
        let snapshot = match IndexLine::parse(text.trim_end()) {
            Some(IndexLine::Snapshot(s)) => Some(s.snapshot.file.clone()),
            _ => None,
        };
        let jit = match &snapshot {
            Some(file) => self.jit_of(rel, file).map_err(SendError::Local)?,
            None => None,
        };
        if self.journal.confirmed(&key).is_some() {
            self.jit_taken(rel, snapshot.as_deref());
            return Ok(());
        }
        self.send_objects(store, sink).await?;
        if let (Some(file), Some(jit)) = (&snapshot, jit) {
            self.send_jit(store, rel, &rel_key, file, jit, sink).await?;
        }
        if let Some(file) = &snapshot {
            self.send_snapshot(store, rel, &rel_key, file, sink).await?;
        }
        self.put_bytes(store, &key, text.as_bytes(), sink).await?;
        self.jit_taken(rel, snapshot.as_deref());
        if self.delete
            && let Some(file) = &snapshot
        {
            self.delete_local(rel, file, sink);
        }
        Ok(())
    }

    /// What `snapshot` of `rel` needs of `rel/.jit/`, once the lines its
    /// recorder wrote before its index line are read.
    fn jit_of(&mut self, rel: &Path, snapshot: &str) -> io::Result<Option<ForSnapshot>> {
        let c = self.jit.entry(rel.to_path_buf()).or_default();
        c.read(&self.out.join(rel))?;
        Ok(c.pending(snapshot))
    }

    fn jit_taken(&mut self, rel: &Path, snapshot: Option<&str>) {
        if let (Some(c), Some(s)) = (self.jit.get_mut(rel), snapshot) {
            c.taken(s);
        }
    }

    /// The chunks of the kept copies `snapshot` reaches, then its lines of
    /// `kept.jsonl` (docs/upload.md, "JIT files"). A copy gone from disk
    /// (removed by hand) is skipped: the fleet report keeps only the lines
    /// its chunks cover.
    async fn send_jit(
        &mut self,
        store: &Store,
        rel: &Path,
        rel_key: &str,
        snapshot: &str,
        jit: ForSnapshot,
        sink: &mut dyn Sink,
    ) -> Result<(), SendError> {
        let dir = self.out.join(rel).join(jit_kept::DIR);
        for c in &jit.chunks {
            let key = self.key.jit_chunk(rel_key, &c.file, c.start, c.end);
            if self.journal.confirmed(&key).is_some() {
                continue;
            }
            let f = match File::open(dir.join(&c.file)) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(SendError::Local(e)),
            };
            let d = send::digest_at(&f, c.start, c.end - c.start).map_err(SendError::Local)?;
            if d.bytes < c.end - c.start {
                continue;
            }
            self.put_file(store, &key, &f, c.start, &d).await?;
            sink.sent(Sent::Jit, &key, &c.file, d.bytes);
        }
        let key = self.key.jit_lines(rel_key, snapshot);
        self.put_bytes(store, &key, jit.lines.as_bytes(), sink)
            .await
    }

    async fn send_snapshot(
        &mut self,
        store: &Store,
        rel: &Path,
        rel_key: &str,
        file: &str,
        sink: &mut dyn Sink,
    ) -> Result<(), SendError> {
        let key = self.key.snapshot(rel_key, file);
        if self.journal.confirmed(&key).is_some() {
            return Ok(());
        }
        // Opened once: a --max-disk deletion meanwhile leaves our fd valid.
        let f = match File::open(self.out.join(rel).join(file)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                sink.lost(file);
                return Ok(());
            }
            Err(e) => return Err(SendError::Local(e)),
        };
        let d = send::digest(&f).map_err(SendError::Local)?;
        self.put_file(store, &key, &f, 0, &d).await?;
        sink.sent(Sent::Snapshot, &key, file, d.bytes);
        Ok(())
    }

    /// The build-id objects in OUT/.debug not handled yet: each once in the
    /// store's shared `.debug/`, and referenced by this run.
    async fn send_objects(&mut self, store: &Store, sink: &mut dyn Sink) -> Result<(), SendError> {
        let debug = self.out.join(".debug");
        for (elf, id, path) in debug_objects(&debug) {
            if self.objects.contains(&elf) {
                continue;
            }
            let shared = keys::debug_object(&self.key.prefix, &id);
            if self.journal.confirmed(&shared).is_none() {
                let f = File::open(&elf).map_err(SendError::Local)?;
                let d = send::digest(&f).map_err(SendError::Local)?;
                if send::holds(store, &shared, &d)
                    .await
                    .map_err(SendError::Store)?
                {
                    self.confirm(&shared, &d)?;
                    sink.sent(Sent::Shared, &shared, &id, d.bytes);
                } else {
                    self.put_file(store, &shared, &f, 0, &d).await?;
                    sink.sent(Sent::Other, &shared, &id, d.bytes);
                }
            }
            let reference = serde_json::to_vec(&serde_json::json!({"id": id, "path": path}))
                .expect("plain data");
            self.put_bytes(store, &self.key.object_ref(&id), &reference, sink)
                .await?;
            self.objects.insert(elf);
        }
        Ok(())
    }

    /// Sends `d.bytes` bytes of `f` from offset `start` to `key` unless
    /// the store holds them there already (asked only in doubt).
    async fn put_file(
        &mut self,
        store: &Store,
        key: &str,
        f: &File,
        start: u64,
        d: &Digest,
    ) -> Result<(), SendError> {
        if !(self.doubt && send::holds(store, key, d).await.map_err(SendError::Store)?) {
            self.doubt = true;
            send::send_at(store, key, f, start, d).await?;
        }
        self.confirm(key, d)
    }

    /// Sends `body` to `key` unless the store confirmed this content there.
    async fn put_bytes(
        &mut self,
        store: &Store,
        key: &str,
        body: &[u8],
        sink: &mut dyn Sink,
    ) -> Result<(), SendError> {
        let d = send::digest_bytes(body);
        if self.journal.confirmed(key) == Some(d.sha256.as_str()) {
            return Ok(());
        }
        if !(self.doubt
            && send::holds(store, key, &d)
                .await
                .map_err(SendError::Store)?)
        {
            self.doubt = true;
            send::send_bytes(store, key, body).await?;
        }
        self.confirm(key, &d)?;
        sink.sent(Sent::Other, key, "", d.bytes);
        Ok(())
    }

    fn confirm(&mut self, key: &str, d: &Digest) -> Result<(), SendError> {
        self.journal
            .confirm(key, d.bytes, &d.sha256)
            .map_err(SendError::Local)?;
        // Confirmed and journaled: nothing of ours is in doubt now.
        self.doubt = false;
        Ok(())
    }

    /// `--upload-delete`: the snapshot is in the store; its local copy goes.
    /// A live recorder indexes it as deleted at its next snapshot; for a run
    /// no recorder writes any more, the line is appended here.
    fn delete_local(&mut self, rel: &Path, file: &str, sink: &mut dyn Sink) {
        let dir = self.out.join(rel);
        if std::fs::remove_file(dir.join(file)).is_ok() {
            sink.deleted(file);
            if self.live {
                self.deleted_live
                    .push((rel.to_path_buf(), file.to_string()));
            } else {
                let _ = crate::output::index::append_deleted(&dir, file);
            }
        }
    }

    /// The recorders have ended: no recorder writes this run's indexes any
    /// more. A file deleted here while one ran may have gone after its last
    /// look (its end): index it as deleted now, unless it did.
    pub fn recorders_ended(&mut self) {
        self.live = false;
        for (rel, file) in std::mem::take(&mut self.deleted_live) {
            let dir = self.out.join(&rel);
            let text = std::fs::read_to_string(dir.join(INDEX_FILE)).unwrap_or_default();
            let said = text.lines().any(
                |l| matches!(IndexLine::parse(l), Some(IndexLine::Deleted(d)) if d.file == file),
            );
            if !said {
                let _ = crate::output::index::append_deleted(&dir, &file);
            }
        }
    }

    /// The run has nothing left: marked so no later agent resumes it.
    pub fn mark_done(&self) -> io::Result<()> {
        self.journal.mark_done()
    }
}

/// The objects of a build-id cache: (`elf` file, id, path of the object),
/// from `ROOT/<path>/<id>/elf` (capture/build_id_cache.rs `layout` and
/// `go_layout`); the `.build-id` links and unfinished copies are skipped.
pub fn debug_objects(root: &Path) -> Vec<(PathBuf, String, String)> {
    let mut out = Vec::new();
    walk_debug(root, Path::new(""), &mut out);
    out.sort();
    out
}

fn walk_debug(root: &Path, rel: &Path, out: &mut Vec<(PathBuf, String, String)>) {
    let Ok(entries) = std::fs::read_dir(root.join(rel)) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        let name = e.file_name();
        if ft.is_dir() && !(rel.as_os_str().is_empty() && name == ".build-id") {
            walk_debug(root, &rel.join(&name), out);
        } else if ft.is_file()
            && name == "elf"
            && let (Some(id), Some(path)) = (rel.file_name(), rel.parent())
            && path.components().next().is_some()
        {
            let id = id.to_string_lossy().into_owned();
            if keys::plain_segment(&id) {
                out.push((e.path(), id, format!("/{}", path.display())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_objects_are_read_from_perfs_layout_without_links_or_partial_copies() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let bid = "47e88be1a2b3c4d5e6f708192a3b4c5d6e7f8091";
        std::fs::create_dir_all(root.join("usr/lib/libc.so.6").join(bid)).unwrap();
        std::fs::write(root.join("usr/lib/libc.so.6").join(bid).join("elf"), b"x").unwrap();
        std::fs::create_dir_all(root.join("srv/app/go-AbC.dEf")).unwrap();
        std::fs::write(root.join("srv/app/go-AbC.dEf/elf"), b"y").unwrap();
        std::fs::write(root.join("srv/app/go-AbC.dEf/elf.tmp"), b"partial").unwrap();
        std::fs::create_dir_all(root.join(".build-id/47")).unwrap();
        std::os::unix::fs::symlink("../../usr/lib/libc.so.6/x", root.join(".build-id/47/e88b"))
            .unwrap();
        let got: Vec<(String, String)> = debug_objects(root)
            .into_iter()
            .map(|(_, id, p)| (id, p))
            .collect();
        assert_eq!(
            got,
            [
                ("go-AbC.dEf".to_string(), "/srv/app".to_string()),
                (bid.to_string(), "/usr/lib/libc.so.6".to_string())
            ]
        );
    }
}
