//! Keeps the traced processes' ELF objects in `OUT/.debug`, by build-id, so
//! that a snapshot names the right functions after a deploy replaced or
//! deleted the binary, or after OUT was copied to another host.
//!
//! The layout is perf's build-id cache, what `perf --buildid-dir OUT/.debug
//! buildid-cache -a FILE` makes (tools/perf/util/build-id.c,
//! `build_id_cache__add`):
//!
//! ```text
//! OUT/.debug/<path of the object>/<build-id>/elf        the object, code and data as holes (keep_debug.rs)
//! OUT/.debug/.build-id/<2 hex>/<38 hex> -> ../../<path of the object>/<build-id>
//! ```
//!
//! so `perf --buildid-dir OUT/.debug script -i SNAPSHOT` finds each object
//! by the build-id that perf recorded in the snapshot's MMAP2 events
//! (`--buildid-mmap`, see perf/record.rs). The links are relative: OUT can
//! be moved.
//!
//! Objects are copied, never hard-linked: perf's own `buildid-cache -a`
//! links when it can, and a deploy that rewrites the file in place (`cp new
//! old`) then rewrites the cached copy too (docs/build-ids.md).
//!
//! When: a recorder asks for a scan of its process when perf is ready and
//! after each snapshot ([`scan`]). A scan reads /proc/PID/maps; objects seen
//! before (same path and inode) cost nothing more, and an object is copied
//! once per build-id for the whole run, whatever the number of processes and
//! snapshots. The copies run on a thread of their own, so a large binary
//! never delays the driver. One cache serves the whole run: with `--exe` and
//! `--config` it is in the run's root directory.

use std::{
    collections::HashSet,
    fs::{self, File, OpenOptions},
    io,
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, OnceLock, mpsc},
    thread::JoinHandle,
};

use crate::{capture::keep_debug, output::events::Printer, symbols::maps};

/// The cache's directory inside OUT, as perf's `--buildid-dir` takes it.
pub const DIR: &str = ".debug";

/// What a run's cache holds, for the log and the summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Objects copied (one per build-id).
    pub objects: u64,
    /// Their total size, bytes.
    pub bytes: u64,
    /// Mapped ELF objects without a build-id note: perf cannot tell their
    /// versions apart, so they are not kept.
    pub without_build_id: Vec<PathBuf>,
    /// Go binaries with a Go build ID but no GNU build-id: (path, Go build
    /// ID). Kept by their Go build ID ([`go_layout`]), where perf does not
    /// look (docs/build-ids.md, "Go binaries").
    pub go_build_id: Vec<(PathBuf, String)>,
    /// Objects that could not be read or copied, with the reason.
    pub failed: Vec<String>,
}

/// What the cache's thread is asked to do.
enum Msg {
    /// Copy what the process maps now.
    Scan(i32),
    /// Open what the process maps now and hold the files, copying nothing
    /// yet (the flight recorder, which writes nothing while it waits).
    Hold(i32),
    /// Copy the held files.
    Commit,
}

struct Cache {
    tx: Mutex<Option<mpsc::Sender<Msg>>>,
    thread: Mutex<Option<JoinHandle<CacheStats>>>,
}

static CACHE: OnceLock<Cache> = OnceLock::new();

/// Starts the run's cache in `root/.debug` (created at the first copy).
/// Later calls do nothing. Warnings go to `printer`.
pub fn init(root: &Path, printer: Arc<Printer>) {
    let root = root.join(DIR);
    let (tx, rx) = mpsc::channel::<Msg>();
    let spawned = std::thread::Builder::new()
        .name("mt-agent-symcache".into())
        .spawn(move || {
            let mut w = Worker::new(root);
            w.printer = Some(printer);
            for msg in rx {
                match msg {
                    Msg::Scan(pid) => {
                        w.hold(pid);
                        w.commit();
                    }
                    Msg::Hold(pid) => w.hold(pid),
                    Msg::Commit => w.commit(),
                }
            }
            w.commit();
            w.stats
        });
    if let Ok(thread) = spawned {
        let _ = CACHE.set(Cache {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        });
    }
}

