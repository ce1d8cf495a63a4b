//! Opening files that someone else controls: a target's files under
//! `/proc/PID/root`, or the files of an output directory that came from
//! elsewhere (`mt-agent report`).
//!
//! Every open is relative to a directory fd and goes through `openat2(2)`
//! (Linux 5.6+) with a [`Scope`] that keeps the walk inside that directory:
//! * [`Scope::InRoot`] (`RESOLVE_IN_ROOT`): the directory is `/` for the
//!   walk; absolute symlinks and `..` resolve against it, as they do for the
//!   process that owns the root, never against the agent's root;
//! * [`Scope::Beneath`] (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`): no symlink
//!   at all, and nothing outside the directory.
//!
//! Both add `RESOLVE_NO_MAGICLINKS`. The file is first opened `O_PATH`
//! (which opens no device and never blocks on a FIFO), `fstat`ed, and only a
//! regular file is then reopened for reading through `/proc/self/fd/N`, with
//! `O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC`. The reopen reaches the
//! inode the `O_PATH` fd holds, so a rename in between changes nothing.
//! docs/safe-open.md gives the kernel's rules this relies on.

use std::{
    fmt,
    fs::File,
    io::{self, Read as _},
    os::fd::{AsFd, AsRawFd as _, BorrowedFd, OwnedFd},
    os::unix::fs::{FileTypeExt as _, MetadataExt as _},
    path::{Component, Path, PathBuf},
};

use nix::{
    errno::Errno,
    fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2},
    sys::stat::Mode,
};

/// How a path is resolved beneath a directory fd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `RESOLVE_IN_ROOT`: the directory is the root of the walk. For a
    /// target's `/proc/PID/root`.
    InRoot,
    /// `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`: stays beneath the directory
    /// and follows no symlink. For an output directory.
    Beneath,
}

impl Scope {
    fn flags(self) -> ResolveFlag {
        let base = ResolveFlag::RESOLVE_NO_MAGICLINKS;
        match self {
            Scope::InRoot => base | ResolveFlag::RESOLVE_IN_ROOT,
            Scope::Beneath => {
                base | ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS
            }
        }
    }
}

/// Why a file was not opened. `Display` gives the reason for a log line.
#[derive(Debug)]
pub enum Refused {
    /// Nothing there (ENOENT, ENOTDIR).
    Missing,
    /// Not a regular file: a FIFO, a device, a socket or a directory.
    NotRegular(&'static str),
    /// The walk would leave the directory (EXDEV), or met a symlink where
    /// none is allowed or too many (ELOOP).
    Escapes(Errno),
    /// Larger than the size budget, bytes.
    TooLarge { size: u64, budget: u64 },
    /// The kernel has no `openat2` (ENOSYS: Linux before 5.6).
    NoOpenat2,
    /// Opened, but not what the caller reads (e.g. "not an ELF file").
    Unusable(&'static str),
    /// Anything else (permissions, I/O).
    Io(io::Error),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Missing => f.write_str("does not exist"),
            Refused::NotRegular(kind) => write!(f, "is {kind}, not a regular file"),
            Refused::Escapes(Errno::EXDEV) => {
                f.write_str("its path leads outside the directory it must stay in")
            }
            Refused::Escapes(Errno::ELOOP) => {
                f.write_str("its path has a symlink that may not be followed here, or a loop")
            }
            Refused::Escapes(e) => write!(f, "its path cannot be resolved safely ({e})"),
            Refused::TooLarge { size, budget } => write!(
                f,
                "is {}, over the {} size budget",
                human_size(*size),
                human_size(*budget)
            ),
            Refused::NoOpenat2 => f.write_str(
                "cannot be opened safely: this kernel has no openat2 (Linux 5.6 or later needed)",
            ),
            Refused::Unusable(why) => f.write_str(why),
            Refused::Io(e) => write!(f, "cannot be opened: {e}"),
        }
    }
}

impl std::error::Error for Refused {}

