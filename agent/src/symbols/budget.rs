//! Budgets for reading a target's files, which the target controls: a size
//! budget per ELF or debug file, and a time budget for one symbol
//! resolution as a whole (`--symbol`, `--address`, `mt-agent symbols`).
//!
//! * Size: 1 GiB per file by default (`MT_AGENT_MAX_FILE_MIB`), and at
//!   most 8 times a file's size read from it (at least 64 MiB, at most the
//!   size budget). Files are read on demand with `pread(2)` (headers, symbol
//!   and string tables, the function's bytes), not mapped, so that a target
//!   that truncates its file while the agent reads it gives a short read,
//!   not a SIGBUS. What the parser reads is kept in memory, so the cap on
//!   bytes read bounds that memory, also for a malformed file whose headers
//!   make the parser read the same bytes over and over. The file size bounds
//!   the reads that are not kept: the CRC-32 check of a `.gnu_debuglink`
//!   debug file (whole), and a symbol table's scan (its string table, then
//!   its entries 64 KiB at a time, docs/symbol-lookup.md).
//!   1 GiB holds libc, libstdc++, libLLVM (112 MiB) and the debug files of
//!   most programs; a larger file (the 2 GiB debug file of a browser) is
//!   skipped at once with a warning naming it.
//! * Time: 10 s by default (`MT_AGENT_SYMBOLS_SECONDS`), several times what
//!   resolving a symbol in a process that maps libLLVM takes
//!   (docs/safe-open.md, "Reading, not mapping"); one that has not ended
//!   after 10 s is facing something unusual (ten million symbols, many
//!   large libraries) and stops with one line naming the file it was reading. The budget is
//!   checked between reads, so it does not interrupt a read the kernel
//!   blocks on.
//!
//! The time budget is per thread: [`start`] arms it, [`over`] is checked in
//! the loops that read and match symbols, and the loops stop early once it
//! has passed; the caller then turns [`failure`] into its error.

use std::{
    cell::RefCell,
    fs::File,
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::error::Failure;

/// Default size budget per file, MiB.
pub const DEFAULT_FILE_MIB: u64 = 1024;
/// Default time budget of one symbol resolution, seconds.
pub const DEFAULT_SECONDS: u64 = 10;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// The size budget per file, bytes.
pub fn file_bytes() -> u64 {
    env_u64("MT_AGENT_MAX_FILE_MIB")
        .unwrap_or(DEFAULT_FILE_MIB)
        .saturating_mul(1 << 20)
}

/// The time budget of one resolution.
pub fn time() -> Duration {
    Duration::from_secs(env_u64("MT_AGENT_SYMBOLS_SECONDS").unwrap_or(DEFAULT_SECONDS))
}

#[derive(Default)]
struct State {
    deadline: Option<Instant>,
    budget: Duration,
    /// The file being read when the deadline passed.
    over_at: Option<String>,
    /// Files skipped because of the size budget: one line each.
    skipped: Vec<String>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Disarms the budget when dropped.
pub struct TimeBudget {
    outer: bool,
}

impl Drop for TimeBudget {
    fn drop(&mut self) {
        if self.outer {
            STATE.with(|s| *s.borrow_mut() = State::default());
        }
    }
}

/// Arms the time budget for this thread (a nested call keeps the outer
/// deadline) and clears what the last resolution recorded.
pub fn start() -> TimeBudget {
    start_with(time())
}

/// [`start`] with an explicit budget (tests).
pub fn start_with(budget: Duration) -> TimeBudget {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        if s.deadline.is_some() {
            return TimeBudget { outer: false };
        }
        *s = State {
            deadline: Some(Instant::now() + budget),
            budget,
            ..State::default()
        };
        TimeBudget { outer: true }
    })
}

/// Whether the time budget has passed; the first time it has, records
/// `file` as the one being read.
pub fn over(file: &Path) -> bool {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        match s.deadline {
            Some(d) if Instant::now() >= d => {
                if s.over_at.is_none() {
                    s.over_at = Some(file.display().to_string());
                }
                true
            }
            _ => false,
        }
    })
}

/// Records a file skipped for its size: `label` and the reason.
pub fn skipped(line: String) {
    log::warn!("{line}");
    STATE.with(|s| s.borrow_mut().skipped.push(line));
}

/// The size-budget lines recorded since [`start`].
pub fn skipped_lines() -> Vec<String> {
    STATE.with(|s| s.borrow().skipped.clone())
}

