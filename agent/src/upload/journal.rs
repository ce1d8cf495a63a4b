//! A run's upload state, `OUT/.upload/` (docs/upload.md, "Local state"):
//! the keys the store confirmed, the run's clock pair, and a `done` mark
//! once nothing is left to send. Created with the first upload, so a run
//! that wrote nothing stays empty.

use std::{
    collections::HashMap,
    fs::{self, File, OpenOptions},
    io::{self, BufRead, BufReader, Write},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

/// The state directory's name in OUT.
pub const DIR: &str = ".upload";
const CONFIRMED: &str = "confirmed.jsonl";
const CLOCK: &str = "clock.json";
const DONE: &str = "done";
const LOCK: &str = "lock";

/// `clock.json`: CLOCK_REALTIME and CLOCK_MONOTONIC read together, ns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clock {
    pub realtime_ns: u64,
    pub monotonic_ns: u64,
    pub host: String,
    pub run: String,
    /// The store the run uploads to, so that only an agent uploading there
    /// resumes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

impl Clock {
    /// Now, for `host`'s run `run`.
    pub fn now(host: &str, run: &str, url: &str) -> Clock {
        let read = |id| {
            nix::time::clock_gettime(id).map_or(0, |t| {
                t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
            })
        };
        Clock {
            realtime_ns: read(nix::time::ClockId::CLOCK_REALTIME),
            monotonic_ns: read(nix::time::ClockId::CLOCK_MONOTONIC),
            host: host.into(),
            run: run.into(),
            url: Some(url.into()),
        }
    }
}

/// One confirmed key.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Line {
    key: String,
    bytes: u64,
    sha256: String,
}

/// The journal of one run.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    /// key -> SHA-256 the store confirmed.
    confirmed: HashMap<String, String>,
    file: Option<File>,
    /// Held while this agent uploads the run (`flock`).
    _lock: Option<nix::fcntl::Flock<File>>,
}

impl Journal {
    /// The journal of the run in `out`, read back if it exists.
    pub fn open(out: &Path) -> Journal {
        let dir = out.join(DIR);
        let mut confirmed = HashMap::new();
        if let Ok(f) = File::open(dir.join(CONFIRMED)) {
            for line in BufReader::new(f).lines().map_while(Result::ok) {
                if let Ok(l) = serde_json::from_str::<Line>(&line) {
                    confirmed.insert(l.key, l.sha256);
                }
            }
        }
        Journal {
            dir,
            confirmed,
            file: None,
            _lock: None,
        }
    }

    /// Takes the run's lock; false if another agent holds it.
    pub fn lock(&mut self) -> io::Result<bool> {
        self.ensure_dir()?;
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.dir.join(LOCK))?;
        match nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(l) => {
                self._lock = Some(l);
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    fn ensure_dir(&self) -> io::Result<()> {
        match fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    }

    /// The SHA-256 the store confirmed for `key`, if it did.
    pub fn confirmed(&self, key: &str) -> Option<&str> {
        self.confirmed.get(key).map(String::as_str)
    }

    /// Records that the store confirmed `key`; one `write()` per line.
    pub fn confirm(&mut self, key: &str, bytes: u64, sha256: &str) -> io::Result<()> {
        if self.file.is_none() {
            self.ensure_dir()?;
            self.file = Some(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(self.dir.join(CONFIRMED))?,
            );
        }
        let line = Line {
            key: key.into(),
            bytes,
            sha256: sha256.into(),
        };
        let mut buf = serde_json::to_vec(&line).map_err(io::Error::other)?;
        buf.push(b'\n');
        self.file.as_mut().expect("opened").write_all(&buf)?;
        self.confirmed.insert(key.into(), sha256.into());
        Ok(())
    }

    /// The run's clock pair: the one written before, or `now` (then written).
    pub fn clock(&self, now: impl FnOnce() -> Clock) -> io::Result<Clock> {
        let path = self.dir.join(CLOCK);
        if let Ok(text) = fs::read(&path)
            && let Ok(c) = serde_json::from_slice(&text)
        {
            return Ok(c);
        }
        self.ensure_dir()?;
        let c = now();
        crate::output::write::replace(&path, &serde_json::to_vec(&c).map_err(io::Error::other)?)?;
        Ok(c)
    }

    /// The clock pair written before, if any.
    pub fn clock_if_any(&self) -> Option<Clock> {
        serde_json::from_slice(&fs::read(self.dir.join(CLOCK)).ok()?).ok()
    }

    /// Has a clock pair: the run started uploading once.
    pub fn started(out: &Path) -> bool {
        out.join(DIR).join(CLOCK).is_file()
    }

    /// Everything was sent (written when a run ends with nothing pending).
    pub fn is_done(out: &Path) -> bool {
        out.join(DIR).join(DONE).exists()
    }

    pub fn mark_done(&self) -> io::Result<()> {
        self.ensure_dir()?;
        crate::output::write::replace(&self.dir.join(DONE), b"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn confirmed_keys_and_the_clock_survive_a_restart() {
        let tmp = tempfile::tempdir().unwrap();
        let mut j = Journal::open(tmp.path());
        assert!(j.lock().unwrap());
        // A second agent on the same run is kept out.
        assert!(!Journal::open(tmp.path()).lock().unwrap());
        j.confirm("p/h/r/index/00000001.json", 10, "ab").unwrap();
        let c = j.clock(|| Clock::now("h", "r", "s3://b/p")).unwrap();
        drop(j);
        let j = Journal::open(tmp.path());
        assert_eq!(j.confirmed("p/h/r/index/00000001.json"), Some("ab"));
        assert_eq!(j.confirmed("other"), None);
        assert_eq!(j.clock(|| panic!("read back, not made")).unwrap(), c);
        assert!(Journal::started(tmp.path()) && !Journal::is_done(tmp.path()));
        j.mark_done().unwrap();
        assert!(Journal::is_done(tmp.path()));
    }
}
