//! What each snapshot needs of its directory's `.jit/` in the store
//! (docs/upload.md, "JIT files"): its lines of `.jit/kept.jsonl`, and the
//! pieces of the kept copies those lines reach that no earlier snapshot
//! sent.
//!
//! A kept copy only grows (capture/jit_maps.rs), and each snapshot covers
//! a prefix of it. So a copy goes to the store as immutable chunks, one
//! per length `kept.jsonl` names beyond the last: bytes `end..bytes`, `end`
//! being the largest length named by an earlier line. The chunks are a
//! function of `kept.jsonl` alone, so a restarted agent, reading it again
//! from its start, plans the same keys, and the store holds each byte of a
//! copy once however many snapshots it covers.

use std::{
    collections::HashMap,
    fs::File,
    io::{self, BufRead as _, BufReader, Seek as _, SeekFrom},
    path::Path,
};

use crate::output::jit_kept::{DIR, INDEX, KeptLine};

/// Bytes `start..end` of the copy `.jit/<file>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub file: String,
    pub start: u64,
    pub end: u64,
}

/// What one snapshot takes to the store.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ForSnapshot {
    /// Its lines of `kept.jsonl`, byte for byte, each with its `\n`.
    pub lines: String,
    /// The chunks to send before them, in `kept.jsonl` order: the ones its
    /// lines reach, and any an earlier snapshot never indexed planned.
    pub chunks: Vec<Chunk>,
}

/// One index directory's `.jit/kept.jsonl`, read as it grows.
#[derive(Debug, Default)]
pub struct KeptCursor {
    /// Where the next unread line starts, bytes.
    offset: u64,
    /// Number of the next line, from 1.
    line: u64,
    /// The end of the chunks planned so far, per copy.
    ends: HashMap<String, u64>,
    /// Chunks planned and not taken, with the line that planned each.
    chunks: Vec<(u64, Chunk)>,
    /// Snapshots not taken: their lines' text, and the number of their
    /// last line.
    snapshots: HashMap<String, (String, u64)>,
}

