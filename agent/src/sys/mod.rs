//! Linux helpers with no policy of their own: the clock, capabilities, safe opens and raw perf and BPF syscalls.

pub mod caps;
pub mod child;
pub mod clock;
pub mod mount_ns;
pub mod perf_event;
pub mod pidfd;
pub mod proc;
pub mod safe_open;
pub mod sched;
