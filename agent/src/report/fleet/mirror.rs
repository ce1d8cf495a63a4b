//! The local tree a fleet report reads: `DIR/<host>/<run>/`, laid out as
//! the run's own OUT was, so that `mt-agent report DIR` finds it:
//!
//! ```text
//! DIR/<host>/<run>/run.json, clock.json
//! DIR/<host>/<run>/<REL>/snapshots.jsonl     the selected lines (select::compose)
//! DIR/<host>/<run>/<REL>/perf.data.<time>    hard links to DIR/.store (copies across file systems)
//! DIR/<host>/<run>/<REL>/.jit/kept.jsonl     the selected snapshots' lines (select::plan_jit)
//! DIR/<host>/<run>/<REL>/.jit/<file>         a kept JIT copy, its chunks joined (one chunk: a hard link)
//! DIR/<host>/<run>/.debug/<path>/<id>/elf    perf's build-id cache (capture/build_id_cache.rs)
//! DIR/<host>/<run>/.debug/.build-id/<2 hex>/<rest> -> ../../<path>/<id>
//! ```
//!
//! An index an earlier report left that this one does not select is
//! removed, so the page shows this report's selection only.

use std::{
    collections::HashSet,
    fs,
    io::{self, Write as _},
    os::unix::fs::MetadataExt as _,
    path::{Component, Path, PathBuf},
};

use serde::Deserialize;

use super::fetch::{STORE_DIR, local_failure};
use crate::{
    capture::build_id_cache::{self, layout},
    error::Failure,
    output::{
        index::{INDEX_FILE, create_exclusive},
        jit_kept,
        run_file::RUN_FILE,
        write,
    },
};

/// `objects/<id>.json`: a build-id object a run's snapshots map.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ObjectRef {
    /// The directory name in `.debug/<path>/`: hex build-id or `go-…`.
    pub id: String,
    /// The object's path on the host, absolute.
    pub path: PathBuf,
}

impl ObjectRef {
    /// Parses the object's text; None unless it names a plain path (no `..`,
    /// absolute) and an id that is one key segment.
    pub fn parse(text: &[u8]) -> Option<Self> {
        let o: ObjectRef = serde_json::from_slice(text).ok()?;
        let mut parts = o.path.components();
        let plain = parts.next() == Some(Component::RootDir)
            && parts.clone().next().is_some()
            && parts.all(|c| matches!(c, Component::Normal(_)));
        (plain && crate::upload::keys::plain_segment(&o.id)).then_some(o)
    }

    /// A GNU build-id (hex) has a `.build-id` link; a Go build ID has none.
    fn is_hex(&self) -> bool {
        self.id.len() > 2 && self.id.bytes().all(|b| b.is_ascii_hexdigit())
    }
}

/// One index directory to mirror.
#[derive(Debug)]
pub struct MirrorDir {
    /// `REL`, "" for the run's own directory.
    pub rel: String,
    /// Its `snapshots.jsonl` lines, without `\n`.
    pub lines: Vec<String>,
    /// (file name, cached copy) of each snapshot.
    pub snapshots: Vec<(String, PathBuf)>,
    /// What the selected snapshots kept of `.jit/`, if any.
    pub jit: Option<MirrorJit>,
}

/// A mirrored directory's `.jit/` (select::plan_jit).
#[derive(Debug, Default)]
pub struct MirrorJit {
    /// Its `kept.jsonl` lines, without `\n`.
    pub lines: Vec<String>,
    /// Each kept copy's name, and the cached chunks that make it, in order
    /// from offset 0.
    pub files: Vec<(String, Vec<PathBuf>)>,
}

/// One run to mirror; every path is a cached copy in `DIR/.store`.
#[derive(Debug)]
pub struct MirrorRun {
    pub host: String,
    pub run: String,
    pub run_file: Option<PathBuf>,
    pub clock: Option<PathBuf>,
    /// Each object and its cached ELF.
    pub objects: Vec<(ObjectRef, PathBuf)>,
    pub dirs: Vec<MirrorDir>,
}

/// Builds the tree for `runs` in `dir`, and removes the indexes of an
/// earlier report that these runs do not have.
pub fn build(dir: &Path, runs: &[MirrorRun]) -> Result<(), Failure> {
    let mut indexes = HashSet::new();
    for r in runs {
        build_run(dir, r).map_err(|e| local_failure(&dir.join(&r.host).join(&r.run), e))?;
        for d in &r.dirs {
            indexes.insert(Path::new(&r.host).join(&r.run).join(&d.rel));
        }
    }
    remove_stale(dir, Path::new(""), 0, &indexes);
    Ok(())
}

