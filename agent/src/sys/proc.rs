//! What /proc says about a process: its stat and status fields, whether it lives, its age and CPU time. Only reads /proc.

use std::{
    fs, io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::Duration,
};

/// `PF_KTHREAD` in the flags field of /proc/PID/stat (include/linux/sched.h).
pub const PF_KTHREAD: u64 = 0x0020_0000;

/// The fields of /proc/PID/stat that mt-agent uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// Process state letter: R, S, D, T, t, Z, X, I.
    pub state: char,
    /// Parent process id (field 4).
    pub ppid: i32,
    /// `PF_*` flags.
    pub flags: u64,
    /// User CPU time, clock ticks.
    pub utime: u64,
    /// System CPU time, clock ticks.
    pub stime: u64,
    /// When the process started, clock ticks after boot (field 22,
    /// `starttime`; the kernel counts it on the boot-time clock).
    pub starttime: u64,
}

/// Parses /proc/PID/stat text. The command name can hold spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state); field N is f[N - 3].
    Some(Stat {
        state: f.first()?.chars().next()?,
        ppid: f.get(4 - 3)?.parse().ok()?,
        flags: f.get(9 - 3)?.parse().ok()?,
        utime: f.get(14 - 3)?.parse().ok()?,
        stime: f.get(15 - 3)?.parse().ok()?,
        starttime: f.get(22 - 3)?.parse().ok()?,
    })
}

/// `pid`'s ancestors, parent first, up to (not including) pid 1, at most
/// `max` of them; fewer when one has gone.
pub fn ancestors(pid: i32, max: usize) -> Vec<i32> {
    let mut out = Vec::new();
    let mut p = pid;
    while out.len() < max {
        match stat(p) {
            Ok(s) if s.ppid > 1 => {
                out.push(s.ppid);
                p = s.ppid;
            }
            _ => break,
        }
    }
    out
}

/// Reads and parses /proc/PID/stat.
pub fn stat(pid: i32) -> io::Result<Stat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| io::Error::other("unparsable /proc/PID/stat"))
}

/// CPU time (user + system) a process has used, from /proc/PID/stat.
pub fn cpu_time(pid: i32) -> Option<Duration> {
    let s = stat(pid).ok()?;
    Some(ticks_to_duration(s.utime + s.stime))
}

/// Converts clock ticks (`sysconf(_SC_CLK_TCK)`, 100 on Linux) to a Duration.
pub fn ticks_to_duration(ticks: u64) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / hz)
}

/// How long ago the process started: `CLOCK_BOOTTIME` now minus its
/// `starttime` (10 ms resolution with 100 clock ticks a second).
pub fn age(pid: i32) -> Option<Duration> {
    let started = ticks_to_duration(stat(pid).ok()?.starttime);
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    Duration::from(now).checked_sub(started)
}

/// (device, inode) of the file a process is running, or None if it is gone.
pub fn exe_id(pid: i32) -> Option<(u64, u64)> {
    let m = fs::metadata(format!("/proc/{pid}/exe")).ok()?;
    Some((m.dev(), m.ino()))
}

/// Whether the process still exists and is not a zombie.
pub fn is_alive(pid: i32) -> bool {
    stat(pid).is_ok_and(|s| s.state != 'Z' && s.state != 'X')
}

/// Whether `pid` is a kernel thread (no user memory).
pub fn is_kernel_thread(pid: i32) -> bool {
    stat(pid).is_ok_and(|s| s.flags & PF_KTHREAD != 0)
}

/// Reads one `Key:\tvalue` line of /proc/PID/status.
pub fn status_field(pid: i32, key: &str) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|r| r.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    })
}

/// `pid`'s id in its own (innermost) pid namespace: the last field of the
/// `NSpid:` line of /proc/PID/status (proc(5), Linux 4.1+). A process in a
/// container names its files by that id (`/tmp/perf-<id>.map`).
pub fn ns_pid(pid: i32) -> Option<i32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| parse_ns_pid(&t))
}

