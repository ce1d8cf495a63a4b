//! The output directory and its index, `OUT/snapshots.jsonl`.
//!
//! The index has one JSON object per line, appended with a single `write()`
//! as each snapshot completes, so a reader never sees half a line:
//!
//! ```text
//! {"kind":"hit","file":"perf.data.2026113007462335","bytes":5416,
//!  "hits":[{"seq":1,"tgid":4242,"tid":4243,"cpu":1,"ktime_ns":330734672679,
//!           "args":[0,0,0,0,0,0],"merged":false}],
//!  "hit_to_kill_ns":153000,"counters":{...},"merged":0}
//! {"kind":"tail","file":"perf.data.2026113007462401","bytes":812,"hits":[],"counters":{...},"merged":0}
//! {"kind":"deleted","file":"perf.data.2026113007462335"}
//! ```
//!
//! Files the agent creates use `O_EXCL | O_NOFOLLOW` and mode 0600; the
//! directory is 0700.

use std::{
    fs::{self, DirBuilder, File, OpenOptions},
    io::{self, Write},
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::{
    error::Failure,
    output::counters::CounterValues,
    perf::{data::SampleSpan, offcpu::OffCpu},
};

/// File name of the index inside the output directory.
pub const INDEX_FILE: &str = "snapshots.jsonl";

/// One accepted hit as the index records it. Read back (`mt-agent
/// report`), a field a line lacks takes its default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct IndexedHit {
    /// Position in ring-buffer order, from 1.
    pub seq: u64,
    /// Process id (thread-group id).
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// CPU the hit ran on.
    pub cpu: u32,
    /// `bpf_ktime_get_ns` of the hit (CLOCK_MONOTONIC, ns).
    pub ktime_ns: u64,
    /// First six integer arguments at entry.
    pub args: [u64; agent_common::NARGS],
    /// `--slower-than`: how long the call took, ns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ns: Option<u64>,
    /// `--slower-than`: the return value (RAX).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retval: Option<u64>,
    /// `--slower-than` on a SysV function: where the call's return address
    /// was kept while it ran, and what it was ([`PendingReturn`]). The
    /// report puts it back into the call's DWARF stack copies, which a
    /// uretprobe leaves holding its trampoline's address.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub pending_return: Option<PendingReturn>,
    /// True when the hit did not cause its own snapshot but was merged into
    /// one already on its way.
    pub merged: bool,
    /// `--slower-than`: the call began before the snapshot's oldest sample,
    /// so the file does not reach back to its start (a flight-recorder ring
    /// too small for the call, or a call that spans an earlier snapshot).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub starts_before_samples: bool,
    /// The off-CPU breakdown of the hit's thread (`--off-cpu`, on by
    /// default with `--slower-than`). The recorder computes it from the
    /// file's context-switch records before indexing.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub off_cpu: Option<OffCpu>,
}

/// The return address of a `--slower-than` call while it ran: the stack
/// address of its slot (the stack pointer at entry) and the value read
/// there at entry. Both are virtual addresses in the target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingReturn {
    pub entry_sp: u64,
    pub return_address: u64,
}

/// Kind of a snapshot file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    /// Closed because of one or more accepted hits.
    Hit,
    /// perf's last file, renamed as it stopped.
    Tail,
}

impl SnapshotKind {
    /// `hit` or `tail`, as the index writes it.
    pub fn name(self) -> &'static str {
        match self {
            SnapshotKind::Hit => "hit",
            SnapshotKind::Tail => "tail",
        }
    }
}

