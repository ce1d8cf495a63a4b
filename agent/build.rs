//! Builds the eBPF programs (`agent-ebpf`) for `bpfel-unknown-none` and puts
//! the object in `OUT_DIR/mt-agent-ebpf`, which `src/probe/mod.rs` embeds,
//! and the bench's floor program in `OUT_DIR/mt-agent-bench-ebpf`, which
//! only the bench loads (the agent does not embed it).
//!
//! This is our own build step rather than `aya_build::build_ebpf`, because
//! aya-build 0.2.0 overwrites `CARGO_ENCODED_RUSTFLAGS` and so cannot pass
//! `-C target-cpu=v3`, which the programs need for BPF compare-exchange and
//! fetch-add (see `docs/ebpf-build.md`). Otherwise it does the same:
//! `cargo +nightly build -Z build-std=core --target bpfel-unknown-none
//! --release` into a target directory of its own (cargo would deadlock on the
//! outer build's lock).
//!
//! No debug info and no BTF: the programs need none (legacy `maps` section,
//! no CO-RE), and BTF would cost at run time. perf records the BTF of every
//! BPF program it sees load into the header of each snapshot it writes; with
//! ours (~20 KB) each switch took ~340 µs longer (measured with the signal
//! and rename tracepoints). The object is 29 KB instead of 518 KB.
//!
//! Needs the nightly toolchain with `rust-src`, and `bpf-linker` on PATH;
//! `cargo xtask setup` installs both.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

const EBPF_PACKAGE: &str = "agent-ebpf";
const EBPF_BIN: &str = "mt-agent-ebpf";
const BENCH_BIN: &str = "mt-agent-bench-ebpf";
const TARGET: &str = "bpfel-unknown-none";

fn main() {
    version_info();
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let workspace = manifest_dir.parent().expect("workspace root");
    let ebpf_dir = workspace.join(EBPF_PACKAGE);
    let common_dir = workspace.join("agent-common");
    for dir in [&ebpf_dir, &common_dir] {
        println!("cargo:rerun-if-changed={}", dir.display());
    }
    println!("cargo:rerun-if-env-changed=MT_AGENT_EBPF_TOOLCHAIN");
    if let Some(linker) = find_on_path("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }

    let toolchain = env::var("MT_AGENT_EBPF_TOOLCHAIN").unwrap_or_else(|_| "nightly".into());
    let target_dir = out_dir.join("ebpf-target");
    let mut cmd = Command::new("rustup");
    cmd.args(["run", &toolchain, "cargo", "build"])
        .args([
            "--package",
            EBPF_PACKAGE,
            "--bin",
            EBPF_BIN,
            "--bin",
            BENCH_BIN,
        ])
        .args(["--release", "--target", TARGET, "-Z", "build-std=core"])
        // No unwinding on the BPF target; only this build aborts on panic.
        .args(["--config", "profile.release.panic=\"abort\""])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(workspace)
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            ["--cfg=bpf_target_arch=\"x86_64\"", "-Ctarget-cpu=v3"].join("\x1f"),
        );
    // Let the inner cargo pick its own toolchain and flags.
    for key in [
        "RUSTC",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTUP_TOOLCHAIN",
        "CARGO",
        "CARGO_MAKEFLAGS",
        "CARGO_ENCODED_RUSTFLAGS_HOST",
    ] {
        cmd.env_remove(key);
    }
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("failed to run rustup ({e}); run `cargo xtask setup` to install the eBPF toolchain")
    });
    if !status.success() {
        panic!(
            "building the eBPF programs failed ({status}); \
             run `cargo xtask setup` (nightly with rust-src, bpf-linker 0.13)"
        );
    }
    for bin in [EBPF_BIN, BENCH_BIN] {
        let built = target_dir.join(TARGET).join("release").join(bin);
        std::fs::copy(&built, out_dir.join(bin))
            .unwrap_or_else(|e| panic!("copy {}: {e}", built.display()));
    }
}

/// Sets MT_AGENT_GIT_COMMIT, MT_AGENT_TARGET and MT_AGENT_AYA_VERSION for
/// `--version`.
fn version_info() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let workspace = manifest_dir.parent().expect("workspace root");
    let commit = env::var("MT_AGENT_GIT_COMMIT").ok().or_else(|| {
        let out = Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(workspace)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    });
    println!(
        "cargo:rustc-env=MT_AGENT_GIT_COMMIT={}",
        commit.unwrap_or_else(|| "unknown".into())
    );
    println!("cargo:rerun-if-env-changed=MT_AGENT_GIT_COMMIT");
    for head in [".git/HEAD", ".git/refs/heads"] {
        let p = workspace.join(head);
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    println!(
        "cargo:rustc-env=MT_AGENT_TARGET={}",
        env::var("TARGET").unwrap_or_default()
    );
    // The aya version cargo resolved, from the lock file.
    let lock = std::fs::read_to_string(workspace.join("Cargo.lock")).unwrap_or_default();
    let aya = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"aya\"\n"))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=MT_AGENT_AYA_VERSION={aya}");
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| Path::new(p).is_file())
}