impl KeptCursor {
    /// Reads the complete lines `dir/.jit/kept.jsonl` gained since the
    /// last call; a directory without one has nothing.
    pub fn read(&mut self, dir: &Path) -> io::Result<()> {
        let mut f = match File::open(dir.join(DIR).join(INDEX)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut r = BufReader::new(f);
        let mut text = String::new();
        while r.read_line(&mut text)? > 0 && text.ends_with('\n') {
            self.offset += text.len() as u64;
            self.add(&std::mem::take(&mut text));
        }
        Ok(())
    }

    /// One complete line of `kept.jsonl`, with its `\n`. A line that does
    /// not parse is skipped, as the report skips it.
    pub fn add(&mut self, text: &str) {
        self.line = self.line.max(1);
        let n = self.line;
        self.line += 1;
        let Some(l) = KeptLine::parse(text.trim_end()) else {
            return;
        };
        let end = self.ends.entry(l.file.clone()).or_default();
        if l.bytes > *end {
            let chunk = Chunk {
                file: l.file.clone(),
                start: *end,
                end: l.bytes,
            };
            *end = l.bytes;
            self.chunks.push((n, chunk));
        }
        let s = self.snapshots.entry(l.snapshot).or_default();
        s.0.push_str(text);
        s.1 = n;
    }

    /// What `snapshot` needs: None when it kept nothing (no JIT file, or
    /// its lines not read yet). It stays planned until [`Self::taken`].
    pub fn pending(&self, snapshot: &str) -> Option<ForSnapshot> {
        let (lines, last) = self.snapshots.get(snapshot)?;
        let chunks = self
            .chunks
            .iter()
            .take_while(|(n, _)| n <= last)
            .map(|(_, c)| c.clone())
            .collect();
        Some(ForSnapshot {
            lines: lines.clone(),
            chunks,
        })
    }

    /// `snapshot`'s index line is in the store, and with it what
    /// [`Self::pending`] gave: forgotten.
    pub fn taken(&mut self, snapshot: &str) {
        if let Some((_, last)) = self.snapshots.remove(snapshot) {
            let upto = self.chunks.partition_point(|(n, _)| *n <= last);
            self.chunks.drain(..upto);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(snapshot: &str, file: &str, bytes: u64) -> String {
        format!(
            "{{\"snapshot\":\"{snapshot}\",\"pid\":7,\"kind\":\"perf_map\",\"file\":\"{file}\",\
             \"bytes\":{bytes},\"origin\":\"/tmp/perf-1.map\"}}\n"
        )
    }

    fn chunk(file: &str, start: u64, end: u64) -> Chunk {
        Chunk {
            file: file.into(),
            start,
            end,
        }
    }

    /// What `snapshot` needs, then marked as sent.
    fn take(c: &mut KeptCursor, snapshot: &str) -> Option<ForSnapshot> {
        let got = c.pending(snapshot);
        c.taken(snapshot);
        got
    }

    #[test]
    fn each_byte_of_a_copy_is_planned_once_whatever_the_snapshots() {
        let mut c = KeptCursor::default();
        let lines = [
            line("perf.data.1", "perf-7.map", 100),
            line("perf.data.1", "jit-7.dump", 40),
            line("perf.data.2", "perf-7.map", 100),
            line("perf.data.2", "jit-7.dump", 90),
            // Indexed by no line of snapshots.jsonl (the agent was killed
            // between the two): its chunk goes with the next snapshot.
            line("perf.data.3", "perf-7.map", 150),
            "not json\n".to_string(),
            line("perf.data.4", "perf-7.map", 170),
        ];
        for l in &lines {
            c.add(l);
        }
        // Asked again after a failed send: the same.
        assert_eq!(c.pending("perf.data.1"), c.pending("perf.data.1"));
        let one = take(&mut c, "perf.data.1").unwrap();
        assert_eq!(one.lines, format!("{}{}", lines[0], lines[1]));
        assert_eq!(
            one.chunks,
            [chunk("perf-7.map", 0, 100), chunk("jit-7.dump", 0, 40)]
        );
        // The map did not grow for snapshot 2: only the dump's new bytes.
        let two = take(&mut c, "perf.data.2").unwrap();
        assert_eq!(two.chunks, [chunk("jit-7.dump", 40, 90)]);
        assert_eq!(two.lines, format!("{}{}", lines[2], lines[3]));
        let four = take(&mut c, "perf.data.4").unwrap();
        assert_eq!(
            four.chunks,
            [chunk("perf-7.map", 100, 150), chunk("perf-7.map", 150, 170)]
        );
        assert_eq!(four.lines, lines[6]);
        assert_eq!(take(&mut c, "perf.data.4"), None);
        assert_eq!(take(&mut c, "perf.data.9"), None);
    }

    /// A second agent reads `kept.jsonl` again from the start, in other
    /// pieces: the same chunks, so the same keys.
    #[test]
    fn reading_again_in_other_pieces_plans_the_same_chunks() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join(DIR)).unwrap();
        let index = tmp.path().join(DIR).join(INDEX);
        let all: String = [
            ("perf.data.1", 10),
            ("perf.data.2", 25),
            ("perf.data.3", 25),
        ]
        .iter()
        .map(|(s, b)| line(s, "perf-7.map", *b))
        .collect();
        let cut = all.find("perf.data.2").unwrap() + 5;
        std::fs::write(&index, &all[..cut]).unwrap();
        let mut first = KeptCursor::default();
        first.read(tmp.path()).unwrap();
        assert_eq!(
            take(&mut first, "perf.data.2"),
            None,
            "half a line is not read"
        );
        std::fs::write(&index, &all).unwrap();
        first.read(tmp.path()).unwrap();
        let mut again = KeptCursor::default();
        again.read(tmp.path()).unwrap();
        for s in ["perf.data.1", "perf.data.2", "perf.data.3"] {
            assert_eq!(take(&mut first, s), take(&mut again, s), "{s}");
        }
        let mut none = KeptCursor::default();
        none.read(&tmp.path().join("nothing")).unwrap();
        assert_eq!(take(&mut none, "perf.data.1"), None);
    }
}
