//! A real S3 store on loopback for the upload tests: one SeaweedFS server
//! (`weed server`, master + volume + filer + S3 gateway in one process),
//! installed by `cargo xtask setup --with-test-deps` into
//! `target/seaweedfs-venv` (docs/dependencies.md, "SeaweedFS (tests)").
//!
//! * [`SeaweedFs::start`] gives the server its own temp dir (data, log,
//!   identities) and its own ports, waits until S3 answers and creates the
//!   bucket [`BUCKET`]. Nothing listens on a default port: each service's
//!   HTTP port and its gRPC port (HTTP + 10000) is chosen free, the
//!   Iceberg and Lance side servers are off (`-s3.port.iceberg=0`,
//!   `-s3.port.lance=0`), telemetry is off, and glog writes to the log
//!   file only (`-logtostderr`), not to `/tmp/weed.*`.
//! * Three identities ([`ADMIN`]: Admin, Read, Write, List, Tagging;
//!   [`WRITER`]: Read, Write, List, Tagging; [`READER`]: Read, List), as `AWS_*` variables for mt-agent
//!   ([`SeaweedFs::admin_env`], [`SeaweedFs::reader_env`]).
//! * Drop kills the whole process group with SIGKILL and waits for it
//!   (weed takes seconds on SIGTERM). [`SeaweedFs::stop`] is an outage;
//!   [`SeaweedFs::restart`] starts it again on the same dir and ports.
//! * An inspection client with the admin identity: [`SeaweedFs::list`],
//!   [`SeaweedFs::get`], [`SeaweedFs::head`], [`SeaweedFs::put`].
//! * [`SeaweedFs::requests`] counts the S3 requests the server served on
//!   [`BUCKET`], by type, from its Prometheus metrics (`-metricsPort`,
//!   counter `SeaweedFS_s3_request_total{type,code,bucket}`): independent of
//!   the agent. The counts include the inspection client's own requests, so
//!   take them before and after the part under test ([`Requests::since`])
//!   with no inspection in between. SeaweedFS counts a HEAD as a `GET`;
//!   [`Requests`] says how to tell them apart. Requests refused for their
//!   credentials are counted under bucket `""` ([`SeaweedFs::requests_on`]). They survive [`SeaweedFs::stop`]: the
//!   guard reads the counter just before the kill and carries it on.
//!   Readiness probes go to a second bucket ([`PROBE_BUCKET`]), not counted.
//!
//! If `weed` is not installed it panics with what is missing and how to
//! install it; it never skips.

use std::{
    collections::BTreeMap,
    fs,
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use futures_util::TryStreamExt;
use object_store::{
    ObjectMeta, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
    aws::{AmazonS3, AmazonS3Builder},
    path::Path as Key,
};
use tempfile::TempDir;

/// The bucket the tests write to.
pub const BUCKET: &str = "moments";
/// The bucket the readiness probe writes to (kept out of [`BUCKET`]'s
/// listings and request counts).
pub const PROBE_BUCKET: &str = "mt-harness-probe";
/// The region the identities sign for (SeaweedFS accepts any).
pub const REGION: &str = "us-east-1";
/// How long a start or restart may take until S3 answers.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// An S3 identity of the server's `-s3.config` file.
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    pub name: &'static str,
    pub access_key: &'static str,
    pub secret_key: &'static str,
    /// SeaweedFS actions (`Admin`, `Read`, `Write`, `List`, `Tagging`).
    pub actions: &'static [&'static str],
}

/// May do everything.
pub const ADMIN: Identity = Identity {
    name: "admin",
    access_key: "MTADMINACCESSKEY",
    secret_key: "mt-admin-secret-key",
    actions: &["Admin", "Read", "Write", "List", "Tagging"],
};

/// May read, write and list, but is no admin: what an agent gets in
/// production. (An admin's PUT creates a missing bucket even with
/// `-s3.autoCreateBucket=false` in some paths; a writer's never does.)
pub const WRITER: Identity = Identity {
    name: "writer",
    access_key: "MTWRITERACCESSKEY",
    secret_key: "mt-writer-secret-key",
    actions: &["Read", "Write", "List", "Tagging"],
};

/// May read and list, not write.
pub const READER: Identity = Identity {
    name: "reader",
    access_key: "MTREADERACCESSKEY",
    secret_key: "mt-reader-secret-key",
    actions: &["Read", "List"],
};

