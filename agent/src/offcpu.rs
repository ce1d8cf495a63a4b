//! Stand-in for the off-CPU core (the integrator's `offcpu.rs` replaces
//! this file on merge): the signatures of the shared interface.

/// A switch of one thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchKind {
    In,
    Out { preempted: bool },
}

/// One thread's switch, CLOCK_MONOTONIC ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switch {
    pub time_ns: u64,
    pub kind: SwitchKind,
}

/// An off-CPU interval, clipped to the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffInterval {
    pub from_ns: u64,
    pub to_ns: u64,
    pub blocked: bool,
}

/// Off-CPU intervals of one thread in `[from_ns, to_ns]`.
pub fn off_intervals(switches: &[Switch], from_ns: u64, to_ns: u64) -> Vec<OffInterval> {
    let mut out = Vec::new();
    // Off-CPU time before the first record is blocked.
    let mut off: Option<(u64, bool)> = match switches.first() {
        Some(s) if s.kind == SwitchKind::In => Some((0, true)),
        _ => None,
    };
    let mut push = |a: u64, b: u64, blocked: bool| {
        let (a, b) = (a.max(from_ns), b.min(to_ns));
        if a < b {
            out.push(OffInterval {
                from_ns: a,
                to_ns: b,
                blocked,
            });
        }
    };
    for s in switches {
        match s.kind {
            SwitchKind::Out { preempted } => off = Some((s.time_ns, !preempted)),
            SwitchKind::In => {
                if let Some((t, blocked)) = off.take() {
                    push(t, s.time_ns, blocked);
                }
            }
        }
    }
    if let Some((t, blocked)) = off {
        push(t, to_ns, blocked);
    }
    out
}