/// `N MiB` from 1 MiB up, else `N bytes`.
pub fn human_size(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

impl From<Errno> for Refused {
    fn from(e: Errno) -> Self {
        match e {
            Errno::ENOENT | Errno::ENOTDIR => Refused::Missing,
            Errno::EXDEV | Errno::ELOOP => Refused::Escapes(e),
            Errno::ENOSYS => Refused::NoOpenat2,
            e => Refused::Io(io::Error::from(e)),
        }
    }
}

/// Whether the kernel has `openat2` (Linux 5.6+). Without it, nothing
/// under a target's root can be opened safely, and mt-agent refuses with
/// exit code 3.
pub fn check_kernel() -> Result<(), crate::error::Failure> {
    let root = Dir::open(Path::new("/")).map_err(|e| {
        crate::error::Failure::environment(format!("cannot open / as a directory: {e}"))
    })?;
    match path_fd(root.fd.as_fd(), Path::new("."), Scope::InRoot) {
        Err(Refused::NoOpenat2) => Err(crate::error::Failure::environment(
            "this kernel has no openat2(2) (Linux 5.6 or later): mt-agent needs it to open \
             a target's files inside the target's root; upgrade the kernel",
        )),
        _ => Ok(()),
    }
}

/// A directory that paths are resolved beneath (an `O_PATH` fd).
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    /// How the directory is named in messages, e.g. `/proc/42/root`.
    pub label: PathBuf,
}

impl Dir {
    /// Opens `path` as a directory (following symlinks and magic links in
    /// `path` itself: the caller chose it).
    pub fn open(path: &Path) -> Result<Self, Refused> {
        let fd = open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self {
            fd,
            label: path.to_path_buf(),
        })
    }

    /// The root directory of process `pid`, `/proc/PID/root`.
    pub fn root_of(pid: i32) -> Result<Self, Refused> {
        Self::open(Path::new(&format!("/proc/{pid}/root")))
    }

    /// Opens the regular file at `rel` beneath this directory for reading.
    /// For any caller that reads a directory it does not trust, such as
    /// `mt-agent report` on an output directory (with [`Scope::Beneath`]).
    pub fn open_file(&self, rel: &Path, scope: Scope) -> Result<Opened, Refused> {
        open_beneath(self.fd.as_fd(), rel, scope, self.label.join(relative(rel)))
    }

    /// `fstat` of what `rel` names beneath this directory, without opening
    /// it for reading (an `O_PATH` fd): a FIFO or device is not opened.
    pub fn stat(&self, rel: &Path, scope: Scope) -> Result<std::fs::Metadata, Refused> {
        let fd = path_fd(self.fd.as_fd(), rel, scope)?;
        File::from(fd).metadata().map_err(Refused::Io)
    }
}

/// A regular file, open for reading, with its metadata and label.
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    pub meta: std::fs::Metadata,
    /// The path it is named by in messages.
    pub label: PathBuf,
}

impl Opened {
    /// Reads the whole file, refusing one larger than `budget` bytes (for
    /// the small files of a directory read with [`Scope::Beneath`]).
    /// Reading (not mapping) means a file that shrinks under us gives a
    /// short read, not a SIGBUS.
    pub fn read_all(mut self, budget: u64) -> Result<Vec<u8>, Refused> {
        let size = self.meta.len();
        if size > budget {
            return Err(Refused::TooLarge { size, budget });
        }
        let mut data = Vec::with_capacity(size as usize);
        // take(budget + 1): a file that grew past the budget since fstat.
        (&mut self.file)
            .take(budget + 1)
            .read_to_end(&mut data)
            .map_err(Refused::Io)?;
        if data.len() as u64 > budget {
            return Err(Refused::TooLarge {
                size: data.len() as u64,
                budget,
            });
        }
        Ok(data)
    }

    /// Reads at most `n` bytes from the start (a header).
    pub fn read_head(&mut self, n: usize) -> Result<Vec<u8>, Refused> {
        use std::os::unix::fs::FileExt as _;
        let mut buf = vec![0u8; n];
        let mut got = 0;
        while got < n {
            match self.file.read_at(&mut buf[got..], got as u64) {
                Ok(0) => break,
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Refused::Io(e)),
            }
        }
        buf.truncate(got);
        Ok(buf)
    }
}

/// `rel` without a leading `/` (openat2 with `RESOLVE_BENEATH` refuses an
/// absolute path; `RESOLVE_IN_ROOT` takes either).
fn relative(rel: &Path) -> PathBuf {
    rel.components()
        .filter(|c| !matches!(c, Component::RootDir | Component::Prefix(_)))
        .collect()
}

