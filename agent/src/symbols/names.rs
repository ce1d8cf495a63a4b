//! Symbol names: demangling (Rust v0 and legacy, C++) and the rules by which
//! a user's `--symbol` matches a symbol. Pure functions.

use cpp_demangle::DemangleOptions;

/// Suffixes that GCC and Clang give to compiler clones of a function `f`:
/// `f.constprop.0`, `f.isra.0`, `f.part.0`, `f.cold`, `f.lto_priv.0`. A clone
/// is a different body than `f`, so it is never picked silently.
const CLONE_SUFFIXES: &[&str] = &[
    "constprop",
    "isra",
    "part",
    "cold",
    "lto_priv",
    "clone",
    "specialized",
];

/// How a symbol name answers a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameMatch {
    /// The symbol is the function asked for.
    Exact,
    /// The symbol is a compiler clone of the function asked for.
    Clone,
}

/// The forms of one symbol name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolName {
    /// As in the symbol table, without any `@VERSION` suffix.
    pub raw: String,
    /// The demangled name, with C++ parameters, without a Rust hash; equal to
    /// `raw` when the name is not mangled.
    pub demangled: String,
    /// Other spellings that also match exactly: the C++ name without
    /// parameters, the Rust name with its hash.
    pub aliases: Vec<String>,
    /// For a clone (`f.constprop.0`): the forms of `f`.
    pub clone_of: Option<Box<SymbolName>>,
    /// The `@V1` or `@@V2` suffix of a versioned `.dynsym` name.
    pub version: Option<String>,
}

impl SymbolName {
    /// Splits off a clone suffix, demangles, and lists the aliases.
    pub fn new(versioned: &str) -> Self {
        let raw = strip_version(versioned);
        let version = (raw != versioned).then(|| versioned[raw.len()..].to_string());
        Self {
            version,
            ..Self::unversioned(raw)
        }
    }

    fn unversioned(raw: &str) -> Self {
        if let Some((stem, suffix)) = raw.split_once('.') {
            let kind = suffix.split('.').next().unwrap_or("");
            if CLONE_SUFFIXES.contains(&kind) {
                let of = Self::new(stem);
                return Self {
                    raw: raw.to_string(),
                    demangled: format!("{}.{suffix}", of.demangled),
                    aliases: Vec::new(),
                    clone_of: Some(Box::new(of)),
                    version: None,
                };
            }
        }
        let (demangled, aliases) = demangle_forms(raw);
        Self {
            raw: raw.to_string(),
            demangled: demangled.unwrap_or_else(|| raw.to_string()),
            aliases,
            clone_of: None,
            version: None,
        }
    }

    /// Whether `query` names this symbol exactly, or names the function this
    /// symbol is a clone of.
    pub fn matches(&self, query: &str) -> Option<NameMatch> {
        if self.is(query) {
            return Some(NameMatch::Exact);
        }
        match &self.clone_of {
            Some(of) if of.is(query) => Some(NameMatch::Clone),
            _ => None,
        }
    }

    fn is(&self, query: &str) -> bool {
        // A versioned query (`foo@@V2`) names that version only.
        if let Some(v) = &self.version
            && strip_version(query) != query
        {
            return query.strip_suffix(v.as_str()) == Some(&self.raw);
        }
        let query = strip_version(query);
        if query == self.raw || query == self.demangled {
            return true;
        }
        let q = squeeze(query);
        squeeze(&self.demangled) == q || self.aliases.iter().any(|a| a == query || squeeze(a) == q)
    }

    /// The name without C++ parameters or Rust hash, for suggestions.
    pub fn short(&self) -> &str {
        self.aliases
            .iter()
            .find(|a| !a.contains('(') && !is_rust_hash_suffixed(a))
            .map_or(&self.demangled, String::as_str)
    }
}

/// `foo@@V2` and `foo@V1` name the function `foo`.
pub fn strip_version(name: &str) -> &str {
    match name.find('@') {
        Some(i) if i > 0 => &name[..i],
        _ => name,
    }
}

