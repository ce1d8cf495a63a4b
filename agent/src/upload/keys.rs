//! The store's key layout (docs/upload.md, "Key layout"): where each file of
//! a run goes, and what a listed key is. Pure: no I/O, so the uploader and
//! the fleet report agree by construction.

use std::path::{Component, Path};

/// Digits of an index line's number in its key (`index/00000042.json`), so
/// that keys list in line order.
const LINE_DIGITS: usize = 8;

/// Directory of the shared build-id objects, below the prefix.
pub const DEBUG_DIR: &str = ".debug";

/// Directory, below an index directory's key, of what its `.jit/` keeps
/// (docs/upload.md, "JIT files").
const JIT_DIR: &str = "jit";
/// Suffix of a snapshot's kept lines (`jit/<snapshot>.jsonl`).
const JIT_LINES_SUFFIX: &str = ".jsonl";
/// Digits of each offset in a chunk's key (`000000000000-000000113190`):
/// a kept copy stops at 256 MiB (capture/jit_maps.rs), 9 digits.
const OFFSET_DIGITS: usize = 12;

/// One run's place in the store: `PREFIX/HOST/RUN/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunKey {
    /// The URL's path, without leading or trailing `/` (may be empty).
    pub prefix: String,
    pub host: String,
    pub run: String,
}

/// What a key below the prefix names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    Clock {
        run: RunKey,
    },
    RunFile {
        run: RunKey,
    },
    /// `REL/perf.data.*`; `rel` is "" or ends without `/`.
    Snapshot {
        run: RunKey,
        rel: String,
        file: String,
    },
    /// `REL/index/<line>.json`, line from 1.
    IndexLine {
        run: RunKey,
        rel: String,
        line: u64,
    },
    ObjectRef {
        run: RunKey,
        id: String,
    },
    /// `REL/jit/<snapshot>.jsonl`: the lines of `REL/.jit/kept.jsonl` for
    /// that snapshot.
    JitLines {
        run: RunKey,
        rel: String,
        snapshot: String,
    },
    /// `REL/jit/<file>/<start>-<end>`: bytes `start..end` of
    /// `REL/.jit/<file>`.
    JitChunk {
        run: RunKey,
        rel: String,
        file: String,
        start: u64,
        end: u64,
    },
    /// `.debug/<id>/elf`.
    DebugObject {
        id: String,
    },
}

/// Joins key segments with `/`, skipping empty ones.
pub fn join_key(parts: &[&str]) -> String {
    join(parts)
}

fn join(parts: &[&str]) -> String {
    parts
        .iter()
        .filter(|p| !p.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("/")
}

/// Is `s` usable as one key segment: not empty, no `/`, not `.`-led (so it
/// cannot be `.debug`, `.` or `..`), no control characters.
pub fn plain_segment(s: &str) -> bool {
    !s.is_empty() && !s.contains('/') && !s.starts_with('.') && !s.chars().any(char::is_control)
}

/// `rel` (an index directory inside the run) as key text: its normal
/// components joined by `/`; None if it has any other component.
pub fn rel_text(rel: &Path) -> Option<String> {
    let mut parts = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str().filter(|s| plain_segment(s))?),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(parts.join("/"))
}

impl RunKey {
    /// `PREFIX/HOST/RUN`.
    pub fn base(&self) -> String {
        join(&[&self.prefix, &self.host, &self.run])
    }

    pub fn clock(&self) -> String {
        join(&[&self.base(), "clock.json"])
    }

    pub fn run_file(&self) -> String {
        join(&[&self.base(), "run.json"])
    }

    pub fn snapshot(&self, rel: &str, file: &str) -> String {
        join(&[&self.base(), rel, file])
    }

    pub fn index_line(&self, rel: &str, line: u64) -> String {
        join(&[
            &self.base(),
            rel,
            "index",
            &format!("{line:0LINE_DIGITS$}.json"),
        ])
    }

    pub fn object_ref(&self, id: &str) -> String {
        join(&[&self.base(), "objects", &format!("{id}.json")])
    }

    /// `REL/jit/<snapshot>.jsonl`.
    pub fn jit_lines(&self, rel: &str, snapshot: &str) -> String {
        join(&[
            &self.base(),
            rel,
            JIT_DIR,
            &format!("{snapshot}{JIT_LINES_SUFFIX}"),
        ])
    }

