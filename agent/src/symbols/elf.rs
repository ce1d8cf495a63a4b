//! Reading one ELF object: its symbol tables, LOAD segments, build-id and
//! debug link. Uses the `object` crate. Files are opened through
//! [`crate::sys::safe_open`] (inside the target's root, regular files only) and
//! read into memory within the size budget of [`crate::symbols::budget`].

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::bail;
use object::{
    Endianness, Object as _, ReadCache, ReadRef as _,
    elf::{self, PT_LOAD},
    read::elf::{ElfFile64, ProgramHeader as _, Sym as _, SymbolTable},
};

use crate::symbols::budget::{Budgeted, Source};

/// Which table a symbol came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Table {
    /// `.symtab` of the object.
    Symtab,
    /// `.dynsym` of the object.
    Dynsym,
    /// `.symtab` of a separate debug file.
    DebugFile(PathBuf),
}

impl Table {
    /// Short label for listings.
    pub fn label(&self) -> &'static str {
        match self {
            Table::Symtab => ".symtab",
            Table::Dynsym => ".dynsym",
            Table::DebugFile(_) => "debug file",
        }
    }
}

/// Symbol type, as far as mt-agent cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymKind {
    /// `STT_FUNC`.
    Func,
    /// `STT_GNU_IFUNC`: a resolver that picks an implementation at run time.
    Ifunc,
    /// `STT_OBJECT` or `STT_TLS`.
    Data,
}

/// A defined symbol of interest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfSymbol {
    /// Name as in the table; for `.dynsym`, with `@VER` or `@@VER` added
    /// from the version table.
    pub name: String,
    /// `st_value`: the ELF virtual address.
    pub value: u64,
    /// `st_size`, bytes.
    pub size: u64,
    pub kind: SymKind,
    pub table: Table,
}

/// A PT_LOAD program header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub vaddr: u64,
    pub offset: u64,
    pub filesz: u64,
    pub executable: bool,
}

/// Converts an ELF virtual address to a file offset through the LOAD
/// segment that contains it: `vaddr - p_vaddr + p_offset`. Section headers
/// are not used: binaries linked with lld lay sections out differently.
pub fn vaddr_to_offset(segments: &[Segment], vaddr: u64) -> Option<u64> {
    segments
        .iter()
        .find(|s| vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz)
        .and_then(|s| (vaddr - s.vaddr).checked_add(s.offset))
}

/// `size` cut to what the LOAD segment holding `vaddr` has from there on:
/// a symbol of a malformed file may claim more (up to 2^64 - 1).
pub fn size_in_segment(segments: &[Segment], vaddr: u64, size: u64) -> u64 {
    segments
        .iter()
        .find(|s| vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz)
        .map_or(0, |s| size.min(s.filesz - (vaddr - s.vaddr)))
}

/// Converts a file offset to an ELF virtual address (the inverse of
/// [`vaddr_to_offset`]).
pub fn offset_to_vaddr(segments: &[Segment], offset: u64) -> Option<u64> {
    segments
        .iter()
        .find(|s| offset >= s.offset && offset - s.offset < s.filesz)
        .and_then(|s| (offset - s.offset).checked_add(s.vaddr))
}

/// An ELF file, read on demand: only the parts parsing needs (headers,
/// symbol and string tables, notes, function bodies) are read, with
/// `pread(2)`, and kept. Reading, not mapping, means a target that truncates
/// its file while the agent reads it gives a short read, not a SIGBUS.
pub struct ElfObject {
    pub path: PathBuf,
    cache: ReadCache<Budgeted>,
    source: Arc<Source>,
    len: u64,
}

