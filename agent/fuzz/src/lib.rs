//! Malformed input must never panic: a harness that feeds the ELF, symbol,
//! demangling and instruction-decoding code with broken ELF files and
//! hostile names.
//!
//! * [`seed_elf`] builds a small, valid ELF64 executable by hand (LOAD and
//!   NOTE segments, `.text`, `.symtab`, `.dynsym` with versions, a build-id,
//!   a `.gnu_debuglink`), recording where each header field lies.
//! * [`corpus`] derives the named malformed cases from it: truncated
//!   headers, huge section and segment counts, overlapping segments, a
//!   dynamic symbol table past the end of the file, absurd symbol values,
//!   deep and huge mangled names.
//! * [`exercise`] runs the agent's own code on one input: the file is
//!   written to disk and resolved with [`mt_agent::symbols::resolve_file`] (the path of
//!   `--exe`: safe open, parsing, name matching, instruction checks), and
//!   the pieces a running target adds (address lookups, listing) are called
//!   directly.
//!
//! The corpus runs in this crate's tests (`tests/corpus.rs`). `cargo xtask
//! fuzz --seconds N` runs [`mutation_loop`] (`src/main.rs`): random mutations of the corpus (byte flips, header
//! fields set to edge values, truncation, splices) from a seeded RNG, for N
//! seconds; an input that panics is saved under `target/fuzz/`.

use std::{
    panic::{self, AssertUnwindSafe},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use mt_agent::symbols::{
    Query,
    elf::{self, ElfObject, SymKind},
    insn,
    names::{self, SymbolName},
};

/// A field of the seed ELF: where it is and how wide (bytes).
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub at: usize,
    pub width: usize,
}