/// Asks for the objects `pid` maps now to be kept. Never blocks on I/O; does
/// nothing without [`init`].
pub fn scan(pid: i32) {
    send(Msg::Scan(pid));
}

/// Like [`scan`], but the objects are only opened and held (the inodes the
/// process runs, whatever a deploy does to the paths later); they are
/// copied at the next [`commit`] or [`scan`], or at [`finish`].
pub fn hold(pid: i32) {
    send(Msg::Hold(pid));
}

/// Copies the held objects.
pub fn commit() {
    send(Msg::Commit);
}

fn send(msg: Msg) {
    if let Some(c) = CACHE.get()
        && let Some(tx) = c.tx.lock().map(|g| g.clone()).ok().flatten()
    {
        let _ = tx.send(msg);
    }
}

/// Waits for the scans asked so far and returns what the cache holds. With
/// `keep: false` (the run wrote no snapshot), removes the cache.
pub fn finish(keep: bool) -> Option<CacheStats> {
    let c = CACHE.get()?;
    drop(c.tx.lock().ok()?.take());
    let stats = c.thread.lock().ok()?.take()?.join().ok()?;
    if !keep && let Some(root) = ROOT.get() {
        let _ = fs::remove_dir_all(root);
    }
    Some(stats)
}

/// The cache directory, once created (for [`finish`]).
static ROOT: OnceLock<PathBuf> = OnceLock::new();

/// The scanning thread's state.
struct Worker {
    root: PathBuf,
    /// Mapped files already looked at: (path, inode).
    seen: HashSet<(PathBuf, u64)>,
    /// Build-ids kept, in hex.
    kept: HashSet<String>,
    /// Mapped files found replaced on disk, warned about: (path, inode).
    replaced: HashSet<(PathBuf, u64)>,
    stats: CacheStats,
    printer: Option<Arc<Printer>>,
    /// Opened, not yet copied: (path, file).
    held: Vec<(PathBuf, File)>,
    /// Why a copy of so many bytes into this directory's file system must
    /// not be made, if it must not: [`leaves_too_little`], replaced in unit
    /// tests so they don't depend on the free space of the disk they run on.
    room: fn(&Path, u64) -> Option<String>,
}

impl Worker {
    fn new(root: PathBuf) -> Self {
        Self {
            root,
            seen: HashSet::new(),
            kept: HashSet::new(),
            replaced: HashSet::new(),
            stats: CacheStats::default(),
            printer: None,
            held: Vec::new(),
            room: leaves_too_little,
        }
    }

    /// Opens the objects `pid` maps that were not seen before, and holds
    /// them until [`Worker::commit`].
    fn hold(&mut self, pid: i32) {
        let Ok(objects) = maps::read_objects(pid) else {
            // The process is gone: what it mapped is in the snapshots' MMAP
            // events, and was kept by earlier scans.
            return;
        };
        // Only code has frames: perf records executable mappings (MMAP2
        // without `-d`). Data mappings such as a database's shared memory
        // (`/dev/zero (deleted)`, `/SYSV...`) have no build-id to keep.
        let code = objects
            .into_iter()
            .filter(|o| o.mappings.iter().any(|m| m.perms.contains('x')));
        for o in code {
            if o.deleted
                && self.replaced.insert((o.path.clone(), o.inode))
                && let Some(r) = &self.printer
            {
                // perf re-reads /proc/PID/maps at each switch and looks up
                // "PATH (deleted)" to read the build-id: it finds nothing.
                r.warning(&format!(
                    "{} was replaced or deleted on disk while pid {pid} runs it: perf cannot read \
                     its build-id, so in the snapshots from now on its frames show as [unknown]; \
                     earlier snapshots keep their names",
                    o.path.display()
                ));
            }
            if !self.seen.insert((o.path.clone(), o.inode)) {
                continue;
            }
            match File::open(&o.open_path) {
                Ok(f) => self.held.push((o.path, f)),
                Err(e) => self.stats.failed.push(format!("{}: {e}", o.path.display())),
            }
        }
    }

