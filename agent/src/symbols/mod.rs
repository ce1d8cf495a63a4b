//! Finding the trigger: from `--symbol` (and `--object`, `--offset`,
//! `--address`) to a file and offset to attach a uprobe to.
//!
//! Rules:
//! * Search the main executable first, then every ELF object in
//!   /proc/PID/maps, opened as the process sees it through /proc/PID/root
//!   (containers), or through /proc/PID/map_files when the file on disk was
//!   replaced after it was mapped.
//! * In each object, look in `.symtab`, then `.dynsym`, then separate debug
//!   info (by build-id or `.gnu_debuglink`).
//! * Names match raw, versioned (`foo@@V2` as `foo`), or demangled (C++ with
//!   or without parameters, Rust with or without hash). A plain name prefers
//!   an object's default version (`@@`) over its compatibility ones (`@`).
//! * Exactly one function must match. Compiler clones are never picked
//!   silently; data symbols are refused with a reason. An IFUNC is followed
//!   to the implementation the process uses ([`ifunc`]), or refused.
//! * `--object PATH` of a file not mapped yet is probed in the file itself
//!   ([`unmapped`]).
//! * The file offset comes from the LOAD program header containing the
//!   symbol, not from section headers.
//! * The probed instruction must be one the kernel can place a uprobe on
//!   ([`insn::uprobe_refusal`]).

pub mod budget;
pub mod elf;
pub mod frame_pointers;
mod ifunc;
pub mod insn;
pub mod maps;
pub mod names;
mod unmapped;
pub mod uretprobe_safety;

use std::{
    cell::OnceCell,
    path::PathBuf,
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::error::Failure;
use elf::{ElfObject, ElfSymbol, RawSymbol, Segment, SymKind, Which};
use insn::CostHint;
use maps::MappedObject;
use names::{NameMatch, SymbolName};

/// What the user asked to probe.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    /// `--symbol`.
    pub symbol: Option<String>,
    /// `--object`.
    pub object: Option<String>,
    /// `--offset`: bytes into the function.
    pub offset: Option<u64>,
    /// `--address`: a virtual address in the target.
    pub address: Option<u64>,
}

/// A function in a mapped object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Function {
    /// Name as in the symbol table (with `@VERSION` for versioned symbols).
    pub name: String,
    /// Demangled name (equal to `name` for C names).
    pub demangled: String,
    /// `st_value`: the ELF virtual address.
    pub elf_address: u64,
    /// Size in bytes.
    pub size: u64,
    /// File offset of the first byte.
    pub file_offset: u64,
    /// `.symtab`, `.dynsym` or `debug file`.
    pub table: &'static str,
}

/// The probe point found for a query.
#[derive(Debug, Clone)]
pub struct Resolution {
    /// The function.
    pub function: Function,
    /// The object it is in.
    pub object: MappedObject,
    /// Bytes into the function where the probe goes.
    pub probe_offset: u64,
    /// File offset to attach the uprobe to.
    pub attach_offset: u64,
    /// What a hit costs, from the probed instruction.
    pub cost: Option<CostHint>,
    /// The object is a Go binary (register ABI for arguments).
    pub is_go: bool,
    /// The function's bytes.
    pub body: Vec<u8>,
    /// The function's `.cold` part, if the compiler split one off, and its bytes.
    pub cold: Option<(Function, Vec<u8>)>,
    /// Things the user should know (clones, replaced file, debug file).
    pub notes: Vec<String>,
}

/// Why a query found nothing to probe.
#[derive(Debug)]
pub enum ResolveError {
    /// Nothing matched; the symbol may still appear (dlopen).
    NotFound(Failure),
    /// Anything else: ambiguous, refused, unreadable.
    Other(Failure),
}

impl From<ResolveError> for Failure {
    fn from(e: ResolveError) -> Self {
        match e {
            ResolveError::NotFound(f) | ResolveError::Other(f) => f,
        }
    }
}

/// One mapped object, opened. Its symbol tables are read when a search
/// needs them, and only the symbols a search keeps are copied out
/// (docs/symbol-lookup.md).
struct View {
    mapped: MappedObject,
    elf: ElfObject,
    segments: Vec<Segment>,
    /// The separate debug file, looked for at the first search that needs
    /// it, and the paths searched.
    debug: OnceCell<(Option<ElfObject>, Vec<PathBuf>)>,
}

/// The tables of a [`View`] in lookup order: `.symtab`, `.dynsym`, then
/// the debug file's `.symtab`.
const LOOKUP: [Which; 3] = [Which::Symtab, Which::Dynsym, Which::DebugFile];

impl View {
    fn open(mapped: MappedObject) -> Option<Self> {
        let elf = ElfObject::open(&mapped.open_path).ok()?;
        let segments = elf.segments();
        Some(Self {
            mapped,
            elf,
            segments,
            debug: OnceCell::new(),
        })
    }