/// The seed ELF and the places of its fields.
pub struct Seed {
    pub bytes: Vec<u8>,
    pub fields: Vec<Field>,
    /// Offsets of named places: `ehdr.e_shnum`, `shdr.dynsym`...
    pub marks: Vec<(&'static str, usize)>,
}

impl Seed {
    fn mark(&self, name: &str) -> usize {
        self.marks.iter().find(|(n, _)| *n == name).unwrap().1
    }
}

/// Appends little-endian fields and remembers where they are.
#[derive(Default)]
struct Writer {
    b: Vec<u8>,
    fields: Vec<Field>,
    marks: Vec<(&'static str, usize)>,
}

impl Writer {
    fn n(&mut self, v: u64, width: usize) {
        self.fields.push(Field {
            at: self.b.len(),
            width,
        });
        self.b.extend_from_slice(&v.to_le_bytes()[..width]);
    }
    fn mark(&mut self, name: &'static str) {
        self.marks.push((name, self.b.len()));
    }
    fn align(&mut self, a: usize) {
        while !self.b.len().is_multiple_of(a) {
            self.b.push(0);
        }
    }
    fn put(&mut self, at: usize, v: u64, width: usize) {
        self.b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
    }
}

/// A string table: offsets of the names added.
#[derive(Default)]
struct Strtab(Vec<u8>);

impl Strtab {
    fn add(&mut self, s: &str) -> u64 {
        if self.0.is_empty() {
            self.0.push(0);
        }
        let at = self.0.len() as u64;
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        at
    }
}

pub const BASE: u64 = 0x40_0000;
pub const TEXT_OFF: u64 = 0x1000;
pub const TEXT_VADDR: u64 = 0x40_1000;

/// x86-64 code: `main` (push rbp; mov rbp,rsp; test edi,edi; je; pop rbp;
/// ret; nop; pop rbp; jmp far), then a rip-relative load, a nop5, an
/// indirect jump and nop padding (not int3: a uprobe refuses it). 64 bytes.
fn text() -> Vec<u8> {
    let mut t = vec![
        0x55, 0x48, 0x89, 0xe5, 0x85, 0xff, 0x74, 0x03, 0x5d, 0xc3, 0x90, 0x5d, 0xe9, 0x00, 0x10,
        0x00, // 16: handle_request
        0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00, 0xc3, //
        0x0f, 0x1f, 0x44, 0x00, 0x00, 0xff, 0xe0, 0xc3, // 32
    ];
    t.resize(64, 0x90);
    t
}

/// (name, value, size, type) of the `.symtab` symbols.
fn symbols() -> Vec<(String, u64, u64, u8)> {
    let f = object::elf::STT_FUNC;
    vec![
        ("main".into(), TEXT_VADDR, 16, f),
        ("handle_request".into(), TEXT_VADDR + 16, 8, f),
        ("handle_request.constprop.0".into(), TEXT_VADDR + 24, 8, f),
        ("handle_request.cold".into(), TEXT_VADDR + 32, 8, f),
        ("_ZN2ns6Worker6handleEi".into(), TEXT_VADDR + 40, 8, f),
        (
            "_ZN8my_crate6server14handle_request17h0123456789abcdefE".into(),
            TEXT_VADDR + 48,
            8,
            f,
        ),
        ("_RNvCs1234_7mycrate3foo".into(), TEXT_VADDR + 56, 8, f),
        (
            "resolver".into(),
            TEXT_VADDR + 16,
            8,
            object::elf::STT_GNU_IFUNC,
        ),
        ("data_sym".into(), BASE + 0x100, 8, object::elf::STT_OBJECT),
        ("zero_size".into(), TEXT_VADDR + 8, 0, f),
        ("outside".into(), 0x90_0000, 8, f),
    ]
}

fn sym(w: &mut Writer, name: u64, ty: u8, shndx: u16, value: u64, size: u64) {
    w.n(name, 4);
    w.n(u64::from(ty) | (1 << 4), 1); // STB_GLOBAL
    w.n(0, 1);
    w.n(u64::from(shndx), 2);
    w.n(value, 8);
    w.n(size, 8);
}

/// Section header fields: name, type, flags, addr, offset, size, link,
/// info, align, entsize.
type Shdr = (u64, u32, u64, u64, u64, u64, u32, u32, u64, u64);

/// Builds the seed: a valid ELF64 x86-64 executable, about 6 KiB.
pub fn seed_elf() -> Seed {
    let mut w = Writer::default();
    // ELF header; e_phoff, e_shoff, e_shnum, e_shstrndx patched later.
    w.b.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    w.n(2, 2); // ET_EXEC
    w.n(62, 2); // EM_X86_64
    w.n(1, 4);
    w.n(TEXT_VADDR, 8);
    w.mark("e_phoff");
    w.n(64, 8);
    w.mark("e_shoff");
    w.n(0, 8);
    w.n(0, 4);
    w.n(64, 2);
    w.n(56, 2);
    w.mark("e_phnum");
    w.n(3, 2);
    w.n(64, 2);
    w.mark("e_shnum");
    w.n(0, 2);
    w.mark("e_shstrndx");
    w.n(0, 2);
    // Program headers: LOAD r (headers), LOAD rx (text), NOTE.
    let note_off = 0x200u64;
    w.mark("phdr.load0");
    for (ty, flags, off, vaddr, size) in [
        (1u64, 4u64, 0u64, BASE, 0x300u64),
        (1, 5, TEXT_OFF, TEXT_VADDR, 0x40),
        (4, 4, note_off, BASE + note_off, 36),
    ] {
        if ty == 1 && off == TEXT_OFF {
            w.mark("phdr.text");
        }
        w.n(ty, 4);
        w.n(flags, 4);
        w.n(off, 8);
        w.n(vaddr, 8);
        w.n(vaddr, 8);
        w.n(size, 8);
        w.n(size, 8);
        w.n(0x1000, 8);
    }
    w.b.resize(note_off as usize, 0);
    // .note.gnu.build-id
    w.n(4, 4);
    w.n(20, 4);
    w.mark("note.type");
    w.n(3, 4);
    w.b.extend_from_slice(b"GNU\0");
    w.b.extend_from_slice(&[0xab; 20]);
    w.align(4);
    let link_off = w.b.len() as u64;
    w.b.extend_from_slice(b"fuzz.debug\0\0");
    w.n(0x1234_5678, 4);
    w.b.resize(TEXT_OFF as usize, 0);
    w.b.extend_from_slice(&text());
    sections(w, note_off, link_off)
}

/// Where [`dynamic_tables`] and [`static_tables`] put things: (offset,
/// size) of each table, by name.
type Placed = Vec<(&'static str, u64, u64)>;

/// `.dynsym`, `.dynstr`, `.gnu.version` and `.gnu.version_d`.
fn dynamic_tables(w: &mut Writer, placed: &mut Placed) {
    let mut dynstr = Strtab::default();
    let dn: Vec<u64> = ["handle_request", "dyn_only"]
        .iter()
        .map(|n| dynstr.add(n))
        .collect();
    let base_ver = dynstr.add("fuzz.so");
    let v1 = dynstr.add("V1");
    w.align(8);
    placed.push(("dynsym", w.b.len() as u64, 72));
    w.mark("dynsym");
    w.b.extend_from_slice(&[0; 24]);
    sym(w, dn[0], 2, 4, TEXT_VADDR + 16, 8);
    sym(w, dn[1], 2, 4, TEXT_VADDR + 24, 8);
    placed.push(("dynstr", w.b.len() as u64, dynstr.0.len() as u64));
    w.b.extend_from_slice(&dynstr.0);
    w.align(2);
    placed.push(("versym", w.b.len() as u64, 6));
    for v in [0u64, 2, 1] {
        w.n(v, 2);
    }
    w.align(4);
    placed.push(("verdef", w.b.len() as u64, 56));
    w.mark("verdef");
    for (i, (flags, name)) in [(1u64, base_ver), (0, v1)].into_iter().enumerate() {
        w.n(1, 2); // vd_version
        w.n(flags, 2);
        w.n(i as u64 + 1, 2); // vd_ndx
        w.n(1, 2); // vd_cnt
        w.n(0x1234 + i as u64, 4); // vd_hash
        w.n(20, 4); // vd_aux
        w.n(if i == 0 { 28 } else { 0 }, 4); // vd_next
        w.n(name, 4); // vda_name
        w.n(0, 4); // vda_next
    }
}

/// `.symtab` and `.strtab`.
fn static_tables(w: &mut Writer, placed: &mut Placed) {
    let mut strtab = Strtab::default();
    let syms = symbols();
    let names: Vec<u64> = syms.iter().map(|s| strtab.add(&s.0)).collect();
    w.align(8);
    let symtab_off = w.b.len() as u64;
    w.mark("symtab");
    w.b.extend_from_slice(&[0; 24]);
    for (s, n) in syms.iter().zip(&names) {
        sym(w, *n, s.3, 4, s.1, s.2);
    }
    placed.push(("symtab", symtab_off, w.b.len() as u64 - symtab_off));
    placed.push(("strtab", w.b.len() as u64, strtab.0.len() as u64));
    w.b.extend_from_slice(&strtab.0);
}

/// Writes the symbol tables, versions and section headers.
fn sections(mut w: Writer, note_off: u64, link_off: u64) -> Seed {
    let mut placed = Placed::new();
    dynamic_tables(&mut w, &mut placed);
    static_tables(&mut w, &mut placed);
    let at = |name: &str| *placed.iter().find(|p| p.0 == name).unwrap();
    let (dynsym, dynstr, versym, verdef) = (at("dynsym"), at("dynstr"), at("versym"), at("verdef"));
    let (symtab, strtab) = (at("symtab"), at("strtab"));
    let mut shstr = Strtab::default();
    let n = |s: &mut Strtab, x: &str| s.add(x);
    #[rustfmt::skip]
    let mut shdrs: Vec<(&'static str, Shdr)> = vec![
        ("shdr.null", (0, 0, 0, 0, 0, 0, 0, 0, 0, 0)),
        ("shdr.note", (n(&mut shstr, ".note.gnu.build-id"), 7, 2, BASE + note_off, note_off, 36, 0, 0, 4, 0)),
        ("shdr.link", (n(&mut shstr, ".gnu_debuglink"), 1, 0, 0, link_off, 16, 0, 0, 4, 0)),
        ("shdr.dynstr", (n(&mut shstr, ".dynstr"), 3, 2, 0, dynstr.1, dynstr.2, 0, 0, 1, 0)),
        ("shdr.text", (n(&mut shstr, ".text"), 1, 6, TEXT_VADDR, TEXT_OFF, 64, 0, 0, 16, 0)),
        ("shdr.dynsym", (n(&mut shstr, ".dynsym"), 11, 2, 0, dynsym.1, dynsym.2, 3, 1, 8, 24)),
        ("shdr.versym", (n(&mut shstr, ".gnu.version"), 0x6fff_ffff, 2, 0, versym.1, versym.2, 5, 0, 2, 2)),
        ("shdr.verdef", (n(&mut shstr, ".gnu.version_d"), 0x6fff_fffd, 2, 0, verdef.1, verdef.2, 3, 2, 4, 0)),
        ("shdr.symtab", (n(&mut shstr, ".symtab"), 2, 0, 0, symtab.1, symtab.2, 9, 1, 8, 24)),
        ("shdr.strtab", (n(&mut shstr, ".strtab"), 3, 0, 0, strtab.1, strtab.2, 0, 0, 1, 0)),
    ];
    let name = n(&mut shstr, ".shstrtab");
    let shstrtab_off = w.b.len() as u64;
    w.b.extend_from_slice(&shstr.0);
    let shstrtab = (
        name,
        3,
        0,
        0,
        shstrtab_off,
        shstr.0.len() as u64,
        0,
        0,
        1,
        0,
    );
    shdrs.push(("shdr.shstrtab", shstrtab));
    w.align(8);
    let shoff = w.b.len() as u64;
    for (mark, s) in &shdrs {
        w.mark(mark);
        for (v, width) in [
            (s.0, 4),
            (u64::from(s.1), 4),
            (s.2, 8),
            (s.3, 8),
            (s.4, 8),
            (s.5, 8),
            (u64::from(s.6), 4),
            (u64::from(s.7), 4),
            (s.8, 8),
            (s.9, 8),
        ] {
            w.n(v, width);
        }
    }
    w.put(0x28, shoff, 8);
    w.put(0x3c, shdrs.len() as u64, 2);
    w.put(0x3e, shdrs.len() as u64 - 1, 2);
    Seed {
        bytes: w.b,
        fields: w.fields,
        marks: w.marks,
    }
}

/// Section header field offsets (within one 64-byte header).
pub const SH_OFFSET: usize = 24;
pub const SH_SIZE: usize = 32;
const SH_LINK: usize = 40;
/// Symbol field offsets (within one 24-byte symbol).
const ST_VALUE: usize = 8;
const ST_SIZE: usize = 16;

pub fn set(b: &mut [u8], at: usize, v: u64, width: usize) {
    if at + width <= b.len() {
        b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
    }
}

/// A mangled name nested `depth` deep (`_ZN1a1a...1aE`, with templates).
pub fn deep_cpp(depth: usize) -> String {
    format!("_ZN{}1fIS_EEv", "1a".repeat(depth))
}

/// Hostile names: deep nesting, template and back-reference storms, and
/// names of megabytes.
pub fn hostile_names() -> Vec<String> {
    vec![
        deep_cpp(10_000),
        format!("_Z1f{}", "I".repeat(50_000)),
        format!("_Z1f{}i{}", "IS_".repeat(5_000), "E".repeat(5_000)),
        format!("_Z{}", "PFv".repeat(20_000)),
        format!("_ZN{}17h0123456789abcdefE", "3foo".repeat(100_000)),
        format!("_RNv{}7mycrate3foo", "Nv".repeat(20_000)),
        format!("_RINvC1a1f{}E", "B_".repeat(20_000)),
        format!("_RYNvC1a1f{}", "Q".repeat(10_000)),
        "_Z".repeat(100_000),
        format!("{}.constprop.0", deep_cpp(5_000)),
        format!("f{}", ".cold".repeat(10_000)),
        "@".repeat(10_000),
        format!("x@@{}", "V".repeat(1 << 20)),
        "a".repeat(4 << 20),
    ]
}

/// Named variants of the seed.
struct Cases<'a> {
    base: &'a [u8],
    out: Vec<(String, Vec<u8>)>,
}

impl Cases<'_> {
    fn add(&mut self, name: &str, f: impl Fn(&mut Vec<u8>)) {
        let mut v = self.base.to_vec();
        f(&mut v);
        self.out.push((name.to_string(), v));
    }
}

/// The named malformed cases, from the seed.
pub fn corpus() -> Vec<(String, Vec<u8>)> {
    let seed = seed_elf();
    let mut c = Cases {
        base: &seed.bytes,
        out: vec![("seed".into(), seed.bytes.clone())],
    };
    header_cases(&seed, &mut c);
    table_cases(&seed, &mut c);
    c.out
}

/// Truncations, section and segment counts, segments.
fn header_cases(seed: &Seed, c: &mut Cases<'_>) {
    let len = seed.bytes.len();
    for cut in [
        0,
        3,
        4,
        16,
        18,
        63,
        64,
        100,
        0x200,
        0x1010,
        len - 64,
        len - 1,
    ] {
        c.add(&format!("truncated at {cut}"), |v| v.truncate(cut));
    }
    let (shnum, phnum, shoff) = (
        seed.mark("e_shnum"),
        seed.mark("e_phnum"),
        seed.mark("e_shoff"),
    );
    c.add("e_shnum 0xffff", |v| set(v, shnum, 0xffff, 2));
    c.add("e_phnum 0xffff", |v| set(v, phnum, 0xffff, 2));
    c.add("e_shoff past the end", |v| set(v, shoff, u64::MAX - 8, 8));
    let s0 = seed.mark("shdr.null");
    c.add("extended section count 2^32-1", |v| {
        set(v, shnum, 0, 2);
        set(v, s0 + SH_SIZE, 0xffff_ffff, 8);
    });
    let (load0, text) = (seed.mark("phdr.load0"), seed.mark("phdr.text"));
    c.add("overlapping LOAD segments", |v| {
        // The text segment now covers the headers' addresses too, at
        // another file offset.
        set(v, text + 16, BASE, 8);
        set(v, text + 32, 0x2000, 8);
    });
    c.add("LOAD segment wraps the address space", |v| {
        set(v, load0 + 16, u64::MAX - 0x10, 8);
        set(v, load0 + 32, 0x300, 8);
        set(v, text + 8, u64::MAX - 4, 8);
    });
    c.add("build-id note descsz huge", |v| {
        set(v, 0x204, 0xffff_fff0, 4)
    });
}

/// Symbol, string and version tables.
fn table_cases(seed: &Seed, c: &mut Cases<'_>) {
    let len = seed.bytes.len() as u64;
    let get = |v: &[u8], at: usize| u64::from_le_bytes(v[at..at + 8].try_into().unwrap()) as usize;
    let dynsym = seed.mark("shdr.dynsym");
    c.add(".dynsym past the end of the file", |v| {
        set(v, dynsym + SH_OFFSET, len + 0x1000, 8)
    });
    c.add(".dynsym of 2^60 bytes", |v| {
        set(v, dynsym + SH_SIZE, 1 << 60, 8)
    });
    c.add(".dynsym offset + size overflows", |v| {
        set(v, dynsym + SH_OFFSET, u64::MAX - 8, 8);
        set(v, dynsym + SH_SIZE, 48, 8);
    });
    let (symtab, strtab) = (seed.mark("shdr.symtab"), seed.mark("shdr.strtab"));
    c.add(".symtab links to itself", |v| {
        set(v, symtab + SH_LINK, 8, 4)
    });
    c.add(".symtab links past the section table", |v| {
        set(v, symtab + SH_LINK, 0xffff, 4)
    });
    c.add(".strtab empty", |v| set(v, strtab + SH_SIZE, 0, 8));
    c.add(".strtab without a final NUL", |v| {
        let (off, size) = (get(v, strtab + SH_OFFSET), get(v, strtab + SH_SIZE));
        v[off..off + size].fill(b'A');
    });
    let syms = seed.mark("symtab");
    c.add("symbols at u64::MAX with size u64::MAX", |v| {
        for i in 1..=symbols().len() {
            set(v, syms + 24 * i + ST_VALUE, u64::MAX - i as u64, 8);
            set(v, syms + 24 * i + ST_SIZE, u64::MAX, 8);
        }
    });
    c.add("symbol sizes past the segment", |v| {
        for i in 1..=symbols().len() {
            set(v, syms + 24 * i + ST_SIZE, 1 << 40, 8);
        }
    });
    let (versym, verdef) = (seed.mark("shdr.versym"), seed.mark("verdef"));
    c.add("version index out of range", |v| {
        let off = get(v, versym + SH_OFFSET);
        set(v, off + 2, 0x7fff, 2);
    });
    c.add("verdef chain ends early", |v| set(v, verdef + 16, 0, 4));
    c.add("verdef aux past the end", |v| {
        set(v, verdef + 12, 0xffff_fff0, 4)
    });
}

/// Queries that walk every path of the resolver.
fn queries() -> Vec<Query> {
    let mut q: Vec<Query> = [
        "main",
        "handle_request",
        "handle_request@@V1",
        "ns::Worker::handle",
        "my_crate::server::handle_request",
        "mycrate::foo",
        "resolver",
        "data_sym",
        "zero_size",
        "outside",
        "dyn_only",
        "nonexistent",
    ]
    .iter()
    .map(|s| Query {
        symbol: Some((*s).to_string()),
        ..Query::default()
    })
    .collect();
    for off in [1, 3, 9, u64::MAX] {
        q.push(Query {
            symbol: Some("main".into()),
            offset: Some(off),
            ..Query::default()
        });
    }
    q
}

/// Runs the agent's ELF, name and instruction code on `data`, written to
/// `path`. Returns normally unless something panics.
pub fn exercise(data: &[u8], path: &Path) {
    std::fs::write(path, data).unwrap();
    for q in queries() {
        if let Ok(r) = mt_agent::symbols::resolve_file(path, &q) {
            // What the run computes from a resolution (return probes, the
            // .cold part's range) must not overflow.
            let f = &r.function;
            assert!(f.elf_address.checked_add(f.size).is_some(), "{f:?}");
            assert!(f.file_offset.checked_add(f.size).is_some(), "{f:?}");
            assert!(r.attach_offset >= f.file_offset, "{f:?}");
            if let Some((c, _)) = &r.cold {
                assert!(c.elf_address.checked_add(c.size).is_some(), "{c:?}");
            }
        }
    }
    let Ok(o) = ElfObject::from_bytes(path.to_path_buf(), data.to_vec()) else {
        return;
    };
    let segs = o.segments();
    let _ = (o.has_symtab(), o.is_go(), o.build_id(), o.debuglink());
    let all: Vec<_> = o.symtab().into_iter().chain(o.dynsym()).collect();
    for s in &all {
        let n = SymbolName::new(&s.name);
        let _ = (n.matches("main"), n.short());
        let Some(off) = elf::vaddr_to_offset(&segs, s.value) else {
            continue;
        };
        let _ = elf::offset_to_vaddr(&segs, off);
        let start = (off as usize).min(data.len());
        let end = (off.saturating_add(s.size) as usize).min(data.len());
        let body = &data[start..end];
        let _ = insn::cost_hint(body, s.value);
        let _ = insn::is_boundary(body, s.size / 2);
        if s.kind == SymKind::Func {
            let _ = insn::exits(body, s.value, &[(s.value, s.value.wrapping_add(8))]);
        }
    }
    let shorts: Vec<String> = all
        .iter()
        .map(|s| SymbolName::new(&s.name).short().to_string())
        .collect();
    let _ = names::closest("handle", shorts.iter().map(String::as_str), 5);
}

/// xorshift64*: a small seeded RNG, so a run can be repeated.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

const EDGE: [u64; 10] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 63,
    u64::MAX,
];

