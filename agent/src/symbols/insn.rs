//! x86-64 decoding with `iced-x86`: what a uprobe hit costs (from the probed
//! instruction), instruction boundaries, and a function's exits.
//!
//! How the kernel handles the probed instruction decides the cost of a hit
//! (arch/x86/kernel/uprobes.c, `branch_setup_xol_ops` and
//! `push_setup_xol_ops`). Figures are the "floor" row of `cargo xtask bench`
//! on our machines (an empty eBPF program, perf record sampling the target;
//! README, Benchmarks); `shared/docs/uprobe-cost.md` has lower figures
//! counted with `perf stat` alone, in the same order:
//! * a 5-byte NOP (`0f 1f 44 00 00`) can take the optimized path (~0.8 µs);
//! * `push reg`, NOPs, and relative `jmp`, `call` and `jcc` are emulated: no
//!   single-step (~1.1 µs for `push`);
//! * anything else, `ret` included, is single-stepped out of line: a second
//!   trap (~6 µs; the bench's `--slower-than` row, a uprobe on a `ret`, costs
//!   the same).

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Formatter as _, Instruction, Mnemonic, NasmFormatter,
    OpKind,
};
use serde::Serialize;

/// What a hit on an instruction costs, by how the kernel handles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeCost {
    /// A 5-byte NOP: the kernel's optimized uprobe path.
    Nop5,
    /// Emulated by the kernel (push reg, nop, relative jmp/call/jcc).
    Emulated,
    /// Single-stepped out of line: a second trap per hit.
    SingleStep,
}

impl ProbeCost {
    /// Approximate cost per hit on our machines, ns: the bench's floor
    /// (README, Benchmarks).
    pub fn approx_ns(self) -> u64 {
        match self {
            ProbeCost::Nop5 => 800,
            ProbeCost::Emulated => 1_100,
            ProbeCost::SingleStep => 6_000,
        }
    }

    /// A short phrase for listings: `emulated, ~1.1 µs/hit`.
    pub fn describe(self) -> String {
        let what = match self {
            ProbeCost::Nop5 => "optimized (nop5)",
            ProbeCost::Emulated => "emulated",
            ProbeCost::SingleStep => "single-stepped",
        };
        let ns = self.approx_ns();
        if ns >= 1000 {
            format!("{what}, ~{:.1} µs/hit", ns as f64 / 1000.0)
        } else {
            format!("{what}, ~{ns} ns/hit")
        }
    }
}

/// The probed instruction and what a hit on it costs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CostHint {
    pub cost: ProbeCost,
    /// The instruction in NASM syntax, e.g. `push rbp`.
    pub instruction: String,
}

impl CostHint {
    /// `push rbp: emulated, ~1.1 µs/hit`.
    pub fn describe(&self) -> String {
        format!("{}: {}", self.instruction, self.cost.describe())
    }
}

fn decoder(bytes: &[u8], ip: u64) -> Decoder<'_> {
    Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE)
}

/// Classifies the instruction at the start of `bytes` (its address is `ip`).
pub fn cost_hint(bytes: &[u8], ip: u64) -> Option<CostHint> {
    let mut d = decoder(bytes, ip);
    if !d.can_decode() {
        return None;
    }
    let insn = d.decode();
    if insn.is_invalid() {
        return None;
    }
    let mut text = String::new();
    NasmFormatter::new().format(&insn, &mut text);
    Some(CostHint {
        cost: classify(&insn, &bytes[..insn.len()]),
        instruction: text,
    })
}

fn classify(insn: &Instruction, raw: &[u8]) -> ProbeCost {
    if raw == [0x0f, 0x1f, 0x44, 0x00, 0x00] {
        return ProbeCost::Nop5;
    }
    match insn.mnemonic() {
        Mnemonic::Nop => ProbeCost::Emulated,
        Mnemonic::Push if insn.op0_kind() == OpKind::Register => ProbeCost::Emulated,
        _ => match insn.flow_control() {
            FlowControl::UnconditionalBranch
            | FlowControl::ConditionalBranch
            | FlowControl::Call
                if insn.op0_kind() != OpKind::Register && insn.op0_kind() != OpKind::Memory =>
            {
                ProbeCost::Emulated
            }
            _ => ProbeCost::SingleStep,
        },
    }
}

/// Whether `offset` bytes into `bytes` (a function's body from its start) is
/// the start of an instruction, decoding linearly from the start.
pub fn is_boundary(bytes: &[u8], offset: u64) -> bool {
    if offset == 0 {
        return true;
    }
    let mut d = decoder(bytes, 0);
    while d.can_decode() {
        let pos = d.ip();
        if pos == offset {
            return true;
        }
        if pos > offset {
            return false;
        }
        let insn = d.decode();
        if insn.is_invalid() {
            return false;
        }
    }
    d.ip() == offset
}