/// A completed snapshot file: the one record behind both its index line and
/// its `snapshot` event (fields in this order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub kind: SnapshotKind,
    /// File name, relative to the output directory.
    pub file: String,
    /// File size when it completed, bytes. The state machine leaves it 0;
    /// the recorder fills it in from the file before indexing.
    #[serde(default)]
    pub bytes: u64,
    /// The hits it answers: the cause first, then merged hits.
    #[serde(default)]
    pub hits: Vec<IndexedHit>,
    /// Time from the first hit to the SIGUSR2 (CLOCK_MONOTONIC), ns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hit_to_kill_ns: Option<u64>,
    /// Time from the SIGUSR2 to perf's `Dump` line for this file, as the
    /// driver read it (CLOCK_MONOTONIC), ns: how long perf took to complete
    /// the snapshot (docs/perf-kallsyms.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_to_dump_ns: Option<u64>,
    /// Merged hits beyond the listed ones (`MAX_LISTED_HITS`, capture/snapshot.rs): counted, not listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unlisted_hits: u64,
    /// Samples in the file and the times of the first and last, on the
    /// hits' clock. The recorder reads them from the file before indexing
    /// (absent when it cannot be read).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub span: Option<SampleSpan>,
    /// With the off-CPU breakdown: the time from which the file shows the
    /// target (its oldest record, or later where a flight-recorder ring
    /// overwrote; CLOCK_MONOTONIC ns). Before it, a hit's breakdown is
    /// unknown (docs/off-cpu.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records_from_ns: Option<u64>,
    /// With the off-CPU breakdown: records perf lost in this file
    /// (`PERF_RECORD_LOST`, `PERF_RECORD_LOST_SAMPLES`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub lost_records: u64,
    /// The stretches where perf lost records, `[from_ns, to_ns]`
    /// CLOCK_MONOTONIC: unknown in a hit's breakdown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_ns: Vec<crate::perf::offcpu::Gap>,
}

impl Snapshot {
    /// The stretches the file does not show, for
    /// [`crate::perf::offcpu::breakdown`]: before
    /// [`Self::records_from_ns`] and where perf lost records. An index line
    /// from before these fields existed has none.
    pub fn gaps(&self) -> Vec<crate::perf::offcpu::Gap> {
        let mut v: Vec<_> = self.records_from_ns.map(|t| [0, t]).into_iter().collect();
        v.extend(self.lost_ns.iter().copied());
        v
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A trigger's disarming so far, as each index line records it (`disarm`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisarmCounters {
    /// Disarm cycles started.
    pub cycles: u64,
    /// Time the probes were out in the cycles that have ended, ns.
    pub disarmed_ns: u64,
}

/// Local time as `YYYYmmdd-HHMMSS`.
pub fn local_timestamp() -> String {
    // SAFETY: time(NULL) and localtime_r with valid pointers.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        format!(
            "{:04}{:02}{:02}-{:02}{:02}{:02}",
            tm.tm_year + 1900,
            tm.tm_mon + 1,
            tm.tm_mday,
            tm.tm_hour,
            tm.tm_min,
            tm.tm_sec
        )
    }
}

/// The output directory of a run. Unless [`OutputDir::keep`] is called, it
/// is tidied away on drop: an empty index is removed, and the directory too
/// if mt-agent created it and it is empty. So a run that fails before perf
/// wrote anything leaves nothing behind.
pub struct OutputDir {
    pub path: PathBuf,
    created: bool,
    keep: bool,
}

impl OutputDir {
    /// Creates (or accepts) the directory; see [`prepare_output_dir`].
    pub fn prepare(dir: &Path) -> Result<Self, Failure> {
        let created = prepare_output_dir(dir)?;
        let path = dir
            .canonicalize()
            .map_err(|e| Failure::usage(format!("output directory {}: {e}", dir.display())))?;
        Ok(Self {
            path,
            created,
            keep: false,
        })
    }

    /// The run produced output: keep everything.
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for OutputDir {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let index = self.path.join(INDEX_FILE);
        if fs::metadata(&index).is_ok_and(|m| m.len() == 0) {
            let _ = fs::remove_file(&index);
        }
        if self.created {
            // Fails, as it should, unless the directory is empty.
            let _ = fs::remove_dir(&self.path);
        }
    }
}

