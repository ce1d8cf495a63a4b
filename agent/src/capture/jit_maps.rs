//! Keeps the JIT symbol files of the traced processes with each snapshot:
//! the perf map (`/tmp/perf-<pid>.map`, written by `node --perf-basic-prof`
//! and other JITs) and the jitdump file (`jit-<pid>.dump`, `node
//! --perf-prof`, Java's perf agent). perf reads them when the report runs,
//! and by then the process, and with it the file, may be gone
//! (docs/jit-maps.md).
//!
//! Both files only grow. So each source file has one growing copy in the
//! recorder's directory (`DIR/.jit/perf-<pid>.map`, `<pid>` as perf.data
//! names the process), and each snapshot gets a line in `DIR/.jit/kept.jsonl`
//! with the length of the copy that covers it: the report gives perf that
//! prefix. The source is held open from the first snapshot on, so the part
//! written after the last snapshot before the process exits is still read
//! for the snapshot perf writes at its exit.
//!
//! A process in a container writes the files in its own `/tmp`, named by
//! its pid in its own pid namespace: they are read through
//! `/proc/PID/root`, with the pid from `NSpid` (sys/proc.rs).

use std::{
    collections::HashMap,
    fs::{self, File, OpenOptions},
    io::{self, BufRead as _, Write as _},
    os::unix::fs::{DirBuilderExt as _, FileExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use crate::{
    output::runs,
    symbols::maps,
    sys::{
        proc,
        safe_open::{Dir, Scope},
    },
};

pub use crate::output::jit_kept::{DIR, INDEX, KeptLine, Kind};

/// A kept file stops growing at this size (bytes): a runaway map must not
/// fill the disk the snapshots need.
pub const MAX_FILE_BYTES: u64 = 256 << 20;
/// How many descendants of a `--pid` target are looked at (it follows
/// forks: its workers' samples are in the same perf.data).
const MAX_DESCENDANTS: usize = 256;

/// A file a process writes, held open, and its copy.
struct Source {
    pid: i32,
    kind: Kind,
    src: File,
    origin: PathBuf,
    /// The copy's name inside [`DIR`].
    name: String,
    /// Bytes copied so far.
    copied: u64,
    /// Bytes up to the end of the last complete line (a perf map), or
    /// `copied` (a jitdump: perf reads its records up to a short one).
    covered: u64,
    /// Stopped growing: the cap, a shrink, or a failed write.
    stopped: bool,
}

/// What a recorder keeps: owned by its index thread.
pub struct JitKeeper {
    /// The recorder's output directory.
    dir: PathBuf,
    sources: Vec<Source>,
    /// Processes already looked at, and whether each has had its files
    /// found: (perf map, jitdump).
    found: HashMap<i32, (bool, bool)>,
    /// Bytes copied so far, all files.
    pub bytes: u64,
    /// What could not be kept, with the reason (for the log).
    pub failed: Vec<String>,
}

impl JitKeeper {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            sources: Vec::new(),
            found: HashMap::new(),
            bytes: 0,
            failed: Vec::new(),
        }
    }

    /// At snapshot `snapshot`: looks for the JIT files of `tgid` and its
    /// descendants not found yet, copies what every held file grew by, and
    /// writes one index line per file. Nothing is written for a process
    /// without JIT files.
    pub fn keep(&mut self, tgid: i32, snapshot: &str) {
        let mut pids = vec![tgid];
        pids.extend(proc::descendants(tgid, MAX_DESCENDANTS));
        for pid in pids {
            self.look(pid);
        }
        self.record(snapshot);
    }

    /// Copies what every held file grew by, and writes its index line for
    /// `snapshot`.
    fn record(&mut self, snapshot: &str) {
        if self.sources.is_empty() {
            return;
        }
        let jit = self.dir.join(DIR);
        let mut lines = Vec::new();
        for s in &mut self.sources {
            match grow(s, &jit) {
                Ok(n) => self.bytes += n,
                Err(e) => {
                    s.stopped = true;
                    self.failed.push(format!("{}: {e}", s.name));
                }
            }
            if s.covered > 0 {
                lines.push(KeptLine {
                    snapshot: snapshot.to_string(),
                    pid: s.pid,
                    kind: s.kind,
                    file: s.name.clone(),
                    bytes: s.covered,
                    origin: s.origin.clone(),
                });
            }
        }
        if let Err(e) = append_lines(&jit.join(INDEX), &lines) {
            self.failed.push(format!("{INDEX}: {e}"));
        }
    }

    /// Opens the JIT files of `pid` not found before.
    fn look(&mut self, pid: i32) {
        let (map_found, dump_found) = self.found.get(&pid).copied().unwrap_or_default();
        if map_found && dump_found {
            return;
        }
        let Some(ns_pid) = proc::ns_pid(pid) else {
            return;
        };
        let Ok(root) = Dir::root_of(pid) else {
            return;
        };
        let mut found = (map_found, dump_found);
        if !map_found {
            let origin = PathBuf::from(format!("/tmp/perf-{ns_pid}.map"));
            if let Ok(o) = root.open_file(&origin, Scope::InRoot) {
                self.add(pid, Kind::PerfMap, o.file, origin);
                found.0 = true;
            }
        }
        if !dump_found && let Some(origin) = jitdump_path(pid, ns_pid) {
            match root.open_file(&origin, Scope::InRoot) {
                Ok(o) => {
                    self.add(pid, Kind::Jitdump, o.file, origin);
                    found.1 = true;
                }
                Err(e) => {
                    found.1 = true;
                    self.failed.push(format!("{}: {e}", origin.display()));
                }
            }
        }
        self.found.insert(pid, found);
    }

    fn add(&mut self, pid: i32, kind: Kind, src: File, origin: PathBuf) {
        let name = match kind {
            Kind::PerfMap => format!("perf-{pid}.map"),
            Kind::Jitdump => format!("jit-{pid}.dump"),
        };
        self.sources.push(Source {
            pid,
            kind,
            src,
            origin,
            name,
            copied: 0,
            covered: 0,
            stopped: false,
        });
    }
}