/// [`ns_pid`]'s pure part: `NSpid:\t4242\t17\t1` → 1; a kernel without the
/// line (before 4.1) or a line without a number gives `None`.
pub fn parse_ns_pid(status: &str) -> Option<i32> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// The threads of process `pid` now (`/proc/PID/task`); none where it is
/// gone.
pub fn threads(pid: i32) -> Vec<u32> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// `pid`'s descendants alive now, children before grandchildren, at most
/// `max`: from `/proc/PID/task/TID/children` (proc(5); Linux 3.5+ with
/// `CONFIG_PROC_CHILDREN`, empty without it).
pub fn descendants(pid: i32, max: usize) -> Vec<i32> {
    let mut out: Vec<i32> = Vec::new();
    let mut next = 0;
    let mut parent = Some(pid);
    while let Some(p) = parent {
        let tasks = fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten();
        for t in tasks.flatten() {
            let text = fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for c in text
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                if out.len() < max && c != pid && !out.contains(&c) {
                    out.push(c);
                }
            }
        }
        parent = out.get(next).copied();
        next += 1;
    }
    out
}

/// The path through which a file of the target's mount namespace is read:
/// `/proc/PID/root/<path>`, which works across containers.
pub fn in_root(pid: i32, path: &Path) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    PathBuf::from(format!("/proc/{pid}/root")).join(rel)
}

/// The kernel's host name (`uname -n`, uname(2)); "localhost" if unreadable.
pub fn host_name() -> String {
    // SAFETY: utsname is plain data, filled by uname(2).
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return "localhost".into();
    }
    // SAFETY: uname NUL-terminates nodename.
    let name = unsafe { std::ffi::CStr::from_ptr(u.nodename.as_ptr()) };
    let name = name.to_string_lossy().into_owned();
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_survives_odd_command_names() {
        let text = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 5000 0";
        let s = parse_stat(text).unwrap();
        assert_eq!(s.state, 'S');
        assert_eq!(s.ppid, 1);
        assert_eq!(s.flags, 4194560);
        assert_eq!((s.utime, s.stime), (7, 3));
        assert_eq!(s.starttime, 5000);
    }

    #[test]
    fn a_child_lists_its_parent_first() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let up = ancestors(child.id() as i32, 8);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(up.first(), Some(&me), "{up:?}");
        assert!(!up.contains(&1));
    }

    #[test]
    fn own_process_is_alive_and_readable() {
        let me = std::process::id() as i32;
        assert!(is_alive(me));
        assert!(exe_id(me).is_some());
        assert!(cpu_time(me).is_some());
        assert!(age(me).is_some_and(|a| a < Duration::from_secs(365 * 86400)));
        assert_eq!(
            status_field(me, "Pid").as_deref(),
            Some(me.to_string().as_str())
        );
    }

    #[test]
    fn the_pid_in_the_innermost_namespace_is_the_last_of_nspid() {
        let status = "Name:\tnode\nTgid:\t4242\nNSpid:\t4242\t17\t1\nPPid:\t1\n";
        assert_eq!(parse_ns_pid(status), Some(1));
        assert_eq!(parse_ns_pid("NSpid:\t4242\n"), Some(4242));
        // A kernel before 4.1 has no such line.
        assert_eq!(parse_ns_pid("Name:\tx\nPid:\t3\n"), None);
        assert_eq!(parse_ns_pid("NSpid:\t\n"), None);
        assert_eq!(parse_ns_pid("NSpid:\t12\tx\n"), None);
        // The test runs in the host's namespace, or in one of its own.
        let me = std::process::id() as i32;
        assert!(ns_pid(me).is_some_and(|p| p > 0));
    }

    #[test]
    fn a_grandchild_is_a_descendant() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & wait"])
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let sh = child.id() as i32;
        // The shell forks its sleep soon after it starts.
        let mut found = Vec::new();
        for _ in 0..200 {
            found = descendants(me, 64);
            if found.iter().any(|&p| ancestors(p, 1) == [sh]) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let grandchild = found.iter().copied().find(|&p| ancestors(p, 1) == [sh]);
        if let Some(g) = grandchild {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(g),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&sh), "{found:?}");
        assert!(grandchild.is_some(), "{found:?}");
        assert!(!found.contains(&me));
    }

    #[test]
    fn paths_are_read_through_the_targets_root() {
        assert_eq!(
            in_root(7, Path::new("/usr/lib/x.so")),
            Path::new("/proc/7/root/usr/lib/x.so")
        );
    }
}
