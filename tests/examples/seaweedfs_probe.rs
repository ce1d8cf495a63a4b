//! Run by hand (not part of the suite) to check the SeaweedFS harness and to
//! see what the store answers:
//!
//! ```text
//! cargo build -p mt-agent-tests --example seaweedfs_probe
//! flock /tmp/priv.lock target/debug/examples/seaweedfs_probe
//! ```
//!
//! Starts a server; writes with the admin, reads with the reader; prints the
//! refusals (read-only put, wrong secret, unknown key, missing bucket, plain
//! HTTP, TLS to the HTTP port); compares ETags with MD5s for a single PUT and
//! a multipart upload; stops, restarts, checks the object is still there;
//! prints request counts and timings. Panics on the first surprise.
//! Findings: docs/upload.md, "What SeaweedFS answers".

use std::time::{Duration, Instant};

use md5::{Digest, Md5};
use mt_agent_tests::store::{ADMIN, BUCKET, READER, SeaweedFs};
use object_store::{
    ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart,
    aws::{AmazonS3, AmazonS3Builder},
    path::Path as Key,
};

const MIB: usize = 1024 * 1024;

/// Bytes that differ from part to part.
fn body(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[0] ^ seed)
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The multipart ETag as AWS defines it: MD5 of the parts' binary MD5s,
/// then `-N`.
fn multipart_etag(data: &[u8], part: usize) -> String {
    let mut all = Md5::new();
    let parts = data.chunks(part).collect::<Vec<_>>();
    for p in &parts {
        all.update(Md5::digest(p));
    }
    format!("{}-{}", hex(&all.finalize()), parts.len())
}

/// What a put of one small object by `c` gives, as one line.
fn try_put(s: &SeaweedFs, c: &AmazonS3, what: &str) {
    let r = s.block_on(c.put(&Key::from("refused/x"), PutPayload::from_static(b"x")));
    match r {
        Ok(_) => panic!("{what}: the put was accepted"),
        Err(e) => println!("{what}: {e}"),
    }
}

/// A client with `key`/`secret` at `endpoint`, `allow_http` as given.
fn raw_client(endpoint: &str, bucket: &str, key: &str, secret: &str, http: bool) -> AmazonS3 {
    AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_allow_http(http)
        .with_region("us-east-1")
        .with_bucket_name(bucket)
        .with_access_key_id(key)
        .with_secret_access_key(secret)
        .with_retry(object_store::RetryConfig {
            max_retries: 0,
            retry_timeout: Duration::from_secs(5),
            ..Default::default()
        })
        .build()
        .expect("client")
}

fn refusals(s: &SeaweedFs) {
    let ep = s.endpoint();
    try_put(s, &s.client(&READER, BUCKET), "read-only identity");
    let wrong = raw_client(&ep, BUCKET, ADMIN.access_key, "wrong-secret", true);
    try_put(s, &wrong, "wrong secret key");
    let unknown = raw_client(&ep, BUCKET, "NOSUCHACCESSKEY", "whatever", true);
    try_put(s, &unknown, "unknown access key");
    try_put(s, &s.client(&ADMIN, "no-such-bucket"), "missing bucket");
    let r = s.block_on(s.client(&READER, "no-such-bucket").head(&Key::from("x")));
    println!("missing bucket, HEAD: {r:?}");
    let r = s.block_on(s.client(&ADMIN, "no-such-bucket").get(&Key::from("x")));
    println!("missing bucket, GET: {:?}", r.err());
    let r = s.block_on(s.client(&ADMIN, "no-such-bucket").list_with_delimiter(None));
    println!("missing bucket, LIST: {:?}", r.err());
    let r = s.block_on(s.client(&ADMIN, BUCKET).get(&Key::from("no/such/key")));
    println!("missing key, GET: {:?}", r.err());
    let plain = raw_client(&ep, BUCKET, ADMIN.access_key, ADMIN.secret_key, false);
    try_put(s, &plain, "plain HTTP without allow_http");
    let tls = ep.replace("http://", "https://");
    let tls = raw_client(&tls, BUCKET, ADMIN.access_key, ADMIN.secret_key, false);
    try_put(s, &tls, "https:// to the HTTP port");
}

