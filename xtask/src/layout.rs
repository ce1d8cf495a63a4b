//! `cargo xtask layout`: the rules of `agent/src`'s layout, checked, and its
//! figures printed (DEVELOPERS.md, "Layout").
//!
//! * The stages are the folders (and top-level files) that `lib.rs`
//!   declares, in its order: a stage may import only the stages after it.
//! * No import circle between modules (files).
//! * Every file opens with a `//!` line; at most [`MAX_TOP_FILES`] files at
//!   the top of `agent/src`.
//!
//! Imports are read as text: every `crate::` path and `super::` path outside
//! comments, string literals and `#[cfg(test)]` items (unit tests may reach
//! anywhere). [`stale_names`] checks the other rule CI keeps: no file of the
//! repository names a source or docs file that does not exist.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

/// At most this many files at the top of `agent/src`.
pub const MAX_TOP_FILES: usize = 8;

/// One file of the crate.
#[derive(Debug)]
pub struct Module {
    /// Its module path, e.g. `["capture", "driver"]` (`[]` for lib.rs).
    pub path: Vec<String>,
    pub file: PathBuf,
    /// The code with comments, literals and test items blanked out.
    code: String,
    text: String,
}

impl Module {
    /// The stage the module belongs to: its first path segment.
    pub fn stage(&self) -> Option<&str> {
        self.path.first().map(String::as_str)
    }
}

/// What the check found.
#[derive(Debug, Default)]
pub struct Findings {
    pub stages: Vec<String>,
    /// (from stage, to stage) → (count, an example file).
    pub folder_edges: BTreeMap<(String, String), (usize, String)>,
    pub problems: Vec<String>,
    pub top_files: Vec<String>,
    /// (lines, function, file:line), longest first.
    pub longest: Vec<(usize, String, String)>,
}

/// Reads every `.rs` file under `src`.
pub fn modules(src: &Path) -> anyhow::Result<Vec<Module>> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).with_context(|| dir.display().to_string())? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p)?;
                let rel = p.strip_prefix(src)?.with_extension("");
                let mut path: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(
                    path.last().map(String::as_str),
                    Some("mod" | "lib" | "main")
                ) {
                    path.pop();
                }
                let code = strip_tests(&blank(&text));
                out.push(Module {
                    path,
                    file: p,
                    code,
                    text,
                });
            }
        }
    }
    out.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(out)
}

