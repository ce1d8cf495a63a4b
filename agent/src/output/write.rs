//! Writing the report's files: `OUT/report.html` and the folded stacks in
//! `OUT/report/`. Nothing else in OUT is touched. Each file is written to a
//! new temporary name (`O_EXCL | O_NOFOLLOW`, mode 0600) and renamed over
//! the old one, so a planted symlink is replaced, never followed, and a
//! reader never sees half a file. There is no fsync: after a crash the
//! files can be made again from the snapshots.

use std::{
    fs::{self, DirBuilder},
    io::{self, Write},
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
};

use crate::output::index::create_exclusive;

/// Creates `base/rel` one component at a time (mode 0700), refusing
/// anything on the way that is not a directory (a symlink, say).
pub fn ensure_dir(base: &Path, rel: &Path) -> io::Result<PathBuf> {
    let mut cur = base.to_path_buf();
    for part in rel.components() {
        cur.push(part);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(io::Error::other(format!(
                    "{} is in the way and is not a directory",
                    cur.display()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                DirBuilder::new().mode(0o700).create(&cur)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(cur)
}

/// Writes `path` (in a directory already checked) atomically.
pub fn replace(path: &Path, data: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other("no file name"))?
        .to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp.{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let result = create_exclusive(&tmp)
        .and_then(|mut f| f.write_all(data))
        .and_then(|()| fs::rename(&tmp, path));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_symlink_is_replaced_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        fs::write(&victim, "keep").unwrap();
        let dir = ensure_dir(tmp.path(), Path::new("report/a")).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("f")).unwrap();
        replace(&dir.join("f"), b"new").unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(fs::read_to_string(dir.join("f")).unwrap(), "new");
        std::os::unix::fs::symlink(tmp.path(), tmp.path().join("report/l")).unwrap();
        assert!(ensure_dir(tmp.path(), Path::new("report/l/x")).is_err());
    }
}