/// Creates the output directory (mode 0700). An existing directory is
/// accepted only if it is empty, ours, and not writable by others. Returns
/// whether it was created.
///
/// Errors (exit code 2): it exists and is not empty, it is not a directory,
/// or it cannot be created (read-only file system, missing parent).
pub fn prepare_output_dir(dir: &Path) -> Result<bool, Failure> {
    match fs::symlink_metadata(dir) {
        Ok(meta) => {
            if !meta.is_dir() {
                return Err(Failure::usage(format!(
                    "output {} exists and is not a directory; give a new --output",
                    dir.display()
                )));
            }
            let not_empty = fs::read_dir(dir)
                .map_err(|e| {
                    Failure::usage(format!(
                        "cannot read output directory {}: {e}",
                        dir.display()
                    ))
                })?
                .next()
                .is_some();
            if not_empty {
                return Err(Failure::usage(format!(
                    "output directory {} exists and is not empty (a previous run?); \
                     give a new --output",
                    dir.display()
                )));
            }
            // SAFETY: geteuid has no preconditions.
            let euid = unsafe { libc::geteuid() };
            if meta.uid() != euid || meta.mode() & 0o022 != 0 {
                return Err(Failure::usage(format!(
                    "output directory {} is not owned by us or is writable by others; \
                     give a new --output (mt-agent creates it)",
                    dir.display()
                )));
            }
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(|e| {
                Failure::usage(format!(
                    "cannot use output directory {}: {e}",
                    dir.display()
                ))
            })?;
            check_writable(dir).map(|()| false)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map(|()| true)
            .map_err(|e| {
                Failure::usage(format!(
                    "cannot create output directory {}: {e}; give a writable --output",
                    dir.display()
                ))
            }),
        Err(e) => Err(Failure::usage(format!(
            "output directory {}: {e}",
            dir.display()
        ))),
    }
}

fn check_writable(dir: &Path) -> Result<(), Failure> {
    if nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_err()
        || nix::sys::statvfs::statvfs(dir)
            .is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
    {
        return Err(Failure::usage(format!(
            "output directory {} is not writable (read-only file system?); give a writable --output",
            dir.display()
        )));
    }
    Ok(())
}

/// Creates a new file in the output directory: `O_EXCL | O_NOFOLLOW`, mode
/// 0600, so a file or symlink planted there is never followed or reused.
pub fn create_exclusive(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// Appends a `deleted` line to the index in `dir`, for a directory whose
/// recorder has ended (or never ran in this agent): `O_APPEND`, one
/// `write()`, never through a symlink.
pub fn append_deleted(dir: &Path, file: &str) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut line = serde_json::to_vec(&Deleted::new(file)).map_err(io::Error::other)?;
    line.push(b'\n');
    OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join(INDEX_FILE))?
        .write_all(&line)
}

/// The index writer.
pub struct Index {
    file: File,
    path: PathBuf,
    /// Bytes of complete lines written so far.
    len: u64,
}

/// One line of the index, as the recorder writes it and the report reads
/// it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum IndexLine<'a> {
    /// A listed file that is gone (perf's `--switch-max-files`, from
    /// `--keep`, or `--max-disk`).
    Deleted(Deleted),
    /// A completed snapshot.
    Snapshot(Box<SnapshotLine<'a>>),
}

/// A completed snapshot's line: the snapshot's fields, then the kernel's
/// counters and the merged count at that moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotLine<'a> {
    #[serde(flatten)]
    pub snapshot: Cow<'a, Snapshot>,
    /// The kernel's counters when the snapshot completed.
    #[serde(default)]
    pub counters: CounterValues,
    /// Hits merged into snapshots so far.
    #[serde(default)]
    pub merged: u64,
    /// The trigger's disarming so far (GUIDE.md, "Disarming during a
    /// cooldown"); absent for a trigger that never disarms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disarm: Option<DisarmCounters>,
}

/// `{"kind":"deleted","file":…}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    kind: DeletedKind,
    pub file: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum DeletedKind {
    Deleted,
}

impl Deleted {
    pub fn new(file: &str) -> Self {
        Self {
            kind: DeletedKind::Deleted,
            file: file.to_string(),
        }
    }
}

impl IndexLine<'static> {
    /// Parses one line; None for one that is not an index line of the
    /// expected shape (a truncated copy, say).
    pub fn parse(line: &str) -> Option<Self> {
        serde_json::from_str(line).ok()
    }
}

