//! Reading one ELF object: its symbol tables, LOAD segments, build-id and
//! debug link. Uses the `object` crate. Files are opened through
//! [`crate::sys::safe_open`] (inside the target's root, regular files only) and
//! read into memory within the size budget of [`crate::symbols::budget`].
//! Headers are read once and kept; symbol tables are scanned
//! ([`ElfObject::scan`]) and not kept, so a 100 MB binary costs its string
//! table's size while a scan runs (docs/symbol-lookup.md).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::bail;
use object::{
    Endian as _, Endianness, Object as _, ReadCache, ReadRef,
    elf::{self, PT_LOAD},
    read::elf::{
        ElfFile64, FileHeader, ProgramHeader as _, SectionHeader as _, SectionTable, Sym as _,
    },
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
        let (h, e) = this.header()?;
        if let Err(err) = h.program_headers(e, &this.cache) {
            bail!("{}: bad program headers: {err}", this.path.display());
        }
        this.sections()?;
        Ok(this)
    }

    /// The file header and its byte order: what every other read starts
    /// from (its bytes are read once and kept).
    fn header(&self) -> anyhow::Result<(&Header, Endianness)> {
        let not_elf = |e: object::Error| {
            anyhow::anyhow!("{} is not a 64-bit ELF object: {e}", self.path.display())
        };
        let h = Header::parse(&self.cache).map_err(not_elf)?;
        Ok((h, h.endian().map_err(not_elf)?))
    }

    /// The section headers (read once and kept), with the byte order.
    fn sections(&self) -> anyhow::Result<(Endianness, Sections<'_>)> {
        let (h, e) = self.header()?;
        match h.sections(e, &self.cache) {
            Ok(t) => Ok((e, t)),
            Err(err) => bail!("{}: bad section headers: {err}", self.path.display()),
        }
    }

    /// The whole file parsed by `object`, which reads and keeps every symbol
    /// of `.symtab` and `.dynsym`: only for the dynamic relocations
    /// ([`Self::imports`], [`Self::irelative_slots`]), which IFUNCs need.
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
        let Ok((h, e)) = self.header() else {
            return Vec::new();
        };
        h.program_headers(e, &self.cache)
            .unwrap_or_default()
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
        self.table(Which::Symtab)
            .is_some_and(|(e, _, shdr)| shdr.sh_size(e) >= SYM_SIZE)
    }

    /// Whether this is a Go binary: it has Go's build information
    /// (`.go.buildinfo`, Go 1.13 on) or Go's build ID note
    /// (`.note.go.buildid`), which the Go linker writes (cmd/link).
    pub fn is_go(&self) -> bool {
        self.has_section(".go.buildinfo") || self.has_section(".note.go.buildid")
    }

    /// Whether the object has a section of this name.
    pub fn has_section(&self, name: &str) -> bool {
        self.sections()
            .is_ok_and(|(e, t)| t.section_by_name(e, name.as_bytes()).is_some())
    }

    /// `DT_SONAME` of the dynamic section, if any.
    pub fn soname(&self) -> Option<String> {
        use object::read::elf::Dyn as _;
        let (e, sections) = self.sections().ok()?;
        let (dynamic, link) = sections.dynamic(e, &self.cache).ok()??;
        let strings = sections.strings(e, &self.cache, link).ok()?;
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
        for which in [Which::Dynsym, Which::Symtab] {
            let found = self.scan(which, |s| {
                let w = wanted.iter().find(|w| w.as_bytes() == s.name)?;
                Some((*w, s.defined))
            });
            for (w, is_defined) in found {
                let list = if is_defined {
                    &mut defined
                } else {
                    &mut imported
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
        gnu_build_id(&self.cache)
    }

    /// `.gnu_debuglink`: the debug file's name and CRC-32 (the name, NUL,
    /// padding to 4 bytes, then the CRC in the file's byte order).
    pub fn debuglink(&self) -> Option<(String, u32)> {
        let (e, sections) = self.sections().ok()?;
        let (_, shdr) = sections.section_by_name(e, b".gnu_debuglink")?;
        let data = shdr.data(e, &self.cache).ok()?;
        let name = &data[..data.iter().position(|&b| b == 0)?];
        let at = (name.len() + 1).next_multiple_of(4);
        let crc: [u8; 4] = data.get(at..at + 4)?.try_into().ok()?;
        let crc = if e.is_little_endian() {
            u32::from_le_bytes(crc)
        } else {
            u32::from_be_bytes(crc)
        };
        Some((String::from_utf8_lossy(name).into_owned(), crc))
    }

    /// Defined symbols of `.symtab`.
    pub fn symtab(&self) -> Vec<ElfSymbol> {
        self.symbols_where(Which::Symtab, |_| true)
    }

    /// Defined symbols of `.dynsym`, with their versions.
    pub fn dynsym(&self) -> Vec<ElfSymbol> {
        self.symbols_where(Which::Dynsym, |_| true)
    }

    /// Defined symbols of `.symtab`, labelled as coming from this debug file.
    pub fn debug_symbols(&self) -> Vec<ElfSymbol> {
        self.symbols_where(Which::DebugFile, |_| true)
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

    /// The defined functions and data symbols of one table whose raw name
    /// (without version) `keep` accepts; the others are never copied out
    /// of the table. `.dynsym` names get their `@VER`/`@@VER`.
    pub fn symbols_where(
        &self,
        which: Which,
        mut keep: impl FnMut(&RawSymbol<'_>) -> bool,
    ) -> Vec<ElfSymbol> {
        let table = match which {
            Which::Symtab => Table::Symtab,
            Which::Dynsym => Table::Dynsym,
            Which::DebugFile => Table::DebugFile(self.path.clone()),
        };
        let kept = self.scan(which, |s| {
            let kind = s.kind().filter(|_| s.defined && !s.name.is_empty())?;
            keep(s).then(|| {
                (
                    s.index,
                    String::from_utf8_lossy(s.name).into_owned(),
                    kind,
                    s.value,
                    s.size,
                )
            })
        });
        // The version table is read only when a `.dynsym` symbol is kept.
        let versions = match (which, kept.is_empty()) {
            (Which::Dynsym, false) => self
                .sections()
                .ok()
                .and_then(|(e, t)| Some((e, t.versions(e, &self.cache).ok()??))),
            _ => None,
        };
        kept.into_iter()
            .map(|(index, mut name, kind, value, size)| {
                if let Some((e, v)) = &versions {
                    let vi = v.version_index(*e, object::SymbolIndex(index));
                    if let Ok(Some(ver)) = v.version(vi) {
                        let sep = if vi.is_hidden() { "@" } else { "@@" };
                        name = format!("{name}{sep}{}", String::from_utf8_lossy(ver.name()));
                    }
                }
                ElfSymbol {
                    name,
                    value,
                    size,
                    kind,
                    table: table.clone(),
                }
            })
            .collect()
    }

    /// The section header of a symbol table, with the byte order.
    fn table(
        &self,
        which: Which,
    ) -> Option<(Endianness, Sections<'_>, &elf::SectionHeader64<Endianness>)> {
        let (e, sections) = self.sections().ok()?;
        let sh_type = match which {
            Which::Dynsym => elf::SHT_DYNSYM,
            Which::Symtab | Which::DebugFile => elf::SHT_SYMTAB,
        };
        let shdr = sections.iter().find(|s| s.sh_type(e) == sh_type)?;
        Some((e, sections, shdr))
    }

    /// Calls `f` on every symbol of a table, in order, and collects what it
    /// returns. The table is read in pieces of [`SCAN_CHUNK`] bytes and its
    /// string table in one read, neither kept: a whole-table pass costs
    /// the string table's size in memory while it runs, and no more after.
    /// Stops early when the time budget has passed.
    pub fn scan<T>(&self, which: Which, mut f: impl FnMut(&RawSymbol<'_>) -> Option<T>) -> Vec<T> {
        let mut out = Vec::new();
        let Some((e, sections, shdr)) = self.table(which) else {
            return out;
        };
        let strings = sections
            .section(object::SectionIndex(shdr.sh_link(e) as usize))
            .ok()
            .filter(|s| s.sh_type(e) == elf::SHT_STRTAB)
            .map(|s| self.read_uncached(s.sh_offset(e), s.sh_size(e)))
            .unwrap_or_default();
        let (start, size) = (shdr.sh_offset(e), shdr.sh_size(e));
        let count = size / SYM_SIZE;
        let le = e.is_little_endian();
        let per_chunk = SCAN_CHUNK / SYM_SIZE;
        let mut index = 0u64;
        while index < count {
            if crate::symbols::budget::over(&self.path) {
                break;
            }
            let n = per_chunk.min(count - index);
            let chunk = self.read_uncached(start + index * SYM_SIZE, n * SYM_SIZE);
            for (i, raw) in chunk.chunks_exact(SYM_SIZE as usize).enumerate() {
                let sym = RawSymbol::parse(raw, le, &strings, (index as usize) + i);
                if let Some(t) = f(&sym) {
                    out.push(t);
                }
            }
            if (chunk.len() as u64) < n * SYM_SIZE {
                break;
            }
            index += n;
        }
        out
    }

    /// Up to `size` bytes at `offset`, read now and not kept in the cache.
    pub fn read_uncached(&self, offset: u64, size: u64) -> Vec<u8> {
        let end = offset.saturating_add(size).min(self.len);
        let mut buf = vec![0u8; end.saturating_sub(offset) as usize];
        let mut at = 0;
        while at < buf.len() {
            match self.source.read_at(&mut buf[at..], offset + at as u64) {
                Ok(0) | Err(_) => break,
                Ok(n) => at += n,
            }
        }
        buf.truncate(at);
        buf
    }
}

/// `Elf64_Sym`'s size.
const SYM_SIZE: u64 = 24;

/// Bytes of a symbol table read at a time by [`ElfObject::scan`].
const SCAN_CHUNK: u64 = 64 << 10;

type Header = elf::FileHeader64<Endianness>;
type Sections<'a> = SectionTable<'a, Header, &'a ReadCache<Budgeted>>;

/// Which symbol table to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Symtab,
    Dynsym,
    /// `.symtab` of an object that is the separate debug file of another.
    DebugFile,
}

/// One entry of a symbol table, as [`ElfObject::scan`] passes it: its name
/// borrowed from the string table (without version).
#[derive(Debug, Clone, Copy)]
pub struct RawSymbol<'a> {
    /// Its index in the table.
    pub index: usize,
    pub name: &'a [u8],
    pub value: u64,
    pub size: u64,
    /// `STT_*`.
    pub st_type: u8,
    /// Not `SHN_UNDEF`.
    pub defined: bool,
}

impl<'a> RawSymbol<'a> {
    /// Parses `Elf64_Sym`: st_name (4 bytes), st_info, st_other,
    /// st_shndx (2), st_value (8), st_size (8).
    fn parse(raw: &[u8], le: bool, strings: &'a [u8], index: usize) -> Self {
        let u32_at = |at: usize| {
            let b: [u8; 4] = raw[at..at + 4].try_into().unwrap_or_default();
            if le {
                u32::from_le_bytes(b)
            } else {
                u32::from_be_bytes(b)
            }
        };
        let u64_at = |at: usize| {
            let b: [u8; 8] = raw[at..at + 8].try_into().unwrap_or_default();
            if le {
                u64::from_le_bytes(b)
            } else {
                u64::from_be_bytes(b)
            }
        };
        let shndx = if le {
            u16::from_le_bytes([raw[6], raw[7]])
        } else {
            u16::from_be_bytes([raw[6], raw[7]])
        };
        let at = usize::try_from(u32_at(0)).unwrap_or(usize::MAX);
        // CStr's search for the NUL is memchr's, a word at a time.
        let name = strings
            .get(at..)
            .and_then(|rest| std::ffi::CStr::from_bytes_until_nul(rest).ok())
            .map_or(&[][..], std::ffi::CStr::to_bytes);
        Self {
            index,
            name,
            st_type: raw[4] & 0xf,
            defined: shndx != elf::SHN_UNDEF,
            value: u64_at(8),
            size: u64_at(16),
        }
    }

    /// The kind, for the types mt-agent lists; None for the others.
    pub fn kind(&self) -> Option<SymKind> {
        match self.st_type {
            elf::STT_FUNC => Some(SymKind::Func),
            elf::STT_GNU_IFUNC => Some(SymKind::Ifunc),
            elf::STT_OBJECT | elf::STT_TLS => Some(SymKind::Data),
            _ => None,
        }
    }
}

/// The GNU build-id note of a 64- or 32-bit ELF file, from its `SHT_NOTE`
/// sections: only the headers and the notes are read.
pub fn gnu_build_id<'d, R: ReadRef<'d>>(data: R) -> Option<Vec<u8>> {
    fn of<'d, H: FileHeader<Endian = Endianness>, R: ReadRef<'d>>(data: R) -> Option<Vec<u8>> {
        let h = H::parse(data).ok()?;
        let e = h.endian().ok()?;
        for shdr in h.sections(e, data).ok()?.iter() {
            let Ok(Some(mut notes)) = shdr.notes(e, data) else {
                continue;
            };
            while let Ok(Some(note)) = notes.next() {
                if note.name() == elf::ELF_NOTE_GNU && note.n_type(e) == elf::NT_GNU_BUILD_ID {
                    return Some(note.desc().to_vec());
                }
            }
        }
        None
    }
    of::<elf::FileHeader64<Endianness>, R>(data)
        .or_else(|| of::<elf::FileHeader32<Endianness>, R>(data))
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