/// The jitdump file `pid` maps, if any: perf finds it the same way, by the
/// mmap of a file named `jit-<pid>.dump`, the pid being the process's own
/// (`jit_detect()` in tools/perf/util/jitdump.c).
fn jitdump_path(pid: i32, ns_pid: i32) -> Option<PathBuf> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let want = format!("jit-{ns_pid}.dump");
    maps::parse_maps(&text)
        .into_iter()
        .find(|m| m.path.file_name().is_some_and(|n| n == want.as_str()))
        .map(|m| m.path)
}

/// Copies what `s` grew by since the last call into `jit/<name>`, up to
/// [`MAX_FILE_BYTES`]. Returns the bytes copied.
fn grow(s: &mut Source, jit: &Path) -> io::Result<u64> {
    if s.stopped {
        return Ok(0);
    }
    let len = s.src.metadata()?.len();
    if len < s.copied {
        // Rewritten from the start: the prefix kept so far is no longer
        // the file's. Earlier snapshots keep theirs.
        s.stopped = true;
        return Ok(0);
    }
    let end = len.min(MAX_FILE_BYTES);
    if end <= s.copied {
        s.stopped |= len > end;
        return Ok(0);
    }
    let mut buf = vec![0u8; (end - s.copied) as usize];
    let n = read_full_at(&s.src, &mut buf, s.copied)?;
    buf.truncate(n);
    if buf.is_empty() {
        return Ok(0);
    }
    mkdir(jit)?;
    let mut out = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(jit.join(&s.name))?;
    out.write_all(&buf)?;
    s.covered = match s.kind {
        Kind::PerfMap => covered_lines(s.covered, s.copied, &buf),
        Kind::Jitdump => s.copied + n as u64,
    };
    s.copied += n as u64;
    Ok(n as u64)
}

/// The end of the last complete line once `chunk`, which starts at offset
/// `start`, is appended to a file whose complete lines end at `covered`.
pub fn covered_lines(covered: u64, start: u64, chunk: &[u8]) -> u64 {
    match chunk.iter().rposition(|&b| b == b'\n') {
        Some(i) => start + i as u64 + 1,
        None => covered,
    }
}

