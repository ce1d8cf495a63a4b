//! The demo workload for `cargo xtask demo`: a pretend server that handles a
//! request every 300-900 ms. Each request parses, hashes and compresses a
//! payload (CPU bursts under different function names, so a snapshot's
//! profile shows them), then calls `handle_request`, the trigger.
//!
//! `demo_workload [SECONDS]` runs for SECONDS (default 60), then exits.

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

/// The trigger function: called once per request, with the request id and
/// its payload size.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn handle_request(id: u64, bytes: u64) -> u64 {
    black_box(id ^ bytes)
}

#[inline(never)]
fn parse_payload(seed: u64, rounds: u64) -> u64 {
    let mut x = seed;
    for i in 0..rounds {
        x = black_box(x.rotate_left(7) ^ i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    x
}

#[inline(never)]
fn hash_payload(seed: u64, rounds: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for i in 0..rounds {
        h = black_box((h ^ (seed + i)).wrapping_mul(0x100_0000_01b3));
    }
    h
}

#[inline(never)]
fn compress_payload(seed: u64, rounds: u64) -> u64 {
    let mut buf = [0u8; 256];
    let mut acc = seed;
    for i in 0..rounds {
        let k = (i % 256) as usize;
        buf[k] = buf[k].wrapping_add((acc >> 3) as u8);
        acc = black_box(acc.wrapping_add(u64::from(buf[(k * 7) % 256])));
    }
    acc
}

/// A small xorshift generator, so runs vary without a dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn main() {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    println!("ready {}", std::process::id());
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut rng = 0x1234_5678_9abc_def0u64 ^ u64::from(std::process::id());
    let mut id = 0u64;
    while Instant::now() < end {
        id += 1;
        let size = 1_000 + next(&mut rng) % 50_000;
        let work = 10_000_000 + next(&mut rng) % 30_000_000;
        let a = parse_payload(id, work);
        let b = hash_payload(a, work / 2);
        let c = compress_payload(b, work / 3);
        black_box(handle_request(id, size ^ (c & 1)));
        std::thread::sleep(Duration::from_millis(100 + next(&mut rng) % 400));
    }
}