    /// Copies the held objects.
    fn commit(&mut self) {
        for (path, file) in std::mem::take(&mut self.held) {
            if let Err(e) = self.keep(&path, file) {
                self.stats.failed.push(format!("{}: {e}", path.display()));
            }
        }
    }

    /// Copies one object into the cache unless its build-id is there.
    fn keep(&mut self, path: &Path, mut file: File) -> io::Result<()> {
        let Some(id) = read_build_id(&file)? else {
            if let Some(go) = read_go_build_id(&file) {
                return self.keep_go(path, file, go);
            }
            if is_elf(&mut file) {
                self.stats.without_build_id.push(path.to_path_buf());
            }
            return Ok(());
        };
        let hex = hex(&id);
        if hex.len() < 3 || self.kept.contains(&hex) {
            return Ok(());
        }
        let (dir, link, target) = layout(&self.root, path, &hex);
        if fs::symlink_metadata(&link).is_ok() {
            // Another run's cache or an earlier copy: trust it.
            self.kept.insert(hex);
            return Ok(());
        }
        let kept = Kept::of(&file)?;
        let parent = self.root.parent().unwrap_or(Path::new("/"));
        if let Some(why) = (self.room)(parent, kept.bytes()) {
            self.stats.failed.push(format!("{}: {why}", path.display()));
            self.kept.insert(hex);
            return Ok(());
        }
        let _ = ROOT.set(self.root.clone());
        mkdirs(&self.root, &dir)?;
        let bytes = copy_new(&file, &kept, &dir.join("elf"))?;
        mkdirs(&self.root, link.parent().expect("link has a parent"))?;
        match std::os::unix::fs::symlink(&target, &link) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        self.stats.objects += 1;
        self.stats.bytes += bytes;
        self.kept.insert(hex);
        Ok(())
    }
}

impl Worker {
    /// Copies a Go binary that has no GNU build-id into its [`go_layout`]
    /// place, once per Go build ID.
    fn keep_go(&mut self, path: &Path, file: File, go: String) -> io::Result<()> {
        let key = format!("go:{go}");
        if self.kept.contains(&key) {
            return Ok(());
        }
        self.kept.insert(key);
        self.stats
            .go_build_id
            .push((path.to_path_buf(), go.clone()));
        let dir = go_layout(&self.root, path, &go);
        if dir.join("elf").exists() {
            return Ok(());
        }
        let kept = Kept::of(&file)?;
        let parent = self.root.parent().unwrap_or(Path::new("/"));
        if let Some(why) = (self.room)(parent, kept.bytes()) {
            self.stats.failed.push(format!("{}: {why}", path.display()));
            return Ok(());
        }
        let _ = ROOT.set(self.root.clone());
        mkdirs(&self.root, &dir)?;
        let bytes = copy_new(&file, &kept, &dir.join("elf"))?;
        self.stats.objects += 1;
        self.stats.bytes += bytes;
        Ok(())
    }
}

/// Where the cache keeps a Go binary that has no GNU build-id, by its Go
/// build ID: `ROOT/<path of the object>/go-<Go build ID, '/' as '.'>`
/// (a Go build ID is `actionID/contentID` in base64url, cmd/go/internal/work/buildid.go).
pub fn go_layout(root: &Path, path: &Path, go_build_id: &str) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    let name: String = go_build_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '.'
            }
        })
        .collect();
    root.join(rel).join(format!("go-{name}"))
}

/// A Go binary the cache kept ([`go_layout`]) whose path now holds another
/// build, or nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoReplaced {
    /// The binary's path when it ran.
    pub path: PathBuf,
    /// The kept copy.
    pub kept: PathBuf,
    /// The Go build ID of the file now at the path, if it is a Go binary.
    pub now: Option<String>,
}

