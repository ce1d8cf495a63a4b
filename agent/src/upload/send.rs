//! Sending one file to one key, and knowing the store has it byte for byte
//! (docs/upload.md, "Key layout"): the file is hashed first (SHA-256, and
//! the MD5 the store's ETag must equal), then sent in one PUT, or in parts
//! of [`PART_BYTES`] when larger, so memory stays bounded by one part.

use std::{
    fs::File,
    io::{self, Read},
    os::unix::fs::FileExt,
};

use md5::{Digest as _, Md5};
use object_store::{
    Attribute, AttributeValue, Attributes, ObjectStoreExt, PutMultipartOptions, PutOptions,
    PutPayload, path::Path as Key,
};
use sha2::Sha256;

use super::store::Store;

/// Size of each part of a multipart upload, bytes; a file up to this size
/// goes in one PUT. S3 parts are at least 5 MiB, except the last (AWS S3
/// API reference, UploadPart); 8 MiB is what the AWS CLI uses
/// (`multipart_chunksize`).
pub const PART_BYTES: u64 = 8 << 20;

/// What a file is, to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    pub bytes: u64,
    /// Lowercase hex.
    pub sha256: String,
    /// The ETag S3 gives this content sent as [`send`] sends it: the hex
    /// MD5 of the whole (one PUT), or the hex MD5 of the parts' binary
    /// MD5s followed by `-<parts>` (multipart).
    pub etag: String,
}

/// A failed send: the store's error, or the local file's.
#[derive(Debug)]
pub enum SendError {
    Store(object_store::Error),
    Local(io::Error),
    /// The store answered, but its ETag is not the content's.
    Mismatch {
        want: String,
        got: Option<String>,
    },
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Store(e) => write!(f, "{e}"),
            SendError::Local(e) => write!(f, "reading the local file: {e}"),
            SendError::Mismatch { want, got } => {
                write!(f, "the store's ETag {got:?} is not the content's {want:?}")
            }
        }
    }
}

/// Hashes `file` as [`send`] will send it.
pub fn digest(file: &File) -> io::Result<Digest> {
    digest_at(file, 0, u64::MAX)
}

/// Hashes at most `len` bytes of `file` from offset `start` (bytes), as
/// [`send_at`] will send them: a piece of a file that grows (a kept JIT
/// map, docs/upload.md "JIT files"). [`Digest::bytes`] is less than `len`
/// when the file ends first.
pub fn digest_at(file: &File, start: u64, len: u64) -> io::Result<Digest> {
    let mut sha = Sha256::new();
    let mut part_md5s = Vec::new();
    let mut bytes = 0;
    let mut buf = vec![0; 1 << 20];
    loop {
        let mut part = Md5::new();
        let mut in_part = 0;
        while in_part < PART_BYTES && bytes < len {
            let want = (buf.len() as u64)
                .min(PART_BYTES - in_part)
                .min(len - bytes) as usize;
            let n = file.read_at(&mut buf[..want], start + bytes)?;
            if n == 0 {
                break;
            }
            sha.update(&buf[..n]);
            part.update(&buf[..n]);
            in_part += n as u64;
            bytes += n as u64;
        }
        if in_part == 0 && !part_md5s.is_empty() {
            break;
        }
        part_md5s.push(part.finalize().to_vec());
        if in_part < PART_BYTES {
            break;
        }
    }
    Ok(Digest {
        bytes,
        sha256: hex(&sha.finalize()),
        etag: etag_of(bytes, &part_md5s),
    })
}

