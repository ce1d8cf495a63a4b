//! A small regular-file copy of `/proc/kallsyms` for perf to read.
//!
//! perf 6.1 reads `/proc/kallsyms` three times at start-up and once at every
//! switch (docs/perf-kallsyms.md has where and why). Generating it costs the
//! kernel ~50 ms of CPU per read on a host with ~120,000 kernel symbols, and
//! perf parses every line. Of all those lines perf's record side uses only
//! the few [`wanted`] keeps: the kernel's text bounds (its kernel map and the
//! `MMAP` record of `[kernel.kallsyms]_text`), the x86 entry trampolines, and
//! the BPF trampolines and dispatchers it writes `KSYMBOL` records for. So
//! perf runs in a mount namespace of its own where `/proc/kallsyms` is a bind
//! mount of this copy (see [`crate::sys::mount_ns`]); kernel symbols are
//! resolved later, by the report's `perf script`, from the real file.
//!
//! The copy is an unlinked file (`O_TMPFILE`) in `/dev/shm`; it gets a name
//! only while a perf is spawned (a bind mount needs a path), and loses it
//! right after. `MT_AGENT_PERF_KALLSYMS=proc` turns the copy off, so that
//! perf reads the real file (the bench's anchor).

use std::{
    fs::File,
    io::{self, Write},
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    thread::JoinHandle,
};

/// The environment variable that turns the copy off (`proc`).
pub const ENV: &str = "MT_AGENT_PERF_KALLSYMS";

/// Symbols perf's record side looks up by name
/// (tools/perf/util/machine.c, event.c, synthetic-events.c in Linux 6.1).
const NAMED: [&str; 5] = [
    "_text",
    "_stext",
    "_etext",
    "_entry_trampoline",
    "__entry_SYSCALL_64_trampoline",
];

/// Whether perf's record side uses this line of `/proc/kallsyms`:
/// `ADDR TYPE NAME` or `ADDR TYPE NAME\t[MODULE]`.
pub fn wanted(line: &str) -> bool {
    let mut fields = line.split_ascii_whitespace();
    let (Some(_addr), Some(_kind), Some(name)) = (fields.next(), fields.next(), fields.next())
    else {
        return false;
    };
    match fields.next() {
        None => NAMED.contains(&name),
        // perf_event__synthesize_bpf_events → process_bpf_image
        // (tools/perf/util/bpf-event.c): the `[bpf]` images.
        Some("[bpf]") => name.starts_with("bpf_trampoline_") || name.starts_with("bpf_dispatcher_"),
        Some(_) => false,
    }
}

/// The lines of `kallsyms` that [`wanted`] keeps, each ending in `\n`,
/// read a line at a time: the file is 5.4 MB here (docs/perf-kallsyms.md),
/// and read whole it was a third of the agent's peak RSS (docs/memory.md).
pub fn minimal(kallsyms: impl io::BufRead) -> io::Result<String> {
    let mut out = String::new();
    for line in kallsyms.lines() {
        let line = line?;
        if wanted(&line) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    Ok(out)
}

/// Whether perf should read the copy (the default) or the real file
/// (`MT_AGENT_PERF_KALLSYMS=proc`).
pub fn wanted_by_env() -> bool {
    std::env::var_os(ENV).is_none_or(|v| v != "proc")
}

/// The copy: an unlinked file holding [`minimal`] of `/proc/kallsyms`.
#[derive(Debug)]
pub struct KallsymsCopy {
    file: File,
    dir: PathBuf,
    /// Lines written, for the `check` line and the tests.
    pub lines: usize,
}

impl KallsymsCopy {
    /// Reads `/proc/kallsyms` (~50 ms of the kernel's CPU) and writes the copy
    /// into `/dev/shm`, or the temporary directory where that is missing.
    pub fn create() -> io::Result<Self> {
        let body = minimal(io::BufReader::new(File::open("/proc/kallsyms")?))?;
        let dir = ["/dev/shm".into(), std::env::temp_dir()]
            .into_iter()
            .find(|d: &PathBuf| d.is_dir())
            .unwrap_or_else(|| "/tmp".into());
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open(&dir)?;
        file.write_all(body.as_bytes())?;
        Ok(Self {
            file,
            dir,
            lines: body.lines().count(),
        })
    }

    /// Starts [`create`](Self::create) on a thread of its own, so that the
    /// read overlaps the rest of the set-up; `None` when the environment
    /// turns the copy off.
    pub fn start() -> Option<JoinHandle<io::Result<Self>>> {
        // In a chroot, `/` is no mount point of ours, and perf in a mount
        // namespace of its own there failed (the release's bare-Debian test):
        // perf reads the real file.
        if !wanted_by_env() || !crate::sys::mount_ns::has_mount_at(std::process::id() as i32, "/") {
            return None;
        }
        std::thread::Builder::new()
            .name("mt-agent-ksyms".into())
            .spawn(Self::create)
            .ok()
    }

    /// Gives the copy a name for as long as the returned [`Linked`] lives.
    pub fn link(&self) -> io::Result<Linked> {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let path = self
            .dir
            .join(format!(".mt-agent-kallsyms.{}.{n}", std::process::id()));
        let from = std::ffi::CString::new(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
            .expect("no NUL");
        let to = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(io::Error::other)?;
        // SAFETY: both are NUL-terminated paths; AT_SYMLINK_FOLLOW links the
        // file the magic link names (the O_TMPFILE way, open(2)).
        let r = unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        };
        if r == -1 {
            return Err(io::Error::last_os_error());
        }
        Ok(Linked { path })
    }
}

/// The copy's name while a perf is spawned; unlinked on drop.
#[derive(Debug)]
pub struct Linked {
    path: PathBuf,
}

impl Linked {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Linked {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_lines_perfs_record_side_uses_are_kept() {
        let text = "ffffffff81000000 T _text\n\
                    ffffffff81000000 T _stext\n\
                    ffffffff81000100 T do_syscall_64\n\
                    ffffffff82276988 T _etext\n\
                    ffffffffc0001000 t bpf_trampoline_6442 [bpf]\n\
                    ffffffffc0002000 t bpf_prog_abc_mt_entry [bpf]\n\
                    ffffffffc0003000 t bpf_dispatcher_xdp [bpf]\n\
                    ffffffffc0100000 t _text [kvm]\n\
                    ffffffff81e00000 T __entry_SYSCALL_64_trampoline\n\
                    garbage\n";
        assert_eq!(
            minimal(text.as_bytes()).unwrap(),
            "ffffffff81000000 T _text\n\
             ffffffff81000000 T _stext\n\
             ffffffff82276988 T _etext\n\
             ffffffffc0001000 t bpf_trampoline_6442 [bpf]\n\
             ffffffffc0003000 t bpf_dispatcher_xdp [bpf]\n\
             ffffffff81e00000 T __entry_SYSCALL_64_trampoline\n"
        );
    }

    #[test]
    fn the_copy_has_a_name_only_while_linked() {
        let copy = KallsymsCopy::create().expect("/proc/kallsyms is readable");
        let linked = copy.link().expect("linkat");
        let path = linked.path().to_path_buf();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().lines().count(),
            copy.lines
        );
        drop(linked);
        assert!(!path.exists());
    }
}