impl Index {
    /// Creates `dir/snapshots.jsonl`.
    pub fn create(dir: &Path) -> io::Result<Self> {
        let path = dir.join(INDEX_FILE);
        Ok(Self {
            file: create_exclusive(&path)?,
            path,
            len: 0,
        })
    }

    /// The index's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a snapshot line.
    pub fn snapshot(
        &mut self,
        snapshot: &Snapshot,
        counters: CounterValues,
        merged: u64,
        disarm: Option<DisarmCounters>,
    ) -> io::Result<()> {
        self.line(&IndexLine::Snapshot(Box::new(SnapshotLine {
            snapshot: Cow::Borrowed(snapshot),
            counters,
            merged,
            disarm,
        })))
    }

    /// Appends a line saying a listed file was deleted (perf's
    /// `--switch-max-files`, from `--keep`).
    pub fn deleted(&mut self, file: &str) -> io::Result<()> {
        self.line(&IndexLine::Deleted(Deleted::new(file)))
    }

    fn line<T: Serialize>(&mut self, value: &T) -> io::Result<()> {
        let mut buf = serde_json::to_vec(value).map_err(io::Error::other)?;
        buf.push(b'\n');
        // One write() per line, appended with O_APPEND. On a full disk a
        // write can land in part: cut the file back to its last complete
        // line, so the index never holds half a line.
        match self.file.write_all(&buf) {
            Ok(()) => {
                self.len += buf.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.len);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_dir_rules() {
        let tmp = tempfile::tempdir().unwrap();
        let new = tmp.path().join("a/b");
        assert!(prepare_output_dir(&new).unwrap());
        assert_eq!(fs::metadata(&new).unwrap().mode() & 0o777, 0o700);
        // Empty and ours: accepted again.
        assert!(!prepare_output_dir(&new).unwrap());
        fs::write(new.join("x"), "").unwrap();
        let err = prepare_output_dir(&new).unwrap_err();
        assert!(err.message.contains("not empty"), "{}", err.message);
        let file = tmp.path().join("f");
        fs::write(&file, "").unwrap();
        assert!(
            prepare_output_dir(&file)
                .unwrap_err()
                .message
                .contains("not a directory")
        );
    }

    #[test]
    fn an_unused_output_dir_is_tidied_away() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        {
            let out = OutputDir::prepare(&dir).unwrap();
            Index::create(&out.path).unwrap();
        }
        assert!(!dir.exists());
        {
            let mut out = OutputDir::prepare(&dir).unwrap();
            let mut idx = Index::create(&out.path).unwrap();
            idx.deleted("x").unwrap();
            out.keep();
        }
        assert!(dir.join(INDEX_FILE).exists());
    }

    #[test]
    fn index_lines_are_json_and_never_follow_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let mut idx = Index::create(tmp.path()).unwrap();
        let snap = Snapshot {
            kind: crate::output::index::SnapshotKind::Tail,
            file: "perf.data.1".into(),
            bytes: 10,
            hits: vec![],
            hit_to_kill_ns: None,
            kill_to_dump_ns: None,
            unlisted_hits: 0,
            span: None,
            records_from_ns: None,
            lost_records: 0,
            lost_ns: Vec::new(),
        };
        idx.snapshot(
            &snap,
            crate::output::counters::CounterValues::default(),
            0,
            None,
        )
        .unwrap();
        idx.deleted("perf.data.1").unwrap();
        let text = fs::read_to_string(idx.path()).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            text.lines().next().unwrap(),
            r#"{"kind":"tail","file":"perf.data.1","bytes":10,"hits":[],"counters":{"seen":0,"dropped":{"tid":0,"when":0,"duration":0,"every":0,"rate":0,"cooldown":0,"no_return":0,"error":0},"accepted":0,"lost":0},"merged":0}"#
        );
        assert_eq!(lines[0]["kind"], "tail");
        assert_eq!(lines[1]["kind"], "deleted");
        let back: Vec<IndexLine> = text.lines().filter_map(IndexLine::parse).collect();
        assert_eq!(
            back,
            [
                IndexLine::Snapshot(Box::new(SnapshotLine {
                    snapshot: Cow::Owned(snap.clone()),
                    counters: Default::default(),
                    merged: 0,
                    disarm: None,
                })),
                IndexLine::Deleted(Deleted::new("perf.data.1")),
            ]
        );
        assert_eq!(fs::metadata(idx.path()).unwrap().mode() & 0o777, 0o600);

