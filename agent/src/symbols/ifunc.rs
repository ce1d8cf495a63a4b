//! GNU indirect functions (`STT_GNU_IFUNC`, such as glibc's `memcpy`,
//! `strlen` and `memset`): the symbol's address is a resolver, which the
//! dynamic loader calls when it binds the symbol; the implementation it
//! returns (`__memmove_avx_unaligned_erms` and so on) goes into the GOT of
//! each module that imports the symbol. The resolver is not what runs on a
//! call, so a probe on it sees nothing.
//!
//! The implementation this process uses is read the way a debugger does
//! (gdb's `elf_gnu_ifunc_resolve_by_got`): find a module that imports the
//! symbol (its `R_X86_64_JUMP_SLOT` or `R_X86_64_GLOB_DAT` relocation), read
//! that GOT entry from /proc/PID/mem, and map the address back to a function
//! of the IFUNC's object. A GOT entry not yet bound (lazy binding, before
//! the first call) still points into its own module's PLT and says nothing.
//! The IFUNC's own object may call it too, through a slot with an
//! `R_X86_64_IRELATIVE` relocation whose addend is the resolver; the loader
//! binds those when it loads the object.

use std::{fs::File, os::unix::fs::FileExt as _, path::PathBuf};

use super::{
    Candidate, Function, Picked, ResolveError, View,
    elf::{ElfObject, Segment, SymKind},
    maps::{self, MappedObject},
    names::{self, SymbolName},
};
use crate::error::Failure;

