//! How perf unwinds the stacks it samples: frame pointers (`--call-graph
//! fp`, what `-g` means) or DWARF (`--call-graph dwarf,SIZE`), chosen by
//! looking at the traced objects' code ([`crate::symbols::frame_pointers`]).
//!
//! With frame pointers, the kernel walks the chain of saved `rbp`s at each
//! sample: cheap, but code built with `-fomit-frame-pointer` (gcc's default
//! at -O1 and above, and how Debian builds its packages) breaks the chain
//! after the leaf. In DWARF mode the kernel copies SIZE bytes of the user
//! stack and the registers into each sample (`PERF_SAMPLE_STACK_USER`,
//! `PERF_SAMPLE_REGS_USER`), and `perf script`/`report` unwind it later with
//! the objects' `.eh_frame`: whole stacks, at the price of SIZE bytes per
//! sample (docs/unwinding.md has the figures).

use std::path::Path;

use crate::{
    flags::parse::CallGraph,
    perf::args::pass_through_decides,
    symbols::frame_pointers::{FrameCount, count_frames},
};
use serde::Serialize;

/// The unwinding a run uses, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unwinding {
    /// perf's `--call-graph` value: `fp` or `dwarf,SIZE`; `pass-through`
    /// when perf arguments after `--` decide.
    pub mode: String,
    /// One phrase: what was found, or that the user chose.
    pub reason: String,
    /// `auto` chose DWARF and the copy size is to be measured on the
    /// target ([`Unwinding::measured`]).
    #[serde(skip)]
    pub measure_copy: bool,
    /// What the measurement of the target's stacks found, when it ran
    /// and chose the size (`report::stack_need`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub copy_measured: Option<Measured>,
}

/// The smallest copy, bytes, when a traced thread had no sample in the
/// measurement (`report::stack_need`): the donors hold none of its
/// stacks, so its cut stacks are completed from its own samples alone,
/// which reach its first frame only if the copy holds its start-up frames
/// (libc's `start_thread`, Rust's thread start, its main loop). Measured
/// (docs/unwinding.md, "What `auto` measures"): the demo's threads, from
/// their own samples, are 6.6% whole at 512, 45.5% at 768 and 100% at
/// 1024.
pub const UNSEEN_FLOOR: u64 = 1024;

/// The copy size `auto` measured on the target: the smallest that keeps
/// the goal's share of the samples whole once the report grafts cut
/// stacks (`report::stack_need`, docs/unwinding.md).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    /// The copy size chosen, bytes.
    pub bytes: u64,
    /// Samples whole at that size once grafted, percent.
    pub whole_percent: f64,
    /// Samples recorded.
    pub samples: usize,
    /// Threads of the traced processes with no sample in the measurement:
    /// with any, the size is at least [`UNSEEN_FLOOR`].
    pub threads_not_sampled: usize,
    /// Wall time of the measurement, recording and unwinding, ms.
    pub ms: f64,
}

impl Unwinding {
    /// The unwinding once the copy size was measured (`Ok`) or could not
    /// be (`Err`, why: the fixed `auto` size stays, and the reason says so).
    pub fn measured(self, m: Result<Measured, String>) -> Self {
        match m {
            Ok(m) => Unwinding {
                mode: format!("dwarf,{}", m.bytes),
                reason: format!(
                    "{}; stack copy measured: {:.1}% of {} samples whole at {} bytes{}",
                    self.reason,
                    m.whole_percent,
                    m.samples,
                    m.bytes,
                    match m.threads_not_sampled {
                        0 => String::new(),
                        n => format!(" (at least {UNSEEN_FLOOR}: {n} thread(s) had no sample)"),
                    }
                ),
                measure_copy: false,
                copy_measured: Some(m),
            },
            Err(why) => Unwinding {
                reason: format!("{}; stack copy not measured ({why})", self.reason),
                measure_copy: false,
                ..self
            },
        }
    }

    /// The arguments for `perf record` (none when the pass-through decides).
    pub fn perf_args(&self) -> Vec<String> {
        if self.mode == "pass-through" {
            Vec::new()
        } else {
            vec!["--call-graph".into(), self.mode.clone()]
        }
    }
}

/// Decides the unwinding. `objects` are the traced objects (executable,
/// trigger's object): a name for messages and the path to open them by.
///
/// Errors (as a message for exit code 2) when `--call-graph` and a
/// pass-through both choose.
pub fn decide(
    request: Option<CallGraph>,
    perf_args: &[String],
    objects: &[(String, &Path)],
) -> Result<Unwinding, String> {
    let pass = pass_through_decides(perf_args);
    match (request, pass) {
        (Some(_), true) => {
            return Err(
                "--call-graph and a call-graph option after `--` (-g, --call-graph) both choose \
                 how stacks are unwound; keep one"
                    .into(),
            );
        }
        (None, true) => {
            return Ok(Unwinding {
                mode: "pass-through".into(),
                reason: "chosen by the perf arguments after `--`".into(),
                measure_copy: false,
                copy_measured: None,
            });
        }
        (Some(CallGraph::Fp), _) => return Ok(chosen("fp")),
        (Some(CallGraph::Dwarf(n)), _) => return Ok(chosen(&format!("dwarf,{n}"))),
        (Some(CallGraph::Auto) | None, false) => {}
    }
    let mut without = Vec::new();
    let mut checked = Vec::new();
    for (name, path) in objects {
        match count_frames(path) {
            Ok(c) if !c.keeps_frame_pointers() => without.push(counted(name, &c)),
            Ok(c) => checked.push(counted(name, &c)),
            Err(e) => without.push(format!("{name}: unreadable ({e})")),
        }
    }
    Ok(if without.is_empty() {
        Unwinding {
            mode: "fp".into(),
            reason: format!("frame pointers kept: {}", checked.join("; ")),
            measure_copy: false,
            copy_measured: None,
        }
    } else {
        Unwinding {
            mode: format!("dwarf,{}", crate::flags::parse::AUTO_DWARF_BYTES),
            reason: format!("no frame pointers: {}", without.join("; ")),
            measure_copy: true,
            copy_measured: None,
        }
    })
}

/// `srv (Go): 198 of 200 functions set one up`.
fn counted(name: &str, c: &FrameCount) -> String {
    let go = if c.go { " (Go)" } else { "" };
    format!(
        "{name}{go}: {} of {} functions set one up",
        c.with_frame, c.sampled
    )
}

fn chosen(mode: &str) -> Unwinding {
    Unwinding {
        mode: mode.into(),
        reason: "chosen with --call-graph".into(),
        measure_copy: false,
        copy_measured: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_through_and_the_option_do_not_both_choose() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(pass_through_decides(&s(&["-g"])));
        assert!(pass_through_decides(&s(&["-ag"])));
        assert!(pass_through_decides(&s(&["--call-graph=dwarf"])));
        assert!(pass_through_decides(&s(&["--call-graph", "lbr"])));
        assert!(!pass_through_decides(&s(&["-e", "cycles", "-F99"])));
        // -c takes a value: `-cg` is a count of "g", not -g.
        assert!(!pass_through_decides(&s(&["-cg"])));
        let u = decide(None, &s(&["--call-graph", "lbr"]), &[]).unwrap();
        assert_eq!(u.mode, "pass-through");
        assert!(u.perf_args().is_empty());
        assert!(decide(Some(CallGraph::Fp), &s(&["-g"]), &[]).is_err());
        let u = decide(Some(CallGraph::Dwarf(16384)), &[], &[]).unwrap();
        assert_eq!(u.perf_args(), ["--call-graph", "dwarf,16384"]);
    }
}