/// Blanks comments, string and char literals (keeping line breaks), so
/// that only code is searched for paths.
fn blank(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let keep = |c: u8| if c == b'\n' { b'\n' } else { b' ' };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    out.extend(b"  ");
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    out.extend(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(keep(b[i]));
                    i += 1;
                }
            }
        } else if let Some(n) = raw_string_len(rest) {
            out.extend(rest[..n].iter().map(|c| keep(*c)));
            i += n;
        } else if b[i] == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                let n = if b[i] == b'\\' { 2 } else { 1 };
                for k in 0..n {
                    out.push(keep(*b.get(i + k).unwrap_or(&b' ')));
                }
                i += n;
            }
            out.push(b' ');
            i += 1;
        } else if b[i] == b'\'' && char_literal_len(rest).is_some() {
            let n = char_literal_len(rest).expect("checked");
            out.extend(std::iter::repeat_n(b' ', n));
            i += n;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The length of a raw string literal (`r"…"`, `r#"…"#`, `br"…"`) at the
/// start of `s`, if one starts there.
fn raw_string_len(s: &[u8]) -> Option<usize> {
    let start = usize::from(s.first() == Some(&b'b'));
    if s.get(start) != Some(&b'r') {
        return None;
    }
    let hashes = s[start + 1..].iter().take_while(|c| **c == b'#').count();
    if s.get(start + 1 + hashes) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let body = start + 2 + hashes;
    let end = s[body..].windows(close.len()).position(|w| w == close)?;
    Some(body + end + close.len())
}

/// The length of a char literal (`'a'`, `'\n'`, `'\''`) at the start of
/// `s`; None for a lifetime.
fn char_literal_len(s: &[u8]) -> Option<usize> {
    if s.get(1) == Some(&b'\\') {
        let end = s[2..].iter().position(|c| *c == b'\'')?;
        return (end < 10).then_some(end + 3);
    }
    // One UTF-8 character, then the closing quote.
    let len = match s.get(1)? {
        c if *c < 0x80 => 1,
        c if *c >= 0xf0 => 4,
        c if *c >= 0xe0 => 3,
        _ => 2,
    };
    (s.get(1 + len) == Some(&b'\'')).then_some(len + 2)
}

/// Blanks every item marked `#[cfg(test)]`: a `mod tests { … }` block or
/// a `mod x;` line.
fn strip_tests(code: &str) -> String {
    let mut out = code.to_string();
    let mut from = 0;
    while let Some(at) = out[from..].find("#[cfg(test)]").map(|i| i + from) {
        let after = at + "#[cfg(test)]".len();
        let semi = out[after..].find(';').map(|i| i + after);
        let brace = out[after..].find('{').map(|i| i + after);
        let end = match (semi, brace) {
            (Some(s), Some(b)) if s < b => s + 1,
            (_, Some(b)) => matching_brace(&out, b).map_or(out.len(), |e| e + 1),
            (Some(s), None) => s + 1,
            (None, None) => out.len(),
        };
        let blanked: String = out[at..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(at..end, &blanked);
        from = end;
    }
    out
}

/// The index of the `}` that closes the `{` at `open`.
fn matching_brace(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// Every path the code names through `crate::` or `super::`, as segments
/// from the crate root (`crate::{a::{b, c}}` gives `a::b` and `a::c`).
pub fn references(m: &Module, is_dir_module: bool) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let c = &m.code;
    let mut i = 0;
    while i < c.len() {
        let rest = &c[i..];
        let boundary = i == 0 || {
            let p = c.as_bytes()[i - 1];
            !(p.is_ascii_alphanumeric() || p == b'_' || p == b':')
        };
        let root: Option<(usize, Vec<String>)> = if !boundary {
            None
        } else if rest.starts_with("crate::") {
            Some((7, Vec::new()))
        } else if rest.starts_with("super::") {
            // `super` of a mod.rs is its folder's parent.
            let mut base = m.path.clone();
            if !is_dir_module || !base.is_empty() {
                base.pop();
            }
            let mut n = 7;
            while c[i + n..].starts_with("super::") {
                base.pop();
                n += 7;
            }
            Some((n, base))
        } else {
            None
        };
        match root {
            Some((n, base)) => {
                let (paths, used) = parse_tree(&c[i + n..]);
                for p in paths {
                    let mut full = base.clone();
                    full.extend(p);
                    out.push(full);
                }
                i += n + used.max(1);
            }
            None => i += rest.chars().next().map_or(1, char::len_utf8),
        }
    }
    out
}

/// Parses `a::b::{c, d::e}` at the start of `s`: the paths it names and
/// how many bytes it took.
fn parse_tree(s: &str) -> (Vec<Vec<String>>, usize) {
    let mut prefix = Vec::new();
    let mut i = 0;
    loop {
        let seg: String = s[i..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !seg.is_empty() {
            i += seg.len();
            prefix.push(seg);
            if s[i..].starts_with("::") {
                i += 2;
                continue;
            }
            return (vec![prefix], i);
        }
        if s[i..].starts_with('{') {
            let Some(close) = matching_brace(s, i) else {
                return (vec![prefix], i);
            };
            let mut out = Vec::new();
            for item in split_top(&s[i + 1..close]) {
                let item = item.trim();
                if item == "self" || item.starts_with("self ") {
                    out.push(prefix.clone());
                    continue;
                }
                for p in parse_tree(item).0 {
                    let mut full = prefix.clone();
                    full.extend(p);
                    out.push(full);
                }
            }
            return (out, close + 1);
        }
        return (vec![prefix], i);
    }
}

/// Splits a use-group's body at its top-level commas.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// The stages: the `mod` lines of `lib.rs`, in order.
pub fn stages(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|l| {
            let l = l.trim();
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l.strip_prefix("mod ")?
                .strip_suffix(';')
                .map(|s| s.trim().to_string())
        })
        .collect()
}

/// The module a path lands in: its longest prefix that is a module.
fn resolve<'a>(path: &[String], known: &'a BTreeSet<Vec<String>>) -> Option<&'a Vec<String>> {
    (1..=path.len())
        .rev()
        .find_map(|n| known.get(&path[..n].to_vec()))
}