    fn debug(&self, pid: i32) -> &(Option<ElfObject>, Vec<PathBuf>) {
        self.debug
            .get_or_init(|| elf::find_debug_file(pid, &self.mapped.path, &self.elf))
    }

    /// The defined symbols of one table whose raw name `keep` accepts.
    fn symbols(
        &self,
        pid: i32,
        which: Which,
        keep: impl FnMut(&RawSymbol<'_>) -> bool,
    ) -> Vec<ElfSymbol> {
        match which {
            Which::DebugFile => self
                .debug(pid)
                .0
                .as_ref()
                .map_or_else(Vec::new, |d| d.symbols_where(Which::DebugFile, keep)),
            _ => self.elf.symbols_where(which, keep),
        }
    }

    /// [`Self::symbols`] of each table, in lookup order.
    fn tables_where(
        &self,
        pid: i32,
        keep: impl FnMut(&RawSymbol<'_>) -> bool + Clone,
    ) -> [Vec<ElfSymbol>; 3] {
        LOOKUP.map(|which| self.symbols(pid, which, keep.clone()))
    }

    /// Every defined symbol of each table: for the paths that need them all
    /// (suggestions for a name not found, IFUNC implementations).
    fn tables(&self, pid: i32) -> [Vec<ElfSymbol>; 3] {
        self.tables_where(pid, |_| true)
    }

    fn function(&self, s: &ElfSymbol) -> Option<Function> {
        let file_offset = elf::vaddr_to_offset(&self.segments, s.value)?;
        Some(Function {
            name: s.name.clone(),
            demangled: SymbolName::new(&s.name).demangled,
            elf_address: s.value,
            size: elf::size_in_segment(&self.segments, s.value, s.size),
            file_offset,
            table: s.table.label(),
        })
    }

    fn bytes(&self, f: &Function) -> Vec<u8> {
        self.elf.read_at(f.file_offset, f.size)
    }

    /// Where a file offset of this object is mapped in the target, if it is.
    fn runtime_address(&self, file_offset: u64) -> Option<u64> {
        self.mapped
            .mappings
            .iter()
            .find(|m| file_offset >= m.offset && file_offset < m.offset + (m.end - m.start))
            .map(|m| m.start + (file_offset - m.offset))
    }

    fn label(&self) -> String {
        self.mapped.path.display().to_string()
    }
}

fn open_views(pid: i32, object: Option<&str>) -> Result<Vec<View>, ResolveError> {
    let objects = maps::read_objects(pid).map_err(|e| {
        let f = if e.kind() == std::io::ErrorKind::PermissionDenied {
            Failure::environment(format!(
                "cannot read /proc/{pid}/maps (permission denied); run as root or with \
                 CAP_SYS_PTRACE (see `mt-agent check`)"
            ))
        } else {
            Failure::usage(format!(
                "cannot read /proc/{pid}/maps: {e}; is pid {pid} running?"
            ))
        };
        ResolveError::Other(f)
    })?;
    let all: Vec<String> = objects.iter().map(MappedObject::file_name).collect();
    let selected: Vec<MappedObject> = match object {
        Some(o) => objects
            .into_iter()
            .filter(|m| m.selected_by(pid, o))
            .collect(),
        None => objects,
    };
    if selected.is_empty() {
        let o = object.unwrap_or_default();
        let mut shown = all;
        shown.dedup();
        return Err(ResolveError::NotFound(
            Failure::usage(format!(
                "{o} is not mapped by pid {pid} (yet): no mapped object matches --object {o}; \
                 if the process loads it later (dlopen), give a capture run \
                 --wait-for-symbol DURATION, otherwise give a path or a file name from the \
                 list below"
            ))
            .with_detail(shown.into_iter().take(30).map(|n| format!("mapped: {n}"))),
        ));
    }
    Ok(selected.into_iter().filter_map(View::open).collect())
}

/// Refuses a query that names nothing: `--symbol ''` (exit code 2).
fn check_query(q: &Query) -> Result<(), Failure> {
    match &q.symbol {
        Some(s) if s.trim().is_empty() => Err(Failure::usage(
            "--symbol is empty; give the name of a function (`mt-agent symbols --pid N PATTERN` \
             lists them)",
        )),
        _ => Ok(()),
    }
}

/// Finds the probe point for `q` in process `pid`, within the time budget
/// of [`crate::symbols::budget`]; files skipped for their size are named in the
/// notes (or in the error's detail).
pub fn resolve(pid: i32, q: &Query) -> Result<Resolution, ResolveError> {
    check_query(q).map_err(ResolveError::Other)?;
    crate::sys::safe_open::check_kernel().map_err(ResolveError::Other)?;
    let _budget = crate::symbols::budget::start();
    within_budget(resolve_unbudgeted(pid, q))
}

/// Turns a resolution that ran past its time budget into that error, and
/// adds the files skipped for their size to its notes or detail.
fn within_budget(r: Result<Resolution, ResolveError>) -> Result<Resolution, ResolveError> {
    if let Some(f) = crate::symbols::budget::failure() {
        return Err(ResolveError::Other(f));
    }
    let skipped = crate::symbols::budget::skipped_lines();
    match r {
        Ok(mut res) => {
            res.notes.extend(skipped);
            Ok(res)
        }
        Err(ResolveError::NotFound(f)) => Err(ResolveError::NotFound(f.with_detail(skipped))),
        Err(ResolveError::Other(f)) => Err(ResolveError::Other(f.with_detail(skipped))),
    }
}

fn resolve_unbudgeted(pid: i32, q: &Query) -> Result<Resolution, ResolveError> {
    let views = match open_views(pid, q.object.as_deref()) {
        Err(ResolveError::NotFound(f)) => {
            return unmapped::resolve(pid, q).unwrap_or(Err(ResolveError::NotFound(f)));
        }
        views => views?,
    };
    let mut note = None;
    let (view, function, probe_offset) = match (&q.symbol, q.address) {
        (_, Some(addr)) => {
            let (v, f, off) = by_address(pid, &views, addr)?;
            if let Some(sym) = &q.symbol
                && SymbolName::new(&f.name).matches(sym) != Some(NameMatch::Exact)
            {
                return Err(ResolveError::Other(Failure::usage(format!(
                    "--address {addr:#x} is in {} in {}, not in {sym}; drop --symbol or fix the address",
                    f.demangled,
                    v.label()
                ))));
            }
            (v, f, off)
        }
        (Some(sym), None) => {
            let p = by_name(pid, &views, sym)?;
            note = p.note;
            (p.view, p.function, q.offset.unwrap_or(0))
        }
        (None, None) => {
            return Err(ResolveError::Other(Failure::usage(
                "give --symbol NAME or --address 0xADDR",
            )));
        }
    };
    let mut r = finish(pid, view, function, probe_offset)?;
    r.notes.extend(note);
    Ok(r)
}

/// Finds the probe point for `q` in the file `path` itself, with no running
/// process (`--exe`): `--object`, if given, must be the path of a library to
/// probe instead. Errors (exit code 2) as for [`resolve`].
pub fn resolve_file(path: &std::path::Path, q: &Query) -> Result<Resolution, Failure> {
    crate::sys::safe_open::check_kernel()?;
    let _budget = crate::symbols::budget::start();
    within_budget(resolve_file_unbudgeted(path, q).map_err(ResolveError::Other))
        .map_err(Failure::from)
}

fn resolve_file_unbudgeted(path: &std::path::Path, q: &Query) -> Result<Resolution, Failure> {
    use std::os::unix::fs::MetadataExt as _;
    check_query(q)?;
    if q.address.is_some() {
        return Err(Failure::usage(
            "--address needs a running process to translate; with --exe, use --symbol and --offset",
        ));
    }
    let file = match &q.object {
        Some(o) if o.contains('/') => std::path::PathBuf::from(o),
        Some(o) => {
            return Err(Failure::usage(format!(
                "with --exe, --object must be the path of a library (not {o:?}): nothing is mapped yet"
            )));
        }
        None => path.to_path_buf(),
    };
    let meta = std::fs::metadata(&file).map_err(|e| {
        Failure::usage(format!(
            "{}: {e}; give the path of an executable",
            file.display()
        ))
    })?;
    let mapped = MappedObject {
        path: file.clone(),
        open_path: file.canonicalize().unwrap_or_else(|_| file.clone()),
        inode: meta.ino(),
        deleted: false,
        is_main: true,
        mappings: Vec::new(),
    };
    let Some(view) = View::open(mapped) else {
        return Err(Failure::usage(format!(
            "{} is not a 64-bit ELF executable",
            file.display()
        )));
    };
    let views = [view];
    let Some(sym) = q.symbol.as_deref() else {
        return Err(Failure::usage("give --symbol NAME"));
    };
    let p = by_name(0, &views, sym).map_err(Failure::from)?;
    finish(0, p.view, p.function, q.offset.unwrap_or(0)).map_err(Failure::from)
}

/// A process younger than this is probably still being set up by its
/// dynamic loader.
const YOUNG: Duration = Duration::from_secs(1);

/// Like [`resolve`], but while nothing matches, polls the target's mappings
/// every 100 ms for up to `wait` (a library still to be dlopen'ed). Without
/// `wait`, a process younger than 1 s gets 1 s: its loader may not have
/// mapped its libraries yet. `log` gets the -v line saying so.
pub fn resolve_waiting(
    pid: i32,
    q: &Query,
    wait: Option<Duration>,
    log: &dyn Fn(&str),
) -> Result<Resolution, Failure> {
    let young = if wait.is_none() {
        crate::sys::proc::age(pid).filter(|a| *a < YOUNG)
    } else {
        None
    };
    let wait = wait.or(young.map(|_| YOUNG));
    let deadline = wait.map(|w| Instant::now() + w);
    let mut logged = false;
    loop {
        let f = match resolve(pid, q) {
            Ok(r) => return Ok(r),
            Err(ResolveError::Other(f)) => return Err(f),
            Err(ResolveError::NotFound(f)) => f,
        };
        match (deadline, young) {
            (Some(d), _) if Instant::now() < d => {
                if !crate::sys::proc::is_alive(pid) {
                    return Err(Failure::usage(format!(
                        "pid {pid} exited while waiting for the symbol to be mapped"
                    )));
                }
                if let (Some(age), false) = (young, logged) {
                    logged = true;
                    log(&format!(
                        "pid {pid} started {} ms ago and the symbol is not mapped yet: waiting up \
                         to 1 s for its loader (--wait-for-symbol waits longer)",
                        age.as_millis()
                    ));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (Some(_), _) => {
                let mut f = f;
                let how = if young.is_some() {
                    " for the loader of a process started less than 1 s ago"
                } else {
                    ""
                };
                f.message = format!(
                    "{} (waited {}{how})",
                    f.message,
                    humantime::format_duration(wait.unwrap_or_default())
                );
                return Err(f);
            }
            (None, _) => return Err(f),
        }
    }
}

/// Refuses a probe point past the function's end, off an instruction
/// boundary, or on an instruction the kernel cannot probe (exit code 2).
fn check_probe_point(f: &Function, body: &[u8], probe_offset: u64) -> Result<(), Failure> {
    if probe_offset >= f.size.max(1) {
        return Err(Failure::usage(format!(
            "--offset {probe_offset} is past the end of {} ({} bytes); give an offset inside it",
            f.demangled, f.size
        )));
    }
    if !insn::is_boundary(body, probe_offset) {
        return Err(Failure::usage(format!(
            "offset {probe_offset:#x} into {} is not an instruction boundary; a probe there \
             would corrupt the target. Pick a boundary from `objdump -d`",
            f.demangled
        )));
    }
    if let Some((insn, why)) = insn::uprobe_refusal(&body[probe_offset as usize..]) {
        let next = probe_offset + insn::length(&body[probe_offset as usize..]).max(1) as u64;
        return Err(Failure::usage(format!(
            "{}+{probe_offset:#x} is `{insn}`, which a uprobe cannot be placed on: {why} \
             (ENOTSUPP); probe another instruction, e.g. --offset {next} (a boundary from \
             `objdump -d`)",
            f.demangled
        )));
    }
    Ok(())
}

fn finish(pid: i32, v: &View, f: Function, probe_offset: u64) -> Result<Resolution, ResolveError> {
    let body = v.bytes(&f);
    check_probe_point(&f, &body, probe_offset).map_err(ResolveError::Other)?;
    let attach_offset = f.file_offset + probe_offset;
    let cost = insn::cost_hint(&body[probe_offset as usize..], f.elf_address + probe_offset);
    let mut notes = Vec::new();
    if v.mapped.deleted {
        notes.push(format!(
            "{} on disk differs from the running file (replaced or deleted); attaching \
             through {}, which reaches the running file",
            v.mapped.path.display(),
            v.mapped.open_path.display()
        ));
    }
    if f.table == "debug file"
        && let Some(d) = &v.debug(pid).0
    {
        notes.push(format!(
            "symbol found in separate debug info {}",
            d.path.display()
        ));
    }
    // Clones that callers may call instead of the function itself.
    let query = f.name.clone();
    let word = names::required_word(&query).map(str::as_bytes);
    let mut clones: Vec<String> = Vec::new();
    let mut cold = None;
    for table in v.tables_where(pid, |s| word.is_none_or(|w| names::contains(s.name, w))) {
        for s in table
            .iter()
            .filter(|s| s.kind == SymKind::Func && s.size > 0)
        {
            let n = SymbolName::new(&s.name);
            if n.matches(names::strip_version(&query)) == Some(NameMatch::Clone) {
                if n.raw.contains(".cold") {
                    if cold.is_none()
                        && let Some(cf) = v.function(s)
                    {
                        let bytes = v.bytes(&cf);
                        cold = Some((cf, bytes));
                    }
                } else if !clones.contains(&s.name) {
                    clones.push(s.name.clone());
                }
            }
        }
    }
    if !clones.is_empty() {
        notes.push(format!(
            "the compiler also made clones of {}: {}; calls that go to a clone do not trigger",
            f.demangled,
            clones.join(", ")
        ));
    }
    Ok(Resolution {
        is_go: v.elf.is_go(),
        object: v.mapped.clone(),
        function: f,
        probe_offset,
        attach_offset,
        cost,
        body,
        cold,
        notes,
    })
}

/// A symbol that matched a name, with where it came from.
struct Candidate<'a> {
    view: &'a View,
    sym: ElfSymbol,
    how: NameMatch,
}

/// What [`by_name`] picked: the function, and a note on how (an IFUNC's
/// implementation).
struct Picked<'a> {
    view: &'a View,
    function: Function,
    note: Option<String>,
}

/// Finds the one function `query` names. A plain name prefers an object's
/// default version (`@@`) over its compatibility versions (`@`); an IFUNC
/// is followed to the implementation the process uses ([`ifunc`]).
fn by_name<'a>(pid: i32, views: &'a [View], query: &'a str) -> Result<Picked<'a>, ResolveError> {
    let mut found = candidates(pid, views, query, names::required_word(query));
    if found.is_empty() {
        // Searched again in every demangled name: the word may be one a
        // demangler spells differently (docs/symbol-lookup.md).
        found = candidates(pid, views, query, None);
    }
    let found = prefer_default_version(found, query);
    let callable = distinct(found.iter().filter(|c| {
        c.how == NameMatch::Exact
            && (c.sym.kind == SymKind::Ifunc || (c.sym.kind == SymKind::Func && c.sym.size > 0))
    }));
    match callable.len() {
        0 => Err(nothing_callable(pid, views, &found, query)),
        1 if callable[0].sym.kind == SymKind::Ifunc => ifunc::implementation(pid, callable[0]),
        1 => {
            let c = callable[0];
            let function = c.view.function(&c.sym).ok_or_else(|| {
                ResolveError::Other(Failure::usage(format!(
                    "{query} at {:#x} in {} is outside every LOAD segment; it cannot be probed",
                    c.sym.value,
                    c.view.label()
                )))
            })?;
            Ok(Picked {
                view: c.view,
                function,
                note: None,
            })
        }
        n => Err(ResolveError::Other(
            Failure::usage(ambiguous(query, n, &callable))
                .with_detail(callable.iter().map(|c| listing_line(c.view, &c.sym))),
        )),
    }
}

/// The refusal of a name that matches `n` functions: overloads in one
/// object are told apart by their full names (`work(double)`), functions
/// in several objects by `--object`.
fn ambiguous(query: &str, n: usize, callable: &[&Candidate<'_>]) -> String {
    let one_object = callable
        .windows(2)
        .all(|w| std::ptr::eq(w[0].view, w[1].view));
    let mut full: Vec<String> = callable
        .iter()
        .map(|c| SymbolName::new(&c.sym.name).demangled)
        .collect();
    full.dedup();
    if one_object && full.len() == n {
        format!(
            "{query} matches {n} functions in {}; give one by its full name: {}",
            callable[0].view.label(),
            full.iter()
                .map(|f| format!("--symbol '{f}'"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        format!(
            "{query} matches {n} functions; pick one with --object PATH|NAME \
             (or give the full mangled or versioned name)"
        )
    }
}

/// The symbols whose name matches `query`, per object: `.symtab`, then
/// `.dynsym`, then the debug file, stopping at the first table of an object
/// that has the function itself. Only the symbols whose raw name contains
/// `word` ([`names::required_word`]) are demangled.
fn candidates<'a>(
    pid: i32,
    views: &'a [View],
    query: &str,
    word: Option<&str>,
) -> Vec<Candidate<'a>> {
    let mut found: Vec<Candidate<'a>> = Vec::new();
    for v in views {
        let start = found.len();
        for which in LOOKUP {
            found.extend(matching(pid, v, which, query, word));
            if found[start..].iter().any(|c| c.how == NameMatch::Exact) {
                break;
            }
        }
    }
    found
}

/// For a name without a version: drops an object's compatibility versions
/// (`memcpy@GLIBC_2.2.5`) when the same object has the default version
/// (`memcpy@@GLIBC_2.14`), which is what programs linked today call.
fn prefer_default_version<'a>(found: Vec<Candidate<'a>>, query: &str) -> Vec<Candidate<'a>> {
    if names::strip_version(query) != query {
        return found;
    }
    let is_default = |c: &Candidate<'_>| c.sym.name.contains("@@");
    let is_compat = |c: &Candidate<'_>| c.sym.name.contains('@') && !is_default(c);
    let defaults: Vec<*const View> = found
        .iter()
        .filter(|c| c.how == NameMatch::Exact && is_default(c))
        .map(|c| std::ptr::from_ref(c.view))
        .collect();
    found
        .into_iter()
        .filter(|c| !(is_compat(c) && defaults.contains(&std::ptr::from_ref(c.view))))
        .collect()
}

/// Why nothing callable matched: a data symbol, an empty function, only
/// compiler clones, or nothing at all (which may still be loaded later).
fn nothing_callable(
    pid: i32,
    views: &[View],
    found: &[Candidate<'_>],
    query: &str,
) -> ResolveError {
    let exact = |kind: SymKind| {
        found
            .iter()
            .find(|c| c.how == NameMatch::Exact && c.sym.kind == kind)
    };
    if let Some(c) = exact(SymKind::Data) {
        return ResolveError::Other(Failure::usage(format!(
            "{query} in {} is a data symbol, not a function; give a function name \
             (`mt-agent symbols --pid {pid} PATTERN` lists them)",
            c.view.label()
        )));
    }
    if let Some(c) = exact(SymKind::Func) {
        return ResolveError::Other(Failure::usage(format!(
            "{query} in {} has size 0 (no body); give a function with code",
            c.view.label()
        )));
    }
    let clones =
        distinct(found.iter().filter(|c| {
            c.how == NameMatch::Clone && c.sym.kind == SymKind::Func && c.sym.size > 0
        }));
    if let Some(first) = clones.first() {
        return ResolveError::Other(
            Failure::usage(format!(
                "{query} has no body of its own; the compiler made the clones below. \
                 Probe one by its full name (e.g. --symbol '{}')",
                first.sym.name
            ))
            .with_detail(clones.iter().map(|c| listing_line(c.view, &c.sym))),
        );
    }
    ResolveError::NotFound(not_found(pid, views, query))
}

fn matching<'a>(
    pid: i32,
    view: &'a View,
    which: Which,
    query: &str,
    word: Option<&str>,
) -> Vec<Candidate<'a>> {
    let word = word.map(str::as_bytes);
    let syms = view.symbols(pid, which, |s| {
        word.is_none_or(|w| names::contains(s.name, w))
    });
    syms.into_iter()
        .filter_map(|sym| {
            if crate::symbols::budget::over(&view.mapped.open_path) {
                return None;
            }
            let how = SymbolName::new(&sym.name).matches(query)?;
            Some(Candidate { view, sym, how })
        })
        .collect()
}

/// Drops aliases: the same object and address is one function.
fn distinct<'a, 'b>(it: impl Iterator<Item = &'b Candidate<'a>>) -> Vec<&'b Candidate<'a>> {
    let mut out: Vec<&Candidate<'a>> = Vec::new();
    for c in it {
        if !out
            .iter()
            .any(|o| std::ptr::eq(o.view, c.view) && o.sym.value == c.sym.value)
        {
            out.push(c);
        }
    }
    out
}

fn listing_line(v: &View, s: &ElfSymbol) -> String {
    let addr = elf::vaddr_to_offset(&v.segments, s.value)
        .and_then(|off| v.runtime_address(off))
        .unwrap_or(s.value);
    let ifunc = if s.kind == SymKind::Ifunc {
        " (IFUNC)"
    } else {
        ""
    };
    format!(
        "{}{ifunc}  [{}]  in {}  at {addr:#x} ({} bytes)",
        SymbolName::new(&s.name).demangled,
        s.name,
        v.label(),
        s.size
    )
}

/// The functions' short names of every view, for suggestions.
fn short_names(pid: i32, views: &[View]) -> Vec<String> {
    let mut shorts: Vec<String> = Vec::new();
    for v in views {
        if crate::symbols::budget::over(&v.mapped.open_path) {
            break;
        }
        for table in v.tables(pid) {
            for s in table
                .iter()
                .filter(|s| s.kind == SymKind::Func && s.size > 0)
            {
                shorts.push(SymbolName::new(&s.name).short().to_string());
            }
        }
    }
    shorts.sort();
    shorts.dedup();
    shorts
}

/// `f@V2` when the object has `f@@V2` (or the reverse): the versions of
/// that name, for the suggestion.
fn versions_of(views: &[View], query: &str) -> Vec<String> {
    let base = names::strip_version(query);
    let mut versions: Vec<String> = Vec::new();
    if base == query {
        return versions;
    }
    for v in views {
        let base_bytes = base.as_bytes();
        for s in v
            .symbols(0, Which::Dynsym, |s| s.name == base_bytes)
            .iter()
            .filter(|s| s.kind == SymKind::Func || s.kind == SymKind::Ifunc)
        {
            if names::strip_version(&s.name) == base && !versions.contains(&s.name) {
                versions.push(s.name.clone());
            }
        }
    }
    versions
}

fn not_found(pid: i32, views: &[View], query: &str) -> Failure {
    let shorts = short_names(pid, views);
    let similar = names::closest(query, shorts.iter().map(String::as_str), 5);
    let mut detail: Vec<String> = similar.iter().map(|s| format!("similar: {s}")).collect();
    for v in views.iter().filter(|v| !v.elf.has_symtab()) {
        let (file, searched) = v.debug(pid);
        if file.is_none() {
            detail.push(format!(
                "{} is stripped (no .symtab) and no debug info was found; looked in: {}",
                v.label(),
                searched
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    let scope = if views.len() == 1 {
        format!("in {}", views[0].label())
    } else {
        format!("in the {} objects pid {pid} has mapped", views.len())
    };
    if pid <= 0 {
        return Failure::usage(format!(
            "no function {query} {scope}; check the name (`nm -C`, or `mt-agent symbols --pid N` \
             on a running process), or give the library with --object PATH"
        ))
        .with_detail(detail);
    }
    let versions = versions_of(views, query);
    if !versions.is_empty() {
        return Failure::usage(format!(
            "no function {query} {scope}; its versions here are {} (`@@` is the default \
             version, `@` a compatibility one)",
            versions.join(", ")
        ))
        .with_detail(detail);
    }
    if let Some(near) = similar.first().filter(|s| names::is_close(query, s)) {
        return Failure::usage(format!(
            "no function {query} {scope}; did you mean {near}? If not, it is not mapped (yet): \
             if a library that has it is loaded later (dlopen), give a capture run \
             --wait-for-symbol DURATION"
        ))
        .with_detail(detail);
    }
    Failure::usage(format!(
        "no function {query} {scope}: it is not mapped (yet); if a library that has it is \
         loaded later (dlopen), give a capture run --wait-for-symbol DURATION, otherwise \
         check the name \
         (`mt-agent symbols --pid {pid} PATTERN`)"
    ))
    .with_detail(detail)
}

fn by_address(pid: i32, views: &[View], addr: u64) -> Result<(&View, Function, u64), ResolveError> {
    let hit = views.iter().find_map(|v| {
        v.mapped
            .mappings
            .iter()
            .find(|m| addr >= m.start && addr < m.end)
            .map(|m| (v, addr - m.start + m.offset))
    });
    let Some((v, file_offset)) = hit else {
        return Err(ResolveError::Other(Failure::usage(format!(
            "address {addr:#x} is not in any file mapped by pid {pid}; take it from /proc/{pid}/maps \
             or `mt-agent symbols`"
        ))));
    };
    let vaddr = elf::offset_to_vaddr(&v.segments, file_offset).unwrap_or(u64::MAX);
    let inside = |s: &RawSymbol<'_>| {
        s.kind() == Some(SymKind::Func)
            && s.size > 0
            && vaddr >= s.value
            && vaddr - s.value < s.size
    };
    for which in LOOKUP {
        if let Some(f) = v
            .symbols(pid, which, inside)
            .first()
            .and_then(|s| v.function(s))
        {
            let into = vaddr - f.elf_address;
            return Ok((v, f, into));
        }
    }
    Err(ResolveError::Other(Failure::usage(format!(
        "address {addr:#x} ({} + file offset {file_offset:#x}) is not inside a known function; \
         mt-agent needs the function to check the instruction boundary",
        v.label()
    ))))
}

/// One row of `mt-agent symbols`.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    pub demangled: String,
    pub mangled: String,
    pub object: PathBuf,
    /// Runtime virtual address in the target.
    pub address: u64,
    pub elf_address: u64,
    pub size: u64,
    pub table: &'static str,
    /// `function`, `ifunc` (a GNU indirect function: its address is its
    /// resolver's) or `ifunc resolver`.
    pub kind: &'static str,
    pub cost: Option<CostHint>,
}

/// Lists the functions whose raw or demangled name contains `pattern`,
/// across the target's mapped objects (or the one `object` selects), with
/// IFUNCs and their resolvers marked.
pub fn list(pid: i32, pattern: Option<&str>, object: Option<&str>) -> Result<Vec<Listed>, Failure> {
    crate::sys::safe_open::check_kernel()?;
    let _budget = crate::symbols::budget::start();
    let rows = list_unbudgeted(pid, pattern, object)?;
    if let Some(f) = crate::symbols::budget::failure() {
        return Err(f);
    }
    for line in crate::symbols::budget::skipped_lines() {
        eprintln!("mt-agent: warning: {line}");
    }
    Ok(rows)
}

fn list_unbudgeted(
    pid: i32,
    pattern: Option<&str>,
    object: Option<&str>,
) -> Result<Vec<Listed>, Failure> {
    let views = open_views(pid, object).map_err(Failure::from)?;
    let word = pattern.and_then(names::required_word);
    let mut out = Vec::new();
    for v in &views {
        out.extend(list_view(pid, v, pattern, word));
    }
    if out.is_empty() && word.is_some() {
        // Looked for again in every demangled name (docs/symbol-lookup.md).
        for v in &views {
            out.extend(list_view(pid, v, pattern, None));
        }
    }
    Ok(out)
}

/// The rows of one object: its functions whose raw or demangled name
/// contains `pattern`, demangling only the names that contain `word`.
fn list_view(pid: i32, v: &View, pattern: Option<&str>, word: Option<&str>) -> Vec<Listed> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let tables = if v.elf.has_symtab() {
        [Which::Symtab, Which::Dynsym]
    } else {
        [Which::Dynsym, Which::DebugFile]
    };
    let is_ifunc = |s: &RawSymbol<'_>| s.kind() == Some(SymKind::Ifunc);
    let resolvers: std::collections::HashSet<u64> = tables
        .iter()
        .flat_map(|&t| v.symbols(pid, t, is_ifunc))
        .map(|s| s.value)
        .collect();
    let (pattern_bytes, word) = (pattern.map(str::as_bytes), word.map(str::as_bytes));
    let wanted = |s: &RawSymbol<'_>| {
        matches!(s.kind(), Some(SymKind::Func | SymKind::Ifunc))
            && s.size > 0
            && (pattern_bytes.is_none_or(|p| names::contains(s.name, p))
                || word.is_none_or(|w| names::contains(s.name, w)))
    };
    for s in tables.iter().flat_map(|&t| v.symbols(pid, t, wanted)) {
        if crate::symbols::budget::over(&v.mapped.open_path) {
            break;
        }
        let n = SymbolName::new(&s.name);
        if let Some(p) = pattern
            && !s.name.contains(p)
            && !n.demangled.contains(p)
        {
            continue;
        }
        let kind = match s.kind {
            SymKind::Ifunc => "ifunc",
            _ if resolvers.contains(&s.value) => "ifunc resolver",
            _ => "function",
        };
        // A versioned `.dynsym` name (`f@@V2`) is listed even where
        // `.symtab` named the same address: it is what --symbol takes.
        let version = n.version.clone().unwrap_or_default();
        if !seen.insert((s.value, kind, version)) {
            continue;
        }
        let Some(f) = v.function(&s) else { continue };
        let bytes = v.bytes(&f);
        out.push(Listed {
            demangled: n.demangled,
            mangled: s.name.clone(),
            object: v.mapped.path.clone(),
            address: v.runtime_address(f.file_offset).unwrap_or(s.value),
            elf_address: s.value,
            size: s.size,
            table: s.table.label(),
            kind,
            cost: insn::cost_hint(&bytes, s.value),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use elf::Table;

    fn own_view() -> View {
        let exe = std::env::current_exe().unwrap();
        View::open(MappedObject {
            path: exe.clone(),
            open_path: exe,
            inode: 0,
            deleted: false,
            is_main: true,
            mappings: Vec::new(),
        })
        .unwrap()
    }

    fn func(name: &str) -> ElfSymbol {
        ElfSymbol {
            name: name.into(),
            value: 0x1000,
            size: 16,
            kind: SymKind::Func,
            table: Table::Dynsym,
        }
    }

    #[test]
    fn a_plain_name_prefers_the_default_version_of_each_object() {
        let (libc, other) = (own_view(), own_view());
        let both = [func("memcpy@GLIBC_2.2.5"), func("memcpy@@GLIBC_2.14")];
        let compat_only = [func("memcpy@GLIBC_2.2.5")];
        let found = || {
            vec![
                Candidate {
                    view: &libc,
                    sym: both[0].clone(),
                    how: NameMatch::Exact,
                },
                Candidate {
                    view: &libc,
                    sym: both[1].clone(),
                    how: NameMatch::Exact,
                },
                Candidate {
                    view: &other,
                    sym: compat_only[0].clone(),
                    how: NameMatch::Exact,
                },
            ]
        };
        let names = |cs: Vec<Candidate<'_>>| -> Vec<String> {
            cs.iter().map(|c| c.sym.name.clone()).collect()
        };
        // The compatibility version goes only where a default one exists.
        assert_eq!(
            names(prefer_default_version(found(), "memcpy")),
            ["memcpy@@GLIBC_2.14", "memcpy@GLIBC_2.2.5"]
        );
        assert!(std::ptr::eq(
            prefer_default_version(found(), "memcpy")[1].view,
            &other
        ));
        // A versioned query keeps what it matched.
        assert_eq!(
            prefer_default_version(found(), "memcpy@GLIBC_2.2.5").len(),
            3
        );
    }

    #[test]
    fn an_empty_name_is_refused() {
        for name in ["", "  "] {
            let q = Query {
                symbol: Some(name.into()),
                ..Query::default()
            };
            let e = check_query(&q).unwrap_err();
            assert!(e.message.contains("--symbol is empty"), "{}", e.message);
        }
        assert!(
            check_query(&Query {
                symbol: Some("f".into()),
                ..Query::default()
            })
            .is_ok()
        );
    }
}