/// The Go binaries kept below `root` (a run's `OUT/.debug`) whose path
/// holds another Go build ID now, or no file: perf names their frames from
/// that file. Directories are walked at most [`GO_WALK_DEPTH`] deep.
pub fn go_replaced(root: &Path) -> Vec<GoReplaced> {
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), 0)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let (p, name) = (e.path(), e.file_name());
            if !e.file_type().is_ok_and(|t| t.is_dir()) || name == ".build-id" {
                continue;
            }
            let is_go = name.to_str().is_some_and(|n| n.starts_with("go-"));
            if !is_go {
                if depth < GO_WALK_DEPTH {
                    stack.push((p, depth + 1));
                }
                continue;
            }
            let kept = p.join("elf");
            let Some(id) = File::open(&kept).ok().and_then(|f| read_go_build_id(&f)) else {
                continue;
            };
            let Ok(rel) = dir.strip_prefix(root) else {
                continue;
            };
            let path = Path::new("/").join(rel);
            let now = File::open(&path).ok().and_then(|f| read_go_build_id(&f));
            if now.as_deref() != Some(id.as_str()) {
                out.push(GoReplaced { path, kept, now });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// How deep [`go_replaced`] looks below the cache: the depth of the kept
/// paths (`/usr/local/bin/x` is 3).
pub const GO_WALK_DEPTH: usize = 16;

/// The Go build ID of a Go binary: the description of its `.note.go.buildid`
/// note (name "Go", type 4, cmd/link/internal/ld/elf.go `elfwritegobuildid`).
pub fn read_go_build_id(file: &File) -> Option<String> {
    use object::{Object as _, ObjectSection as _};
    let data = object::ReadCache::new(file);
    let elf = object::File::parse(&data).ok()?;
    let note = elf.section_by_name(".note.go.buildid")?.data().ok()?;
    parse_go_note(note)
}

/// The description of an ELF note named "Go" of type 4 (little-endian
/// header: name size, description size, type; name and description padded
/// to 4 bytes).
fn parse_go_note(note: &[u8]) -> Option<String> {
    let word = |i: usize| -> Option<usize> {
        let b: [u8; 4] = note.get(i..i + 4)?.try_into().ok()?;
        Some(u32::from_le_bytes(b) as usize)
    };
    let (namesz, descsz, kind) = (word(0)?, word(4)?, word(8)?);
    // Go's linker writes the name with its padding: size 4, "Go\0\0".
    let name = note.get(12..12 + namesz)?;
    if kind != 4 || name.iter().rev().skip_while(|&&b| b == 0).count() != 2 || &name[..2] != b"Go" {
        return None;
    }
    let start = 12 + namesz.div_ceil(4) * 4;
    let desc = note.get(start..start.checked_add(descsz)?)?;
    let id = std::str::from_utf8(desc).ok()?;
    (!id.is_empty()).then(|| id.to_string())
}

/// Space the snapshots keep for themselves: a copy is skipped when it would
/// leave less free than this, or than a tenth of the file system.
pub const RESERVE_BYTES: u64 = 64 << 20;

/// Why copying `size` bytes into the file system of `dir` would take space
/// the snapshots need, if it would.
fn leaves_too_little(dir: &Path, size: u64) -> Option<String> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    let free = s.blocks_available() * s.fragment_size();
    let total = s.blocks() * s.fragment_size();
    too_little(free, total, size)
}

/// [`leaves_too_little`]'s rule on a file system with `free` of `total`
/// bytes free: the reserve is [`RESERVE_BYTES`] or a tenth of `total`.
fn too_little(free: u64, total: u64, size: u64) -> Option<String> {
    let reserve = RESERVE_BYTES.max(total / 10);
    (free < size.saturating_add(reserve)).then(|| {
        format!(
            "not kept: {size} bytes would leave less than {} MiB free for the snapshots",
            reserve >> 20
        )
    })
}

/// Where perf's build-id cache keeps the object at `path` with build-id
/// `hex`: (its directory, the `.build-id` link, the link's relative target).
pub fn layout(root: &Path, path: &Path, hex: &str) -> (PathBuf, PathBuf, PathBuf) {
    let rel = path.strip_prefix("/").unwrap_or(path);
    let dir = root.join(rel).join(hex);
    let link = root.join(".build-id").join(&hex[..2]).join(&hex[2..]);
    let target = Path::new("../..").join(rel).join(hex);
    (dir, link, target)
}

