//! Attaching a loaded uprobe program without aya's `&mut` program handle,
//! so that a thread other than the driver can do it (disarm/arming_thread.rs).
//!
//! The same two system calls aya 0.14 makes for a uprobe
//! (`aya::sys::perf_event_open_probe` and `perf_attach`):
//! `perf_event_open` on the `uprobe` PMU (type from
//! /sys/bus/event_source/devices/uprobe/type, `config1` the path,
//! `config2` the file offset, `config` bit 0 for a uretprobe), then
//! `BPF_LINK_CREATE` of type `BPF_PERF_EVENT` with the attach cookie
//! (include/uapi/linux/bpf.h, include/uapi/linux/perf_event.h).

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::Path,
    sync::OnceLock,
};

/// `BPF_LINK_CREATE` (enum bpf_cmd).
const BPF_LINK_CREATE: libc::c_long = 28;
/// `BPF_PERF_EVENT` (enum bpf_attach_type).
const BPF_PERF_EVENT: u32 = 41;
/// `PERF_ATTR_SIZE_VER8`, bytes.
const PERF_ATTR_SIZE: usize = 136;

/// One attached uprobe: closing both fds detaches it.
pub struct RawLink {
    _link: OwnedFd,
    _perf: OwnedFd,
}

fn uprobe_pmu_type() -> io::Result<u32> {
    static TYPE: OnceLock<Result<u32, String>> = OnceLock::new();
    TYPE.get_or_init(|| {
        std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")
            .map_err(|e| e.to_string())
            .and_then(|s| s.trim().parse().map_err(|e| format!("{e}")))
    })
    .clone()
    .map_err(io::Error::other)
}

/// Attaches `prog` as a uprobe (a uretprobe if `ret`) at `path`+`offset`
/// in process `pid` (-1: every process), with `cookie`.
pub fn attach(
    prog: BorrowedFd<'_>,
    path: &Path,
    offset: u64,
    ret: bool,
    pid: i32,
    cookie: u64,
) -> io::Result<RawLink> {
    let name = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let perf = perf_event_open(
        uprobe_pmu_type()?,
        u64::from(ret),
        &name,
        offset,
        pid,
        false,
    )?;
    Ok(RawLink {
        _link: link(prog, perf.as_fd(), cookie)?,
        _perf: perf,
    })
}

/// Opens a perf event of the tracepoint with this `id` (a tracefs uprobe
/// event's, `events/GROUP/NAME/id`) in process `pid` (-1: every process),
/// created disabled: it samples nothing, and a program attached to the
/// event runs anyway (`__uprobe_perf_func()` in kernel/trace/trace_uprobe.c
/// runs the event's programs before looking at its samplers).
pub fn open_tracepoint(id: u64, pid: i32) -> io::Result<OwnedFd> {
    /// `PERF_TYPE_TRACEPOINT`.
    const TRACEPOINT: u32 = 2;
    perf_event_open(TRACEPOINT, id, c"", 0, pid, true)
}

/// `perf_event_open(2)` with a zeroed attr but for these fields.
fn perf_event_open(
    kind: u32,
    config: u64,
    config1: &std::ffi::CStr,
    config2: u64,
    pid: i32,
    disabled: bool,
) -> io::Result<OwnedFd> {
    // struct perf_event_attr, zeroed, as u64 words.
    let mut attr = [0u64; PERF_ATTR_SIZE / 8];
    attr[0] = u64::from(kind) | ((PERF_ATTR_SIZE as u64) << 32); // type, size
    attr[1] = config;
    attr[5] = u64::from(disabled); // flags: bit 0 `disabled`
    if !config1.is_empty() {
        attr[7] = config1.as_ptr() as u64; // config1: uprobe_path
    }
    attr[8] = config2; // config2: probe_offset
    // SAFETY: a valid perf_event_attr of the size it states; `config1`
    // lives across the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            libc::c_long::from(pid),
            // Any CPU; perf_event_open refuses pid -1 with cpu -1, and a
            // program attached to a uprobe runs on every CPU whatever the
            // event's CPU (as aya does for its file-wide uprobes).
            libc::c_long::from(if pid == -1 { 0 } else { -1 }),
            -1 as libc::c_long,       // no group
            libc::c_ulong::from(8u8), // PERF_FLAG_FD_CLOEXEC
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Attaches `prog` to the perf event `perf` with `cookie`: a BPF link.
pub fn link(prog: BorrowedFd<'_>, perf: BorrowedFd<'_>, cookie: u64) -> io::Result<OwnedFd> {
    // union bpf_attr's link_create: prog_fd, target_fd, attach_type, flags,
    // perf_event.bpf_cookie.
    let mut link_attr = [0u64; 8];
    link_attr[0] = prog.as_raw_fd() as u32 as u64 | ((perf.as_raw_fd() as u32 as u64) << 32);
    link_attr[1] = u64::from(BPF_PERF_EVENT);
    link_attr[2] = cookie;
    // SAFETY: a bpf_attr for BPF_LINK_CREATE of the size given.
    let link = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_CREATE,
            link_attr.as_ptr(),
            std::mem::size_of_val(&link_attr) as libc::c_uint,
        )
    };
    if link < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(link as i32) })
}