/// One to eight mutations of `input`.
pub fn mutate(rng: &mut Rng, input: &[u8], fields: &[Field], donor: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..=rng.below(8) {
        if v.is_empty() {
            v.extend_from_slice(&donor[..donor.len().min(64)]);
        }
        if v.is_empty() {
            v.push(0x7f);
        }
        match rng.below(7) {
            0 => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(v.len());
                v[i] = rng.next_u64() as u8;
            }
            2 | 3 => {
                // A header field (of the seed's layout) set to an edge value.
                let f = fields[rng.below(fields.len())];
                let e = EDGE[rng.below(EDGE.len())];
                let e = if rng.below(2) == 0 {
                    e
                } else {
                    e.wrapping_add(rng.below(64) as u64)
                };
                set(&mut v, f.at, e, f.width);
            }
            4 => v.truncate(rng.below(v.len() + 1)),
            5 => {
                // Splice a chunk of another input in.
                let (a, n) = (rng.below(donor.len()), rng.below(256));
                let chunk = donor[a..(a + n).min(donor.len())].to_vec();
                let at = rng.below(v.len());
                let end = (at + chunk.len()).min(v.len());
                v.splice(at..end, chunk);
            }
            _ => {
                let i = rng.below(v.len());
                let n = rng.below(64);
                v.splice(i..i, std::iter::repeat_n(rng.next_u64() as u8, n));
            }
        }
    }
    v
}

