//! x86-64 decoding with `iced-x86`: what a uprobe hit costs (from the probed
//! instruction), instruction boundaries, and a function's exits.
//!
//! How the kernel handles the probed instruction decides the cost of a hit
//! (arch/x86/kernel/uprobes.c, `branch_setup_xol_ops` and
//! `push_setup_xol_ops`), cheapest first; the costs are the "floor" row of
//! `cargo xtask bench` (BENCHMARKS.md, "Per-hit overhead": an empty eBPF
//! program, perf record sampling the target; [`ProbeCost::approx_ns`] is
//! what the agent prints), and `docs/uprobe-cost.md` counts them with
//! `perf stat` alone:
//! * a 5-byte NOP (`0f 1f 44 00 00`) can take the optimized path;
//! * `push reg`, NOPs, and relative `jmp`, `call` and `jcc` are emulated: no
//!   single-step;
//! * anything else, `ret` included, is single-stepped out of line: a second
//!   trap (the bench's `--slower-than --probe-rets` row, a uprobe on a
//!   `ret`, costs the same; docs/uprobe-cost.md, "Seeing the returns").

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
    /// (BENCHMARKS.md, "Per-hit overhead"), rounded.
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

/// One-byte opcodes the kernel's x86-64 uprobe decoder accepts, as 256
/// bits: `good_insns_64` in arch/x86/kernel/uprobes.c (as of Linux 6.x). Row `i` holds opcodes `16*i .. 16*i+15`,
/// bit `j` of a row is opcode `16*i + j`. Refused among others: `int3`
/// (cc), `int N` (cd), `into`/`iret` (ce, cf), `ins`/`outs` (6c-6f), `in`/`out`
/// (e4-e7, ec-ef), `int1` (f1), `hlt` (f4), `cli`/`sti` (fa, fb) and opcodes
/// that are invalid in 64-bit mode. `0f` is accepted, so every two- and
/// three-byte opcode passes; for VEX and EVEX instructions the kernel looks
/// up the byte after the prefix in this same table (so `vmovdqu`, `c5 fe
/// 6f`, is refused).
const GOOD_INSNS_64: [u16; 16] = [
    0b1011_1111_0011_1111, // 00-0f: not 06 07 0e
    0b0011_1111_0011_1111, // 10-1f: not 16 17 1e 1f
    0b0111_1111_0111_1111, // 20-2f: not 27 2f
    0b0111_1111_0111_1111, // 30-3f: not 37 3f
    0xffff,                // 40-4f
    0xffff,                // 50-5f
    0b0000_1111_1111_1000, // 60-6f: not 60 61 62 6c-6f
    0xffff,                // 70-7f
    0b1111_1111_1111_1011, // 80-8f: not 82
    0b1111_1011_1111_1111, // 90-9f: not 9a
    0xffff,                // a0-af
    0xffff,                // b0-bf
    0b0000_1111_1111_1111, // c0-cf: not cc cd ce cf
    0b1111_1111_1000_1111, // d0-df: not d4 d5 d6
    0b0000_1011_0000_1111, // e0-ef: not e4-e7 ea ec-ef
    0b1111_0011_1110_1101, // f0-ff: not f1 f4 fa fb
];

/// Legacy prefixes (Intel SDM vol. 2, 2.1.1).
const PREFIXES: [u8; 11] = [
    0x26, 0x2e, 0x36, 0x3e, 0x64, 0x65, 0x66, 0x67, 0xf0, 0xf2, 0xf3,
];

