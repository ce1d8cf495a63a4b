//! Whether a uretprobe is proven harmless in a process: what lets
//! `--slower-than` see returns with the kernel's uretprobe (one trap, then
//! the trampoline's syscall) instead of single-stepped uprobes on each
//! `ret` (two traps), docs/uprobe-cost.md "Seeing the returns".
//!
//! A uretprobe replaces the return address on the stack with the kernel's
//! trampoline while the call is pending (`arch_uretprobe_hijack_return_addr`,
//! arch/x86/kernel/uprobes.c). That harms the target when:
//! * an exception unwinds through the frame: the unwinder finds no unwind
//!   info for the trampoline and `std::terminate` aborts (C++, Rust panics);
//! * the runtime walks or moves the stack (Go's traceback and stack copies);
//! * the thread switches stacks while the call is pending (coroutines,
//!   `swapcontext`, a signal handler on an alternate stack): the kernel
//!   pops its pending returns in order and by stack address
//!   (`uprobe_handle_trampoline`, `cleanup_return_instances` in
//!   kernel/events/uprobes.c), so a return on another stack resumes at the
//!   wrong caller or gets SIGILL;
//! * an object loaded later (`dlopen`) brings any of the above.
//!
//! So the proof is over every object the process maps with code, and each
//! must show none of them. What an object shows is read from its symbol
//! tables, sections and code ([`ObjectFacts`]); the decision is
//! [`hazard`], a pure function.

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};

/// Symbols whose import or definition means the object raises exceptions
/// or is a runtime with a personality routine (C++, Rust, Ada, Objective-C,
/// D).
pub const RAISERS: [&str; 10] = [
    "__cxa_throw",
    "__cxa_rethrow",
    "_Unwind_RaiseException",
    "_Unwind_Resume_or_Rethrow",
    "_Unwind_ForcedUnwind",
    "__gxx_personality_v0",
    "rust_eh_personality",
    "__gnat_personality_v0",
    "__objc_personality_v0",
    "__gdc_personality_v0",
];

/// Functions that create or switch to another stack, or load objects later.
pub const SWITCHERS: [&str; 6] = [
    "swapcontext",
    "makecontext",
    "setcontext",
    "sigaltstack",
    "dlopen",
    "dlmopen",
];

/// `DT_SONAME`s of [`ObjectFacts::core_runtime`] objects.
pub const CORE_RUNTIME: [&str; 3] = ["libc.so.6", "ld-linux-x86-64.so.2", "libgcc_s.so.1"];

/// What one mapped object shows, as [`hazard`] needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectFacts {
    /// Its name in messages.
    pub name: String,
    /// glibc's libc or dynamic loader, or GCC's unwinder (by `DT_SONAME`:
    /// [`CORE_RUNTIME`]): libc's own `.gcc_except_table` serves the cleanup
    /// of thread cancellation, it defines the [`SWITCHERS`] others would
    /// import, and the three write rsp by hand (`longjmp`, `swapcontext`,
    /// the lazy-binding trampoline, `_Unwind_Resume`), reached only through
    /// what the other objects import.
    pub core_runtime: bool,
    /// A Go binary.
    pub is_go: bool,
    /// Has a `.gcc_except_table` section (LSDAs: C++ or Rust code, or C
    /// built with `-fexceptions` and cleanups).
    pub except_table: bool,
    /// [`RAISERS`] and [`SWITCHERS`] it defines.
    pub defines: Vec<String>,
    /// [`RAISERS`] and [`SWITCHERS`] it imports (undefined symbols).
    pub imports: Vec<String>,
    /// An instruction that loads the stack pointer from somewhere other
    /// than the frame (`mov rsp, rdi`, `pop rsp`, ...): a stack switch
    /// written by hand. Its text, with its offset in the code.
    pub stack_switch: Option<String>,
}

