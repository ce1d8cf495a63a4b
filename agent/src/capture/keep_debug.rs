//! What the build-id cache keeps of a mapped object: only the bytes the
//! report reads from it (docs/build-ids.md, "What a kept object holds").
//!
//! `perf script` reads a cached object for its symbol tables (`.symtab`,
//! `.dynsym`, their string tables, the PLT's relocations), its notes (the
//! build-id), its DWARF (`addr2line` for inlined frames and lines) and, for
//! DWARF stacks, its `.eh_frame_hdr` and `.eh_frame`, which perf's libunwind
//! reads through the object's *mapped addresses* (`access_dso_mem` in
//! tools/perf/util/unwind-libunwind-local.c reads the file at the offset
//! the mapping gives). So the copy keeps the file's layout byte for byte,
//! headers and offsets included, and leaves the code and data sections
//! (`.text`, `.rodata`, `.data`, ...) as holes: a sparse file of the
//! object's length whose kept bytes are what the disk holds.
//! `objcopy --only-keep-debug` drops `.eh_frame` and moves sections, so its
//! output would no longer unwind.

use std::{fs::File, io, ops::Range, os::unix::fs::FileExt as _};

use object::{Object as _, ObjectSection as _};

/// A section as the choice needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionHeader {
    pub name: String,
    /// `sh_type`.
    pub kind: u32,
    /// `sh_flags`.
    pub flags: u64,
    /// File offset and size, bytes.
    pub offset: u64,
    pub size: u64,
}

/// Loaded sections whose contents the report reads, by name (or prefix,
/// ending in `*`): the unwinding tables, the PLT and GOT (perf names PLT
/// entries from `.rela.plt` and the PLT's header), the loader's path.
const LOADED_KEPT: &[&str] = &[
    ".eh_frame",
    ".eh_frame_hdr",
    ".gcc_except_table",
    ".interp",
    ".plt*",
    ".got*",
];

/// Whether a section's bytes can be left out: a loaded (`SHF_ALLOC`)
/// `SHT_PROGBITS` section not in [`LOADED_KEPT`]: code, read-only and
/// writable data. Every other kind (symbol and string tables, notes,
/// relocations, `.dynamic`, and all unloaded sections, DWARF among them)
/// is kept.
pub fn unneeded(s: &SectionHeader) -> bool {
    let kept = LOADED_KEPT.iter().any(|k| match k.strip_suffix('*') {
        Some(prefix) => s.name.starts_with(prefix),
        None => s.name == *k,
    });
    s.kind == object::elf::SHT_PROGBITS && s.flags & u64::from(object::elf::SHF_ALLOC) != 0 && !kept
}

/// The byte ranges of a file of `len` bytes to copy: everything but the
/// [`unneeded`] sections, in order, merged.
pub fn kept_ranges(sections: &[SectionHeader], len: u64) -> Vec<Range<u64>> {
    let mut holes: Vec<Range<u64>> = sections
        .iter()
        .filter(|s| unneeded(s))
        .map(|s| s.offset.min(len)..s.offset.saturating_add(s.size).min(len))
        .filter(|r| !r.is_empty())
        .collect();
    holes.sort_by_key(|r| r.start);
    let mut kept = Vec::new();
    let mut at = 0;
    for h in holes {
        if h.start > at {
            kept.push(at..h.start);
        }
        at = at.max(h.end);
    }
    if at < len {
        kept.push(at..len);
    }
    kept
}

/// The sections of a 64-bit ELF file; `None` when it is not one. NOBITS
/// sections (`.bss`) take no file bytes and are not listed.
pub fn section_headers(file: &File) -> Option<Vec<SectionHeader>> {
    use object::read::elf::{ElfFile64, SectionHeader as _};
    let data = object::ReadCache::new(file);
    let elf = ElfFile64::<object::Endianness, _>::parse(&data).ok()?;
    let e = elf.endian();
    let headers = elf
        .sections()
        .filter_map(|s| {
            let h = s.elf_section_header();
            let kind = h.sh_type(e);
            (kind != object::elf::SHT_NOBITS).then(|| SectionHeader {
                name: s.name().unwrap_or_default().to_string(),
                kind,
                flags: h.sh_flags(e),
                offset: h.sh_offset(e),
                size: h.sh_size(e),
            })
        })
        .collect();
    Some(headers)
}

/// Writes the [`kept_ranges`] of `from` (`len` bytes) into `to` at the same
/// offsets and sets its length to `len`: the rest are holes. Returns the
/// bytes written.
pub fn copy_sparse(from: &File, to: &File, len: u64, kept: &[Range<u64>]) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut written = 0;
    for r in kept {
        let mut at = r.start;
        while at < r.end {
            let n = (r.end - at).min(buf.len() as u64) as usize;
            from.read_exact_at(&mut buf[..n], at)?;
            to.write_all_at(&buf[..n], at)?;
            at += n as u64;
            written += n as u64;
        }
    }
    to.set_len(len)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sec(name: &str, kind: u32, flags: u32, offset: u64, size: u64) -> SectionHeader {
        SectionHeader {
            name: name.into(),
            kind,
            flags: u64::from(flags),
            offset,
            size,
        }
    }

    #[test]
    fn code_and_data_are_left_out_and_tables_kept() {
        use object::elf::*;
        let a = SHF_ALLOC;
        let sections = [
            sec(".dynsym", SHT_DYNSYM, a, 0x100, 0x100),
            sec(".plt", SHT_PROGBITS, a | SHF_EXECINSTR, 0x200, 0x10),
            sec(".text", SHT_PROGBITS, a | SHF_EXECINSTR, 0x210, 0x1000),
            sec(".rodata", SHT_PROGBITS, a, 0x1210, 0x800),
            sec(".eh_frame_hdr", SHT_PROGBITS, a, 0x1a10, 0x20),
            sec(".eh_frame", SHT_PROGBITS, a, 0x1a30, 0x100),
            sec(".data", SHT_PROGBITS, a | SHF_WRITE, 0x1b30, 0x100),
            sec(".got.plt", SHT_PROGBITS, a | SHF_WRITE, 0x1c30, 0x10),
            sec(".note.gnu.build-id", SHT_NOTE, a, 0x1c40, 0x24),
            sec(".debug_info", SHT_PROGBITS, 0, 0x1c64, 0x300),
            sec(".symtab", SHT_SYMTAB, 0, 0x1f64, 0x100),
        ];
        let left_out: Vec<&str> = sections
            .iter()
            .filter(|s| unneeded(s))
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(left_out, [".text", ".rodata", ".data"]);
        assert_eq!(
            kept_ranges(&sections, 0x2100),
            [0..0x210, 0x1a10..0x1b30, 0x1c30..0x2100]
        );
    }

    #[test]
    fn ranges_past_the_end_and_overlaps_are_clipped() {
        use object::elf::*;
        let a = SHF_ALLOC;
        let sections = [
            sec(".text", SHT_PROGBITS, a, 0x10, 0x40),
            sec(".text.hot", SHT_PROGBITS, a, 0x30, 0x40),
            sec(".rodata", SHT_PROGBITS, a, 0x90, 0x1000),
        ];
        assert_eq!(kept_ranges(&sections, 0x100), [0..0x10, 0x70..0x90]);
        assert_eq!(
            kept_ranges(&[], 7),
            vec![std::ops::Range { start: 0, end: 7 }]
        );
    }
}