/// Why the kernel refuses a uprobe on the instruction at the start of
/// `bytes`, if it does: the checks of `uprobe_init_insn` in
/// arch/x86/kernel/uprobes.c, where a refusal is `ENOTSUPP` (524) from
/// `perf_event_open`. Returns the instruction (NASM syntax) and the reason.
pub fn uprobe_refusal(bytes: &[u8]) -> Option<(String, &'static str)> {
    let mut d = decoder(bytes, 0);
    let insn = d.decode();
    if insn.is_invalid() {
        let shown: Vec<String> = bytes.iter().take(4).map(|b| format!("{b:02x}")).collect();
        return Some((
            format!("bytes {}", shown.join(" ")),
            "not a valid x86-64 instruction",
        ));
    }
    let raw = &bytes[..insn.len()];
    let mut text = String::new();
    NasmFormatter::new().format(&insn, &mut text);
    let mut i = 0;
    while i < raw.len() && PREFIXES.contains(&raw[i]) {
        if matches!(raw[i], 0x26 | 0x2e | 0x36 | 0x3e | 0xf0) {
            return Some((
                text,
                "the kernel does not probe instructions with a lock or es/cs/ss/ds (notrack) prefix",
            ));
        }
        i += 1;
    }
    if raw.get(i).is_some_and(|b| (0x40..=0x4f).contains(b)) {
        i += 1; // REX
    }
    let opcode = match raw.get(i).copied()? {
        0xc5 => raw.get(i + 2).copied()?, // VEX, 2 bytes
        0xc4 => raw.get(i + 3).copied()?, // VEX, 3 bytes
        0x62 => raw.get(i + 4).copied()?, // EVEX, 4 bytes
        b => b,
    };
    if opcode == 0x8e && raw.get(i + 1).is_some_and(|m| (m >> 3) & 7 == 2) {
        return Some((text, "the kernel does not single-step a move to ss"));
    }
    let good = GOOD_INSNS_64[usize::from(opcode >> 4)] & (1 << (opcode & 0xf)) != 0;
    (!good).then_some((text, "the kernel's uprobe decoder refuses this opcode"))
}

/// Length in bytes of the instruction at the start of `bytes` (0 if it
/// does not decode).
pub fn length(bytes: &[u8]) -> usize {
    let insn = decoder(bytes, 0).decode();
    if insn.is_invalid() { 0 } else { insn.len() }
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
    fn instructions_the_kernel_refuses() {
        let refused = |b: &[u8]| uprobe_refusal(b).map(|(t, _)| t);
        assert_eq!(refused(&[0xcc]).as_deref(), Some("int3"));
        assert!(refused(&[0xcd, 0x80]).unwrap().starts_with("int"));
        assert_eq!(refused(&[0xf4]).as_deref(), Some("hlt"));
        // lock add [rax], eax; notrack jmp rax.
        assert!(refused(&[0xf0, 0x01, 0x00]).is_some());
        assert!(refused(&[0x3e, 0xff, 0xe0]).is_some());
        // vmovdqu ymm0, [rsi]: VEX opcode 6f.
        assert!(refused(&[0xc5, 0xfe, 0x6f, 0x06]).is_some());
        // Accepted: push rbp, endbr64, mov rax, rdi, nop5, ret, fs-prefixed
        // mov, syscall (0f 05 passes through the 0f entry), vzeroupper.
        for ok in [
            &[0x55][..],
            &[0xf3, 0x0f, 0x1e, 0xfa],
            &[0x48, 0x89, 0xf8],
            &[0x0f, 0x1f, 0x44, 0x00, 0x00],
            &[0xc3],
            &[0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0x00, 0x00, 0x00],
            &[0x0f, 0x05],
            &[0xc5, 0xf8, 0x77],
        ] {
            assert_eq!(uprobe_refusal(ok), None, "{ok:02x?}");
        }
    }

    #[test]
    fn the_table_matches_the_kernels_list_of_refused_opcodes() {
        // good_insns_64's zeros, from arch/x86/kernel/uprobes.c.
        let refused: Vec<u8> = vec![
            0x06, 0x07, 0x0e, 0x16, 0x17, 0x1e, 0x1f, 0x27, 0x2f, 0x37, 0x3f, 0x60, 0x61, 0x62,
            0x6c, 0x6d, 0x6e, 0x6f, 0x82, 0x9a, 0xcc, 0xcd, 0xce, 0xcf, 0xd4, 0xd5, 0xd6, 0xe4,
            0xe5, 0xe6, 0xe7, 0xea, 0xec, 0xed, 0xee, 0xef, 0xf1, 0xf4, 0xfa, 0xfb,
        ];
        for op in 0..=255u8 {
            let good = GOOD_INSNS_64[usize::from(op >> 4)] & (1 << (op & 0xf)) != 0;
            assert_eq!(good, !refused.contains(&op), "opcode {op:#04x}");
        }
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