/// The server's ports. Each HTTP port's gRPC twin is `port + 10000`.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub master: u16,
    pub volume: u16,
    pub filer: u16,
    pub s3: u16,
    /// Prometheus metrics (HTTP only).
    pub metrics: u16,
}

/// The `weed` binary: `MT_WEED_BIN`, else `seaweedfs-venv/bin/weed` in the
/// target directory this executable was built in. Panics when missing.
pub fn weed_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("MT_WEED_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let found = exe
        .ancestors()
        .map(|d| d.join("seaweedfs-venv/bin/weed"))
        .find(|w| w.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "SeaweedFS is missing: no seaweedfs-venv/bin/weed in a parent of {} (nor MT_WEED_BIN); \
             install it with `cargo xtask setup --with-test-deps`",
            exe.display()
        )
    })
}

/// Whether nothing listens on 127.0.0.1:`port`.
fn port_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Five ports from 15000..22000 whose `+ 10000` twins (25000..32000) are
/// free too: both ranges are below Linux's ephemeral ports (32768+). The
/// start point depends on the pid so that test binaries running at once
/// try different ports first.
fn pick_ports() -> Ports {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id().wrapping_mul(7919) % 7000;
    let mut got = Vec::new();
    for _ in 0..7000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let p = 15000 + ((offset + n) % 7000) as u16;
        if port_free(p) && port_free(p + 10000) {
            got.push(p);
            if got.len() == 5 {
                return Ports {
                    master: got[0],
                    volume: got[1],
                    filer: got[2],
                    s3: got[3],
                    metrics: got[4],
                };
            }
        }
    }
    panic!("no 5 free ports (with free port+10000) in 127.0.0.1:15000..22000");
}

/// `s3.config` for [`ADMIN`], [`READER`] and [`WRITER`].
fn identities_json() -> String {
    identities_json_of(&[ADMIN, READER, WRITER])
}

/// `s3.config` for `ids`.
fn identities_json_of(ids: &[Identity]) -> String {
    let one = |i: &Identity| {
        serde_json::json!({
            "name": i.name,
            "credentials": [{"accessKey": i.access_key, "secretKey": i.secret_key}],
            "actions": i.actions,
        })
    };
    let all: Vec<serde_json::Value> = ids.iter().map(one).collect();
    serde_json::json!({"identities": all}).to_string()
}

/// A plain HTTP GET on loopback: the whole response, or None when nothing
/// answers within a second.
fn http_get(port: u16, path: &str) -> Option<String> {
    let addr = ("127.0.0.1", port);
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/").then_some(out)
}

/// S3 request counts of one bucket by type, as SeaweedFS counts them
/// (`SeaweedFS_s3_request_total{type}`, summed over status codes):
///
/// * `GET`: GETs *and HEADs* of objects (SeaweedFS counts a HEAD as a GET),
///   whatever their status;
/// * `GET_BODY`: GETs that sent an object's bytes
///   (`SeaweedFS_s3_time_to_first_byte_millisecond_count{type="GET"}`; a
///   HEAD or a 404 is not one), so HEADs and failed GETs are
///   `GET - GET_BODY`;
/// * `PUT`: single PUTs and multipart parts; `POST`: multipart create and
///   complete; `LIST`; `DELETE`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Requests(pub BTreeMap<String, u64>);

/// Every bucket's [`Requests`] (bucket `""`: requests refused before
/// SeaweedFS resolved a bucket, such as bad signatures).
type Counters = BTreeMap<String, Requests>;

impl Requests {
    /// The count of one type (0 when none was served).
    pub fn of(&self, kind: &str) -> u64 {
        self.0.get(kind).copied().unwrap_or(0)
    }

    /// GETs that sent an object's bytes.
    pub fn gets_with_body(&self) -> u64 {
        self.of("GET_BODY")
    }

    /// HEADs and GETs that sent no bytes (404s).
    pub fn heads_and_failed_gets(&self) -> u64 {
        self.of("GET").saturating_sub(self.of("GET_BODY"))
    }

    /// The requests served after `before` was taken.
    pub fn since(&self, before: &Requests) -> Requests {
        let d = self
            .0
            .iter()
            .map(|(k, v)| (k.clone(), v.saturating_sub(before.of(k))));
        Requests(d.filter(|(_, v)| *v > 0).collect())
    }

