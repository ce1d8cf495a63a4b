//! The target's mapped files, from /proc/PID/maps.

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::sys::proc;

/// One line of /proc/PID/maps that maps a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First virtual address.
    pub start: u64,
    /// One past the last virtual address.
    pub end: u64,
    /// `r-xp` and so on.
    pub perms: String,
    /// File offset of `start`, bytes.
    pub offset: u64,
    /// Inode of the mapped file.
    pub inode: u64,
    /// Path as the process sees it, without ` (deleted)`.
    pub path: PathBuf,
    /// The file was replaced or removed after it was mapped.
    pub deleted: bool,
}

/// Parses /proc/PID/maps text; keeps file-backed mappings only.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|line| {
            let mut it = line.splitn(6, ' ');
            let range = it.next()?;
            let perms = it.next()?;
            let offset = it.next()?;
            let _dev = it.next()?;
            let inode = it.next()?;
            let path = it.next()?.trim_start();
            if !path.starts_with('/') {
                return None;
            }
            let inode: u64 = inode.parse().ok()?;
            if inode == 0 {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            let (path, deleted) = match path.strip_suffix(" (deleted)") {
                Some(p) => (p, true),
                None => (path, false),
            };
            Some(Mapping {
                start: u64::from_str_radix(start, 16).ok()?,
                end: u64::from_str_radix(end, 16).ok()?,
                perms: perms.to_string(),
                offset: u64::from_str_radix(offset, 16).ok()?,
                inode,
                path: PathBuf::from(path),
                deleted,
            })
        })
        .collect()
}

/// A file the target has mapped, as one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedObject {
    /// Path as the process sees it.
    pub path: PathBuf,
    /// How mt-agent opens it and attaches to it: `/proc/PID/exe` for the
    /// main executable, else `/proc/PID/map_files/START-END` (the kernel's
    /// link to the mapped file, which works in containers and for files
    /// replaced on disk).
    pub open_path: PathBuf,
    /// The mapped file's inode.
    pub inode: u64,
    /// The file on disk differs from the one that is running.
    pub deleted: bool,
    /// The process's main executable.
    pub is_main: bool,
    /// Its mappings.
    pub mappings: Vec<Mapping>,
}

impl MappedObject {
    /// Short name for messages: the file name.
    pub fn file_name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }

    /// Whether `--object` selects this object: a path (compared as given and
    /// through the target's root), or a file name or its prefix up to a `.`
    /// or `-` (`libsqlite3` selects `libsqlite3.so.0.8.6`).
    pub fn selected_by(&self, pid: i32, object: &str) -> bool {
        if object.contains('/') {
            let want = Path::new(object);
            if want == self.path {
                return true;
            }
            // The same file by inode, through our root or the target's
            // (resolved inside its root).
            let same = |p: &Path| {
                crate::sys::safe_open::stat_labelled(p).is_ok_and(|m| m.ino() == self.inode)
            };
            return same(want) || same(&proc::in_root(pid, want));
        }
        let name = self.file_name();
        name == object
            || name
                .strip_prefix(object)
                .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('-'))
    }
}

/// Groups mappings into objects, the main executable first, then in address
/// order.
pub fn objects(pid: i32, maps: &[Mapping], exe_inode: Option<u64>) -> Vec<MappedObject> {
    let mut objects: Vec<MappedObject> = Vec::new();
    for m in maps {
        if let Some(o) = objects
            .iter_mut()
            .find(|o| o.inode == m.inode && o.path == m.path)
        {
            o.mappings.push(m.clone());
            continue;
        }
        let is_main = exe_inode == Some(m.inode);
        // Opened and attached through the kernel's own link to the file the
        // target runs or maps: never by a path under its root, which the
        // target could change (a symlink resolves against the agent's root
        // when the kernel attaches by path) between our check and the attach.
        let open_path = if is_main {
            PathBuf::from(format!("/proc/{pid}/exe"))
        } else {
            PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
        };
        let deleted = m.deleted || (!is_main && replaced_on_disk(pid, &m.path, m.inode));
        objects.push(MappedObject {
            path: m.path.clone(),
            open_path,
            inode: m.inode,
            deleted,
            is_main,
            mappings: vec![m.clone()],
        });
    }
    objects.sort_by_key(|o| !o.is_main);
    objects
}

