//! Whether a traced object keeps frame pointers, from its code: what `--call-graph auto` decides by.
//!
//! The check: in each traced object (the executable, and the object of the
//! trigger), sample up to [`SAMPLE`] functions that make calls, and look for
//! the frame set-up in their first [`PROLOGUE_INSNS`] instructions: C's
//! `push rbp; mov rbp, rsp`, or Go's `sub rsp, N; mov [rsp+N-8], rbp;
//! lea rbp, [rsp+N-8]` (docs/unwinding.md). An object keeps frame pointers when at
//! least half of them have it. Leaf functions are left out: gcc's
//! `-momit-leaf-frame-pointer` drops their frames without breaking a chain.

use std::path::Path;

use iced_x86::{Code, Decoder, DecoderOptions, Mnemonic, OpKind, Register};

use crate::symbols::elf::{ElfObject, RawSymbol, SymKind, Which, size_in_segment, vaddr_to_offset};

/// Functions sampled per object.
pub const SAMPLE: usize = 200;

/// Instructions of each function searched for the frame set-up (gcc
/// shrink-wraps some early exits before it; Go checks its stack first).
pub const PROLOGUE_INSNS: usize = 12;

/// Start-up code the C runtime links into every program, built its own way
/// (`_start` never has a frame): left out, or it would sway the count of a
/// small program.
const STARTUP: [&str; 8] = [
    "_start",
    "_init",
    "_fini",
    "__do_global_dtors_aux",
    "frame_dummy",
    "register_tm_clones",
    "deregister_tm_clones",
    "__libc_csu_init",
];

/// Crates of Rust's standard library and its dependencies, as legacy
/// mangled prefixes (`_ZN3std…`). Since Rust 1.79 the prebuilt standard
/// library keeps frame pointers while a release build of the program's own
/// code does not, so these would outvote the code the user runs.
const RUST_STD_CRATES: [&str; 19] = [
    "std",
    // The allocator and panic shims the compiler adds (v0: `7___rustc`).
    "__rustc",
    "core",
    "alloc",
    "panic_unwind",
    "panic_abort",
    "hashbrown",
    "rustc_demangle",
    "gimli",
    "addr2line",
    "miniz_oxide",
    "object",
    "std_detect",
    "compiler_builtins",
    "adler",
    "adler2",
    "memchr",
    "unwind",
    "libc",
];

/// Whether a symbol is toolchain code rather than the program's own:
/// start-up code, or Rust's standard library.
fn is_toolchain(name: &str) -> bool {
    if STARTUP.contains(&name) || name.starts_with("__rust") || name.starts_with("rust_") {
        return true;
    }
    let crate_name = match name.strip_prefix("_ZN") {
        Some(rest) => length_prefixed(rest),
        None => name.strip_prefix("_R").and_then(v0_first_crate),
    };
    crate_name.is_some_and(|c| RUST_STD_CRATES.contains(&c))
}

/// `3std…` → `std`: a length-prefixed identifier at the start of `s`.
fn length_prefixed(s: &str) -> Option<&str> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let n: usize = s[..digits].parse().ok()?;
    s.get(digits..digits + n)
}

/// A v0 identifier: a decimal length, then `_` when the name itself starts
/// with `_` or a digit, then the name.
fn v0_identifier(s: &str) -> Option<&str> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    let n: usize = s[..digits].parse().ok()?;
    let start = digits + usize::from(s[digits..].starts_with('_'));
    s.get(start..start + n)
}

/// The first crate root of a v0-mangled Rust symbol (after `_R`): `C`,
/// an optional disambiguator `s<base-62>_`, then the crate's
/// length-prefixed name (the Rust symbol-mangling v0 grammar). For a
/// function, that is the crate that defines it or its outer item.
fn v0_first_crate(rest: &str) -> Option<&str> {
    let b = rest.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'C' {
            let mut j = i + 1;
            if b.get(j) == Some(&b's') {
                while j < b.len() && b[j] != b'_' {
                    j += 1;
                }
                j += 1;
            }
            if b.get(j).is_some_and(u8::is_ascii_digit) {
                return v0_identifier(&rest[j..]);
            }
        }
        i += 1;
    }
    None
}

/// How many sampled functions of an object set up a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FrameCount {
    pub with_frame: usize,
    pub sampled: usize,
    /// A Go binary ([`ElfObject::is_go`]): its functions set up frames Go's way.
    pub go: bool,
}

impl FrameCount {
    /// At least half of the sampled functions set up a frame. An object with
    /// no function to sample counts as keeping them (nothing to unwind).
    pub fn keeps_frame_pointers(&self) -> bool {
        self.sampled == 0 || self.with_frame * 2 >= self.sampled
    }
}