/// The `O_PATH` fd of `rel` beneath `dir`. Retries EAGAIN, which the kernel
/// returns when a concurrent rename could have let `..` escape.
fn path_fd(dir: BorrowedFd<'_>, rel: &Path, scope: Scope) -> Result<OwnedFd, Refused> {
    let rel = relative(rel);
    let rel = if rel.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        rel
    };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(scope.flags());
    let mut tries = 0;
    loop {
        match openat2(dir, &rel, how) {
            Err(Errno::EAGAIN | Errno::EINTR) if tries < 16 => tries += 1,
            r => return r.map_err(Refused::from),
        }
    }
}

fn open_beneath(
    dir: BorrowedFd<'_>,
    rel: &Path,
    scope: Scope,
    label: PathBuf,
) -> Result<Opened, Refused> {
    let fd = path_fd(dir, rel, scope)?;
    reopen_regular(fd, label)
}

/// Checks that the `O_PATH` fd is a regular file and reopens it for reading.
fn reopen_regular(fd: OwnedFd, label: PathBuf) -> Result<Opened, Refused> {
    let meta = File::from(fd.try_clone().map_err(Refused::Io)?)
        .metadata()
        .map_err(Refused::Io)?;
    let kind = file_kind(&meta);
    if kind != "a regular file" {
        return Err(Refused::NotRegular(kind));
    }
    let file = File::from(open(
        Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())),
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?);
    let reopened = file.metadata().map_err(Refused::Io)?;
    if (reopened.dev(), reopened.ino()) != (meta.dev(), meta.ino()) {
        return Err(Refused::Io(io::Error::other("file changed while opening")));
    }
    Ok(Opened {
        file,
        meta: reopened,
        label,
    })
}

/// "a FIFO", "a character device"... for messages.
pub fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "a symlink"
    }
}

/// How mt-agent names a target's file, split into how to open it.
#[derive(Debug, PartialEq, Eq)]
enum Where<'a> {
    /// `/proc/PID/root/REST`: REST inside the target's root.
    InRootOf(i32, PathBuf),
    /// `/proc/PID/exe`, `/proc/PID/map_files/...`: a kernel magic link to
    /// the very file the target runs or maps.
    ProcLink(&'a Path),
    /// Any other path: the agent's own file system (a path the user gave,
    /// or the host's `/usr/lib/debug`).
    Host(&'a Path),
}

fn classify(path: &Path) -> Where<'_> {
    let mut c = path.components();
    if c.next() == Some(Component::RootDir)
        && c.next() == Some(Component::Normal("proc".as_ref()))
        && let Some(Component::Normal(pid)) = c.next()
        && let Some(pid) = pid.to_str().and_then(|p| p.parse::<i32>().ok())
    {
        match c.next() {
            Some(Component::Normal(n)) if n == "root" => {
                return Where::InRootOf(pid, c.as_path().to_path_buf());
            }
            Some(Component::Normal(n)) if n == "exe" || n == "map_files" => {
                return Where::ProcLink(path);
            }
            _ => {}
        }
    }
    Where::Host(path)
}

/// Opens a file named the way mt-agent names a target's files: a path
/// under `/proc/PID/root/` is resolved inside that root ([`Scope::InRoot`]),
/// `/proc/PID/exe` and `/proc/PID/map_files/*` are opened through the
/// kernel's link, and any other path in the agent's own root. Always a
/// regular file, never a FIFO or device.
pub fn open_labelled(path: &Path) -> Result<Opened, Refused> {
    match classify(path) {
        Where::InRootOf(pid, rest) => {
            let root = Dir::root_of(pid)?;
            open_beneath(root.fd.as_fd(), &rest, Scope::InRoot, path.to_path_buf())
        }
        Where::ProcLink(p) => {
            let fd = open(p, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())?;
            reopen_regular(fd, p.to_path_buf())
        }
        Where::Host(p) => {
            let root = Dir::open(Path::new("/"))?;
            open_beneath(root.fd.as_fd(), p, Scope::InRoot, p.to_path_buf())
        }
    }
}