/// The ways a function's body can be left.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Exits {
    /// Offsets (from the body's start) of `ret` instructions.
    pub rets: Vec<u64>,
    /// Direct jumps to outside the function (and its other parts): tail
    /// calls, which leave without a `ret` we can see.
    pub tail_jumps: usize,
    /// Indirect jumps: switch tables or tail calls; not covered if tail calls.
    pub indirect_jumps: usize,
}

/// Decodes a function body that starts at `ip` and finds its exits. Jumps
/// into any of `parts` (such as the function's `.cold` part, as
/// `[start, end)` address ranges) are not exits.
pub fn exits(bytes: &[u8], ip: u64, parts: &[(u64, u64)]) -> Exits {
    let end = ip.saturating_add(bytes.len() as u64);
    let inside = |t: u64| (t >= ip && t < end) || parts.iter().any(|&(s, e)| t >= s && t < e);
    let mut out = Exits::default();
    let mut d = decoder(bytes, ip);
    while d.can_decode() {
        let insn = d.decode();
        if insn.is_invalid() {
            continue;
        }
        match insn.flow_control() {
            FlowControl::Return => out.rets.push(insn.ip() - ip),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
                if matches!(
                    insn.op0_kind(),
                    OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16
                ) && !inside(insn.near_branch_target()) =>
            {
                out.tail_jumps += 1;
            }
            FlowControl::IndirectBranch => out.indirect_jumps += 1,
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_instruction_costs() {
        assert_eq!(cost_hint(&[0x55], 0).unwrap().cost, ProbeCost::Emulated); // push rbp
        assert_eq!(
            cost_hint(&[0x41, 0x57], 0).unwrap().cost,
            ProbeCost::Emulated
        ); // push r15
        assert_eq!(
            cost_hint(&[0x0f, 0x1f, 0x44, 0x00, 0x00], 0).unwrap().cost,
            ProbeCost::Nop5
        );
        assert_eq!(cost_hint(&[0x90], 0).unwrap().cost, ProbeCost::Emulated);
        // mov rax, [rip+0x10]: single-stepped.
        let h = cost_hint(&[0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00], 0).unwrap();
        assert_eq!(h.cost, ProbeCost::SingleStep);
        assert!(h.instruction.starts_with("mov rax"), "{}", h.instruction);
        // sub rsp, 8
        assert_eq!(
            cost_hint(&[0x48, 0x83, 0xec, 0x08], 0).unwrap().cost,
            ProbeCost::SingleStep
        );
        // jmp rel32 is emulated; ret is not (branch_setup_xol_ops has no
        // case for 0xc3), and the bench measures it at the single-step cost.
        assert_eq!(
            cost_hint(&[0xe9, 0, 0, 0, 0], 0).unwrap().cost,
            ProbeCost::Emulated
        );
        assert_eq!(cost_hint(&[0xc3], 0).unwrap().cost, ProbeCost::SingleStep);
        // push qword [rax]: memory operand, single-stepped.
        assert_eq!(
            cost_hint(&[0xff, 0x30], 0).unwrap().cost,
            ProbeCost::SingleStep
        );
    }

    #[test]
    fn boundaries() {
        // push rbp; mov rbp, rsp; ret
        let code = [0x55, 0x48, 0x89, 0xe5, 0xc3];
        assert!(is_boundary(&code, 0));
        assert!(is_boundary(&code, 1));
        assert!(!is_boundary(&code, 2));
        assert!(!is_boundary(&code, 3));
        assert!(is_boundary(&code, 4));
        assert!(!is_boundary(&code, 9));
    }

    #[test]
    fn exits_find_rets_and_tail_jumps() {
        // 0: push rbp; 1: test edi, edi; 3: je +3 (to 8); 5: pop rbp; 6: ret;
        // 7: nop; 8: pop rbp; 9: jmp rel32 far away (tail call)
        let code = [
            0x55, 0x85, 0xff, 0x74, 0x03, 0x5d, 0xc3, 0x90, 0x5d, 0xe9, 0x00, 0x10, 0x00, 0x00,
        ];
        let e = exits(&code, 0x1000, &[]);
        assert_eq!(e.rets, [6]);
        assert_eq!(e.tail_jumps, 1);
        // The same jump into a known `.cold` part is not an exit.
        let e = exits(&code, 0x1000, &[(0x2000, 0x2100)]);
        assert_eq!(e.tail_jumps, 0);
    }
}