/// Whether `path`, resolved inside the target's root (/proc/PID/root), no
/// longer names the mapped file `inode`: replaced or deleted on disk.
///
/// False once the target's root is gone: a process that is exiting loses
/// it (`exit_fs`, kernel/exit.c) after its maps were read, and nothing is
/// known of the file then. Counting that as "replaced" warned of a
/// replaced ld-linux in CI as a test target exited (stop 40).
fn replaced_on_disk(pid: i32, path: &Path, inode: u64) -> bool {
    match crate::sys::safe_open::stat_labelled(&proc::in_root(pid, path)) {
        Ok(m) => m.ino() != inode,
        Err(_) => fs::metadata(format!("/proc/{pid}/root")).is_ok(),
    }
}

/// Reads the target's maps and returns its mapped objects.
pub fn read_objects(pid: i32) -> std::io::Result<Vec<MappedObject>> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    let exe_inode = proc::exe_id(pid).map(|(_, ino)| ino);
    Ok(objects(pid, &parse_maps(&text), exe_inode))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 1234 /usr/bin/app
55d0c0a01000-55d0c0a02000 r-xp 00001000 fe:01 1234 /usr/bin/app
7f00aa000000-7f00aa100000 r-xp 00002000 fe:01 5678 /usr/lib/x86_64-linux-gnu/libsqlite3.so.0.8.6
7f00ab000000-7f00ab001000 r-xp 00000000 fe:01 9999 /tmp/my lib.so (deleted)
7f00ac000000-7f00ac021000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
";

    #[test]
    fn maps_lines_are_parsed() {
        let m = parse_maps(MAPS);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].start, 0x55d0c0a01000);
        assert_eq!(m[1].offset, 0x1000);
        assert_eq!(m[3].path, Path::new("/tmp/my lib.so"));
        assert!(m[3].deleted);
    }

    #[test]
    fn objects_group_mappings_and_put_the_executable_first() {
        let maps = parse_maps(MAPS);
        let objs = objects(1, &maps, Some(1234));
        assert_eq!(objs.len(), 3);
        assert!(objs[0].is_main);
        assert_eq!(objs[0].mappings.len(), 2);
        assert_eq!(objs[0].open_path, Path::new("/proc/1/exe"));
        let deleted = objs.iter().find(|o| o.inode == 9999).unwrap();
        assert!(deleted.deleted);
        assert!(deleted.open_path.starts_with("/proc/1/map_files/"));
    }

    #[test]
    fn a_file_is_replaced_only_while_the_target_can_tell() {
        let lib = Path::new("/proc/self/exe").canonicalize().unwrap();
        let inode = fs::metadata(&lib).unwrap().ino();
        let me = std::process::id() as i32;
        assert!(!replaced_on_disk(me, &lib, inode));
        assert!(replaced_on_disk(me, &lib, inode + 1));
        assert!(replaced_on_disk(
            me,
            Path::new("/nonexistent/lib.so"),
            inode
        ));
        // A process that exited: its root is gone, so nothing is known.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id() as i32;
        child.wait().unwrap();
        assert!(!replaced_on_disk(gone, &lib, inode + 1));
    }

    #[test]
    fn object_selection_by_name() {
        let maps = parse_maps(MAPS);
        let objs = objects(1, &maps, Some(1234));
        let sqlite = &objs[1];
        assert!(sqlite.selected_by(1, "libsqlite3"));
        assert!(sqlite.selected_by(1, "libsqlite3.so.0.8.6"));
        assert!(sqlite.selected_by(1, "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0.8.6"));
        assert!(!sqlite.selected_by(1, "libsql"));
        assert!(!objs[0].selected_by(1, "libsqlite3"));
    }
}