/// Checks the crate under `src`.
pub fn check(src: &Path) -> anyhow::Result<Findings> {
    let mods = modules(src)?;
    let lib = std::fs::read_to_string(src.join("lib.rs")).context("reading lib.rs")?;
    let mut f = Findings {
        stages: stages(&lib),
        ..Findings::default()
    };
    let rank = |s: &str| f.stages.iter().position(|x| x == s);
    let known: BTreeSet<Vec<String>> = mods.iter().map(|m| m.path.clone()).collect();
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut edges = BTreeMap::new();
    for m in &mods {
        let name = m.file.strip_prefix(src)?.display().to_string();
        if !m.text.trim_start().starts_with("//!") {
            problems.push(format!("{name} does not open with a `//!` line"));
        }
        if m.path.len() == 1 && !m.file.ends_with("mod.rs") || m.path.is_empty() {
            f.top_files.push(name.clone());
        }
        let is_dir = m.file.ends_with("mod.rs") || m.file.ends_with("lib.rs");
        for r in references(m, is_dir) {
            let Some(to) = resolve(&r, &known) else {
                continue;
            };
            if to == &m.path || to.is_empty() {
                continue;
            }
            graph.entry(m.path.clone()).or_default().insert(to.clone());
            let (Some(a), Some(b)) = (m.stage(), to.first().map(String::as_str)) else {
                continue;
            };
            if a == b {
                continue;
            }
            let e = edges
                .entry((a.to_string(), b.to_string()))
                .or_insert((0, name.clone()));
            e.0 += 1;
            if let (Some(ra), Some(rb)) = (rank(a), rank(b))
                && ra > rb
            {
                problems.push(format!(
                    "{name} imports {} from stage `{b}`, which lib.rs lists above `{a}`",
                    r.join("::")
                ));
            }
        }
    }
    for cycle in cycles(&graph) {
        let names: Vec<String> = cycle.iter().map(|p| p.join("::")).collect();
        problems.push(format!("import circle: {}", names.join(" -> ")));
    }
    if f.top_files.len() > MAX_TOP_FILES {
        problems.push(format!(
            "{} files at the top of agent/src (at most {MAX_TOP_FILES}): {}",
            f.top_files.len(),
            f.top_files.join(", ")
        ));
    }
    for m in &mods {
        f.longest.extend(functions(
            &m.code,
            &m.file.strip_prefix(src)?.display().to_string(),
        ));
    }
    f.longest.sort_by_key(|l| std::cmp::Reverse(l.0));
    f.folder_edges = edges;
    f.problems = problems;
    Ok(f)
}

/// The strongly connected components of more than one module.
fn cycles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    // Kosaraju: order by finish time, then walk the reversed graph.
    let nodes: BTreeSet<&Vec<String>> = graph
        .keys()
        .chain(graph.values().flat_map(|s| s.iter()))
        .collect();
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for n in &nodes {
        finish(n, graph, &mut seen, &mut order);
    }
    let mut reverse: BTreeMap<&Vec<String>, Vec<&Vec<String>>> = BTreeMap::new();
    for (a, bs) in graph {
        for b in bs {
            reverse.entry(b).or_default().push(a);
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for n in order.iter().rev() {
        if assigned.contains(n) {
            continue;
        }
        let mut comp = Vec::new();
        let mut stack = vec![*n];
        assigned.insert(*n);
        while let Some(x) = stack.pop() {
            comp.push(x.clone());
            for y in reverse.get(x).into_iter().flatten() {
                if assigned.insert(*y) {
                    stack.push(y);
                }
            }
        }
        if comp.len() > 1 {
            comp.sort();
            out.push(comp);
        }
    }
    out
}

fn finish<'a>(
    n: &'a Vec<String>,
    graph: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
    seen: &mut BTreeSet<&'a Vec<String>>,
    order: &mut Vec<&'a Vec<String>>,
) {
    if !seen.insert(n) {
        return;
    }
    for m in graph.get(n).into_iter().flatten() {
        finish(m, graph, seen, order);
    }
    order.push(n);
}

