//! A Rust target for the end-to-end tests: the trigger is
//! `rust_target::module::handler`, found by its demangled path.
//!
//! `rust_target N GAP_MS`: after the go line on stdin, calls handler(i) for
//! i in 0..N, GAP_MS apart.

use std::{
    hint::black_box,
    io::BufRead,
    time::{Duration, Instant},
};

mod module {
    /// The trigger.
    #[inline(never)]
    pub fn handler(i: u64) -> u64 {
        std::hint::black_box(i).wrapping_mul(2)
    }
}

fn burn(d: Duration) {
    let end = Instant::now() + d;
    let mut x = 0u64;
    while Instant::now() < end {
        x = black_box(x.wrapping_add(1));
    }
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (n, gap) = (
        args.first().copied().unwrap_or(3),
        args.get(1).copied().unwrap_or(300),
    );
    println!("ready {}", std::process::id());
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).unwrap_or(0) == 0 {
        std::process::exit(3);
    }
    burn(Duration::from_millis(200));
    for i in 0..n {
        black_box(module::handler(i));
        burn(Duration::from_millis(gap));
    }
    burn(Duration::from_millis(200));
    println!("done");
}