/// Lowercase hex, as perf names build-ids.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The GNU build-id note of an ELF file, if it has one; a file that is not
/// ELF has none. Read on demand (`pread`), not mapped: a target that
/// truncates its file gives a short read, not SIGBUS.
pub fn read_build_id(file: &File) -> io::Result<Option<Vec<u8>>> {
    // Only the headers and the notes: not the symbol tables, which
    // `object::File::parse` would read (4.4 MB of node's).
    Ok(crate::symbols::elf::gnu_build_id(&object::ReadCache::new(
        file,
    )))
}

fn is_elf(file: &mut File) -> bool {
    use std::io::{Read as _, Seek as _};
    let mut magic = [0u8; 4];
    file.rewind().is_ok() && file.read_exact(&mut magic).is_ok() && magic == *b"\x7fELF"
}

/// Creates `dir` and its parents below `root`, mode 0700.
fn mkdirs(root: &Path, dir: &Path) -> io::Result<()> {
    if !root.exists() {
        fs::DirBuilder::new().mode(0o700).create(root)?;
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// What of an object the cache keeps: its length and the byte ranges
/// written (capture/keep_debug.rs); the rest are holes.
struct Kept {
    len: u64,
    ranges: Vec<std::ops::Range<u64>>,
}

impl Kept {
    fn of(file: &File) -> io::Result<Kept> {
        let len = file.metadata()?.len();
        let ranges = match keep_debug::section_headers(file) {
            Some(sections) => keep_debug::kept_ranges(&sections, len),
            None => std::iter::once(0..len).collect(),
        };
        Ok(Kept { len, ranges })
    }

    /// The bytes written, and so what the disk holds.
    fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }
}

/// Writes what `kept` names of `from` into a new file `to` (mode 0600,
/// never through a symlink), through a temporary name, so that perf never
/// sees a half-written object. Returns the bytes written.
fn copy_new(from: &File, kept: &Kept, to: &Path) -> io::Result<u64> {
    let tmp = to.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let copied = keep_debug::copy_sparse(from, &out, kept.len, &kept.ranges)
        .and_then(|n| out.sync_data().map(|()| n));
    match copied {
        Ok(n) => {
            fs::rename(&tmp, to)?;
            Ok(n)
        }
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_perfs() {
        let (dir, link, target) = layout(
            Path::new("/out/.debug"),
            Path::new("/usr/bin/app"),
            "47e88be14769cc0fde7d4d222d7e9a13a57f48fe",
        );
        assert_eq!(
            dir,
            Path::new("/out/.debug/usr/bin/app/47e88be14769cc0fde7d4d222d7e9a13a57f48fe")
        );
        assert_eq!(
            link,
            Path::new("/out/.debug/.build-id/47/e88be14769cc0fde7d4d222d7e9a13a57f48fe")
        );
        assert_eq!(
            target,
            Path::new("../../usr/bin/app/47e88be14769cc0fde7d4d222d7e9a13a57f48fe")
        );
    }

    #[test]
    fn our_own_executable_is_kept_once_with_a_relative_link() {
        let exe = std::env::current_exe().unwrap();
        let id = read_build_id(&File::open(&exe).unwrap()).unwrap();
        let Some(id) = id else {
            // rustc's test binaries carry a build-id on Linux (ld's default
            // in Debian's gcc); without one there is nothing to keep.
            panic!("{} has no build-id", exe.display());
        };
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join(DIR);
        let mut w = Worker::new(root.clone());
        // The test binary is large (debug info); the rule about free space
        // has its own test below.
        w.room = |_, _| None;
        w.keep(Path::new("/some/app"), File::open(&exe).unwrap())
            .unwrap();
        w.keep(Path::new("/other/path"), File::open(&exe).unwrap())
            .unwrap();
        assert_eq!(w.stats.objects, 1);
        let (dir, link, _) = layout(&root, Path::new("/some/app"), &hex(&id));
        // The copy is the object's layout: its length, its headers and
        // symbol tables; code and data are holes (keep_debug.rs).
        let copied = fs::read(dir.join("elf")).unwrap();
        let original = fs::read(&exe).unwrap();
        assert_eq!(copied.len(), original.len());
        let sections = keep_debug::section_headers(&File::open(&exe).unwrap()).unwrap();
        let kept = keep_debug::kept_ranges(&sections, original.len() as u64);
        assert!(kept.len() > 1, "nothing left out: {kept:?}");
        let mut written = vec![0u8; original.len()];
        for r in kept {
            let r = r.start as usize..r.end as usize;
            written[r.clone()].copy_from_slice(&original[r]);
        }
        assert!(
            copied == written,
            "the copy is not the kept ranges and holes"
        );
        let symtab = sections.iter().find(|s| s.name == ".symtab").unwrap();
        let at = symtab.offset as usize..(symtab.offset + symtab.size) as usize;
        assert_eq!(copied[at.clone()], original[at]);
        // The link resolves, and still does once the tree is moved.
        assert!(link.join("elf").is_file());
        let moved = tmp.path().join("moved");
        fs::rename(&root, &moved).unwrap();
        let (_, link, _) = layout(&moved, Path::new("/some/app"), &hex(&id));
        assert!(link.join("elf").is_file());
    }

    #[test]
    fn a_copy_that_would_fill_the_disk_is_counted_as_not_kept() {
        const G: u64 = 1 << 30;
        // A tenth of the file system, or 64 MiB, stays free.
        assert_eq!(too_little(100 * G, 200 * G, 80 * G), None);
        let why = too_little(100 * G, 200 * G, 81 * G).unwrap();
        assert!(why.contains("less than 20480 MiB free"), "{why}");
        assert!(too_little(100 << 20, 200 << 20, 40 << 20).is_some());
        assert_eq!(too_little(100 << 20, 200 << 20, 36 << 20), None);

        let exe = std::env::current_exe().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let mut w = Worker::new(tmp.path().join(DIR));
        w.room = |_, size| Some(format!("not kept: {size} bytes"));
        w.keep(Path::new("/some/app"), File::open(&exe).unwrap())
            .unwrap();
        assert_eq!(w.stats.objects, 0);
        assert_eq!(w.stats.failed.len(), 1, "{:?}", w.stats.failed);
        assert!(w.stats.failed[0].starts_with("/some/app: not kept: "));
        assert!(!tmp.path().join(DIR).exists());
    }

    #[test]
    fn a_go_build_id_note_is_read() {
        // The note of the tests' Go target (go 1.19), shortened.
        let id = b"tkviB_YAaGRq/uIT1SoVBra8h/GQM6OzLWii4Q/WBblZxofhhnS";
        let mut note = Vec::new();
        // As go 1.19's linker writes it (readelf -x .note.go.buildid).
        note.extend(4u32.to_le_bytes());
        note.extend((id.len() as u32).to_le_bytes());
        note.extend(4u32.to_le_bytes());
        note.extend(b"Go\0\0");
        note.extend(id);
        assert_eq!(
            parse_go_note(&note).as_deref(),
            Some("tkviB_YAaGRq/uIT1SoVBra8h/GQM6OzLWii4Q/WBblZxofhhnS")
        );
        // A GNU note (type 3) is not a Go build ID.
        let mut gnu = note.clone();
        gnu[8] = 3;
        assert_eq!(parse_go_note(&gnu), None);
        assert_eq!(parse_go_note(&note[..20]), None);
        // The name without its padding in the size is the same note.
        let mut short = note.clone();
        short[0] = 3;
        assert_eq!(parse_go_note(&short), parse_go_note(&note));
        let mut other = note.clone();
        other[13] = b'N';
        assert_eq!(parse_go_note(&other), None);
        assert_eq!(
            go_layout(Path::new("/o/.debug"), Path::new("/srv/app"), "a/b-c_d"),
            Path::new("/o/.debug/srv/app/go-a.b-c_d")
        );
        // Not a Go binary: our own test executable.
        let exe = std::env::current_exe().unwrap();
        assert_eq!(read_go_build_id(&File::open(exe).unwrap()), None);
    }

    #[test]
    fn files_that_are_not_elf_have_no_build_id() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        fs::write(tmp.path(), b"not an object").unwrap();
        assert_eq!(
            read_build_id(&File::open(tmp.path()).unwrap()).unwrap(),
            None
        );
    }
}