    fn add(&mut self, other: &Requests) {
        for (k, v) in &other.0 {
            *self.0.entry(k.clone()).or_default() += v;
        }
    }
}

fn add_all(to: &mut Counters, from: &Counters) {
    for (bucket, r) in from {
        to.entry(bucket.clone()).or_default().add(r);
    }
}

/// The [`Counters`] in a Prometheus text page of SeaweedFS.
pub fn parse_metrics(page: &str) -> Counters {
    let mut all = Counters::new();
    for line in page.lines() {
        let (kind_of, rest) = if let Some(r) = line.strip_prefix("SeaweedFS_s3_request_total{") {
            (None, r)
        } else if let Some(r) =
            line.strip_prefix("SeaweedFS_s3_time_to_first_byte_millisecond_count{")
        {
            (Some("GET_BODY"), r)
        } else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
        };
        let (Some(bucket), Some(kind)) = (label("bucket"), label("type")) else {
            continue;
        };
        let kind = kind_of.map_or(kind, str::to_string);
        let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        *all.entry(bucket).or_default().0.entry(kind).or_default() += n;
    }
    all
}

/// A running SeaweedFS server, killed (with its process group) on drop.
pub struct SeaweedFs {
    dir: TempDir,
    ports: Ports,
    child: Option<Child>,
    rt: tokio::runtime::Runtime,
    admin: AmazonS3,
    /// Counts carried over from before the last stop.
    carried: Counters,
    /// Counts when [`SeaweedFs::start`] returned (its own requests).
    baseline: Counters,
    /// How long the last start or restart took until S3 answered HTTP.
    answered_after: Duration,
    /// How long it took until S3 served a PUT and a GET.
    ready_after: Duration,
}

impl SeaweedFs {
    /// Starts a server in a fresh temp dir and creates [`BUCKET`].
    pub fn start() -> SeaweedFs {
        let weed = weed_bin();
        assert!(
            weed.is_file(),
            "SeaweedFS is missing: {} does not exist; install it with \
             `cargo xtask setup --with-test-deps`",
            weed.display()
        );
        let dir = tempfile::Builder::new()
            .prefix("mt-seaweedfs-")
            .tempdir()
            .expect("temp dir");
        fs::create_dir(dir.path().join("data")).expect("data dir");
        fs::write(dir.path().join("identities.json"), identities_json()).expect("identities");
        let ports = pick_ports();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let admin = client(ports.s3, &ADMIN, BUCKET);
        let mut s = SeaweedFs {
            dir,
            ports,
            child: None,
            rt,
            admin,
            carried: Counters::new(),
            baseline: Counters::new(),
            answered_after: Duration::ZERO,
            ready_after: Duration::ZERO,
        };
        s.launch(true);
        s.baseline = s.counters();
        s
    }

    /// Kills the server (SIGKILL to its process group) and waits for it: an
    /// outage. The data dir stays. Does nothing when it is not running.
    pub fn stop(&mut self) {
        if self.child.is_none() {
            return;
        }
        if let Some(page) = http_get(self.ports.metrics, "/metrics") {
            add_all(&mut self.carried, &parse_metrics(&page));
        }
        self.kill();
    }

    /// Stops the server if it runs and starts it again on the same data dir
    /// and ports; returns once S3 answers and serves what was written.
    pub fn restart(&mut self) {
        self.stop();
        self.launch(false);
    }

    /// Restarts the server knowing only `ids` (on the same data and
    /// ports): a credential that is gone stands for one that expired.
    pub fn restart_with_identities(&mut self, ids: &[Identity]) {
        self.stop();
        let path = self.dir.path().join("identities.json");
        fs::write(path, identities_json_of(ids)).expect("identities");
        self.launch(false);
    }

    /// Whether the server process is running (not stopped).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// How long the last start or restart took until the S3 port answered
    /// HTTP at all (any status).
    pub fn answered_after(&self) -> Duration {
        self.answered_after
    }

    /// How long the last start or restart took until S3 served a PUT and a
    /// GET (on the first start: with the buckets created).
    pub fn ready_after(&self) -> Duration {
        self.ready_after
    }

    pub fn ports(&self) -> Ports {
        self.ports
    }

