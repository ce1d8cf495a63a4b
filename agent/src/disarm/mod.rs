//! Disarming: a trigger's uprobes taken out of the target's code during its cooldown and put back when it ends (docs/disarming.md).

pub mod arming_thread;
pub mod control;
pub mod cycle;
pub mod event_uprobes;
pub mod rcu_warmup;
pub mod tracefs_events;
pub mod tracefs_reaper;
