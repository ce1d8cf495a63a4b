//! The fleet report's requests: LISTs of the prefix, and GETs through a
//! local cache, `DIR/.store/BUCKET/<key>`. Every object the uploader
//! writes is immutable (docs/upload.md, "Key layout"), so an object in the
//! cache is never asked for again: a second report into the same DIR makes
//! LISTs only, and GETs what is new.

use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    sync::Mutex,
};

use futures_util::{StreamExt as _, TryStreamExt as _};
use object_store::{ObjectStoreExt as _, path::Path as StorePath};
use serde::Serialize;

use crate::{
    error::Failure,
    output::{index::create_exclusive, write},
    upload::store::{Refusal, Store},
};

pub use crate::output::runs::STORE_DIR;

/// GETs in flight at once.
const PARALLEL_GETS: usize = 8;

/// What the report asked of the store, and what the cache answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// LIST calls (one per prefix listed; the store pages each by 1,000 keys).
    pub lists: u64,
    /// Keys the LISTs returned.
    pub listed: u64,
    /// Objects fetched (GET), and their bytes.
    pub fetched: u64,
    pub fetched_bytes: u64,
    /// Objects read from the cache instead, and their bytes.
    pub cached: u64,
    pub cached_bytes: u64,
}

/// The store and the cache in front of it.
pub struct Fetcher {
    store: Store,
    /// `DIR/.store/BUCKET`.
    root: PathBuf,
    stats: Mutex<Stats>,
}

impl Fetcher {
    /// Makes `dir/.store/BUCKET` (mode 0700).
    pub fn new(store: Store, dir: &Path) -> Result<Self, Failure> {
        let root = write::ensure_dir(dir, &Path::new(STORE_DIR).join(&store.bucket))
            .map_err(|e| local_failure(&dir.join(STORE_DIR), e))?;
        Ok(Fetcher {
            store,
            root,
            stats: Mutex::new(Stats::default()),
        })
    }

    pub fn stats(&self) -> Stats {
        *self.stats.lock().expect("stats")
    }

    /// Every key below `prefix` (`""`: the whole bucket), with its size in bytes.
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, Failure> {
        let at = (!prefix.is_empty()).then(|| StorePath::from(prefix));
        let listed: Vec<_> = self
            .store
            .client
            .list(at.as_ref())
            .map_ok(|m| (m.location.to_string(), m.size))
            .try_collect()
            .await
            .map_err(|e| self.refused(&format!("list {prefix:?}"), &e))?;
        let mut s = self.stats.lock().expect("stats");
        s.lists += 1;
        s.listed += listed.len() as u64;
        Ok(listed)
    }

    /// The cached copy of each key, fetched when the cache lacks it (or holds
    /// another size than `bytes`, the listed size when known), in order.
    pub async fn get_all(&self, keys: Vec<(String, Option<u64>)>) -> Result<Vec<PathBuf>, Failure> {
        futures_util::stream::iter(keys)
            .map(|(key, bytes)| async move { self.get(&key, bytes).await })
            .buffered(PARALLEL_GETS)
            .try_collect()
            .await
    }

    /// The cached copy of `key` ([`Self::get_all`]).
    pub async fn get(&self, key: &str, bytes: Option<u64>) -> Result<PathBuf, Failure> {
        let path = self.root.join(key);
        if let Ok(m) = fs::symlink_metadata(&path)
            && m.is_file()
            && bytes.is_none_or(|b| b == m.len())
        {
            let mut s = self.stats.lock().expect("stats");
            s.cached += 1;
            s.cached_bytes += m.len();
            return Ok(path);
        }
        let parent = Path::new(key).parent().unwrap_or(Path::new(""));
        let dir = write::ensure_dir(&self.root, parent).map_err(|e| local_failure(&path, e))?;
        let name = path.file_name().expect("a key's name").to_string_lossy();
        let tmp = dir.join(format!(".{name}.part.{}", std::process::id()));
        let _ = fs::remove_file(&tmp);
        let got = self.download(key, &tmp).await;
        let got = got.and_then(|n| {
            fs::rename(&tmp, &path).map_err(|e| local_failure(&path, e))?;
            Ok(n)
        });
        if got.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        let n = got?;
        let mut s = self.stats.lock().expect("stats");
        s.fetched += 1;
        s.fetched_bytes += n;
        Ok(path)
    }

    /// GETs `key` into the new file `tmp`; returns its size in bytes.
    async fn download(&self, key: &str, tmp: &Path) -> Result<u64, Failure> {
        let what = || format!("fetch {key}");
        let got = self
            .store
            .client
            .get(&StorePath::from(key))
            .await
            .map_err(|e| self.refused(&what(), &e))?;
        let mut file = create_exclusive(tmp).map_err(|e| local_failure(tmp, e))?;
        let mut body = got.into_stream();
        let mut n = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| self.refused(&what(), &e))?;
            file.write_all(&chunk).map_err(|e| local_failure(tmp, e))?;
            n += chunk.len() as u64;
        }
        Ok(n)
    }

    /// One line for a refused request: exit code 3 when the bucket, the
    /// credentials or the permissions are wrong (the environment), 4 for an
    /// outage or anything else (a runtime failure).
    fn refused(&self, what: &str, e: &object_store::Error) -> Failure {
        let r = Refusal::of(e);
        let advice = match r {
            Refusal::Unreachable => {
                "the store cannot be reached; check AWS_ENDPOINT_URL and the network, and try again"
            }
            Refusal::Denied => {
                "these credentials may not read this bucket or prefix; grant s3:ListBucket and s3:GetObject"
            }
            _ if matches!(e, object_store::Error::NotFound { .. }) => {
                "a listed object is gone; was the prefix cleaned up while the report ran?"
            }
            _ => r.advice(),
        };
        let message = format!(
            "cannot {what} in {}: {advice} ({})",
            self.store.url,
            detail(e)
        );
        match r {
            Refusal::NoBucket | Refusal::Credentials | Refusal::Denied => {
                Failure::environment(message)
            }
            _ => Failure::runtime(message),
        }
    }
}

/// The S3 error code of a refusal (`<Code>NoSuchBucket</Code>`), else the
/// error's text on one line, cut to 200 characters.
fn detail(e: &object_store::Error) -> String {
    let text: String = e
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let code = text
        .split_once("<Code>")
        .and_then(|(_, rest)| rest.split_once("</Code>"))
        .map(|(code, _)| code);
    match code {
        Some(c) => format!("S3 error {c}"),
        None if text.chars().count() > 200 => text.chars().take(200).chain("…".chars()).collect(),
        None => text,
    }
}

/// A local file of DIR could not be written: exit code 4.
pub fn local_failure(path: &Path, e: std::io::Error) -> Failure {
    Failure::runtime(format!("cannot write {}: {e}", path.display()))
}