/// `fstat` of a file named as for [`open_labelled`], without opening it
/// for reading: a FIFO or device is not opened.
pub fn stat_labelled(path: &Path) -> Result<std::fs::Metadata, Refused> {
    match classify(path) {
        Where::InRootOf(pid, rest) => Dir::root_of(pid)?.stat(&rest, Scope::InRoot),
        Where::ProcLink(p) | Where::Host(p) => std::fs::metadata(p).map_err(Refused::Io),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> (tempfile::TempDir, Dir) {
        let t = tempfile::tempdir().unwrap();
        let r = t.path().join("root");
        std::fs::create_dir_all(r.join("usr/lib")).unwrap();
        std::fs::write(r.join("usr/lib/real"), b"inside").unwrap();
        std::fs::write(t.path().join("outside"), b"outside").unwrap();
        let d = Dir::open(&r).unwrap();
        (t, d)
    }

    fn read(d: &Dir, rel: &str, scope: Scope) -> Result<String, Refused> {
        let o = d.open_file(Path::new(rel), scope)?;
        Ok(String::from_utf8(o.read_all(1 << 20)?).unwrap())
    }

    #[test]
    fn absolute_symlinks_resolve_inside_the_root() {
        let (t, d) = tree();
        let r = t.path().join("root");
        symlink("/usr/lib/real", r.join("abs")).unwrap();
        symlink(t.path().join("outside"), r.join("host")).unwrap();
        symlink("../../../../../../outside", r.join("dotdot")).unwrap();
        assert_eq!(read(&d, "abs", Scope::InRoot).unwrap(), "inside");
        assert_eq!(read(&d, "/abs", Scope::InRoot).unwrap(), "inside");
        // The host path does not exist inside the root.
        assert!(matches!(
            read(&d, "host", Scope::InRoot),
            Err(Refused::Missing)
        ));
        // `..` stops at the root.
        assert!(matches!(
            read(&d, "dotdot", Scope::InRoot),
            Err(Refused::Missing)
        ));
    }

    #[test]
    fn beneath_follows_no_symlink_and_stays_below() {
        let (t, d) = tree();
        let r = t.path().join("root");
        symlink("usr/lib/real", r.join("rel")).unwrap();
        assert_eq!(read(&d, "usr/lib/real", Scope::Beneath).unwrap(), "inside");
        assert!(matches!(
            read(&d, "rel", Scope::Beneath),
            Err(Refused::Escapes(_))
        ));
        assert!(matches!(
            read(&d, "../outside", Scope::Beneath),
            Err(Refused::Escapes(Errno::EXDEV))
        ));
    }

    #[test]
    fn fifos_and_devices_are_refused_without_blocking() {
        let (t, d) = tree();
        let r = t.path().join("root");
        nix::unistd::mkfifo(&r.join("fifo"), Mode::S_IRUSR | Mode::S_IWUSR).unwrap();
        symlink("/dev/null", r.join("null")).unwrap();
        assert!(matches!(
            read(&d, "fifo", Scope::InRoot),
            Err(Refused::NotRegular("a FIFO"))
        ));
        assert!(matches!(
            read(&d, "usr", Scope::InRoot),
            Err(Refused::NotRegular("a directory"))
        ));
        // /dev/null is resolved inside the root, where it does not exist.
        assert!(matches!(
            read(&d, "null", Scope::InRoot),
            Err(Refused::Missing)
        ));
        // Through the host's root, it is a device, refused.
        let host = Dir::open(Path::new("/")).unwrap();
        assert!(matches!(
            host.open_file(Path::new("/dev/null"), Scope::InRoot),
            Err(Refused::NotRegular("a character device"))
        ));
    }

    #[test]
    fn reads_over_the_budget_are_refused() {
        let (_t, d) = tree();
        let o = d
            .open_file(Path::new("usr/lib/real"), Scope::InRoot)
            .unwrap();
        let e = o.read_all(3).unwrap_err();
        assert_eq!(e.to_string(), "is 6 bytes, over the 3 bytes size budget");
    }

    #[test]
    fn labels_are_classified() {
        assert_eq!(
            classify(Path::new("/proc/7/root/usr/lib/x.so")),
            Where::InRootOf(7, PathBuf::from("usr/lib/x.so"))
        );
        assert_eq!(
            classify(Path::new("/proc/7/exe")),
            Where::ProcLink(Path::new("/proc/7/exe"))
        );
        assert_eq!(
            classify(Path::new("/proc/self/root/x")),
            Where::Host(Path::new("/proc/self/root/x"))
        );
        assert_eq!(
            classify(Path::new("/usr/lib/debug/x")),
            Where::Host(Path::new("/usr/lib/debug/x"))
        );
    }

    #[test]
    fn own_root_and_exe_open_through_labels() {
        let me = std::process::id();
        let exe = open_labelled(Path::new(&format!("/proc/{me}/exe"))).unwrap();
        assert!(exe.meta.is_file());
        let own = std::env::current_exe().unwrap();
        let via_root = format!("/proc/{me}/root{}", own.display());
        assert!(open_labelled(Path::new(&via_root)).is_ok());
    }
}
