//! Opening the store an `s3://BUCKET/PREFIX` URL names, with the AWS tools'
//! variables (`object_store`'s `AmazonS3Builder::from_env`), and saying in
//! one line what a refusal means.

use std::{sync::Arc, time::Duration};

use object_store::{ObjectStore, aws::AmazonS3Builder};

use crate::error::Failure;

/// How long one request may take, connect included: a snapshot of tens of
/// MB on a slow link is sent in 8 MiB parts (`super::send::PART_BYTES`).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long connecting may take; a store that is down refuses at once on
/// loopback, and a black-holed one is given this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// An opened store: the client, and where in the bucket the keys go.
#[derive(Clone)]
pub struct Store {
    pub client: Arc<dyn ObjectStore>,
    pub bucket: String,
    /// The URL's path, without leading or trailing `/` (may be empty).
    pub prefix: String,
    /// The URL as given, for messages.
    pub url: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Store({})", self.url)
    }
}

/// Splits `s3://BUCKET/PREFIX`; a usage failure (exit 2) for anything else.
pub fn parse_url(url: &str) -> Result<(String, String), Failure> {
    let bad = |why: &str| {
        Failure::usage(format!(
            "bad upload URL {url:?}: {why}; give s3://BUCKET or s3://BUCKET/PREFIX"
        ))
    };
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| bad("only s3:// URLs are supported"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if !bucket_ok {
        return Err(bad(
            "the bucket name must be 3-63 lowercase letters, digits, '-' or '.'",
        ));
    }
    let prefix = prefix.trim_matches('/');
    if prefix.split('/').any(|s| s == "." || s == "..") || prefix.contains("//") {
        return Err(bad("the prefix has an empty, '.' or '..' segment"));
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

/// The environment, as far as the choice of credentials and transport
/// goes (so that the checks are pure).
#[derive(Debug, Default, Clone)]
pub struct Env {
    pub key_pair: bool,
    pub web_identity: bool,
    pub container: bool,
    /// `AWS_EC2_METADATA_DISABLED=false`: the instance's role (IMDS) may be asked.
    pub imds: bool,
    pub endpoint: Option<String>,
    pub allow_http: bool,
}

impl Env {
    pub fn read() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Env {
            key_pair: var("AWS_ACCESS_KEY_ID").is_some() && var("AWS_SECRET_ACCESS_KEY").is_some(),
            web_identity: var("AWS_WEB_IDENTITY_TOKEN_FILE").is_some()
                && var("AWS_ROLE_ARN").is_some(),
            container: var("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
                || var("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some(),
            imds: var("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("false")),
            endpoint: var("AWS_ENDPOINT_URL_S3").or_else(|| var("AWS_ENDPOINT_URL")),
            allow_http: var("AWS_ALLOW_HTTP").is_some_and(|v| v.eq_ignore_ascii_case("true")),
        }
    }
}

/// Refuses, before any request, what cannot work: no credentials, or an
/// `http://` endpoint without `AWS_ALLOW_HTTP=true`. Exit code 3 (the
/// environment lacks something).
pub fn check_env(env: &Env) -> Result<(), Failure> {
    if !(env.key_pair || env.web_identity || env.container || env.imds) {
        return Err(Failure::environment(
            "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or \
             AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN (a pod's web identity), or \
             AWS_EC2_METADATA_DISABLED=false to use the instance's role",
        ));
    }
    if let Some(e) = &env.endpoint
        && e.starts_with("http://")
        && !env.allow_http
    {
        return Err(Failure::environment(format!(
            "the S3 endpoint {e} is plain HTTP: credentials and moments would cross the \
             network unencrypted; use https://, or set AWS_ALLOW_HTTP=true on a trusted network"
        )));
    }
    Ok(())
}

/// Opens the store `url` names. No request is made.
pub fn open(url: &str) -> Result<Store, Failure> {
    let (bucket, prefix) = parse_url(url)?;
    check_env(&Env::read())?;
    use object_store::{ClientConfigKey as C, aws::AmazonS3ConfigKey as K};
    let secs = |d: Duration| format!("{}s", d.as_secs());
    // Retries are ours (`super::send`), with the pending count kept true.
    let retry = object_store::RetryConfig {
        max_retries: 0,
        ..Default::default()
    };
    let client = AmazonS3Builder::from_env()
        .with_bucket_name(&bucket)
        // Set key by key, so that the client settings from the AWS_*
        // variables (AWS_ALLOW_HTTP, proxies) stay.
        .with_config(K::Client(C::Timeout), secs(REQUEST_TIMEOUT))
        .with_config(K::Client(C::ConnectTimeout), secs(CONNECT_TIMEOUT))
        .with_retry(retry)
        .build()
        .map_err(|e| Failure::environment(format!("cannot use the store {url}: {e}")))?;
    Ok(Store {
        client: Arc::new(client),
        bucket,
        prefix,
        url: url.to_string(),
    })
}

/// Writes a small object below the prefix, reads it back and deletes it:
/// the store answers, the bucket exists, and these credentials may write
/// there. The key, `PREFIX/.mt-agent-check/HOST.PID`, is no run's
/// (`keys::parse` ignores it). A refused delete is not a failure (some
/// policies allow writing only); it is said in the Ok text.
pub async fn preflight(store: &Store, host: &str) -> Result<String, object_store::Error> {
    use object_store::{ObjectStoreExt as _, path::Path as Key};
    let name = format!("{host}.{}", std::process::id());
    let key = Key::from(super::keys::join_key(&[
        &store.prefix,
        ".mt-agent-check",
        &name,
    ]));
    // A listing first: a missing bucket is NoSuchBucket there, where a PUT
    // by an identity without admin rights gets AccessDenied (SeaweedFS).
    let under = Key::from(store.prefix.as_str());
    store.client.list_with_delimiter(Some(&under)).await?;
    let body = format!("mt-agent check from {host}\n");
    store
        .client
        .put(&key, body.clone().into_bytes().into())
        .await?;
    let back = store.client.get(&key).await?.bytes().await?;
    if back != body.as_bytes() {
        return Err(object_store::Error::Generic {
            store: "S3",
            source: "the object read back differs from the one written".into(),
        });
    }
    Ok(match store.client.delete(&key).await {
        Ok(()) => format!("{} can be written, read and listed", store.url),
        Err(e) => format!(
            "{} can be written and read; deleting the check object {key} was refused ({e})",
            store.url
        ),
    })
}

/// A store error in a few words: the S3 error code and message when the
/// store sent them (`<Code>…</Code><Message>…</Message>`), else the
/// error's first line.
pub fn short(e: &object_store::Error) -> String {
    let text = format!("{e:?}");
    let tag = |t: &str| {
        let open = format!("<{t}>");
        let from = text.find(&open)? + open.len();
        let len = text[from..].find(&format!("</{t}>"))?;
        Some(text[from..from + len].to_string())
    };
    match (tag("Code"), tag("Message")) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        (Some(c), None) => c,
        _ => e.to_string().lines().next().unwrap_or_default().to_string(),
    }
}

/// What a failed request means, for the one line a user sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The store could not be reached or answered 5xx: an outage.
    Unreachable,
    NoBucket,
    /// Unknown key, bad signature, expired token.
    Credentials,
    /// The identity may not write (or read) here.
    Denied,
    /// A quota, a full bucket, an object too large.
    Full,
    Other,
}

impl Refusal {
    /// Classifies an `object_store` error by its kind and the S3 error code
    /// its text carries (AWS S3 API reference, "Error responses").
    pub fn of(e: &object_store::Error) -> Refusal {
        let text = format!("{e:?} {e}");
        let has = |codes: &[&str]| codes.iter().any(|c| text.contains(c));
        if has(&["NoSuchBucket"]) {
            return Refusal::NoBucket;
        }
        if has(&[
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "ExpiredToken",
            "TokenRefreshRequired",
            "InvalidToken",
        ]) {
            return Refusal::Credentials;
        }
        let status = |codes: &[u16]| codes.iter().any(|c| text.contains(&format!("status: {c}")));
        if has(&["QuotaExceeded", "EntityTooLarge", "InsufficientStorage"]) || status(&[413, 507]) {
            return Refusal::Full;
        }
        let unreachable = [
            "error sending request",
            "connect",
            "Connect",
            "timed out",
            "Timeout",
            "SlowDown",
        ];
        match e {
            object_store::Error::PermissionDenied { .. } => Refusal::Denied,
            object_store::Error::Unauthenticated { .. } => Refusal::Credentials,
            _ if has(&["AccessDenied"]) => Refusal::Denied,
            _ if has(&unreachable) || status(&[500, 502, 503, 504]) => Refusal::Unreachable,
            _ => Refusal::Other,
        }
    }

    /// Refusals said once together: a refused key and a refused request
    /// (a HEAD's 403 has no body to tell them apart).
    pub fn same_kind(self, other: Refusal) -> bool {
        let class = |r| match r {
            Refusal::Credentials | Refusal::Denied => Refusal::Denied,
            r => r,
        };
        class(self) == class(other)
    }

    /// What it means and what to do, in words.
    pub fn advice(self) -> &'static str {
        match self {
            Refusal::Unreachable => {
                "the store cannot be reached; snapshots wait in OUT (within --max-disk) and are sent when it is back"
            }
            Refusal::NoBucket => "the bucket does not exist; create it, or fix the URL",
            Refusal::Credentials => {
                "the store refused the credentials (unknown key, bad secret or expired token); renew AWS_* credentials"
            }
            Refusal::Denied => {
                "the store refused these credentials here: they may not write to this bucket or \
                 prefix, or are no longer valid; grant s3:PutObject, GetObject and ListBucket, or \
                 renew them"
            }
            Refusal::Full => {
                "the store refused the object for space (a quota or a full bucket); free space or raise the quota"
            }
            Refusal::Other => "the store refused the request",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_split_into_bucket_and_prefix_or_refused() {
        assert_eq!(
            parse_url("s3://moments/prod").unwrap(),
            ("moments".into(), "prod".into())
        );
        assert_eq!(
            parse_url("s3://moments/a/b/").unwrap(),
            ("moments".into(), "a/b".into())
        );
        assert_eq!(
            parse_url("s3://moments").unwrap(),
            ("moments".into(), "".into())
        );
        for bad in [
            "moments/prod",
            "gs://x/y",
            "s3://",
            "s3://UPPER/x",
            "s3://ab",
            "s3://b-1/a/../c",
            "s3://b-1/a//c",
        ] {
            let f = parse_url(bad).unwrap_err();
            assert_eq!(f.code, crate::error::ExitCode::Usage, "{bad}");
            assert!(f.message.contains("s3://BUCKET"), "{}", f.message);
        }
    }

    #[test]
    fn refusals_are_told_by_the_s3_code_or_the_status_not_by_stray_digits() {
        let generic = |text: &str| object_store::Error::Generic {
            store: "S3",
            source: text.to_string().into(),
        };
        let cases = [
            // A port or a duration with 413 or 507 in it is no status.
            (
                "PUT http://127.0.0.1:15413/x in 2.507ms - error sending request",
                Refusal::Unreachable,
            ),
            ("Status { status: 507, body: None }", Refusal::Full),
            ("<Code>QuotaExceeded</Code>", Refusal::Full),
            ("<Code>NoSuchBucket</Code>", Refusal::NoBucket),
            ("<Code>ExpiredToken</Code>", Refusal::Credentials),
            ("Status { status: 503, body: None }", Refusal::Unreachable),
            ("something else", Refusal::Other),
        ];
        for (text, want) in cases {
            assert_eq!(Refusal::of(&generic(text)), want, "{text}");
        }
        assert!(Refusal::Credentials.same_kind(Refusal::Denied));
        assert!(!Refusal::Unreachable.same_kind(Refusal::Denied));
    }

    #[test]
    fn no_credentials_and_plain_http_are_refused_before_any_request() {
        let keys = Env {
            key_pair: true,
            ..Default::default()
        };
        assert!(check_env(&keys).is_ok());
        let f = check_env(&Env::default()).unwrap_err();
        assert!(f.message.starts_with("no S3 credentials"), "{}", f.message);
        let http = Env {
            endpoint: Some("http://127.0.0.1:8333".into()),
            ..keys.clone()
        };
        assert!(
            check_env(&http)
                .unwrap_err()
                .message
                .contains("AWS_ALLOW_HTTP=true")
        );
        assert!(
            check_env(&Env {
                allow_http: true,
                ..http
            })
            .is_ok()
        );
        let https = Env {
            endpoint: Some("https://s3.example".into()),
            ..keys
        };
        assert!(check_env(&https).is_ok());
    }
}