/// The implementation the process `pid` calls for the IFUNC `c`, or a
/// refusal (exit code 2) that names the IFUNC and lists implementations.
pub(super) fn implementation<'a>(pid: i32, c: &Candidate<'a>) -> Result<Picked<'a>, ResolveError> {
    let name = names::strip_version(&c.sym.name);
    let version = SymbolName::new(&c.sym.name)
        .version
        .map(|v| v.trim_start_matches('@').to_string());
    let (bound, why) = if pid > 0 {
        let own = (&c.view.mapped.path, c.sym.value);
        match bound_addresses(pid, name, version.as_deref(), own) {
            Ok(b) => (b, None),
            Err(e) => (Vec::new(), Some(e)),
        }
    } else {
        (
            Vec::new(),
            Some("no process to read it from (--exe)".to_string()),
        )
    };
    let mut found: Vec<(Function, PathBuf)> = Vec::new();
    for (importer, addr) in bound {
        if let Some(f) = function_at(pid, c.view, addr)
            && !found.iter().any(|(g, _)| g.elf_address == f.elf_address)
        {
            found.push((f, importer));
        }
    }
    match found.len() {
        1 => {
            let (function, importer) = found.remove(0);
            let note = format!(
                "{name} in {} is an IFUNC; pid {pid} calls its implementation {} (read from \
                 the GOT of {}), so that is probed; other IFUNCs bound to the same \
                 implementation trigger too",
                c.view.label(),
                function.demangled,
                importer.display()
            );
            Ok(Picked {
                view: c.view,
                function,
                note: Some(note),
            })
        }
        0 => Err(refusal(
            pid,
            c.view,
            name,
            &why.unwrap_or_else(|| {
                "no module of the process has bound it yet (lazy binding binds it at the first \
                 call)"
                    .to_string()
            }),
        )),
        _ => Err(refusal(
            pid,
            c.view,
            name,
            &format!(
                "modules of the process are bound to different implementations ({})",
                found
                    .iter()
                    .map(|(f, m)| format!("{} in {}", f.demangled, m.display()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )),
    }
}

fn refusal(pid: i32, v: &View, name: &str, why: &str) -> ResolveError {
    ResolveError::Other(
        Failure::usage(format!(
            "{name} in {} is a GNU indirect function (IFUNC): its resolver picks an \
             implementation at run time, and mt-agent cannot tell which one this process \
             uses: {why}; probe one of the implementations below by name",
            v.label()
        ))
        .with_detail(candidates(pid, v, name)),
    )
}

/// The address each importing module's GOT holds for `name`, with the
/// module; `own` is the IFUNC's object and resolver address, whose own
/// calls (IRELATIVE slots) count too. Errors when /proc/PID/maps or
/// /proc/PID/mem cannot be read.
fn bound_addresses(
    pid: i32,
    name: &str,
    version: Option<&str>,
    own: (&PathBuf, u64),
) -> Result<Vec<(PathBuf, u64)>, String> {
    let objects = maps::read_objects(pid).map_err(|e| format!("/proc/{pid}/maps: {e}"))?;
    let mut mem: Option<File> = None;
    let mut out = Vec::new();
    for o in &objects {
        let Ok(elf) = ElfObject::open(&o.open_path) else {
            continue;
        };
        let mut slots = elf.imports(name, version);
        if &o.path == own.0 {
            slots.extend(elf.irelative_slots(own.1));
        }
        if slots.is_empty() {
            continue;
        }
        let Some(bias) = load_bias(o, &elf.segments()) else {
            continue;
        };
        if mem.is_none() {
            mem = Some(
                File::open(format!("/proc/{pid}/mem"))
                    .map_err(|e| format!("/proc/{pid}/mem: {e}"))?,
            );
        }
        let Some(mem) = mem.as_ref() else { continue };
        for slot in slots {
            let mut word = [0u8; 8];
            if mem.read_exact_at(&mut word, bias + slot).is_ok() {
                out.push((o.path.clone(), u64::from_le_bytes(word)));
            }
        }
    }
    Ok(out)
}

/// Where an object is loaded: runtime address minus ELF virtual address,
/// from its mapping at file offset 0 and its first LOAD segment (which
/// starts at file offset 0, its address rounded down to a page).
fn load_bias(o: &MappedObject, segments: &[Segment]) -> Option<u64> {
    let start = o
        .mappings
        .iter()
        .filter(|m| m.offset == 0)
        .map(|m| m.start)
        .min()?;
    let first = segments.iter().find(|s| s.offset == 0)?;
    start.checked_sub(first.vaddr & !0xfff)
}

/// The function of `v` that starts at runtime address `addr`, if any.
fn function_at(pid: i32, v: &View, addr: u64) -> Option<Function> {
    let vaddr = addr.checked_sub(load_bias(&v.mapped, &v.segments)?)?;
    v.tables_where(pid, |s| {
        s.kind() == Some(SymKind::Func) && s.size > 0 && s.value == vaddr
    })
    .into_iter()
    .flatten()
    .next()
    .and_then(|s| v.function(&s))
}

/// Functions of `v` named like implementations of `name` (`__name_*`,
/// `name_*`, leaving out the `_chk` variants of `__name_chk`), for refusals.
fn candidates(pid: i32, v: &View, name: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let prefixes = [format!("__{name}_"), format!("{name}_")];
    for s in v.tables(pid).into_iter().flatten() {
        let base = names::strip_version(&s.name);
        if s.kind == SymKind::Func
            && s.size > 0
            && prefixes.iter().any(|p| base.starts_with(p.as_str()))
            && !base.contains("_chk")
            && !out
                .iter()
                .any(|o| o.split_whitespace().next() == Some(base))
        {
            out.push(format!("{base}  ({} bytes)", s.size));
        }
    }
    out.sort();
    if out.is_empty() {
        out.push("(no implementations found by name; see `mt-agent symbols`)".into());
    }
    out.truncate(20);
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::symbols::maps::Mapping;

    fn mapping(start: u64, offset: u64) -> Mapping {
        Mapping {
            start,
            end: start + 0x1000,
            perms: "r--p".into(),
            offset,
            inode: 1,
            path: PathBuf::from("/lib/x.so"),
            deleted: false,
        }
    }

    #[test]
    fn load_bias_comes_from_the_mapping_at_offset_zero() {
        let seg = |vaddr, offset| Segment {
            vaddr,
            offset,
            filesz: 0x1000,
            executable: false,
        };
        let o = MappedObject {
            path: PathBuf::from("/lib/x.so"),
            open_path: PathBuf::from("/lib/x.so"),
            inode: 1,
            deleted: false,
            is_main: false,
            mappings: vec![
                mapping(0x7f00_0000_1000, 0x1000),
                mapping(0x7f00_0000_0000, 0),
            ],
        };
        // A shared object (first LOAD at 0) and a non-PIE executable (at 0x400000).
        assert_eq!(load_bias(&o, &[seg(0, 0)]), Some(0x7f00_0000_0000));
        let mut exe = o.clone();
        exe.mappings = vec![mapping(0x40_0000, 0)];
        assert_eq!(load_bias(&exe, &[seg(0x40_0000, 0)]), Some(0));
    }
}