        let dir2 = tempfile::tempdir().unwrap();
        let victim = dir2.path().join("victim");
        fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir2.path().join(INDEX_FILE)).unwrap();
        assert!(Index::create(dir2.path()).is_err());
        assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
    }

    #[test]
    fn a_hit_line_reads_back_as_written() {
        use crate::perf::{
            data::SampleSpan,
            offcpu::{Breakdown, OffCpu},
        };
        let hit = IndexedHit {
            seq: 3,
            tgid: 10,
            tid: 11,
            cpu: 1,
            ktime_ns: 5_000,
            args: [1, 2, 3, 4, 5, 6],
            duration_ns: Some(900),
            retval: Some(7),
            pending_return: Some(PendingReturn {
                entry_sp: 0x7ffd_0000_1000,
                return_address: 0x5555_0000_1234,
            }),
            merged: false,
            starts_before_samples: true,
            off_cpu: Some(OffCpu {
                off_cpu_from_ns: 4_100,
                breakdown: Breakdown {
                    on_cpu_ns: 500,
                    runnable_ns: 60,
                    blocked_ns: 300,
                    unknown_ns: 40,
                },
                reaches_start: false,
            }),
        };
        let line = IndexLine::Snapshot(Box::new(SnapshotLine {
            snapshot: Cow::Owned(Snapshot {
                kind: SnapshotKind::Hit,
                file: "perf.data.2".into(),
                bytes: 99,
                hits: vec![
                    hit.clone(),
                    IndexedHit {
                        merged: true,
                        ..hit
                    },
                ],
                hit_to_kill_ns: Some(40),
                kill_to_dump_ns: Some(3_000_000),
                unlisted_hits: 2,
                span: Some(SampleSpan {
                    samples: 12,
                    first_sample_ns: 1_000,
                    last_sample_ns: 6_000,
                }),
                records_from_ns: Some(4_140),
                lost_records: 3,
                lost_ns: vec![[4_500, 4_600]],
            }),
            counters: Default::default(),
            merged: 1,
            disarm: Some(DisarmCounters {
                cycles: 4,
                disarmed_ns: 8,
            }),
        }));
        let text = serde_json::to_string(&line).unwrap();
        assert_eq!(IndexLine::parse(&text), Some(line));
        for field in [
            r#""unknown_ns":40"#,
            r#""lost_ns":[[4500,4600]]"#,
            r#""records_from_ns":4140"#,
        ] {
            assert!(text.contains(field), "{field} not in {text}");
        }
        // A line without the optional parts still reads.
        let bare = r#"{"kind":"hit","file":"f","hits":[{"seq":1,"tgid":2,"tid":3,"ktime_ns":4}]}"#;
        let Some(IndexLine::Snapshot(s)) = IndexLine::parse(bare) else {
            panic!("not a snapshot line")
        };
        assert_eq!(s.snapshot.hits[0].off_cpu, None);
        assert_eq!(s.snapshot.span, None);
        assert!(s.snapshot.gaps().is_empty());
        // A breakdown written before `unknown_ns` existed reads as all known.
        let old = r#"{"kind":"hit","file":"f","hits":[{"seq":1,"tgid":2,"tid":3,"ktime_ns":9,
            "off_cpu_from_ns":4,"on_cpu_ns":2,"runnable_ns":1,"blocked_ns":2}]}"#;
        let Some(IndexLine::Snapshot(s)) = IndexLine::parse(old) else {
            panic!("not a snapshot line")
        };
        let o = s.snapshot.hits[0].off_cpu.unwrap();
        assert_eq!((o.breakdown.blocked_ns, o.breakdown.unknown_ns), (2, 0));
        assert_eq!(IndexLine::parse(r#"{"kind":"tail","fi"#), None);
    }
}