impl ElfObject {
    /// Opens and checks the file: a 64-bit ELF. `path` is named as
    /// [`crate::sys::safe_open::open_labelled`] takes it. A file that is refused
    /// (not a regular file, outside the target's root, over the size
    /// budget) is an error whose reason is also logged at `-v`.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        if crate::symbols::budget::over(path) {
            bail!(
                "{}: symbol resolution is past its time budget",
                path.display()
            );
        }
        let (file, len) = match open_elf_file(path) {
            Ok(f) => f,
            Err(e @ crate::sys::safe_open::Refused::Unusable(_)) => {
                log::debug!("skipping {}: {e}", path.display());
                bail!("{}: {e}", path.display());
            }
            Err(e) => {
                log::info!("skipping {}: {e}", path.display());
                bail!("{}: {e}", path.display());
            }
        };
        Self::from_source(
            path.to_path_buf(),
            crate::symbols::budget::Source::File(file),
            len,
        )
    }

    /// Checks `data`: a 64-bit ELF. For the fuzz harness and tests.
    pub fn from_bytes(path: PathBuf, data: Vec<u8>) -> anyhow::Result<Self> {
        let len = data.len() as u64;
        Self::from_source(path, crate::symbols::budget::Source::Bytes(data), len)
    }

    fn from_source(path: PathBuf, source: Source, len: u64) -> anyhow::Result<Self> {
        let source = Arc::new(source);
        // What is read is kept. Parsing a well-formed file reads less than
        // its size plus up to 256 bytes per symbol name; a malformed one
        // (thousands of sections over the same bytes) may ask for far more,
        // so reading stops at 8 times the size (at least 64 MiB, at most the
        // size budget).
        let budget = len
            .saturating_mul(8)
            .max(64 << 20)
            .min(crate::symbols::budget::file_bytes());
        let reader =
            crate::symbols::budget::Budgeted::new(source.clone(), len, budget, path.clone());
        let this = Self {
            path,
            cache: ReadCache::new(reader),
            source,
            len,
        };
        this.elf()?;
        Ok(this)
    }

    fn elf(&self) -> anyhow::Result<ElfFile64<'_, Endianness, &ReadCache<Budgeted>>> {
        match ElfFile64::<Endianness, _>::parse(&self.cache) {
            Ok(f) => Ok(f),
            Err(e) => bail!("{} is not a 64-bit ELF object: {e}", self.path.display()),
        }
    }

    /// Up to `size` bytes at file offset `offset` (fewer at the end of the
    /// file; none if they cannot be read).
    pub fn read_at(&self, offset: u64, size: u64) -> Vec<u8> {
        let start = offset.min(self.len);
        let end = offset.saturating_add(size).min(self.len);
        (&self.cache)
            .read_bytes_at(start, end - start)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }

    /// CRC-32 of the whole file (the `.gnu_debuglink` check), read in 1 MiB
    /// pieces, not kept.
    pub fn crc32(&self) -> Option<u32> {
        let mut h = crc32fast::Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        while at < self.len {
            let n = self.source.read_at(&mut buf, at).ok()?;
            if n == 0 {
                return None;
            }
            h.update(&buf[..n.min((self.len - at) as usize)]);
            at += n as u64;
        }
        Some(h.finalize())
    }

    /// PT_LOAD segments. Segments whose end does not fit in 64 bits (a
    /// malformed file) are left out, so that any address or offset inside a
    /// segment plus a size cut by [`size_in_segment`] cannot overflow.
    pub fn segments(&self) -> Vec<Segment> {
        let Ok(f) = self.elf() else { return Vec::new() };
        let e = f.endian();
        f.elf_program_headers()
            .iter()
            .filter(|p| p.p_type(e) == PT_LOAD)
            .map(|p| Segment {
                vaddr: p.p_vaddr(e),
                offset: p.p_offset(e),
                filesz: p.p_filesz(e),
                executable: p.p_flags(e) & elf::PF_X != 0,
            })
            .filter(|s| {
                s.vaddr.checked_add(s.filesz).is_some() && s.offset.checked_add(s.filesz).is_some()
            })
            .collect()
    }

    /// Whether the object has a `.symtab` (is not stripped).
    pub fn has_symtab(&self) -> bool {
        self.elf().is_ok_and(|f| !f.elf_symbol_table().is_empty())
    }

    /// Whether this is a Go binary: it has Go's build information
    /// (`.go.buildinfo`, Go 1.13 on) or Go's build ID note
    /// (`.note.go.buildid`), which the Go linker writes (cmd/link).
    pub fn is_go(&self) -> bool {
        self.elf().is_ok_and(|f| {
            f.section_by_name(".go.buildinfo").is_some()
                || f.section_by_name(".note.go.buildid").is_some()
        })
    }

    /// Whether the object has a section of this name.
    pub fn has_section(&self, name: &str) -> bool {
        self.elf().is_ok_and(|f| f.section_by_name(name).is_some())
    }

    /// `DT_SONAME` of the dynamic section, if any.
    pub fn soname(&self) -> Option<String> {
        use object::read::elf::Dyn as _;
        let f = self.elf().ok()?;
        let e = f.endian();
        let sections = f.elf_section_table();
        let (dynamic, link) = sections.dynamic(e, f.data()).ok()??;
        let strings = sections.strings(e, f.data(), link).ok()?;
        dynamic
            .iter()
            .find(|d| d.tag32(e) == Some(elf::DT_SONAME))
            .and_then(|d| u32::try_from(Into::<u64>::into(d.d_val(e))).ok())
            .and_then(|at| strings.get(at).ok())
            .map(|n| String::from_utf8_lossy(n).into_owned())
    }

    /// The names among `wanted` this object defines and those it imports
    /// (undefined), from `.dynsym` and `.symtab`, without versions.
    pub fn symbols_among(&self, wanted: &[&str]) -> (Vec<String>, Vec<String>) {
        let (mut defined, mut imported) = (Vec::new(), Vec::new());
        let Ok(f) = self.elf() else {
            return (defined, imported);
        };
        let e = f.endian();
        for symbols in [f.elf_dynamic_symbol_table(), f.elf_symbol_table()] {
            for sym in symbols.iter() {
                let Ok(name) = sym.name(e, symbols.strings()) else {
                    continue;
                };
                let Some(w) = wanted.iter().find(|w| w.as_bytes() == name) else {
                    continue;
                };
                let list = if sym.is_undefined(e) {
                    &mut imported
                } else {
                    &mut defined
                };
                if !list.iter().any(|n| n == w) {
                    list.push(w.to_string());
                }
            }
        }
        (defined, imported)
    }

    /// The GNU build-id note, if any.
    pub fn build_id(&self) -> Option<Vec<u8>> {
        self.elf().ok()?.build_id().ok()?.map(<[u8]>::to_vec)
    }

    /// `.gnu_debuglink`: the debug file's name and CRC-32.
    pub fn debuglink(&self) -> Option<(String, u32)> {
        let (name, crc) = self.elf().ok()?.gnu_debuglink().ok()??;
        Some((String::from_utf8_lossy(name).into_owned(), crc))
    }

    /// Defined symbols of `.symtab`.
    pub fn symtab(&self) -> Vec<ElfSymbol> {
        self.symbols_of(false, Table::Symtab)
    }

    /// Defined symbols of `.dynsym`, with their versions.
    pub fn dynsym(&self) -> Vec<ElfSymbol> {
        self.symbols_of(true, Table::Dynsym)
    }

    /// Defined symbols of `.symtab`, labelled as coming from this debug file.
    pub fn debug_symbols(&self) -> Vec<ElfSymbol> {
        self.symbols_of(false, Table::DebugFile(self.path.clone()))
    }

    /// Where this object's GOT holds the address of the function `name`
    /// it imports: the ELF virtual addresses (`r_offset`) of its
    /// `R_X86_64_JUMP_SLOT` and `R_X86_64_GLOB_DAT` relocations against
    /// `name`. With `version`, an import bound to another version is left
    /// out (an import without version information is kept).
    pub fn imports(&self, name: &str, version: Option<&str>) -> Vec<u64> {
        let Ok(f) = self.elf() else { return Vec::new() };
        let e = f.endian();
        let Some(relocs) = f.dynamic_relocations() else {
            return Vec::new();
        };
        let symbols = f.elf_dynamic_symbol_table();
        let versions = f
            .elf_section_table()
            .versions(e, &self.cache)
            .ok()
            .flatten();
        let mut out = Vec::new();
        for (offset, r) in relocs {
            let object::RelocationFlags::Elf { r_type } = r.flags() else {
                continue;
            };
            let object::RelocationTarget::Symbol(index) = r.target() else {
                continue;
            };
            if r_type != elf::R_X86_64_JUMP_SLOT && r_type != elf::R_X86_64_GLOB_DAT {
                continue;
            }
            let Ok(sym) = symbols.symbol(index) else {
                continue;
            };
            if sym.name(e, symbols.strings()).ok() != Some(name.as_bytes()) {
                continue;
            }
            let bound = versions
                .as_ref()
                .and_then(|v| v.version(v.version_index(e, index)).ok().flatten())
                .map(|v| v.name());
            if let (Some(want), Some(got)) = (version, bound)
                && want.as_bytes() != got
            {
                continue;
            }
            out.push(offset);
        }
        out
    }

    /// The GOT slots (ELF virtual addresses) of this object's own calls to
    /// the IFUNC whose resolver is at `resolver`: its `R_X86_64_IRELATIVE`
    /// relocations with that addend, which the loader always binds at load
    /// time.
    pub fn irelative_slots(&self, resolver: u64) -> Vec<u64> {
        let Ok(f) = self.elf() else { return Vec::new() };
        let Some(relocs) = f.dynamic_relocations() else {
            return Vec::new();
        };
        relocs
            .filter(|(_, r)| {
                matches!(r.flags(), object::RelocationFlags::Elf { r_type } if r_type == elf::R_X86_64_IRELATIVE)
                    && u64::try_from(r.addend()).ok() == Some(resolver)
            })
            .map(|(offset, _)| offset)
            .collect()
    }

    fn symbols_of(&self, dynamic: bool, table: Table) -> Vec<ElfSymbol> {
        let Ok(f) = self.elf() else { return Vec::new() };
        let e = f.endian();
        let symbols: &SymbolTable<'_, _, &ReadCache<Budgeted>> = if dynamic {
            f.elf_dynamic_symbol_table()
        } else {
            f.elf_symbol_table()
        };
        let versions = if dynamic {
            f.elf_section_table()
                .versions(e, &self.cache)
                .ok()
                .flatten()
        } else {
            None
        };
        let strings = symbols.strings();
        let mut out = Vec::new();
        for (index, sym) in symbols.enumerate() {
            if index.0 % 4096 == 0 && crate::symbols::budget::over(&self.path) {
                break;
            }
            if sym.is_undefined(e) {
                continue;
            }
            let kind = match sym.st_type() {
                elf::STT_FUNC => SymKind::Func,
                elf::STT_GNU_IFUNC => SymKind::Ifunc,
                elf::STT_OBJECT | elf::STT_TLS => SymKind::Data,
                _ => continue,
            };
            let Ok(name) = sym.name(e, strings) else {
                continue;
            };
            if name.is_empty() {
                continue;
            }
            let mut name = String::from_utf8_lossy(name).into_owned();
            if let Some(v) = &versions {
                let vi = v.version_index(e, index);
                if let Ok(Some(ver)) = v.version(vi) {
                    let sep = if vi.is_hidden() { "@" } else { "@@" };
                    name = format!("{name}{sep}{}", String::from_utf8_lossy(ver.name()));
                }
            }
            out.push(ElfSymbol {
                name,
                value: sym.st_value(e),
                size: sym.st_size(e),
                kind,
                table: table.clone(),
            });
        }
        out
    }
}