/// Why a uretprobe is not proven harmless in a process that maps this
/// object, if it is not. `None`: the object shows nothing that could be hurt.
pub fn hazard(o: &ObjectFacts) -> Option<String> {
    let name = &o.name;
    if o.is_go {
        return Some(format!("{name} is Go (its runtime walks and moves stacks)"));
    }
    let raiser = |s: &String| {
        RAISERS.contains(&s.as_str())
            // glibc's unwinder use and libgcc_s's definitions are the
            // machinery, not a raiser: only an importer raises.
            && !(s.starts_with("_Unwind_") && o.core_runtime)
    };
    if let Some(s) = o.imports.iter().find(|s| raiser(s)) {
        return Some(format!("{name} can raise exceptions (it imports {s})"));
    }
    let defines_raiser = o
        .defines
        .iter()
        .find(|s| raiser(s) && !s.starts_with("_Unwind_"));
    if let Some(s) = defines_raiser {
        return Some(format!("{name} is an exception runtime (it defines {s})"));
    }
    if o.except_table && !o.core_runtime {
        return Some(format!(
            "{name} has exception tables (.gcc_except_table: C++ or Rust code)"
        ));
    }
    let switcher = |s: &String| SWITCHERS.contains(&s.as_str());
    if let Some(s) = o.imports.iter().find(|s| switcher(s)) {
        return Some(format!("{name} imports {s}"));
    }
    if let Some(s) = o
        .defines
        .iter()
        .find(|s| switcher(s))
        .filter(|_| !o.core_runtime)
    {
        return Some(format!("{name} defines {s}"));
    }
    if let Some(at) = o.stack_switch.as_ref().filter(|_| !o.core_runtime) {
        return Some(format!("{name} switches stacks by hand ({at})"));
    }
    None
}

/// The first instruction in `code` (at address `ip`) that loads the stack
/// pointer with a value not derived from the frame: `mov rsp, REG` from a
/// register other than rbp, `mov rsp, [MEM]`, `xchg` with rsp, `pop rsp`,
/// `lea rsp, [REG+...]` with a base other than rsp or rbp, or a `cmov` into
/// rsp. Compilers write rsp only relative to itself or to rbp (`sub rsp,
/// N`, `sub rsp, rax` for alloca, `mov rsp, rbp`, `lea rsp, [rbp-N]`);
/// hand-written context switches (coroutines, `longjmp`) load it from
/// elsewhere. Returns its text and address.
pub fn stack_switch(code: &[u8], ip: u64) -> Option<String> {
    stack_switch_until(code, ip, code.len() as u64).0
}

/// [`stack_switch`], decoding instructions that start before byte `stop`
/// of `code`; also returns where decoding stopped (bytes into `code`).
fn stack_switch_until(code: &[u8], ip: u64, stop: u64) -> (Option<String>, u64) {
    let mut d = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    while d.can_decode() && (d.position() as u64) < stop {
        let insn = d.decode();
        if insn.is_invalid() || insn.op_count() == 0 || insn.op0_kind() != OpKind::Register {
            continue;
        }
        let writes_rsp = insn.op0_register() == Register::RSP;
        let xchg_rsp = insn.mnemonic() == Mnemonic::Xchg
            && insn.op_count() == 2
            && insn.op1_kind() == OpKind::Register
            && insn.op1_register() == Register::RSP;
        if !(writes_rsp || xchg_rsp) {
            continue;
        }
        let from_frame = |r: Register| matches!(r, Register::RSP | Register::RBP);
        let switch = match insn.mnemonic() {
            Mnemonic::Mov => match insn.op1_kind() {
                OpKind::Register => !from_frame(insn.op1_register()),
                OpKind::Memory => true,
                _ => false,
            },
            Mnemonic::Lea => !from_frame(insn.memory_base()),
            Mnemonic::Pop | Mnemonic::Xchg => true,
            m => format!("{m:?}").starts_with("Cmov"),
        };
        if switch {
            let at = format!("{:?} at {:#x}", insn.mnemonic(), insn.ip()).to_lowercase();
            return (Some(at), d.position() as u64);
        }
    }
    (None, d.position() as u64)
}

/// Most bytes of code [`process_hazard`] decodes in one process (the sum
/// over its objects): ~0.1-0.3 s of a release build's decoding here. A
/// process with more is not proven harmless.
pub const MAX_CODE_BYTES: u64 = 64 << 20;

/// Why a uretprobe is not proven harmless in process `pid`, if it is not:
/// the first [`hazard`] of an object it maps with code, or an object that
/// cannot be read. `None`: every object was read and shows nothing.
pub fn process_hazard(pid: i32) -> Option<String> {
    let objects = match super::maps::read_objects(pid) {
        Ok(o) => o,
        Err(e) => return Some(format!("/proc/{pid}/maps: {e}")),
    };
    let mut budget = MAX_CODE_BYTES;
    for o in objects {
        if !o.mappings.iter().any(|m| m.perms.contains('x')) {
            continue;
        }
        let name = o.file_name();
        let elf = match super::elf::ElfObject::open(&o.open_path) {
            Ok(e) => e,
            Err(e) => return Some(format!("{name} could not be read ({e:#})")),
        };
        let facts = match object_facts(&elf, name, &mut budget) {
            Ok(f) => f,
            Err(why) => return Some(why),
        };
        if let Some(h) = hazard(&facts) {
            return Some(h);
        }
    }
    None
}