fn build_run(dir: &Path, r: &MirrorRun) -> io::Result<()> {
    let base = write::ensure_dir(dir, &Path::new(&r.host).join(&r.run))?;
    if let Some(src) = &r.run_file {
        place(src, &base.join(RUN_FILE))?;
    }
    if let Some(src) = &r.clock {
        place(src, &base.join("clock.json"))?;
    }
    for d in &r.dirs {
        let at = write::ensure_dir(&base, Path::new(&d.rel))?;
        for (file, src) in &d.snapshots {
            place(src, &at.join(file))?;
        }
        let mut text = d.lines.join("\n");
        text.push('\n');
        write::replace(&at.join(INDEX_FILE), text.as_bytes())?;
        match &d.jit {
            Some(j) => place_jit(&at, j)?,
            // An earlier report's, for other snapshots.
            None => {
                let _ = fs::remove_file(at.join(jit_kept::DIR).join(jit_kept::INDEX));
            }
        }
    }
    if r.objects.is_empty() {
        return Ok(());
    }
    let root = write::ensure_dir(&base, Path::new(build_id_cache::DIR))?;
    for (o, src) in &r.objects {
        place_object(&root, o, src)?;
    }
    Ok(())
}

/// `root/<path>/<id>/elf`, and for a hex build-id its `.build-id` link.
fn place_object(root: &Path, o: &ObjectRef, src: &Path) -> io::Result<()> {
    let (obj_dir, link, target) = layout(root, &o.path, &o.id);
    let rel = obj_dir.strip_prefix(root).expect("below the cache");
    write::ensure_dir(root, rel)?;
    place(src, &obj_dir.join("elf"))?;
    if !o.is_hex() {
        return Ok(());
    }
    let parent = link.parent().expect("a link's directory");
    write::ensure_dir(root, parent.strip_prefix(root).expect("below the cache"))?;
    if fs::read_link(&link).is_ok_and(|t| t == target) {
        return Ok(());
    }
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(&target, &link)
}

/// `at/.jit/`: each kept copy, and `kept.jsonl` last, so that no line
/// names more bytes than its copy holds.
fn place_jit(at: &Path, j: &MirrorJit) -> io::Result<()> {
    let dir = write::ensure_dir(at, Path::new(jit_kept::DIR))?;
    for (file, chunks) in &j.files {
        if !jit_kept::valid_name(file) {
            continue;
        }
        match &chunks[..] {
            [one] => place(one, &dir.join(file))?,
            _ => join(chunks, &dir.join(file))?,
        }
    }
    let mut text = j.lines.join("\n");
    if !text.is_empty() {
        text.push('\n');
    }
    write::replace(&dir.join(jit_kept::INDEX), text.as_bytes())
}