/// Opens a file that should be an ELF object: checks the magic, and the
/// size budget; a file over the budget is recorded as skipped, with a
/// warning naming it. Returns the file and its size.
fn open_elf_file(path: &Path) -> Result<(std::fs::File, u64), crate::sys::safe_open::Refused> {
    use crate::sys::safe_open::Refused;
    let mut opened = crate::sys::safe_open::open_labelled(path)?;
    if opened.read_head(4)? != b"\x7fELF" {
        return Err(Refused::Unusable("is not an ELF file"));
    }
    let (size, budget) = (opened.meta.len(), crate::symbols::budget::file_bytes());
    if size > budget {
        let e = Refused::TooLarge { size, budget };
        crate::symbols::budget::skipped(format!(
            "{} {e}; skipped (MT_AGENT_MAX_FILE_MIB raises the budget)",
            path.display()
        ));
        return Err(e);
    }
    Ok((opened.file, size))
}

/// Where separate debug info for an object may be, in lookup order: by
/// build-id under `/usr/lib/debug/.build-id/`, then by `.gnu_debuglink` next
/// to the object, in its `.debug/`, and under `/usr/lib/debug/`. Each path is
/// tried in the target's root first (containers), then, if it is under
/// `/usr/lib/debug/`, in ours: the host's debug store. Other paths of ours
/// would be the target's own directories seen from the host, where its
/// symlinks resolve against the host's root. A debug link that is not a
/// plain file name (`../x`, `/etc/x`) is ignored: it comes from the target.
pub fn debug_candidates(
    pid: i32,
    object_path: &Path,
    build_id: Option<&[u8]>,
    debuglink: Option<&str>,
) -> Vec<PathBuf> {
    let mut rel: Vec<PathBuf> = Vec::new();
    if let Some(id) = build_id.filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        rel.push(format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]).into());
    }
    let plain = |l: &&str| !l.is_empty() && !l.contains('/') && *l != "." && *l != "..";
    if let Some(link) = debuglink.filter(plain) {
        let dir = object_path.parent().unwrap_or(Path::new("/"));
        rel.push(dir.join(link));
        rel.push(dir.join(".debug").join(link));
        rel.push(
            Path::new("/usr/lib/debug")
                .join(dir.strip_prefix("/").unwrap_or(dir))
                .join(link),
        );
    }
    let mut out = Vec::new();
    for p in rel {
        if pid > 0 {
            out.push(crate::sys::proc::in_root(pid, &p));
            if !p.starts_with("/usr/lib/debug") {
                continue;
            }
        }
        out.push(p);
    }
    out.dedup();
    out
}