    /// The temp dir: `data/` (the server's `-dir`), `weed.log`,
    /// `identities.json`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log (stdout and stderr of every start).
    pub fn log(&self) -> PathBuf {
        self.dir.path().join("weed.log")
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// `http://127.0.0.1:PORT`, the S3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.s3)
    }

    /// `s3://BUCKET/prefix`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{}", prefix.trim_start_matches('/'))
    }

    /// The `AWS_*` variables that make mt-agent use `id` on this server.
    pub fn env(&self, id: &Identity) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", id.access_key.to_string()),
            ("AWS_SECRET_ACCESS_KEY", id.secret_key.to_string()),
            ("AWS_REGION", REGION.to_string()),
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// [`SeaweedFs::env`] for [`ADMIN`].
    pub fn admin_env(&self) -> Vec<(String, String)> {
        self.env(&ADMIN)
    }

    /// [`SeaweedFs::env`] for [`READER`].
    pub fn reader_env(&self) -> Vec<(String, String)> {
        self.env(&READER)
    }

    /// An object_store client for `bucket` as `id` (few retries, 10 s).
    pub fn client(&self, id: &Identity, bucket: &str) -> AmazonS3 {
        client(self.ports.s3, id, bucket)
    }

    /// Runs a future on the guard's runtime (current-thread tokio).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// Every key under `prefix` in [`BUCKET`] with its size in bytes, sorted.
    pub fn list(&self, prefix: &str) -> Vec<(String, u64)> {
        let p = Key::from(prefix);
        let metas: Vec<ObjectMeta> = self
            .block_on(self.admin.list(Some(&p)).try_collect())
            .unwrap_or_else(|e| panic!("list {prefix:?}: {e}"));
        let mut out: Vec<(String, u64)> = metas
            .into_iter()
            .map(|m| (m.location.to_string(), m.size))
            .collect();
        out.sort();
        out
    }

    /// The bytes of `key` in [`BUCKET`]; panics when it is not there.
    pub fn get(&self, key: &str) -> Vec<u8> {
        let k = Key::from(key);
        let fetch = async { self.admin.get(&k).await?.bytes().await };
        self.block_on(fetch)
            .unwrap_or_else(|e| panic!("get {key:?}: {e}"))
            .to_vec()
    }

    /// `key`'s metadata (size, ETag), or None when it is not there.
    pub fn head(&self, key: &str) -> Option<ObjectMeta> {
        match self.block_on(self.admin.head(&Key::from(key))) {
            Ok(m) => Some(m),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => panic!("head {key:?}: {e}"),
        }
    }

    /// Writes `key` in [`BUCKET`] as the admin; returns its ETag.
    pub fn put(&self, key: &str, bytes: &[u8]) -> Option<String> {
        let payload = PutPayload::from(bytes.to_vec());
        self.block_on(self.admin.put(&Key::from(key), payload))
            .unwrap_or_else(|e| panic!("put {key:?}: {e}"))
            .e_tag
    }

    /// S3 requests served on [`BUCKET`] since [`SeaweedFs::start`]
    /// returned, by type. Panics when the server runs and its metrics do
    /// not answer.
    pub fn requests(&self) -> Requests {
        self.requests_on(BUCKET)
    }

    /// [`SeaweedFs::requests`] for any bucket; `""` counts the requests
    /// refused before a bucket was resolved (bad or unknown credentials,
    /// and a read-only identity's writes).
    pub fn requests_on(&self, bucket: &str) -> Requests {
        let c = self.counters();
        let now = c.get(bucket).cloned().unwrap_or_default();
        now.since(&self.baseline.get(bucket).cloned().unwrap_or_default())
    }

    fn counters(&self) -> Counters {
        let mut c = self.carried.clone();
        if self.child.is_some() {
            add_all(&mut c, &parse_metrics(&self.metrics()));
        }
        c
    }

    /// The server's Prometheus page (`/metrics` on the metrics port).
    pub fn metrics(&self) -> String {
        let port = self.ports.metrics;
        http_get(port, "/metrics")
            .unwrap_or_else(|| panic!("SeaweedFS metrics on 127.0.0.1:{port} do not answer"))
    }

    /// The `weed server` command line.
    fn command(&self) -> Command {
        let d = self.dir.path();
        let p = self.ports;
        let mut c = Command::new(weed_bin());
        c.arg("-logtostderr").arg("server");
        let args = [
            format!("-dir={}", d.join("data").display()),
            "-ip=127.0.0.1".into(),
            "-ip.bind=127.0.0.1".into(),
            format!("-master.port={}", p.master),
            format!("-master.port.grpc={}", p.master + 10000),
            format!("-volume.port={}", p.volume),
            format!("-volume.port.grpc={}", p.volume + 10000),
            format!("-filer.port={}", p.filer),
            format!("-filer.port.grpc={}", p.filer + 10000),
            format!("-filer.localSocket={}", d.join("filer.sock").display()),
            "-s3".into(),
            format!("-s3.port={}", p.s3),
            format!("-s3.port.grpc={}", p.s3 + 10000),
            format!("-s3.localSocket={}", d.join("s3.sock").display()),
            format!("-s3.config={}", d.join("identities.json").display()),
            // As on AWS, a write to a missing bucket is refused (SeaweedFS
            // creates it for an admin identity by default).
            "-s3.autoCreateBucket=false".into(),
            "-s3.port.iceberg=0".into(),
            "-s3.port.lance=0".into(),
            format!("-metricsPort={}", p.metrics),
            "-master.telemetry=false".into(),
            // One master: its election need not take 10 s (the default).
            // With hashicorp's raft a restart answered in 2.3 s in 4 runs
            // of 4, with the default raft in 2 of 3 (7 s in the third: the
            // volume server's first heartbeat lost the race with the
            // election, and the next comes 5 s later).
            "-master.electionTimeout=1s".into(),
            "-master.raftHashicorp".into(),
            // Each bucket is a collection that grows 7 volumes at its first
            // write; the default limit of 8 volumes leaves the second bucket
            // one and a third none. Volumes are sparse files.
            "-volume.max=100".into(),
            "-master.volumeSizeLimitMB=256".into(),
        ];
        c.args(args);
        c
    }

    /// Spawns the server and waits until S3 answers; on the first start,
    /// creates the buckets first.
    fn launch(&mut self, first: bool) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .expect("weed.log");
        let mut cmd = self.command();
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .process_group(0);
        let t0 = Instant::now();
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", weed_bin().display()));
        self.child = Some(child);
        self.wait(t0, "S3 to answer HTTP", |s| {
            http_get(s.ports.s3, "/").is_some()
        });
        self.answered_after = t0.elapsed();
        if first {
            self.wait(t0, "the buckets to be created", |s| s.create_buckets());
        }
        self.wait(t0, "S3 to serve a PUT and a GET", |s| s.probe());
        self.ready_after = t0.elapsed();
    }

    /// Polls `ready` every 100 ms until [`READY_TIMEOUT`] after `t0`;
    /// panics with the log's tail when it never holds or weed exits.
    fn wait(&mut self, t0: Instant, what: &str, ready: impl Fn(&SeaweedFs) -> bool) {
        loop {
            if ready(self) {
                return;
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                panic!(
                    "weed server exited ({status}) waiting for {what}; its log ends:\n{}",
                    self.log_tail(40)
                );
            }
            if t0.elapsed() > READY_TIMEOUT {
                panic!(
                    "SeaweedFS did not get ready in {READY_TIMEOUT:?} (waiting for {what}); its log ends:\n{}",
                    self.log_tail(40)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Creates [`BUCKET`] and [`PROBE_BUCKET`] with `weed shell`
    /// (object_store has no CreateBucket); true when both exist.
    fn create_buckets(&self) -> bool {
        let script =
            format!("s3.bucket.create -name {BUCKET}\ns3.bucket.create -name {PROBE_BUCKET}\n");
        let mut shell = Command::new(weed_bin());
        shell
            .args(["-logtostderr", "shell"])
            .arg(format!("-master=127.0.0.1:{}", self.ports.master))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let Ok(mut child) = shell.spawn() else {
            return false;
        };
        let _ = child
            .stdin
            .take()
            .map(|mut i| i.write_all(script.as_bytes()));
        let _ = child.wait();
        self.bucket_listable(BUCKET) && self.bucket_listable(PROBE_BUCKET)
    }

    fn bucket_listable(&self, bucket: &str) -> bool {
        let c = client(self.ports.s3, &ADMIN, bucket);
        self.block_on(c.list_with_delimiter(None)).is_ok()
    }

    /// Whether a PUT and a GET of a probe object in [`PROBE_BUCKET`] work
    /// (filer, master and volume server all up).
    fn probe(&self) -> bool {
        let c = client(self.ports.s3, &ADMIN, PROBE_BUCKET);
        let k = Key::from("probe");
        let body = b"probe".to_vec();
        let work = async {
            c.put(&k, PutPayload::from(body.clone())).await?;
            c.get(&k).await?.bytes().await
        };
        self.block_on(work)
            .is_ok_and(|b| b.as_ref() == body.as_slice())
    }

    fn kill(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: kill has no memory preconditions; the group is our child's.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        let _ = child.wait();
    }
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        self.kill();
        // The gRPC unix sockets weed puts in /tmp (there is no flag for them).
        for (svc, port) in [
            ("master", self.ports.master),
            ("volume", self.ports.volume),
            ("filer", self.ports.filer),
            ("s3", self.ports.s3),
        ] {
            let _ = fs::remove_file(format!("/tmp/seaweedfs-{svc}-grpc-{}.sock", port + 10000));
        }
    }
}

/// An object_store S3 client on loopback for `bucket` as `id`.
fn client(s3_port: u16, id: &Identity, bucket: &str) -> AmazonS3 {
    let retry = RetryConfig {
        max_retries: 1,
        retry_timeout: Duration::from_secs(10),
        ..RetryConfig::default()
    };
    AmazonS3Builder::new()
        .with_endpoint(format!("http://127.0.0.1:{s3_port}"))
        .with_allow_http(true)
        .with_region(REGION)
        .with_bucket_name(bucket)
        .with_access_key_id(id.access_key)
        .with_secret_access_key(id.secret_key)
        .with_retry(retry)
        .build()
        .expect("object_store S3 client")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as SeaweedFS 4.48 writes them.
    const PAGE: &str = r#"# TYPE SeaweedFS_s3_request_total counter
SeaweedFS_s3_request_total{bucket="",code="403",type="PUT"} 3
SeaweedFS_s3_request_total{bucket="moments",code="200",type="GET"} 4
SeaweedFS_s3_request_total{bucket="moments",code="404",type="GET"} 1
SeaweedFS_s3_request_total{bucket="moments",code="200",type="PUT"} 5
SeaweedFS_s3_request_total{bucket="mt-harness-probe",code="200",type="PUT"} 1
SeaweedFS_s3_request_seconds_count{bucket="moments",type="GET"} 5
SeaweedFS_s3_time_to_first_byte_millisecond_count{bucket="moments",type="GET"} 2
SeaweedFS_s3_bucket_traffic_sent_bytes_total{bucket="moments"} 1.2583936e+07
"#;

    #[test]
    fn metrics_are_summed_by_bucket_and_type() {
        let all = parse_metrics(PAGE);
        let m = &all["moments"];
        assert_eq!(m.of("GET"), 5);
        assert_eq!(m.of("PUT"), 5);
        assert_eq!(m.gets_with_body(), 2);
        assert_eq!(m.heads_and_failed_gets(), 3);
        assert_eq!(all[""].of("PUT"), 3);
        assert_eq!(all["mt-harness-probe"].of("PUT"), 1);
        assert_eq!(all.len(), 3);
    }

    #[test]
    fn since_subtracts_and_drops_zeros() {
        let before = Requests([("GET".to_string(), 2), ("PUT".to_string(), 1)].into());
        let after = Requests([("GET".to_string(), 5), ("PUT".to_string(), 1)].into());
        assert_eq!(
            after.since(&before),
            Requests([("GET".to_string(), 3)].into())
        );
    }

    #[test]
    fn identities_name_every_key() {
        let v: serde_json::Value = serde_json::from_str(&identities_json()).unwrap();
        let ids = v["identities"].as_array().unwrap();
        assert_eq!(ids.len(), 3);
        assert_eq!(ids[2]["credentials"][0]["accessKey"], WRITER.access_key);
        assert_eq!(
            ids[2]["actions"],
            serde_json::json!(["Read", "Write", "List", "Tagging"])
        );
        assert_eq!(ids[1]["credentials"][0]["accessKey"], READER.access_key);
        assert_eq!(ids[1]["actions"], serde_json::json!(["Read", "List"]));
    }
}
