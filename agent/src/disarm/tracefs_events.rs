//! Uprobe events of tracefs (`uprobe_events`): a uprobe with a name and an
//! id, which any number of perf events can open.
//!
//! Why not only the `uprobe` PMU (what aya uses): a PMU uprobe is its own
//! trace event, so closing its perf event unregisters the uprobe and waits
//! for RCU grace periods under the kernel's `event_mutex` (measured in
//! docs/disarming.md, "In short"). A tracefs event is shared: while one perf event
//! keeps it registered, opening another perf event for a process only
//! installs the breakpoints in that process, and closing it only removes
//! them (`uprobe_perf_open()` / `uprobe_perf_close()` in
//! kernel/trace/trace_uprobe.c; `perf_trace_event_unreg()` in
//! kernel/trace/trace_event_perf.c returns early while `perf_refcount` is
//! not zero). docs/disarming.md has what a close and an open take.
//!
//! The events of one agent are in the group `mt_agent_<pid>`: the agent
//! deletes them at the end, a reaper process does if the agent is killed
//! (tracefs_reaper.rs), and the next agent that disarms deletes the groups of
//! agents that are gone ([`remove_stale`]).

use std::{
    fs::OpenOptions,
    io::{self, Write},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
};

/// Where tracefs is, or is mounted by perf (tools/lib/api/fs/fs.c).
const TRACEFS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The tracefs directory with `uprobe_events`, mounting tracefs at
/// /sys/kernel/tracing if it is not mounted (as perf does for a
/// tracepoint, and leaves it mounted).
pub fn tracefs() -> io::Result<PathBuf> {
    let found = || {
        TRACEFS
            .iter()
            .map(PathBuf::from)
            .find(|d| d.join("uprobe_events").exists())
    };
    if let Some(d) = found() {
        return Ok(d);
    }
    nix::mount::mount(
        Some("nodev"),
        TRACEFS[0],
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .map_err(|e| io::Error::other(format!("mounting tracefs at {}: {e}", TRACEFS[0])))?;
    found().ok_or_else(|| io::Error::other("tracefs has no uprobe_events"))
}

/// The event group of the agent with this pid.
pub fn group_of(pid: u32) -> String {
    format!("mt_agent_{pid}")
}

/// The agent pid of an event group of ours.
fn pid_of_group(group: &str) -> Option<u32> {
    group.strip_prefix("mt_agent_")?.parse().ok()
}

/// One agent's uprobe events.
pub struct UprobeEvents {
    dir: PathBuf,
    group: String,
    next: AtomicU32,
}

/// A uprobe event: its name in the group and its tracepoint id.
#[derive(Debug)]
pub struct UprobeEvent {
    pub name: String,
    pub id: u64,
}

impl UprobeEvents {
    /// This process's group in the tracefs directory `dir`.
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            group: group_of(std::process::id()),
            next: AtomicU32::new(0),
        }
    }

    /// The tracefs directory.
    pub fn dir(&self) -> PathBuf {
        self.dir.clone()
    }

    pub fn uprobe_events(&self) -> PathBuf {
        self.dir.join("uprobe_events")
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// Defines a uprobe (a uretprobe if `ret`) at `path`+`offset`. Nothing
    /// is in any process's code until a perf event opens it.
    pub fn create(&self, path: &Path, offset: u64, ret: bool) -> io::Result<UprobeEvent> {
        let path = path.to_str().filter(|p| !p.contains(char::is_whitespace));
        let Some(path) = path else {
            return Err(io::Error::other("the path has white space or is not UTF-8"));
        };
        let name = format!("p{}", self.next.fetch_add(1, Ordering::Relaxed));
        let kind = if ret { 'r' } else { 'p' };
        let line = format!("{kind}:{}/{name} {path}:{offset:#x}\n", self.group);
        self.write(&line)?;
        let id_file = self
            .dir
            .join("events")
            .join(&self.group)
            .join(&name)
            .join("id");
        let id = std::fs::read_to_string(&id_file)
            .and_then(|s| s.trim().parse().map_err(io::Error::other));
        match id {
            Ok(id) => Ok(UprobeEvent { name, id }),
            Err(e) => {
                let _ = self.delete(&name);
                Err(e)
            }
        }
    }

    /// Deletes an event (no perf event may have it open).
    pub fn delete(&self, name: &str) -> io::Result<()> {
        self.write(&format!("-:{}/{name}\n", self.group))
    }

    /// Deletes the whole group; Ok if it had no event.
    pub fn delete_all(&self) -> io::Result<()> {
        delete_group(&self.uprobe_events(), &self.group)
    }

    fn write(&self, line: &str) -> io::Result<()> {
        OpenOptions::new()
            .append(true)
            .open(self.uprobe_events())?
            .write_all(line.as_bytes())
    }
}

/// Deletes an event group (`-:GROUP/` deletes every event of it); Ok if
/// it had none.
fn delete_group(uprobe_events: &Path, group: &str) -> io::Result<()> {
    let r = OpenOptions::new()
        .append(true)
        .open(uprobe_events)?
        .write_all(format!("-:{group}/\n").as_bytes());
    match r {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r,
    }
}

/// The groups of `uprobe_events` lines (`p:GROUP/NAME PATH:OFFSET`).
fn groups(listing: &str) -> Vec<&str> {
    let mut v: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split_once(':')?.1.split_once('/').map(|(g, _)| g))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Whether `uprobe_events` in `dir` has events of `group`.
pub fn has_group(dir: &Path, group: &str) -> bool {
    std::fs::read_to_string(dir.join("uprobe_events"))
        .is_ok_and(|listing| groups(&listing).contains(&group))
}

/// Deletes the event groups of agents that are gone (killed before they
/// or their reaper could), and a group with this agent's pid (a dead
/// agent's). An agent is gone when no live process (not a zombie) with its
/// pid is named mt-agent.
pub fn remove_stale(dir: &Path) {
    let file = dir.join("uprobe_events");
    let Ok(listing) = std::fs::read_to_string(&file) else {
        return;
    };
    for group in groups(&listing) {
        let Some(pid) = pid_of_group(group) else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        // This agent's own group can only be a dead agent's that had its
        // pid: the kernel would add new events to it.
        let mine = pid == std::process::id();
        let alive = crate::sys::proc::is_alive(pid as i32) && comm.starts_with("mt-agent");
        if mine || !alive {
            let _ = delete_group(&file, group);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_read_from_the_listing() {
        let listing = "p:mt_agent_12/p0 /usr/bin/x:0x0000000000001189\n\
                       r:mt_agent_12/p1 /usr/bin/x:0x0000000000001189\n\
                       p:probe_x/f /bin/x:0x10\n";
        assert_eq!(groups(listing), vec!["mt_agent_12", "probe_x"]);
        assert_eq!(pid_of_group("mt_agent_12"), Some(12));
        assert_eq!(pid_of_group("probe_x"), None);
        assert_eq!(pid_of_group(&group_of(7)), Some(7));
    }
}
