//! The demo workload for `cargo xtask demo` (and its test, tests/tests/demo.rs):
//! a pretend server whose `handle_request(id, bytes)` is the trigger. Most
//! requests take 4-8 ms of CPU; one in a few is slow, for one of two reasons
//! the report can show:
//!
//! * a large payload (`bytes >= LARGE`, about one request in five) takes a
//!   rare code path, `parse_slow_path`, that burns 40 ms of CPU;
//! * a request that arrives while the `compactor` thread holds the cache's
//!   lock (120 ms of CPU in `compact_cache`, about once a second) waits for
//!   it in `wait_for_lock`: blocked, not on CPU.
//!
//! Work is measured in this thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`),
//! so a loaded machine stretches a call with runnable time, not with less
//! work, and a debug build does the same work as a release build.
//!
//! `demo_workload [SECONDS] [--requests N] [--wait-for-go]` runs for SECONDS
//! (default 60) or N requests, whichever ends first. It prints `ready PID`;
//! with `--wait-for-go` it then waits for a line on stdin before the first
//! request (the tests' protocol).

use std::{
    hint::black_box,
    io::{BufRead, Write as _},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// Payloads of at least this many bytes take `parse_slow_path`.
const LARGE: u64 = 100_000;
/// CPU time of the slow path, ms.
const SLOW_PATH_MS: u64 = 40;
/// CPU time the compactor holds the lock for, ms.
const COMPACT_MS: u64 = 120;
const MS: u64 = 1_000_000;
/// Iterations between two reads of the thread's CPU clock (tens of µs).
const CHUNK: u64 = 20_000;

/// The shared cache: requests look their payload up in it, the compactor
/// rewrites it.
type Cache = Arc<Mutex<Vec<u64>>>;

/// This thread's CPU time, ns (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The trigger function: one call per request, with the request id and
/// its payload size. Parses, looks the payload up in the cache, hashes and
/// compresses it.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn handle_request(id: u64, bytes: u64) -> u64 {
    let cache = CACHE.get().expect("the cache is set before any request");
    let mut x = parse_payload(id, 2 + id % 3);
    if bytes >= LARGE {
        x = parse_slow_path(x, SLOW_PATH_MS);
    }
    x ^= wait_for_lock(cache, bytes);
    x = hash_payload(x, 1 + id % 2);
    black_box(compress_payload(x, 1 + bytes % 3))
}

static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();

#[inline(never)]
fn parse_payload(seed: u64, cpu_ms: u64) -> u64 {
    let end = thread_cpu_ns() + cpu_ms * MS;
    let mut x = seed;
    while thread_cpu_ns() < end {
        for i in 0..CHUNK {
            x = black_box(x.rotate_left(7) ^ i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    x
}

/// The rare code path: large payloads are parsed byte by byte.
#[inline(never)]
fn parse_slow_path(seed: u64, cpu_ms: u64) -> u64 {
    let end = thread_cpu_ns() + cpu_ms * MS;
    let mut x = seed;
    while thread_cpu_ns() < end {
        for i in 0..CHUNK {
            x = black_box(x.rotate_right(3).wrapping_add(i)) ^ 0x5555_aaaa_5555_aaaa;
        }
    }
    x
}

/// Looks the payload up in the cache: waits while the compactor holds it.
#[inline(never)]
fn wait_for_lock(cache: &Cache, key: u64) -> u64 {
    let c = cache.lock().unwrap_or_else(|e| e.into_inner());
    c[(key % c.len() as u64) as usize]
}

#[inline(never)]
fn hash_payload(seed: u64, cpu_ms: u64) -> u64 {
    let end = thread_cpu_ns() + cpu_ms * MS;
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    while thread_cpu_ns() < end {
        for i in 0..CHUNK {
            h = black_box((h ^ (seed + i)).wrapping_mul(0x100_0000_01b3));
        }
    }
    h
}

#[inline(never)]
fn compress_payload(seed: u64, cpu_ms: u64) -> u64 {
    let end = thread_cpu_ns() + cpu_ms * MS;
    let mut buf = [0u8; 256];
    let mut acc = seed;
    while thread_cpu_ns() < end {
        for i in 0..CHUNK {
            let k = (i % 256) as usize;
            buf[k] = buf[k].wrapping_add((acc >> 3) as u8);
            acc = black_box(acc.wrapping_add(u64::from(buf[(k * 7) % 256])));
        }
    }
    acc
}

/// Rewrites the cache, holding its lock for `COMPACT_MS` of CPU.
#[inline(never)]
fn compact_cache(cache: &Cache, round: u64) {
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    let end = thread_cpu_ns() + COMPACT_MS * MS;
    let mut x = round;
    while thread_cpu_ns() < end {
        for v in c.iter_mut() {
            x = black_box(x.rotate_left(5) ^ *v).wrapping_mul(0x2545_f491_4f6c_dd1d);
            *v = x;
        }
    }
}

/// The compactor thread: compacts the cache every 0.6-1.0 s.
fn compactor(cache: Cache, mut rng: u64) {
    let mut round = 0;
    loop {
        std::thread::sleep(Duration::from_millis(600 + next(&mut rng) % 400));
        round += 1;
        compact_cache(&cache, round);
    }
}

/// A small xorshift generator, so runs vary without a dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// SECONDS, `--requests N`, `--wait-for-go`.
fn parse_args() -> (u64, u64, bool) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let requests = args
        .iter()
        .position(|a| a == "--requests")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(u64::MAX);
    let seconds = args.first().and_then(|s| s.parse().ok()).unwrap_or(60);
    (seconds, requests, args.iter().any(|a| a == "--wait-for-go"))
}

fn main() {
    let (seconds, requests, wait_for_go) = parse_args();
    let cache: Cache = Arc::new(Mutex::new((0..4096).collect()));
    CACHE.set(cache.clone()).expect("set once");
    let mut rng = 0x1234_5678_9abc_def0u64 ^ u64::from(std::process::id());
    let seed = next(&mut rng);
    std::thread::Builder::new()
        .name("compactor".into())
        .spawn(move || compactor(cache, seed))
        .expect("the compactor thread");
    println!("ready {}", std::process::id());
    if wait_for_go
        && std::io::stdin()
            .lock()
            .read_line(&mut String::new())
            .unwrap_or(0)
            == 0
    {
        std::process::exit(3);
    }
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut id = 0u64;
    while Instant::now() < end && id < requests {
        id += 1;
        // One payload in five is large.
        let bytes = match next(&mut rng) % 5 {
            0 => LARGE + next(&mut rng) % 200_000,
            _ => 1_000 + next(&mut rng) % 50_000,
        };
        black_box(handle_request(id, bytes));
        // Waiting for the next request.
        std::thread::sleep(Duration::from_millis(30 + next(&mut rng) % 60));
    }
    // The demo reads only the ready line: a closed pipe is no error here.
    let _ = writeln!(std::io::stdout(), "done {id}");
}