/// Each function's length in lines, from its `fn` line to its closing
/// brace.
fn functions(code: &str, file: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = code.lines().collect();
    let starts: Vec<usize> = lines
        .iter()
        .scan(0, |off, l| {
            let s = *off;
            *off += l.len() + 1;
            Some(s)
        })
        .collect();
    for (n, line) in lines.iter().enumerate() {
        let Some(at) = fn_name_at(line) else {
            continue;
        };
        let name: String = line[at..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let from = starts[n];
        // The body's brace, unless a `;` (a declaration) comes first.
        let Some(open) = code[from..].find(['{', ';']).map(|i| i + from) else {
            continue;
        };
        if code.as_bytes()[open] == b';' {
            continue;
        }
        if let Some(close) = matching_brace(code, open) {
            let len = code[from..=close].lines().count();
            out.push((len, name, format!("{file}:{}", n + 1)));
        }
    }
    out
}

/// Where the name starts on a line that begins a function.
fn fn_name_at(line: &str) -> Option<usize> {
    let t = line.trim_start();
    let mut rest = t;
    for q in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
        "extern \"C\" ",
    ] {
        rest = rest.strip_prefix(q).unwrap_or(rest);
    }
    let name = rest.strip_prefix("fn ")?;
    Some(line.len() - name.len())
}