/// Whether a function's first [`PROLOGUE_INSNS`] instructions set up a frame,
/// and whether its body makes a call. `bytes` is the function's body.
///
/// Two set-ups count, each leaving `rbp` pointing at the caller's saved
/// `rbp` with the return address just above it:
/// - C's: `push rbp`, then `mov rbp, rsp` with nothing moving the stack
///   pointer in between (gcc schedules other instructions there);
/// - Go's on amd64 (`cmd/internal/obj/x86/obj6.go`, `preprocess`; docs/unwinding.md):
///   `sub rsp, N`, then `mov [rsp+N-8], rbp` and `lea rbp, [rsp+N-8]`.
pub fn classify(bytes: &[u8]) -> (bool, bool) {
    let mut d = Decoder::with_ip(64, bytes, 0, DecoderOptions::NONE);
    let mut frame = false;
    let mut calls = false;
    let mut prologue = Prologue::default();
    let mut n = 0;
    while d.can_decode() {
        let insn = d.decode();
        if insn.is_invalid() {
            break;
        }
        n += 1;
        if n <= PROLOGUE_INSNS && !frame {
            frame = prologue.step(&insn);
        }
        if insn.mnemonic() == Mnemonic::Call {
            calls = true;
        }
        if frame && calls {
            break;
        }
    }
    (frame, calls)
}

/// What the instructions of a prologue did so far, for [`classify`].
#[derive(Default)]
struct Prologue {
    /// `push rbp` was the last move of the stack pointer (C).
    pushed_rbp: bool,
    /// Bytes opened by `sub rsp, imm` since the entry, when nothing else
    /// moved the stack pointer (Go).
    opened: Option<u64>,
    /// `rsp` displacement at which `rbp` was saved just below the return
    /// address (Go).
    saved_at: Option<u64>,
}

impl Prologue {
    /// Takes one instruction; true once a frame is set up.
    fn step(&mut self, insn: &iced_x86::Instruction) -> bool {
        let is_mov = matches!(insn.code(), Code::Mov_rm64_r64 | Code::Mov_r64_rm64);
        if self.pushed_rbp
            && is_mov
            && insn.op0_register() == Register::RBP
            && insn.op1_register() == Register::RSP
        {
            return true;
        }
        if insn.mnemonic() == Mnemonic::Push && insn.op0_register() == Register::RBP {
            self.pushed_rbp = self.opened.is_none();
            self.opened = None;
            self.saved_at = None;
            return false;
        }
        if let Some(x) = self.saved_at
            && insn.mnemonic() == Mnemonic::Lea
            && insn.op0_register() == Register::RBP
            && rsp_displacement(insn, 1) == Some(x)
        {
            return true;
        }
        if let Some(opened) = self.opened
            && is_mov
            && insn.op1_register() == Register::RBP
            && rsp_displacement(insn, 0).is_some_and(|x| x + 8 == opened)
        {
            self.saved_at = rsp_displacement(insn, 0);
            return false;
        }
        let sub = matches!(insn.code(), Code::Sub_rm64_imm8 | Code::Sub_rm64_imm32);
        if sub && insn.op0_kind() == OpKind::Register && insn.op0_register() == Register::RSP {
            let first = self.opened.is_none() && !self.pushed_rbp;
            self.opened = first.then(|| insn.immediate(1));
            self.pushed_rbp = false;
            self.saved_at = None;
            return false;
        }
        if moves_rsp(insn) || (insn.op_count() > 0 && insn.op0_register() == Register::RBP) {
            // rbp would not point at the saved rbp: no chain.
            self.pushed_rbp = false;
            self.opened = None;
            self.saved_at = None;
        }
        false
    }
}

/// The displacement of operand `op` when it is `[rsp+disp]` with no index.
fn rsp_displacement(insn: &iced_x86::Instruction, op: u32) -> Option<u64> {
    (insn.op_kind(op) == OpKind::Memory
        && insn.memory_base() == Register::RSP
        && insn.memory_index() == Register::None)
        .then(|| insn.memory_displacement64())
}

/// Whether an instruction changes the stack pointer (pushes, pops, calls,
/// and arithmetic or moves into `rsp`).
fn moves_rsp(insn: &iced_x86::Instruction) -> bool {
    matches!(
        insn.mnemonic(),
        Mnemonic::Push | Mnemonic::Pop | Mnemonic::Call | Mnemonic::Enter | Mnemonic::Leave
    ) || (insn.op_count() > 0
        && insn.op0_kind() == OpKind::Register
        && insn.op0_register() == Register::RSP)
}