/// The S3 ETag of content whose parts of [`PART_BYTES`] have these MD5s.
fn etag_of(bytes: u64, part_md5s: &[Vec<u8>]) -> String {
    if bytes <= PART_BYTES {
        return hex(&part_md5s[0]);
    }
    let mut all = Md5::new();
    for m in part_md5s {
        all.update(m);
    }
    format!("{}-{}", hex(&all.finalize()), part_md5s.len())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// An ETag as S3 sends it, without its quotes.
fn bare(etag: &str) -> &str {
    etag.trim_matches('"')
}

/// Does the store hold `key` with exactly `d`'s content (size and ETag)?
/// For a send whose answer was lost, and an agent resuming an older run.
pub async fn holds(store: &Store, key: &str, d: &Digest) -> Result<bool, object_store::Error> {
    match store.client.head(&Key::from(key)).await {
        Ok(meta) => Ok(meta.size == d.bytes && meta.e_tag.as_deref().map(bare) == Some(&d.etag)),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

fn attributes(d: &Digest) -> Attributes {
    let mut a = Attributes::new();
    a.insert(
        Attribute::Metadata("sha256".into()),
        AttributeValue::from(d.sha256.clone()),
    );
    a
}

/// Sends `file` (hashed as `d`) to `key`, and checks the store's ETag.
pub async fn send(store: &Store, key: &str, file: &File, d: &Digest) -> Result<(), SendError> {
    send_at(store, key, file, 0, d).await
}

/// Sends the `d.bytes` bytes of `file` from offset `start` (hashed as `d`
/// by [`digest_at`]) to `key`, and checks the store's ETag.
pub async fn send_at(
    store: &Store,
    key: &str,
    file: &File,
    start: u64,
    d: &Digest,
) -> Result<(), SendError> {
    let key = Key::from(key);
    let etag = if d.bytes <= PART_BYTES {
        let body = read_part(file, start, d.bytes).map_err(SendError::Local)?;
        let opts = PutOptions {
            attributes: attributes(d),
            ..Default::default()
        };
        let r = store
            .client
            .put_opts(&key, PutPayload::from(body), opts)
            .await;
        r.map_err(SendError::Store)?.e_tag
    } else {
        send_parts(store, &key, file, start, d).await?
    };
    match etag.as_deref().map(bare) {
        Some(got) if got == d.etag => Ok(()),
        got => Err(SendError::Mismatch {
            want: d.etag.clone(),
            got: got.map(str::to_string),
        }),
    }
}

async fn send_parts(
    store: &Store,
    key: &Key,
    file: &File,
    start: u64,
    d: &Digest,
) -> Result<Option<String>, SendError> {
    let opts = PutMultipartOptions {
        attributes: attributes(d),
        ..Default::default()
    };
    let mut up = store
        .client
        .put_multipart_opts(key, opts)
        .await
        .map_err(SendError::Store)?;
    let mut at = 0;
    while at < d.bytes {
        let n = PART_BYTES.min(d.bytes - at);
        let part = match read_part(file, start + at, n) {
            Ok(p) => p,
            Err(e) => {
                let _ = up.abort().await;
                return Err(SendError::Local(e));
            }
        };
        if let Err(e) = up.put_part(PutPayload::from(part)).await {
            let _ = up.abort().await;
            return Err(SendError::Store(e));
        }
        at += n;
    }
    Ok(up.complete().await.map_err(SendError::Store)?.e_tag)
}

fn read_part(file: &File, at: u64, n: u64) -> io::Result<Vec<u8>> {
    let mut buf = vec![0; n as usize];
    file.read_exact_at(&mut buf, at)?;
    Ok(buf)
}

/// Sends bytes held in memory (an index line, `clock.json`, an object
/// reference): always one PUT.
pub async fn send_bytes(store: &Store, key: &str, body: &[u8]) -> Result<Digest, SendError> {
    let d = digest_bytes(body);
    let opts = PutOptions {
        attributes: attributes(&d),
        ..Default::default()
    };
    let r = store
        .client
        .put_opts(&Key::from(key), PutPayload::from(body.to_vec()), opts)
        .await
        .map_err(SendError::Store)?;
    match r.e_tag.as_deref().map(bare) {
        Some(got) if got == d.etag => Ok(d),
        got => Err(SendError::Mismatch {
            want: d.etag.clone(),
            got: got.map(str::to_string),
        }),
    }
}

/// [`Digest`] of bytes in memory (at most [`PART_BYTES`]).
pub fn digest_bytes(body: &[u8]) -> Digest {
    Digest {
        bytes: body.len() as u64,
        sha256: hex(&Sha256::digest(body)),
        etag: hex(&Md5::digest(body)),
    }
}

/// Reads a small local file whole (`run.json`), at most `max` bytes.
pub fn read_small(path: &std::path::Path, max: u64) -> io::Result<Vec<u8>> {
    let mut v = Vec::new();
    File::open(path)?.take(max).read_to_end(&mut v)?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn digest_of(bytes: &[u8]) -> Digest {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        digest(&f).unwrap()
    }

    #[test]
    fn small_content_has_the_md5_as_etag() {
        // RFC 1321's test vector, and SHA-256 of "abc" (FIPS 180-2).
        let d = digest_of(b"abc");
        assert_eq!(d.etag, "900150983cd24fb0d6963f7d28e17f72");
        assert_eq!(
            d.sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(d, digest_bytes(b"abc"));
        assert_eq!(digest_of(b"").etag, "d41d8cd98f00b204e9800998ecf8427e");
    }

    #[test]
    fn multipart_content_has_the_md5_of_its_parts_md5s() {
        let body: Vec<u8> = (0..PART_BYTES * 2 + 5).map(|i| (i % 251) as u8).collect();
        let d = digest_of(&body);
        let parts: Vec<Vec<u8>> = body
            .chunks(PART_BYTES as usize)
            .map(|c| Md5::digest(c).to_vec())
            .collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(d.etag, format!("{}-3", hex(&Md5::digest(parts.concat()))));
        assert_eq!(d.bytes, body.len() as u64);
        assert_eq!(d.sha256, hex(&Sha256::digest(&body)));
        // Exactly one part's worth is still one PUT.
        let one = digest_of(&body[..PART_BYTES as usize]);
        assert!(!one.etag.contains('-'));
    }

    #[test]
    fn a_piece_of_a_file_hashes_as_that_content_alone() {
        let body: Vec<u8> = (0..PART_BYTES * 2 + 5).map(|i| (i % 251) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&body).unwrap();
        let start = 7;
        let len = PART_BYTES + 3;
        let piece = &body[start as usize..(start + len) as usize];
        assert_eq!(digest_at(&f, start, len).unwrap(), digest_of(piece));
        assert_eq!(digest_at(&f, 3, 4).unwrap(), digest_bytes(&body[3..7]));
        // Past the end: what there is.
        let tail = digest_at(&f, body.len() as u64 - 2, 10).unwrap();
        assert_eq!(tail, digest_bytes(&body[body.len() - 2..]));
        assert_eq!(digest_at(&f, 0, u64::MAX).unwrap(), digest_of(&body));
    }
}