/// What a mutation run found.
#[derive(Debug, Default)]
pub struct Findings {
    pub iterations: u64,
    /// One line per distinct panic (message and location), with the file
    /// the input was saved to.
    pub panics: Vec<String>,
    /// The slowest input: how long it took, and where it was saved when it
    /// took longer than [`SLOW`].
    pub slowest: (Duration, Option<PathBuf>),
}

/// An input slower than this is saved as a finding (the agent reads every
/// mapped object; one file must not take seconds).
pub const SLOW: Duration = Duration::from_secs(2);

thread_local! {
    /// Inside [`catch`] on this thread, and the last panic it saw.
    static CATCHING: std::cell::RefCell<(bool, Option<String>)> =
        const { std::cell::RefCell::new((false, None)) };
}

/// Runs `f`, catching a panic as its message and location. A process-wide
/// hook, installed once, records panics of threads inside `catch` and
/// passes the others on to the default hook (tests run in parallel).
pub fn catch(f: impl FnOnce()) -> Option<String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let catching = CATCHING.with(|c| c.borrow().0);
            if !catching {
                return default(info);
            }
            let loc = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            CATCHING.with(|c| c.borrow_mut().1 = Some(format!("{loc}: {msg}")));
        }));
    });
    CATCHING.with(|c| *c.borrow_mut() = (true, None));
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    let last = CATCHING.with(|c| std::mem::take(&mut *c.borrow_mut()).1);
    r.err().map(|_| last.unwrap_or_default())
}