/// Whether a name looks mangled (Itanium C++ or Rust legacy `_Z…`, Rust v0 `_R…`).
pub fn is_mangled(name: &str) -> bool {
    name.starts_with("_Z") || name.starts_with("_R") || name.starts_with("__Z")
}

/// Demangles: returns the main demangled form and other exact spellings.
fn demangle_forms(raw: &str) -> (Option<String>, Vec<String>) {
    if !is_mangled(raw) {
        return (None, Vec::new());
    }
    if let Ok(d) = rustc_demangle::try_demangle(raw) {
        let without_hash = format!("{d:#}");
        let with_hash = format!("{d}");
        let mut aliases = Vec::new();
        if with_hash != without_hash {
            aliases.push(with_hash);
        }
        return (Some(without_hash), aliases);
    }
    if let Ok(sym) = cpp_demangle::Symbol::new(raw)
        // Not `to_string()`: formatting a deeply nested name fails (the
        // demangler's recursion limit), and `to_string` panics on that.
        && let Ok(full) = sym.demangle(&DemangleOptions::new())
    {
        let mut aliases = Vec::new();
        if let Ok(short) = sym.demangle(&DemangleOptions::new().no_params().no_return_type())
            && short != full
        {
            aliases.push(short);
        }
        return (Some(full), aliases);
    }
    (None, Vec::new())
}