/// The error for a resolution that ran past its time budget (exit code 4),
/// or None.
pub fn failure() -> Option<Failure> {
    STATE.with(|s| {
        let s = s.borrow();
        let file = s.over_at.as_ref()?;
        Some(Failure::runtime(format!(
            "symbol resolution passed its {} s time budget while reading {file}; \
             give --object to search fewer files, or raise MT_AGENT_SYMBOLS_SECONDS",
            s.budget.as_secs_f64()
        )))
    })
}

/// What a [`Budgeted`] reader reads: a file (with `pread`, so a shared fd's
/// position never matters) or bytes already in memory (tests, fuzzing).
#[derive(Debug)]
pub enum Source {
    File(File),
    Bytes(Vec<u8>),
}

impl Source {
    /// Reads at `offset` (like `pread(2)`); 0 at or past the end.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        use std::os::unix::fs::FileExt as _;
        match self {
            Source::File(f) => f.read_at(buf, offset),
            Source::Bytes(b) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(b.len());
                let n = buf.len().min(b.len() - start);
                buf[..n].copy_from_slice(&b[start..start + n]);
                Ok(n)
            }
        }
    }
}

/// A `Read + Seek` view of a [`Source`] of `len` bytes (its size when it was
/// opened: a file that grows is not read further), which fails once `budget`
/// bytes have been read in all: a malformed file whose headers make a parser
/// read the same bytes again and again cannot make it read without end.
#[derive(Debug)]
pub struct Budgeted {
    src: std::sync::Arc<Source>,
    len: u64,
    pos: u64,
    read: u64,
    budget: u64,
    /// Names the file in the warning given when the budget runs out.
    label: PathBuf,
    spent: bool,
}

impl Budgeted {
    pub fn new(src: std::sync::Arc<Source>, len: u64, budget: u64, label: PathBuf) -> Self {
        Self {
            src,
            len,
            pos: 0,
            read: 0,
            budget,
            label,
            spent: false,
        }
    }
}

impl io::Read for Budgeted {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.len.saturating_sub(self.pos);
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if self.read.saturating_add(want as u64) > self.budget {
            if !std::mem::replace(&mut self.spent, true) {
                skipped(format!(
                    "{}: {} read, its read budget; the rest of it is ignored",
                    self.label.display(),
                    crate::sys::safe_open::human_size(self.read)
                ));
            }
            return Err(io::Error::other("read budget spent"));
        }
        let n = self.src.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        self.read += n as u64;
        Ok(n)
    }
}

impl io::Seek for Budgeted {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        let pos = match to {
            io::SeekFrom::Start(p) => Some(p),
            io::SeekFrom::End(d) => self.len.checked_add_signed(d),
            io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = pos.ok_or_else(|| io::Error::other("seek out of range"))?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_names_the_file_and_is_cleared_on_drop() {
        {
            let _a = start_with(Duration::ZERO);
            // A nested start keeps the outer deadline.
            let _b = start_with(Duration::from_secs(3600));
            assert!(over(Path::new("/first")));
            assert!(over(Path::new("/second")));
            let f = failure().unwrap();
            assert!(f.message.contains("while reading /first"), "{}", f.message);
        }
        assert!(!over(Path::new("/x")));
        assert!(failure().is_none());
    }

    #[test]
    fn an_unarmed_budget_never_passes() {
        assert!(!over(Path::new("/x")));
        let _a = start_with(Duration::from_secs(3600));
        assert!(!over(Path::new("/x")));
        assert!(failure().is_none());
    }

    #[test]
    fn a_budgeted_reader_stops_at_its_budget_and_the_length_seen() {
        use std::io::{Read as _, Seek as _, SeekFrom};
        let src = std::sync::Arc::new(Source::Bytes(b"0123456789".to_vec()));
        let mut r = Budgeted::new(src.clone(), 8, 12, PathBuf::from("x"));
        let mut buf = [0u8; 16];
        assert_eq!(r.read(&mut buf).unwrap(), 8, "stops at the length seen");
        assert_eq!(r.seek(SeekFrom::End(-2)).unwrap(), 6);
        assert_eq!(r.read(&mut buf[..2]).unwrap(), 2);
        r.seek(SeekFrom::Start(0)).unwrap();
        assert!(r.read(&mut buf[..4]).is_err(), "8 + 2 + 4 > 12");
        assert!(r.seek(SeekFrom::Current(-100)).is_err());
    }
}