/// `pread` until `buf` is full or the file ends; returns the bytes read.
fn read_full_at(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn mkdir(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

fn append_lines(path: &Path, lines: &[KeptLine]) -> io::Result<()> {
    let mut text = String::new();
    for l in lines {
        text.push_str(&serde_json::to_string(l).map_err(io::Error::other)?);
        text.push('\n');
    }
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.write_all(text.as_bytes())
}

/// A kept perf map for the report: the process's pid as perf.data names
/// it, and the prefix of the copy that covers the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptMap {
    pub pid: i32,
    pub content: Vec<u8>,
}

/// The perf maps kept for snapshot `snapshot` of the output directory
/// `dir`, each cut to the length that covers it. Opened beneath `dir`
/// (no symlink, no `..`): OUT may come from elsewhere. Empty when none was
/// kept; a line or file that can't be read is skipped.
pub fn maps_for(dir: &Path, snapshot: &str) -> Vec<KeptMap> {
    kept_for(dir, snapshot, Kind::PerfMap)
        .into_iter()
        .filter_map(|(l, f)| {
            let mut content = vec![0u8; l.bytes.min(MAX_FILE_BYTES) as usize];
            let n = read_full_at(&f, &mut content, 0).ok()?;
            content.truncate(n);
            Some(KeptMap {
                pid: l.pid,
                content,
            })
        })
        .collect()
}

/// A kept jitdump file for the report: the process's pid as perf.data
/// names it, the open copy, and how many of its bytes cover the snapshot.
#[derive(Debug)]
pub struct KeptDump {
    pub pid: i32,
    pub file: File,
    pub bytes: u64,
}

/// The jitdump files kept for snapshot `snapshot` of `dir`, opened as
/// [`maps_for`] opens the maps, by pid.
pub fn dumps_for(dir: &Path, snapshot: &str) -> Vec<KeptDump> {
    kept_for(dir, snapshot, Kind::Jitdump)
        .into_iter()
        .map(|(l, file)| KeptDump {
            pid: l.pid,
            file,
            bytes: l.bytes.min(MAX_FILE_BYTES),
        })
        .collect()
}

/// The last index line of each kept file of `kind` for `snapshot`, with
/// the file opened beneath `dir`, by pid.
fn kept_for(dir: &Path, snapshot: &str, kind: Kind) -> Vec<(KeptLine, File)> {
    let Ok(index) = runs::open_in(dir, &Path::new(DIR).join(INDEX)) else {
        return Vec::new();
    };
    let mut last: HashMap<String, KeptLine> = HashMap::new();
    for line in io::BufReader::new(index).lines().map_while(Result::ok) {
        let Some(l) = KeptLine::parse(&line) else {
            continue;
        };
        if l.snapshot == snapshot && l.kind == kind {
            last.insert(l.file.clone(), l);
        }
    }
    let mut out: Vec<(KeptLine, File)> = last
        .into_values()
        .filter_map(|l| {
            let f = runs::open_in(dir, &Path::new(DIR).join(&l.file)).ok()?;
            Some((l, f))
        })
        .collect();
    out.sort_by_key(|(l, _)| l.pid);
    out
}

/// The directory that holds the snapshot open as `file`, and its name:
/// from the descriptor's link in /proc (the path it has now, so an OUT
/// moved or copied elsewhere is found where it is).
pub fn snapshot_of(file: &File) -> Option<(PathBuf, String)> {
    use std::os::fd::AsRawFd as _;
    let path = fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()?;
    let name = path.file_name()?.to_str()?.to_string();
    Some((path.parent()?.to_path_buf(), name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_partial_last_line_is_not_covered_until_it_ends() {
        assert_eq!(covered_lines(0, 0, b"1000 10 a\n2000 1"), 10);
        assert_eq!(covered_lines(10, 17, b"0 b"), 10);
        assert_eq!(covered_lines(10, 20, b"\n"), 21);
        assert_eq!(covered_lines(0, 0, b""), 0);
    }

    /// A map written in three steps, kept at three snapshots: each
    /// snapshot reads back the prefix it was kept with, and the copy is
    /// one file that grew.
    #[test]
    fn each_snapshot_gets_the_prefix_kept_with_it() {
        let tmp = tempfile::tempdir().unwrap();
        let src_path = tmp.path().join("perf-1.map");
        let out = tmp.path().join("out");
        fs::create_dir(&out).unwrap();
        fs::write(&src_path, "1000 10 JS:*a x.js:1:1\n2000 2").unwrap();
        let mut k = JitKeeper::new(out.clone());
        let src = File::open(&src_path).unwrap();
        k.add(4242, Kind::PerfMap, src, PathBuf::from("/tmp/perf-1.map"));
        k.record("perf.data.1");
        let mut f = OpenOptions::new().append(true).open(&src_path).unwrap();
        f.write_all(b"0 JS:*b x.js:2:1\n").unwrap();
        k.record("perf.data.2");
        // The process is gone and its file with it: the held file is read.
        fs::remove_file(&src_path).unwrap();
        f.write_all(b"3000 30 JS:*c x.js:3:1\n").unwrap();
        k.record("perf.data.3");
        k.record("perf.data.4");
        assert!(k.failed.is_empty(), "{:?}", k.failed);
        let first = "1000 10 JS:*a x.js:1:1\n";
        let second = format!("{first}2000 20 JS:*b x.js:2:1\n");
        let third = format!("{second}3000 30 JS:*c x.js:3:1\n");
        let got = |snap: &str| maps_for(&out, snap);
        assert_eq!(
            got("perf.data.1"),
            [KeptMap {
                pid: 4242,
                content: first.into()
            }]
        );
        assert_eq!(got("perf.data.2")[0].content, second.as_bytes());
        assert_eq!(got("perf.data.3")[0].content, third.as_bytes());
        assert_eq!(got("perf.data.4")[0].content, third.as_bytes());
        assert_eq!(got("perf.data.5"), []);
        assert_eq!(k.bytes, third.len() as u64);
        let copy = fs::read(out.join(DIR).join("perf-4242.map")).unwrap();
        assert_eq!(copy, third.as_bytes());
        // Moved elsewhere, the run reads the same.
        let moved = tmp.path().join("moved");
        fs::rename(&out, &moved).unwrap();
        assert_eq!(
            maps_for(&moved, "perf.data.2")[0].content,
            second.as_bytes()
        );
    }

    #[test]
    fn a_file_rewritten_from_the_start_stops_growing() {
        let tmp = tempfile::tempdir().unwrap();
        let src_path = tmp.path().join("m");
        fs::write(&src_path, "1 1 a\n2 2 b\n").unwrap();
        let mut k = JitKeeper::new(tmp.path().to_path_buf());
        k.add(
            7,
            Kind::PerfMap,
            File::open(&src_path).unwrap(),
            src_path.clone(),
        );
        k.record("s1");
        fs::write(&src_path, "9 9 z\n").unwrap();
        k.record("s2");
        let kept = |s: &str| maps_for(tmp.path(), s)[0].content.clone();
        assert_eq!(kept("s1"), b"1 1 a\n2 2 b\n");
        assert_eq!(kept("s2"), b"1 1 a\n2 2 b\n");
    }

    #[test]
    fn an_index_line_naming_a_path_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join(DIR)).unwrap();
        fs::write(tmp.path().join("secret"), "x").unwrap();
        let line = KeptLine {
            snapshot: "s".into(),
            pid: 1,
            kind: Kind::PerfMap,
            file: "../secret".into(),
            bytes: 1,
            origin: "/tmp/perf-1.map".into(),
        };
        append_lines(&tmp.path().join(DIR).join(INDEX), &[line]).unwrap();
        fs::write(tmp.path().join(DIR).join(INDEX).with_extension("x"), "").unwrap();
        assert_eq!(maps_for(tmp.path(), "s"), []);
    }

    #[test]
    fn a_snapshot_is_found_by_its_descriptor() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("perf.data.2026");
        fs::write(&p, "").unwrap();
        let (dir, name) = snapshot_of(&File::open(&p).unwrap()).unwrap();
        assert_eq!(
            (dir.as_path(), name.as_str()),
            (tmp.path(), "perf.data.2026")
        );
    }
}