fn is_rust_hash_suffixed(s: &str) -> bool {
    s.rsplit_once("::h")
        .is_some_and(|(_, h)| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Words a demangled name may show that its mangled name does not spell
/// out: C++'s built-in types and keywords (mangled as codes: `i` is `int`),
/// the `std::` names the Itanium ABI abbreviates (`St`, `Sa`, `Ss`, ...),
/// the demangler's own words (`{lambda(int)#1}`, `(anonymous namespace)`,
/// `non-virtual thunk to`), and Rust's (`{closure#0}`, `<impl Trait for T>`,
/// primitive types in v0). docs/symbol-lookup.md.
const NOT_SPELLED: &[&str] = &[
    "void",
    "wchar_t",
    "bool",
    "char",
    "char8_t",
    "char16_t",
    "char32_t",
    "signed",
    "unsigned",
    "short",
    "int",
    "long",
    "float",
    "double",
    "__int128",
    "__float128",
    "_Float16",
    "decimal128",
    "const",
    "volatile",
    "restrict",
    "operator",
    "new",
    "delete",
    "sizeof",
    "alignof",
    "typeid",
    "throw",
    "noexcept",
    "decltype",
    "auto",
    "nullptr_t",
    "true",
    "false",
    "this",
    "template",
    "typename",
    "std",
    "allocator",
    "basic_string",
    "string",
    "char_traits",
    "basic_istream",
    "basic_ostream",
    "basic_iostream",
    "istream",
    "ostream",
    "iostream",
    "anonymous",
    "namespace",
    "lambda",
    "unnamed",
    "type",
    "parm",
    "default",
    "arg",
    "vtable",
    "typeinfo",
    "name",
    "for",
    "guard",
    "variable",
    "reference",
    "temporary",
    "construction",
    "non",
    "virtual",
    "thunk",
    "covariant",
    "return",
    "transaction_clone",
    "wrapper",
    "init",
    "function",
    "imaginary",
    "complex",
    "literal",
    "expansion",
    "impl",
    "dyn",
    "mut",
    "unsafe",
    "extern",
    "closure",
    "shim",
    "static",
    "u128",
    "usize",
    "i128",
    "isize",
    "f32",
    "f64",
    "str",
    "never",
];

/// A piece of text that the raw name of every symbol `query` names (as
/// [`SymbolName::matches`] decides, exactly or as a clone) contains, so that
/// a search can skip the others without demangling them: the longest word
/// of the query (a run of letters, digits and `_`, not starting with a
/// digit, at least 3 long, outside `[...]`) that is no part of a
/// [`NOT_SPELLED`] word. Mangling spells each identifier out (Itanium's
/// `<source-name>`, Rust's legacy and v0 identifiers), so such a word is
/// in the raw name; an unmangled name is the query itself. None when the
/// query has no such word: every symbol must then be demangled.
pub fn required_word(query: &str) -> Option<&str> {
    let query = strip_version(query);
    let mut words: Vec<&str> = Vec::new();
    let (mut depth, mut start) = (0usize, None);
    for (i, c) in query.char_indices().chain([(query.len(), ' ')]) {
        if c.is_ascii_alphanumeric() || c == '_' {
            start.get_or_insert(i);
            continue;
        }
        if let Some(st) = start.take()
            && depth == 0
        {
            words.push(&query[st..i]);
        }
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    words
        .into_iter()
        .filter(|w| {
            w.len() >= 3
                && !w.starts_with(|c: char| c.is_ascii_digit())
                && !NOT_SPELLED.iter().any(|n| n.contains(w))
        })
        .rev()
        .max_by_key(|w| w.len())
}

/// Whether `hay` contains `needle`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let Some(&first) = needle.first() else {
        return true;
    };
    hay.windows(needle.len())
        .any(|w| w[0] == first && w == needle)
}

/// Removes whitespace, so `foo(int, char)` matches `foo(int,char)`.
fn squeeze(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

/// The `n` names closest to `query` by edit distance, best first.
pub fn closest<'a>(query: &str, names: impl IntoIterator<Item = &'a str>, n: usize) -> Vec<String> {
    // The edit distance costs len(query) × len(name); a name far longer or
    // shorter than the query is no suggestion, and a huge one (a target's
    // symbols are its own to choose) must not cost seconds.
    let near = |name: &str| name.len() <= query.len().saturating_mul(4).max(64);
    let mut scored: Vec<(usize, &str)> = names
        .into_iter()
        .filter(|name| near(name))
        .map(|name| (strsim::levenshtein(query, name), name))
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored
        .into_iter()
        .take(n)
        .map(|(_, s)| s.to_string())
        .collect()
}

/// Whether `name` is close enough to `query` to be what was meant: at most
/// one edit in four characters (at least one).
pub fn is_close(query: &str, name: &str) -> bool {
    strsim::levenshtein(query, name) <= (query.chars().count() / 4).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_close_name_is_one_edit_in_four_characters() {
        assert!(is_close("triger", "trigger"));
        assert!(is_close("handle_reqest", "handle_request"));
        assert!(!is_close("f", "main"));
        assert!(!is_close("trigger", "f_slow"));
    }

    #[test]
    fn plain_c_names_match_exactly() {
        let n = SymbolName::new("handle_request");
        assert_eq!(n.matches("handle_request"), Some(NameMatch::Exact));
        assert_eq!(n.matches("handle"), None);
    }

    #[test]
    fn cpp_names_match_with_or_without_parameters() {
        let n = SymbolName::new("_ZN2ns6Worker6handleEi");
        assert_eq!(n.demangled, "ns::Worker::handle(int)");
        assert_eq!(n.matches("ns::Worker::handle(int)"), Some(NameMatch::Exact));
        assert_eq!(n.matches("ns::Worker::handle"), Some(NameMatch::Exact));
        assert_eq!(
            n.matches("ns::Worker::handle( int )"),
            Some(NameMatch::Exact)
        );
        assert_eq!(n.matches("_ZN2ns6Worker6handleEi"), Some(NameMatch::Exact));
        assert_eq!(n.matches("ns::Worker::handle(long)"), None);
        assert_eq!(n.short(), "ns::Worker::handle");
    }

    #[test]
    fn rust_legacy_names_match_with_or_without_hash() {
        let n = SymbolName::new("_ZN8my_crate6server14handle_request17h0123456789abcdefE");
        assert_eq!(n.demangled, "my_crate::server::handle_request");
        assert_eq!(
            n.matches("my_crate::server::handle_request"),
            Some(NameMatch::Exact)
        );
        assert_eq!(
            n.matches("my_crate::server::handle_request::h0123456789abcdef"),
            Some(NameMatch::Exact)
        );
        assert_eq!(n.short(), "my_crate::server::handle_request");
    }

    #[test]
    fn rust_v0_names_match() {
        // From the v0 mangling RFC's examples: `foo::bar` in crate `foo`
        // with disambiguator.
        let n = SymbolName::new("_RNvCs1234_7mycrate3foo");
        assert_eq!(n.matches("mycrate::foo"), Some(NameMatch::Exact));
    }

    #[test]
    fn clones_are_recognized_but_not_exact() {
        for raw in [
            "f.constprop.0",
            "f.isra.0",
            "f.part.0",
            "f.cold",
            "f.cold.1",
            "f.lto_priv.0",
        ] {
            let n = SymbolName::new(raw);
            assert_eq!(n.matches("f"), Some(NameMatch::Clone), "{raw}");
            assert_eq!(n.matches(raw), Some(NameMatch::Exact), "{raw}");
        }
        let n = SymbolName::new("_ZN2ns6Worker6handleEi.constprop.0");
        assert_eq!(n.matches("ns::Worker::handle"), Some(NameMatch::Clone));
    }

    #[test]
    fn versioned_names_match_their_base() {
        assert_eq!(strip_version("foo@@V2"), "foo");
        assert_eq!(
            SymbolName::new("foo@V1").matches("foo"),
            Some(NameMatch::Exact)
        );
        // A versioned query picks that version only.
        let v2 = SymbolName::new("foo@@V2");
        assert_eq!(v2.matches("foo@@V2"), Some(NameMatch::Exact));
        assert_eq!(v2.matches("foo@V1"), None);
        assert_eq!(SymbolName::new("foo@V1").matches("foo@@V2"), None);
        // An unversioned symbol (from .symtab) still matches a versioned query.
        assert_eq!(
            SymbolName::new("foo").matches("foo@@V2"),
            Some(NameMatch::Exact)
        );
    }

    #[test]
    fn the_required_word_is_spelled_out_in_every_matching_raw_name() {
        let cases = [
            ("handle_request", "handle_request", Some("handle_request")),
            (
                "ns::Worker::handle(int)",
                "_ZN2ns6Worker6handleEi",
                Some("Worker"),
            ),
            (
                "v8::internal::Heap::CollectGarbage(v8::internal::AllocationSpace, v8::internal::GarbageCollectionReason, v8::GCCallbackFlags)",
                "_ZN2v88internal4Heap14CollectGarbageENS0_15AllocationSpaceENS0_23GarbageCollectionReasonENS_15GCCallbackFlagsE",
                Some("GarbageCollectionReason"),
            ),
            (
                "Heap::CollectGarbage(v8",
                "_ZN2v88internal4Heap14CollectGarbageE",
                Some("CollectGarbage"),
            ),
            ("foo@@GLIBC_2.14", "foo", Some("foo")),
            (
                "my_crate::server::handle_request::h0123456789abcdef",
                "_ZN8my_crate6server14handle_request17h0123456789abcdefE",
                Some("h0123456789abcdef"),
            ),
            ("mycrate::foo", "_RNvCs1234_7mycrate3foo", Some("mycrate")),
            ("f.constprop.0", "f.constprop.0", Some("constprop")),
        ];
        for (query, raw, want) in cases {
            let got = required_word(query);
            assert_eq!(got, want, "{query}");
            if let Some(w) = got {
                assert!(contains(raw.as_bytes(), w.as_bytes()), "{query}: {raw}");
            }
        }
        // Nothing the mangled name is sure to spell out: search everything.
        for query in [
            "std::string::operator+=",
            "f",
            "{lambda()#1}::operator()",
            "x[abi:cxx11]",
        ] {
            assert_eq!(required_word(query), None, "{query}");
        }
        // Parts of words the mangling abbreviates are not used either.
        assert_eq!(required_word("(unsig"), None);
    }

    #[test]
    fn closest_names_by_edit_distance() {
        let names = ["handle_request", "handle_reply", "main", "parse_request"];
        assert_eq!(
            closest("handle_requst", names, 2),
            ["handle_request", "handle_reply"]
        );
    }
}