/// The watchdog's counter value that stops it.
const DONE: u64 = u64::MAX;

/// How long one input may take before the run counts it as a hang.
pub const HANG: Duration = Duration::from_secs(60);

/// A thread that ends the process when the counter it returns stops moving
/// for [`HANG`]: the input being exercised (written to `input` first) is
/// copied to `crash_dir/hang.elf`, and the process exits with status 3.
fn watchdog(input: &Path, crash_dir: &Path) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
    use std::sync::{Arc, atomic::AtomicU64, atomic::Ordering};
    let progress = Arc::new(AtomicU64::new(0));
    let (p, input, crash_dir) = (
        progress.clone(),
        input.to_path_buf(),
        crash_dir.to_path_buf(),
    );
    std::thread::spawn(move || {
        let mut last = u64::MAX;
        loop {
            std::thread::sleep(HANG);
            let now = p.load(Ordering::Relaxed);
            if now == DONE {
                return;
            }
            if now == last {
                let _ = std::fs::create_dir_all(&crash_dir);
                let saved = crash_dir.join("hang.elf");
                let _ = std::fs::copy(&input, &saved);
                println!(
                    "fuzz: an input took over {HANG:?}: saved {}",
                    saved.display()
                );
                std::process::exit(3);
            }
            last = now;
        }
    });
    progress
}