/// Paths that this repository's files name and that do not exist: a
/// `*.rs` path, or a Markdown page (`docs/x.md`, `GUIDE.md`).
pub fn stale_names(repo: &Path) -> anyhow::Result<Vec<String>> {
    let files = tracked(repo)?;
    let mut out = Vec::new();
    for rel in &files {
        // This file's own examples and tests name files on purpose.
        if rel == "xtask/src/layout.rs" {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(repo.join(rel)) else {
            continue;
        };
        for name in named_files(&text) {
            let found = files
                .iter()
                .any(|f| f == &name || f.ends_with(&format!("/{name}")));
            if !found {
                out.push(format!("{rel} names {name}, which does not exist"));
            }
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The tracked files of the repository, relative to it.
fn tracked(repo: &Path) -> anyhow::Result<Vec<String>> {
    let out = std::process::Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(repo)
        .output()
        .context("running git ls-files")?;
    if !out.status.success() {
        bail!("git ls-files failed in {}", repo.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| repo.join(l).exists())
        .map(str::to_string)
        .collect())
}

/// The file names a text mentions: tokens ending in `.rs`, and `.md`
/// pages, outside URLs.
fn named_files(text: &str) -> Vec<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/');
    let mut out = Vec::new();
    for word in text.split(|c: char| !is_name(c) && c != ':') {
        if word.contains("://") || word.starts_with("http") {
            continue;
        }
        let word = word.rsplit(':').next().unwrap_or(word);
        let word = word.trim_start_matches("./").trim_end_matches('.');
        let ext_ok = word.ends_with(".rs") || word.ends_with(".md");
        let stem = word.rsplit('/').next().unwrap_or("");
        if ext_ok && stem.len() > 3 && !word.starts_with('/') && !word.contains("..") {
            out.push(word.to_string());
        }
    }
    out
}

/// `cargo xtask layout`: prints the stages, the imports between them, the
/// top-level files and the longest functions; fails on a broken rule.
pub fn layout() -> anyhow::Result<()> {
    let repo = crate::util::workspace();
    let f = check(&repo.join("agent/src"))?;
    println!("stages (lib.rs order; each imports only those after it):");
    println!("  {}", f.stages.join(" > "));
    println!("imports between stages (count, e.g. the first file):");
    for ((a, b), (n, file)) in &f.folder_edges {
        println!("  {a} -> {b}: {n} ({file})");
    }
    println!("files at the top of agent/src: {}", f.top_files.join(", "));
    println!("longest functions:");
    for (n, name, at) in f.longest.iter().take(8) {
        println!("  {n:4} {name} ({at})");
    }
    let mut problems = f.problems;
    problems.extend(stale_names(&repo)?);
    if problems.is_empty() {
        println!("layout: every rule holds");
        return Ok(());
    }
    for p in &problems {
        eprintln!("layout: {p}");
    }
    bail!("{} layout rule(s) broken", problems.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(path: &[&str], text: &str) -> Module {
        Module {
            path: path.iter().map(|s| s.to_string()).collect(),
            file: PathBuf::from(format!("{}.rs", path.join("/"))),
            code: strip_tests(&blank(text)),
            text: text.to_string(),
        }
    }

    fn refs(m: &Module) -> Vec<String> {
        references(m, false).iter().map(|p| p.join("::")).collect()
    }

    #[test]
    fn use_groups_comments_strings_and_tests_are_read_as_code_reads_them() {
        let m = module(
            &["capture", "driver"],
            r#"//! crate::nothing
use crate::{a::{b, c::{self, D}}, e};
// crate::comment
let s = "crate::string"; let c = '{'; let l: &'static str = my_crate::x;
fn f() { super::sibling::g(); crate::h::i() }
#[cfg(test)]
mod tests { use crate::upward; }
"#,
        );
        assert_eq!(
            refs(&m),
            [
                "a::b",
                "a::c",
                "a::c::D",
                "e",
                "capture::sibling::g",
                "h::i"
            ]
        );
    }

    #[test]
    fn stages_are_lib_rs_mod_lines_in_order() {
        let lib = "//! x\n\npub mod commands;\npub mod capture;\nmod sys;\n";
        assert_eq!(stages(lib), ["commands", "capture", "sys"]);
    }

    #[test]
    fn function_lengths_count_from_fn_to_the_closing_brace() {
        let code = "fn a() {\n    if x {\n    }\n}\npub fn b(x: u8) -> u8 { x }\nfn decl();\n";
        let f = functions(code, "f.rs");
        assert_eq!(f[0], (4, "a".to_string(), "f.rs:1".to_string()));
        assert_eq!(f[1].0, 1);
        assert_eq!(f.len(), 2);
    }

    #[test]
    fn file_names_in_text_are_found_but_not_urls() {
        let t = "see agent/src/probe/mod.rs, `docs/unwinding.md` and \
                 https://x.invalid/a/b.rs (GUIDE.md).";
        assert_eq!(
            named_files(t),
            ["agent/src/probe/mod.rs", "docs/unwinding.md", "GUIDE.md"]
        );
    }

    #[test]
    fn a_circle_is_found() {
        let mut g: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        let v = |s: &str| vec![s.to_string()];
        g.entry(v("a")).or_default().insert(v("b"));
        g.entry(v("b")).or_default().insert(v("a"));
        g.entry(v("b")).or_default().insert(v("c"));
        assert_eq!(cycles(&g), vec![vec![v("a"), v("b")]]);
    }

    /// The repository itself keeps the rules.
    #[test]
    fn agent_src_keeps_its_layout() {
        let repo = crate::util::workspace();
        let f = check(&repo.join("agent/src")).unwrap();
        assert!(f.problems.is_empty(), "{}", f.problems.join("\n"));
    }

    #[test]
    fn no_file_names_a_missing_file() {
        let stale = stale_names(&crate::util::workspace()).unwrap();
        assert!(stale.is_empty(), "{}", stale.join("\n"));
    }
}