    /// `REL/jit/<file>/<start>-<end>`, offsets in bytes.
    pub fn jit_chunk(&self, rel: &str, file: &str, start: u64, end: u64) -> String {
        join(&[
            &self.base(),
            rel,
            JIT_DIR,
            file,
            &format!("{start:0OFFSET_DIGITS$}-{end:0OFFSET_DIGITS$}"),
        ])
    }
}

/// `<start>-<end>` of a chunk's key, each of [`OFFSET_DIGITS`] digits,
/// start before end.
fn parse_span(name: &str) -> Option<(u64, u64)> {
    let (a, b) = name.split_once('-')?;
    let num = |s: &str| {
        (s.len() == OFFSET_DIGITS && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let (start, end) = (num(a)?, num(b)?);
    (start < end).then_some((start, end))
}

/// `PREFIX/.debug/<id>/elf`.
pub fn debug_object(prefix: &str, id: &str) -> String {
    join(&[prefix, DEBUG_DIR, id, "elf"])
}

/// `PREFIX/HOST/` (or `PREFIX/` with no host): what a report lists.
pub fn list_prefix(prefix: &str, host: Option<&str>) -> String {
    let mut s = join(&[prefix, host.unwrap_or("")]);
    if !s.is_empty() {
        s.push('/');
    }
    s
}

/// Reads a listed key back; None for a key of no known shape (someone
/// else's object under the prefix).
pub fn parse(prefix: &str, key: &str) -> Option<Key> {
    let rest = if prefix.is_empty() {
        key
    } else {
        key.strip_prefix(prefix)?.strip_prefix('/')?
    };
    let parts: Vec<&str> = rest.split('/').collect();
    if let [DEBUG_DIR, id, "elf"] = parts[..] {
        return plain_segment(id).then(|| Key::DebugObject { id: id.into() });
    }
    let [host, run, tail @ ..] = &parts[..] else {
        return None;
    };
    if !plain_segment(host) || !plain_segment(run) || tail.is_empty() {
        return None;
    }
    let run = RunKey {
        prefix: prefix.into(),
        host: (*host).into(),
        run: (*run).into(),
    };
    parse_in_run(run, tail)
}

fn parse_in_run(run: RunKey, tail: &[&str]) -> Option<Key> {
    match tail {
        ["clock.json"] => return Some(Key::Clock { run }),
        ["run.json"] => return Some(Key::RunFile { run }),
        ["objects", name] => {
            let id = name.strip_suffix(".json").filter(|id| plain_segment(id))?;
            return Some(Key::ObjectRef { run, id: id.into() });
        }
        _ => {}
    }
    let (last, dirs) = tail.split_last()?;
    if !dirs.iter().all(|d| plain_segment(d)) {
        return None;
    }
    if let Some(k) = parse_jit(&run, dirs, last) {
        return Some(k);
    }
    if let Some((index, rel)) = dirs.split_last().filter(|(d, _)| **d == "index") {
        let _ = index;
        let n = last.strip_suffix(".json")?;
        if n.len() != LINE_DIGITS || !n.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        return Some(Key::IndexLine {
            run,
            rel: rel.join("/"),
            line: n.parse().ok().filter(|&l| l > 0)?,
        });
    }
    last.starts_with("perf.data.").then(|| Key::Snapshot {
        run,
        rel: dirs.join("/"),
        file: (*last).into(),
    })
}

/// A `jit/` key below an index directory's (`dirs` and `last` as in
/// [`parse_in_run`]).
fn parse_jit(run: &RunKey, dirs: &[&str], last: &str) -> Option<Key> {
    if let Some((&JIT_DIR, rel)) = dirs.split_last()
        && let Some(snapshot) = last.strip_suffix(JIT_LINES_SUFFIX)
        && snapshot.starts_with("perf.data.")
    {
        return Some(Key::JitLines {
            run: run.clone(),
            rel: rel.join("/"),
            snapshot: snapshot.into(),
        });
    }
    let [rel @ .., JIT_DIR, file] = dirs else {
        return None;
    };
    let (start, end) = parse_span(last)?;
    Some(Key::JitChunk {
        run: run.clone(),
        rel: rel.join("/"),
        file: (*file).into(),
        start,
        end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(prefix: &str) -> RunKey {
        RunKey {
            prefix: prefix.into(),
            host: "web-1".into(),
            run: "20261202-093000".into(),
        }
    }

    #[test]
    fn every_key_a_run_writes_parses_back_to_what_made_it() {
        for prefix in ["", "prod", "moments/prod"] {
            let r = run(prefix);
            let cases = [
                (r.clock(), Key::Clock { run: r.clone() }),
                (r.run_file(), Key::RunFile { run: r.clone() }),
                (
                    r.snapshot("api/4242", "perf.data.2026120209300012"),
                    Key::Snapshot {
                        run: r.clone(),
                        rel: "api/4242".into(),
                        file: "perf.data.2026120209300012".into(),
                    },
                ),
                (
                    r.snapshot("", "perf.data.2026120209300012"),
                    Key::Snapshot {
                        run: r.clone(),
                        rel: "".into(),
                        file: "perf.data.2026120209300012".into(),
                    },
                ),
                (
                    r.index_line("api", 42),
                    Key::IndexLine {
                        run: r.clone(),
                        rel: "api".into(),
                        line: 42,
                    },
                ),
                (
                    r.object_ref("47e88be1"),
                    Key::ObjectRef {
                        run: r.clone(),
                        id: "47e88be1".into(),
                    },
                ),
                (
                    r.jit_lines("api/4242", "perf.data.2026120209300012"),
                    Key::JitLines {
                        run: r.clone(),
                        rel: "api/4242".into(),
                        snapshot: "perf.data.2026120209300012".into(),
                    },
                ),
                (
                    r.jit_chunk("", "perf-4242.map", 0, 113190),
                    Key::JitChunk {
                        run: r.clone(),
                        rel: "".into(),
                        file: "perf-4242.map".into(),
                        start: 0,
                        end: 113190,
                    },
                ),
                (
                    r.jit_chunk("jit", "jit-7.dump", 5, 6),
                    Key::JitChunk {
                        run: r.clone(),
                        rel: "jit".into(),
                        file: "jit-7.dump".into(),
                        start: 5,
                        end: 6,
                    },
                ),
                (
                    r.snapshot("jit", "perf.data.1"),
                    Key::Snapshot {
                        run: r.clone(),
                        rel: "jit".into(),
                        file: "perf.data.1".into(),
                    },
                ),
                (
                    debug_object(prefix, "go-abc"),
                    Key::DebugObject {
                        id: "go-abc".into(),
                    },
                ),
            ];
            for (key, want) in cases {
                assert_eq!(parse(prefix, &key), Some(want), "{key}");
            }
        }
        assert_eq!(
            run("p").index_line("", 42),
            "p/web-1/20261202-093000/index/00000042.json"
        );
        assert_eq!(debug_object("", "ab"), ".debug/ab/elf");
        assert_eq!(
            run("p").jit_chunk("api", "perf-1.map", 10, 1234),
            "p/web-1/20261202-093000/api/jit/perf-1.map/000000000010-000000001234"
        );
    }

    #[test]
    fn keys_of_no_known_shape_and_other_prefixes_are_not_ours() {
        for key in [
            "other/web-1/r/clock.json",
            "prod/web-1/r/index/42.json",
            "prod/web-1/r/index/00000000.json",
            "prod/web-1/r/notes.txt",
            "prod/.hidden/r/clock.json",
            "prod/web-1/r/../clock.json",
            "prod/.debug/ab/elf.tmp",
            "prod/web-1",
            "prod/web-1/r/jit/perf-1.map/000000000010-000000000010",
            "prod/web-1/r/jit/perf-1.map/000000000020-000000000010",
            "prod/web-1/r/jit/perf-1.map/10-20",
            "prod/web-1/r/jit/perf-1.map/00000000001a-000000000020",
            "prod/web-1/r/jit/.x/000000000000-000000000020",
            "prod/web-1/r/jit/notes.jsonl",
        ] {
            assert_eq!(parse("prod", key), None, "{key}");
        }
    }

    #[test]
    fn rel_paths_become_key_text_only_when_plain() {
        assert_eq!(rel_text(Path::new("")).as_deref(), Some(""));
        assert_eq!(rel_text(Path::new("api/4242")).as_deref(), Some("api/4242"));
        assert_eq!(rel_text(Path::new("../x")), None);
        assert_eq!(rel_text(Path::new(".debug")), None);
        assert_eq!(list_prefix("prod", Some("web-1")), "prod/web-1/");
        assert_eq!(list_prefix("", None), "");
    }
}