/// Mutates the corpus for `budget`, from `seed`; saves each input that
/// panicked (the first per distinct panic) into `crash_dir`.
pub fn mutation_loop(seed: u64, budget: Duration, crash_dir: &Path) -> Findings {
    let work = tempfile::tempdir().unwrap();
    let path = work.path().join("input.elf");
    let s = seed_elf();
    let corpus: Vec<Vec<u8>> = corpus().into_iter().map(|(_, b)| b).collect();
    let mut rng = Rng::new(seed);
    let mut found = Findings::default();
    let start = Instant::now();
    let progress = watchdog(&path, crash_dir);
    while start.elapsed() < budget {
        progress.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let input = &corpus[rng.below(corpus.len())];
        let donor = &corpus[rng.below(corpus.len())];
        let m = mutate(&mut rng, input, &s.fields, donor);
        found.iterations += 1;
        let t0 = Instant::now();
        let panicked = catch(|| exercise(&m, &path));
        let took = t0.elapsed();
        if took > found.slowest.0 {
            found.slowest = (took, None);
            if took > SLOW {
                std::fs::create_dir_all(crash_dir).unwrap();
                let file = crash_dir.join("slowest.elf");
                std::fs::write(&file, &m).unwrap();
                found.slowest.1 = Some(file);
            }
        }
        if let Some(p) = panicked {
            let site = p.split(": ").next().unwrap_or_default().to_string();
            if !found.panics.iter().any(|q| q.starts_with(&site)) {
                std::fs::create_dir_all(crash_dir).unwrap();
                let file: PathBuf = crash_dir.join(format!("crash-{}.elf", found.panics.len()));
                std::fs::write(&file, &m).unwrap();
                found
                    .panics
                    .push(format!("{p} (input: {})", file.display()));
            }
        }
    }
    progress.store(DONE, std::sync::atomic::Ordering::Relaxed);
    found
}