/// Counts frame set-ups in up to [`SAMPLE`] functions that make calls,
/// spread evenly over the object's functions (`.symtab`, else `.dynsym`).
pub fn count_frames(path: &Path) -> anyhow::Result<FrameCount> {
    // Opened and read as every other read of a target's file: safely, on
    // demand and within the size budget (symbols::elf).
    let elf = ElfObject::open(path)?;
    let go = elf.is_go();
    // Only addresses and sizes are kept, not names (node: 180,000 symbols).
    let code = |s: &RawSymbol<'_>| {
        (s.defined
            && !s.name.is_empty()
            && s.kind() == Some(SymKind::Func)
            && s.size >= 4
            && !std::str::from_utf8(s.name).is_ok_and(is_toolchain))
        .then_some((s.value, s.size))
    };
    let mut funcs: Vec<(u64, u64)> = elf.scan(Which::Symtab, code);
    funcs.extend(elf.scan(Which::Dynsym, code));
    funcs.sort_unstable();
    funcs.dedup_by_key(|f| f.0);
    let segments = elf.segments();
    // Every k-th function, then more if too few of those make calls.
    let step = (funcs.len() / (SAMPLE * 2)).max(1);
    let mut count = FrameCount {
        go,
        ..FrameCount::default()
    };
    for &(addr, size) in funcs.iter().step_by(step) {
        let Some(offset) = vaddr_to_offset(&segments, addr) else {
            continue;
        };
        let bytes = elf.read_uncached(offset, size_in_segment(&segments, addr, size.min(4096)));
        if bytes.is_empty() {
            continue;
        }
        let (frame, calls) = classify(&bytes);
        if calls {
            count.sampled += 1;
            count.with_frame += usize::from(frame);
            if count.sampled == SAMPLE {
                break;
            }
        }
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENDBR: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
    const PUSH_RBP: [u8; 1] = [0x55];
    const MOV_RBP_RSP: [u8; 3] = [0x48, 0x89, 0xe5];
    const CALL: [u8; 5] = [0xe8, 0, 0, 0, 0];
    const RET: [u8; 1] = [0xc3];

    fn code(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn frame_set_up_is_recognized() {
        // gcc -fno-omit-frame-pointer, with and without CET.
        assert_eq!(
            classify(&code(&[&PUSH_RBP, &MOV_RBP_RSP, &CALL, &RET])),
            (true, true)
        );
        assert_eq!(
            classify(&code(&[&ENDBR, &PUSH_RBP, &MOV_RBP_RSP, &CALL, &RET])),
            (true, true)
        );
        // The other encoding of mov rbp, rsp (48 8b ec).
        assert_eq!(
            classify(&code(&[&PUSH_RBP, &[0x48, 0x8b, 0xec], &CALL])),
            (true, true)
        );
        // gcc -O2 schedules other instructions between the two:
        // push rbp; lea rsi, [rip+0x3dc]; mov rbp, rsp.
        assert_eq!(
            classify(&code(&[
                &PUSH_RBP,
                &[0x48, 0x8d, 0x35, 0xdc, 0x03, 0, 0],
                &MOV_RBP_RSP,
                &CALL
            ])),
            (true, true)
        );
        // A shrink-wrapped early exit first: test edi, edi; je; then the frame.
        assert_eq!(
            classify(&code(&[
                &[0x85, 0xff, 0x74, 0x01],
                &RET,
                &PUSH_RBP,
                &MOV_RBP_RSP,
                &CALL
            ])),
            (true, true)
        );
    }

    #[test]
    fn gos_frame_set_up_is_recognized() {
        // Go 1.19's main.slow: cmp rsp, [r14+0x10]; jbe; sub rsp, 0x10;
        // mov [rsp+8], rbp; lea rbp, [rsp+8]; call.
        let stack_check: &[u8] = &[0x49, 0x3b, 0x66, 0x10, 0x76, 0x58];
        let small = code(&[
            stack_check,
            &[0x48, 0x83, 0xec, 0x10],
            &[0x48, 0x89, 0x6c, 0x24, 0x08],
            &[0x48, 0x8d, 0x6c, 0x24, 0x08],
            &CALL,
        ]);
        assert_eq!(classify(&small), (true, true));
        // A large frame (main.main): lea r12, [rsp-0xc8]; cmp r12, [r14+0x10];
        // jbe; sub rsp, 0x148; mov [rsp+0x140], rbp; lea rbp, [rsp+0x140].
        let large = code(&[
            &[0x4c, 0x8d, 0xa4, 0x24, 0x38, 0xff, 0xff, 0xff],
            &[0x4d, 0x3b, 0x66, 0x10, 0x0f, 0x86, 0x34, 0x03, 0, 0],
            &[0x48, 0x81, 0xec, 0x48, 0x01, 0, 0],
            &[0x48, 0x89, 0xac, 0x24, 0x40, 0x01, 0, 0],
            &[0x48, 0x8d, 0xac, 0x24, 0x40, 0x01, 0, 0],
            &CALL,
        ]);
        assert_eq!(classify(&large), (true, true));
        // rbp saved elsewhere than below the return address: rbp would not
        // point at a link of the chain (mov [rsp], rbp; lea rbp, [rsp]).
        let low = code(&[
            &[0x48, 0x83, 0xec, 0x10],
            &[0x48, 0x89, 0x2c, 0x24],
            &[0x48, 0x8d, 0x2c, 0x24],
            &CALL,
        ]);
        assert_eq!(classify(&low), (false, true));
        // Saved, but rbp then used for data (mov rbp, rdi).
        let data = code(&[
            &[0x48, 0x83, 0xec, 0x10],
            &[0x48, 0x89, 0x6c, 0x24, 0x08],
            &[0x48, 0x89, 0xfd],
            &CALL,
        ]);
        assert_eq!(classify(&data), (false, true));
    }

    #[test]
    fn code_without_frame_pointers_is_recognized() {
        // -fomit-frame-pointer: sub rsp, 8; call; add rsp, 8; ret.
        let omit = code(&[
            &[0x48, 0x83, 0xec, 0x08],
            &CALL,
            &[0x48, 0x83, 0xc4, 0x08],
            &RET,
        ]);
        assert_eq!(classify(&omit), (false, true));
        // rbp pushed as a callee-saved register and used for data.
        let saved = code(&[&PUSH_RBP, &[0x48, 0x89, 0xfd], &CALL, &[0x5d], &RET]);
        assert_eq!(classify(&saved), (false, true));
        // push rbp; push rbx; mov rbp, rsp: not directly after the push.
        let apart = code(&[&PUSH_RBP, &[0x53], &MOV_RBP_RSP, &CALL]);
        assert_eq!(classify(&apart), (false, true));
        // A leaf: no call.
        assert_eq!(
            classify(&code(&[&PUSH_RBP, &MOV_RBP_RSP, &RET])),
            (true, false)
        );
    }

    #[test]
    fn rust_std_and_start_up_code_do_not_vote() {
        assert!(is_toolchain("_ZN3std2io5stdio6_print17h0123456789abcdefE"));
        assert!(is_toolchain("_ZN4core3fmt5write17h0123456789abcdefE"));
        assert!(is_toolchain("_start"));
        assert!(is_toolchain("__rust_alloc"));
        assert!(!is_toolchain(
            "_ZN13demo_workload13parse_payload17h127b251e425be3b8E"
        ));
        assert!(!is_toolchain("_ZN4stdx3foo17h0123456789abcdefE"));
        assert!(!is_toolchain("main"));
        assert!(!is_toolchain("_ZN2"));
        // v0 mangling, as the prebuilt standard library uses.
        assert!(is_toolchain(
            "_RINvNtCsgEmfK2I1SDS_4core3ptr13drop_in_placeINtCs4X4t9plMPHF_9addr2line7ContextECsjrHSEGnQ3l9_3std"
        ));
        assert!(is_toolchain("_RNvNtCsjrHSEGnQ3l9_3std2io5stdio"));
        assert!(is_toolchain("_RNvCsfLfy6EI15iL_7___rustc12___rust_alloc"));
        assert!(!is_toolchain("_RNvCs1234_13demo_workload4main"));
    }

    #[test]
    fn the_majority_decides() {
        let c = |with_frame, sampled| FrameCount {
            with_frame,
            sampled,
            go: false,
        };
        assert!(c(190, 200).keeps_frame_pointers());
        assert!(c(100, 200).keeps_frame_pointers());
        assert!(!c(3, 200).keeps_frame_pointers());
        assert!(c(0, 0).keeps_frame_pointers());
    }

    #[test]
    fn our_own_test_binary_is_classified_as_omitting_frame_pointers() {
        // Rust builds without frame pointers by default, and the workspace
        // asks for none (no -C force-frame-pointers in .cargo/config.toml):
        // the test binary's code omits them (4 of 200 sampled functions
        // set up a frame in a debug build).
        let exe = std::env::current_exe().unwrap();
        let c = count_frames(&exe).unwrap();
        assert_eq!(c.sampled, SAMPLE, "{c:?}");
        assert!(!c.keeps_frame_pointers(), "{c:?}");
        assert!(c.with_frame < SAMPLE / 10, "{c:?}");
    }
}