/// Finds and opens the separate debug file of `object`, checking that it
/// belongs to it (same build-id, or the debuglink CRC-32 when there is no
/// build-id). Returns it and the paths searched.
pub fn find_debug_file(
    pid: i32,
    object_path: &Path,
    object: &ElfObject,
) -> (Option<ElfObject>, Vec<PathBuf>) {
    let build_id = object.build_id();
    let link = object.debuglink();
    let searched = debug_candidates(
        pid,
        object_path,
        build_id.as_deref(),
        link.as_ref().map(|(n, _)| n.as_str()),
    );
    let own = crate::sys::safe_open::stat_labelled(&object.path).ok();
    for cand in &searched {
        let meta = match crate::sys::safe_open::stat_labelled(cand) {
            Ok(meta) => meta,
            Err(e) => {
                log::debug!("skipping {}: {e}", cand.display());
                continue;
            }
        };
        if own.as_ref().is_some_and(|o| {
            use std::os::unix::fs::MetadataExt as _;
            o.ino() == meta.ino() && o.dev() == meta.dev()
        }) {
            continue;
        }
        let Ok(debug) = ElfObject::open(cand) else {
            continue;
        };
        let belongs = match (&build_id, debug.build_id()) {
            (Some(a), Some(b)) => *a == b,
            _ => link
                .as_ref()
                .is_some_and(|(_, crc)| debug.crc32() == Some(*crc)),
        };
        if belongs && debug.has_symtab() {
            return (Some(debug), searched);
        }
    }
    (None, searched)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_come_from_load_segments() {
        // An lld-style layout: text at vaddr 0x2000 but file offset 0x1000.
        let segs = [
            Segment {
                vaddr: 0,
                offset: 0,
                filesz: 0x800,
                executable: false,
            },
            Segment {
                vaddr: 0x2000,
                offset: 0x1000,
                filesz: 0x500,
                executable: true,
            },
        ];
        assert_eq!(vaddr_to_offset(&segs, 0x2100), Some(0x1100));
        assert_eq!(offset_to_vaddr(&segs, 0x1100), Some(0x2100));
        assert_eq!(vaddr_to_offset(&segs, 0x1000), None);
    }

    #[test]
    fn debug_file_candidates() {
        let c = debug_candidates(
            7,
            Path::new("/usr/bin/app"),
            Some(&[0xab, 0xcd, 0xef]),
            Some("app.debug"),
        );
        let c: Vec<String> = c.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(c[0], "/proc/7/root/usr/lib/debug/.build-id/ab/cdef.debug");
        assert_eq!(c[1], "/usr/lib/debug/.build-id/ab/cdef.debug");
        assert!(c.contains(&"/proc/7/root/usr/bin/.debug/app.debug".to_string()));
        assert!(c.contains(&"/usr/lib/debug/usr/bin/app.debug".to_string()));
        // The target's directories are not read from the host's root.
        assert!(!c.contains(&"/usr/bin/.debug/app.debug".to_string()));
        // Without a target, paths are the host's (--exe).
        let c = debug_candidates(0, Path::new("/usr/bin/app"), None, Some("app.debug"));
        assert!(c.contains(&PathBuf::from("/usr/bin/.debug/app.debug")));
    }

    #[test]
    fn debug_links_that_are_not_file_names_are_ignored() {
        for link in ["../../etc/shadow", "/etc/shadow", "..", ".", "a/b", ""] {
            let c = debug_candidates(7, Path::new("/usr/bin/app"), None, Some(link));
            assert!(c.is_empty(), "{link}: {c:?}");
        }
    }

    #[test]
    fn reads_our_own_executable() {
        let exe = std::env::current_exe().unwrap();
        let o = ElfObject::open(&exe).unwrap();
        assert!(!o.segments().is_empty());
        assert!(o.segments().iter().any(|s| s.executable));
        assert!(o.symtab().iter().any(|s| s.kind == SymKind::Func));
    }
}
