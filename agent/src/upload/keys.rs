//! The store's key layout (docs/upload.md, "Key layout"): where each file of
//! a run goes, and what a listed key is. Pure: no I/O, so the uploader and
//! the fleet report agree by construction.

use std::path::{Component, Path};

/// Digits of an index line's number in its key (`index/00000042.json`), so
/// that keys list in line order.
const LINE_DIGITS: usize = 8;

/// Directory of the shared build-id objects, below the prefix.
pub const DEBUG_DIR: &str = ".debug";

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