/// The processes that map the file of `inode` at `path` (as their maps
/// name it), from /proc/*/maps: those a file-wide uprobe reaches now.
pub fn processes_mapping(inode: u64, path: &std::path::Path) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|pid: &i32| {
            std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|text| {
                super::maps::parse_maps(&text)
                    .iter()
                    .any(|m| m.inode == inode && m.path == path)
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// What `elf` shows; its code is decoded unless it is a core runtime,
/// within `budget` bytes (decreased by what is decoded).
fn object_facts(
    elf: &super::elf::ElfObject,
    name: String,
    budget: &mut u64,
) -> Result<ObjectFacts, String> {
    let wanted: Vec<&str> = RAISERS
        .iter()
        .chain(&SWITCHERS)
        .chain(&["gnu_get_libc_version"])
        .copied()
        .collect();
    let (defines, imports) = elf.symbols_among(&wanted);
    let core_runtime = elf
        .soname()
        .is_some_and(|s| CORE_RUNTIME.contains(&s.as_str()));
    let mut facts = ObjectFacts {
        name,
        core_runtime,
        is_go: elf.is_go(),
        except_table: elf.has_section(".gcc_except_table"),
        defines,
        imports,
        stack_switch: None,
    };
    // The code is decoded only when nothing else has decided: an object
    // that imports a raiser (node: __gxx_personality_v0) is a hazard
    // whatever its code does.
    if core_runtime || hazard(&facts).is_some() {
        return Ok(facts);
    }
    for seg in elf.segments().iter().filter(|s| s.executable) {
        if seg.filesz > *budget {
            return Err(format!(
                "the process maps more than {} MiB of code to check",
                MAX_CODE_BYTES >> 20
            ));
        }
        *budget -= seg.filesz;
        if let Some(at) = segment_stack_switch(elf, seg, DECODE_CHUNK) {
            facts.stack_switch = Some(at);
            break;
        }
    }
    Ok(facts)
}

/// Bytes of code read and decoded at a time: a segment is never held whole.
const DECODE_CHUNK: u64 = 1 << 20;

/// [`stack_switch`] over one executable segment, read in pieces of
/// `chunk` bytes ([`DECODE_CHUNK`]), decoding the same instructions as the whole
/// segment would: a piece is decoded up to 15 bytes (the longest x86
/// instruction) before its end, and the next piece starts where the decoder
/// stopped, so no instruction is cut.
fn segment_stack_switch(
    elf: &super::elf::ElfObject,
    seg: &super::elf::Segment,
    chunk: u64,
) -> Option<String> {
    const LONGEST: u64 = 15;
    let mut at = 0u64;
    while at < seg.filesz {
        let want = chunk.max(2 * LONGEST).min(seg.filesz - at);
        let code = elf.read_uncached(seg.offset + at, want);
        if code.is_empty() {
            return None;
        }
        let last = at + code.len() as u64 >= seg.filesz;
        let stop = if last {
            code.len() as u64
        } else {
            (code.len() as u64).saturating_sub(LONGEST).max(1)
        };
        let (found, decoded) = stack_switch_until(&code, seg.vaddr + at, stop);
        if found.is_some() {
            return found;
        }
        at += decoded.max(1);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c_object() -> ObjectFacts {
        ObjectFacts {
            name: "app".into(),
            imports: vec!["malloc".into()],
            ..Default::default()
        }
    }

    #[test]
    fn a_plain_c_object_and_glibc_are_harmless() {
        assert_eq!(hazard(&c_object()), None);
        let libc = ObjectFacts {
            name: "libc.so.6".into(),
            core_runtime: true,
            except_table: true,
            defines: vec!["swapcontext".into(), "dlopen".into(), "sigaltstack".into()],
            ..Default::default()
        };
        assert_eq!(hazard(&libc), None);
        // libgcc_s defines the unwinder; defining it raises nothing.
        let libgcc = ObjectFacts {
            name: "libgcc_s.so.1".into(),
            defines: vec!["_Unwind_RaiseException".into()],
            ..Default::default()
        };
        assert_eq!(hazard(&libgcc), None);
    }

    #[test]
    fn exceptions_go_stack_switches_and_dlopen_are_hazards() {
        let with = |f: &dyn Fn(&mut ObjectFacts)| {
            let mut o = c_object();
            f(&mut o);
            hazard(&o).unwrap_or_default()
        };
        assert!(with(&|o| o.imports.push("__cxa_throw".into())).contains("__cxa_throw"));
        assert!(with(&|o| o.imports.push("_Unwind_RaiseException".into())).contains("raise"));
        assert!(with(&|o| o.defines.push("__gxx_personality_v0".into())).contains("runtime"));
        assert!(with(&|o| o.defines.push("rust_eh_personality".into())).contains("runtime"));
        assert!(with(&|o| o.except_table = true).contains(".gcc_except_table"));
        assert!(with(&|o| o.is_go = true).contains("Go"));
        assert!(with(&|o| o.imports.push("dlopen".into())).contains("dlopen"));
        assert!(with(&|o| o.imports.push("swapcontext".into())).contains("swapcontext"));
        // A static binary that carries swapcontext uses it.
        assert!(with(&|o| o.defines.push("makecontext".into())).contains("makecontext"));
        assert!(with(&|o| o.stack_switch = Some("mov at 0x10".into())).contains("by hand"));
        // glibc importing its unwinder is not a raiser, but it is not
        // exempt from a C++ runtime's symbols.
        let glibc = |f: &dyn Fn(&mut ObjectFacts)| {
            let mut o = c_object();
            o.core_runtime = true;
            f(&mut o);
            hazard(&o)
        };
        assert_eq!(
            glibc(&|o| o.imports.push("_Unwind_ForcedUnwind".into())),
            None
        );
        assert!(glibc(&|o| o.imports.push("__cxa_throw".into())).is_some());
    }

    #[test]
    fn this_rust_test_process_is_not_proven_harmless() {
        // Rust's std raises panics through _Unwind_RaiseException.
        let h = process_hazard(std::process::id() as i32);
        assert!(
            h.as_deref().is_some_and(|h| h.contains("exception")),
            "{h:?}"
        );
    }

    #[test]
    fn code_decoded_in_pieces_is_decoded_as_a_whole() {
        // glibc's libc has hand-written stack switches (longjmp,
        // swapcontext); the pieces must find the same first one.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = super::super::maps::parse_maps(&maps)
            .into_iter()
            .find(|m| m.path.to_string_lossy().contains("libc.so"))
            .map(|m| m.path)
            .unwrap();
        let elf = super::super::elf::ElfObject::open(&libc).unwrap();
        let mut found = 0;
        for seg in elf.segments().iter().filter(|s| s.executable) {
            let whole = stack_switch(&elf.read_uncached(seg.offset, seg.filesz), seg.vaddr);
            found += usize::from(whole.is_some());
            for chunk in [4093, 65536] {
                assert_eq!(segment_stack_switch(&elf, seg, chunk), whole, "{chunk}");
            }
        }
        assert!(found > 0, "{}", libc.display());
    }

    #[test]
    fn compiler_writes_of_rsp_are_not_stack_switches() {
        let code: &[u8] = &[
            0x48, 0x83, 0xec, 0x10, // sub rsp, 0x10
            0x48, 0x29, 0xc4, // sub rsp, rax (alloca)
            0x48, 0x89, 0xec, // mov rsp, rbp
            0x48, 0x8d, 0x65, 0xf0, // lea rsp, [rbp-0x10]
            0x48, 0x8d, 0x64, 0x24, 0x08, // lea rsp, [rsp+8]
            0x48, 0x83, 0xe4, 0xf0, // and rsp, -16
            0xc9, // leave
            0xc3, // ret
        ];
        assert_eq!(stack_switch(code, 0), None);
    }

    #[test]
    fn loads_of_rsp_from_elsewhere_are_stack_switches() {
        for (code, what) in [
            (&[0x48, 0x89, 0xfc][..], "mov rsp, rdi"),
            (&[0x48, 0x8b, 0x67, 0x08], "mov rsp, [rdi+8]"),
            (&[0x5c], "pop rsp"),
            (&[0x48, 0x87, 0xe7], "xchg rdi, rsp"),
            (&[0x48, 0x8d, 0x66, 0x10], "lea rsp, [rsi+0x10]"),
            (&[0x48, 0x0f, 0x44, 0xe7], "cmove rsp, rdi"),
        ] {
            let mut with_prefix = vec![0x90, 0x90];
            with_prefix.extend_from_slice(code);
            let found = stack_switch(&with_prefix, 0x1000);
            assert!(
                found.as_deref().is_some_and(|f| f.ends_with("at 0x1002")),
                "{what}: {found:?}"
            );
        }
    }
}