fn etags(s: &SeaweedFs) {
    let small = body(1024, 1);
    let etag = s.put("etag/single", &small).expect("single PUT ETag");
    let md5 = hex(&Md5::digest(&small));
    println!("single 1 KiB: ETag {etag} MD5 {md5}");
    assert_eq!(etag.trim_matches('"'), md5);
    let head = s.head("etag/single").expect("head");
    println!("  HEAD: ETag {:?}, size {}", head.e_tag, head.size);

    let big = body(12 * MIB, 2);
    let c = s.client(&ADMIN, BUCKET);
    let k = Key::from("etag/multipart");
    let result = s.block_on(async {
        let upload = c.put_multipart(&k).await.expect("start multipart");
        let mut w = WriteMultipart::new_with_chunk_size(upload, 5 * MIB);
        w.write(&big);
        w.finish().await.expect("finish multipart")
    });
    let want = multipart_etag(&big, 5 * MIB);
    println!(
        "multipart 12 MiB / 5 MiB parts: ETag {:?} AWS form {want}",
        result.e_tag
    );
    let head = s.head("etag/multipart").expect("head");
    println!("  HEAD: ETag {:?}, size {}", head.e_tag, head.size);
    assert_eq!(s.get("etag/multipart"), big);
}

fn main() {
    let t = Instant::now();
    let mut s = SeaweedFs::start();
    println!(
        "start: S3 answered HTTP after {:?}, served PUT+GET after {:?} (guard returned after {:?})",
        s.answered_after(),
        s.ready_after(),
        t.elapsed()
    );
    println!("ports {:?}, dir {}", s.ports(), s.dir().display());
    let r0 = s.requests();
    println!("requests at start: {r0:?}");

    let data = body(1024, 0);
    s.put("run/one", &data);
    let reader = s.client(&READER, BUCKET);
    let got = s.block_on(async { reader.get(&Key::from("run/one")).await?.bytes().await });
    assert_eq!(got.expect("reader get").as_ref(), data.as_slice());
    let r1 = s.requests();
    println!("after admin PUT + reader GET: {:?}", r1.since(&r0));

    let refused0 = s.requests_on("");
    refusals(&s);
    let r2 = s.requests();
    println!("the refusals counted: {:?}", r2.since(&r1));
    println!(
        "  under bucket \"\": {:?}",
        s.requests_on("").since(&refused0)
    );
    println!(
        "  under no-such-bucket: {:?}",
        s.requests_on("no-such-bucket")
    );

    etags(&s);
    let r3 = s.requests();
    println!("the ETag part counted: {:?}", r3.since(&r2));
    for l in s
        .metrics()
        .lines()
        .filter(|l| l.starts_with("SeaweedFS_s3_request_total"))
    {
        println!("  {l}");
    }
    s.head("run/one");
    s.head("run/one");
    let two = s.requests().since(&r3);
    println!(
        "two HEADs counted: {two:?}: heads_and_failed_gets {}, gets_with_body {}",
        two.heads_and_failed_gets(),
        two.gets_with_body()
    );
    let r3 = s.requests();
    println!("list: {:?}", s.list(""));
    let r4 = s.requests();
    println!("one list counted: {:?}", r4.since(&r3));

    println!("data dir: {}", du(s.dir()));
    let t = Instant::now();
    s.stop();
    println!("stop (SIGKILL to the group, reaped) took {:?}", t.elapsed());
    s.restart();
    println!(
        "restart: S3 answered HTTP after {:?}, served PUT+GET after {:?}",
        s.answered_after(),
        s.ready_after()
    );
    assert_eq!(s.get("run/one"), data);
    println!("after restart: list {:?}", s.list("run/"));
    println!(
        "requests carried over the restart: {:?}",
        s.requests().since(&r4)
    );
    if let Some(to) = std::env::var_os("KEEP_LOG") {
        std::fs::copy(s.log(), to).expect("copy log");
    }
    let t = Instant::now();
    drop(s);
    println!("drop took {:?}", t.elapsed());
}

fn du(p: &std::path::Path) -> String {
    let out = std::process::Command::new("du")
        .args(["-sh", "--apparent-size"])
        .arg(p)
        .output();
    let real = std::process::Command::new("du").arg("-sh").arg(p).output();
    format!(
        "{} apparent, {} on disk",
        String::from_utf8_lossy(&out.expect("du").stdout).trim(),
        String::from_utf8_lossy(&real.expect("du").stdout).trim()
    )
}