/// Writes the `parts` one after the other at `dst`, by rename.
fn join(parts: &[PathBuf], dst: &Path) -> io::Result<()> {
    let tmp = dst.with_file_name(format!(
        ".{}.tmp.{}",
        dst.file_name().expect("a name").to_string_lossy(),
        std::process::id()
    ));
    let _ = fs::remove_file(&tmp);
    let result = create_exclusive(&tmp).and_then(|mut out| {
        for p in parts {
            io::copy(&mut fs::File::open(p)?, &mut out)?;
        }
        out.flush()?;
        fs::rename(&tmp, dst)
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Puts the cached `src` at `dst`: a hard link (nothing is copied), or a
/// copy where DIR/.store is on another file system. A file already there
/// that is `src` itself is left.
fn place(src: &Path, dst: &Path) -> io::Result<()> {
    if let (Ok(a), Ok(b)) = (fs::metadata(src), fs::symlink_metadata(dst))
        && a.ino() == b.ino()
        && a.dev() == b.dev()
    {
        return Ok(());
    }
    match fs::symlink_metadata(dst) {
        Ok(m) if m.is_dir() => {
            return Err(io::Error::other(format!(
                "{} is in the way and is a directory",
                dst.display()
            )));
        }
        Ok(_) => fs::remove_file(dst)?,
        Err(_) => {}
    }
    if fs::hard_link(src, dst).is_ok() {
        return Ok(());
    }
    let tmp = dst.with_file_name(format!(
        ".{}.tmp.{}",
        dst.file_name().expect("a name").to_string_lossy(),
        std::process::id()
    ));
    fs::copy(src, &tmp)?;
    fs::rename(&tmp, dst)
}

/// How deep indexes of an earlier report are looked for: as deep as the
/// report looks (output/runs.rs).
const STALE_DEPTH: usize = 4;

/// Removes `snapshots.jsonl` from directories under `dir` that are not in
/// `keep` (paths relative to `dir`), skipping the cache, the page's files
/// and `.debug`.
fn remove_stale(dir: &Path, rel: &Path, depth: usize, keep: &HashSet<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir.join(rel)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Ok(ft) = e.file_type() else { continue };
        let sub = rel.join(&name);
        if ft.is_file() && name == INDEX_FILE && !keep.contains(rel) {
            let _ = fs::remove_file(e.path());
        } else if ft.is_dir()
            && depth < STALE_DEPTH
            && name != build_id_cache::DIR
            && !(depth == 0 && (name == STORE_DIR || name == crate::report::FOLDED_DIR))
        {
            remove_stale(dir, &sub, depth + 1, keep);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_refs_name_a_plain_absolute_path() {
        let ok = ObjectRef::parse(br#"{"id":"47e88be1","path":"/usr/bin/app"}"#).unwrap();
        assert!(ok.is_hex());
        let go = ObjectRef::parse(br#"{"id":"go-abc.def","path":"/srv/app"}"#).unwrap();
        assert!(!go.is_hex());
        for bad in [
            r#"{"id":"47e8","path":"usr/bin/app"}"#,
            r#"{"id":"47e8","path":"/usr/../../etc"}"#,
            r#"{"id":"47e8","path":"/"}"#,
            r#"{"id":"../x","path":"/usr/bin/app"}"#,
            r#"{"id":".debug","path":"/usr/bin/app"}"#,
            r#"{"path":"/usr/bin/app"}"#,
        ] {
            assert_eq!(ObjectRef::parse(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn the_tree_is_a_runs_out_with_perfs_build_id_cache_its_jit_files_and_no_stale_index() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let cache = dir.join(STORE_DIR).join("b");
        fs::create_dir_all(&cache).unwrap();
        let file = |name: &str, text: &str| {
            let p = cache.join(name);
            fs::write(&p, text).unwrap();
            p
        };
        // An index from an earlier report, for a run not selected now.
        fs::create_dir_all(dir.join("web-2/r0")).unwrap();
        fs::write(dir.join("web-2/r0").join(INDEX_FILE), "{}\n").unwrap();
        let run = MirrorRun {
            host: "web-1".into(),
            run: "r1".into(),
            run_file: Some(file("run.json", "{\"triggers\":[]}")),
            clock: None,
            objects: vec![
                (
                    ObjectRef::parse(br#"{"id":"47e88be1","path":"/usr/bin/app"}"#).unwrap(),
                    file("elf1", "ELF1"),
                ),
                (
                    ObjectRef::parse(br#"{"id":"go-x","path":"/srv/go"}"#).unwrap(),
                    file("elf2", "ELF2"),
                ),
            ],
            dirs: vec![MirrorDir {
                rel: "api/4242".into(),
                lines: vec!["{\"a\":1}".into(), "{\"b\":2}".into()],
                snapshots: vec![("perf.data.1".into(), file("snap", "PERF"))],
                jit: Some(MirrorJit {
                    lines: vec![r#"{"snapshot":"perf.data.1","bytes":9}"#.into()],
                    files: vec![
                        (
                            "perf-5.map".into(),
                            vec![file("c1", "1 1 a\n"), file("c2", "2 2 b\n")],
                        ),
                        ("jit-5.dump".into(), vec![file("c3", "DUMP")]),
                    ],
                }),
            }],
        };
        for _ in 0..2 {
            build(dir, std::slice::from_ref(&run)).unwrap();
        }
        let base = dir.join("web-1/r1");
        let at = base.join("api/4242");
        assert_eq!(
            fs::read_to_string(at.join(INDEX_FILE)).unwrap(),
            "{\"a\":1}\n{\"b\":2}\n"
        );
        let snap = fs::metadata(at.join("perf.data.1")).unwrap();
        assert_eq!(snap.ino(), fs::metadata(cache.join("snap")).unwrap().ino());
        assert!(base.join(RUN_FILE).is_file());
        let debug = base.join(".debug");
        assert_eq!(
            fs::read_to_string(debug.join("usr/bin/app/47e88be1/elf")).unwrap(),
            "ELF1"
        );
        assert_eq!(
            fs::read_link(debug.join(".build-id/47/e88be1")).unwrap(),
            Path::new("../../usr/bin/app/47e88be1")
        );
        assert_eq!(
            fs::read_to_string(debug.join(".build-id/47/e88be1/elf")).unwrap(),
            "ELF1"
        );
        assert!(debug.join("srv/go/go-x/elf").is_file());
        assert!(!dir.join("web-2/r0").join(INDEX_FILE).exists());
        assert!(cache.join("snap").is_file());
        let jit = at.join(jit_kept::DIR);
        assert_eq!(
            fs::read_to_string(jit.join("perf-5.map")).unwrap(),
            "1 1 a\n2 2 b\n"
        );
        let dump = fs::metadata(jit.join("jit-5.dump")).unwrap();
        assert_eq!(dump.ino(), fs::metadata(cache.join("c3")).unwrap().ino());
        assert_eq!(
            fs::read_to_string(jit.join(jit_kept::INDEX)).unwrap(),
            "{\"snapshot\":\"perf.data.1\",\"bytes\":9}\n"
        );
    }
}
