//! `cargo xtask dist`: a self-contained release for fleets.
//!
//! Builds `mt-agent` for `x86_64-unknown-linux-musl` (statically linked, the
//! eBPF object embedded) and packs `dist/mt-agent-<version>-x86_64-linux-musl.tar.gz`
//! with the systemd unit, its env file, an example config, the DaemonSet,
//! README and LICENSE, plus `SHA256SUMS` beside it.
//!
//! Reproducible: two runs from the same checkout, each into its own clean
//! target directory, give the same tarball. Timestamps come from
//! `SOURCE_DATE_EPOCH` (default: the last commit's time), entries are
//! sorted, owners are root:root, modes are fixed, the gzip header carries no
//! time or name, and paths that differ between builds (the workspace, cargo's
//! home) are remapped in the binary.

use std::{
    fs::{self, File},
    io::Write,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use sha2::{Digest, Sha256};

use crate::{
    setup::setup,
    util::{cargo, output, run, workspace},
};

const TARGET: &str = "x86_64-unknown-linux-musl";

/// Files packed next to the binary: (source in the workspace, name in the
/// tarball, mode).
const EXTRA: &[(&str, &str, u32)] = &[
    ("packaging/mt-agent.service", "mt-agent.service", 0o644),
    ("packaging/mt-agent.env", "mt-agent.env", 0o644),
    ("packaging/mt-agent.toml", "mt-agent.toml", 0o644),
    ("packaging/daemonset.yaml", "daemonset.yaml", 0o644),
    ("README.md", "README.md", 0o644),
    ("GUIDE.md", "GUIDE.md", 0o644),
    ("LICENSE", "LICENSE", 0o644),
];

/// The tarball's name without `.tar.gz`, also its top directory.
fn tarball_name() -> String {
    format!("mt-agent-{}-x86_64-linux-musl", env!("CARGO_PKG_VERSION"))
}

/// Where [`dist`] writes the tarball in `out_dir`.
pub fn tarball_path(out_dir: &Path) -> PathBuf {
    out_dir.join(format!("{}.tar.gz", tarball_name()))
}

/// Builds the release; returns the tarball's path.
pub fn dist(target_dir: Option<&Path>, out_dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    setup(false)?;
    let ws = workspace();
    let target_dir = target_dir
        .map(Path::to_path_buf)
        .unwrap_or_else(crate::util::target_dir);
    let out_dir = out_dir
        .map(Path::to_path_buf)
        .unwrap_or_else(|| ws.join("dist"));
    let epoch = source_date_epoch()?;

    let home = std::env::var("CARGO_HOME")
        .ok()
        .or_else(|| std::env::var("HOME").ok().map(|h| format!("{h}/.cargo")))
        .unwrap_or_default();
    let remap = [
        format!("--remap-path-prefix={}=/mt-agent", ws.display()),
        format!("--remap-path-prefix={home}=/cargo"),
        format!("--remap-path-prefix={}=/target", target_dir.display()),
    ];
    run(cargo()
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            TARGET,
            "-p",
            "mt-agent",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .env("SOURCE_DATE_EPOCH", epoch.to_string())
        .env("CARGO_ENCODED_RUSTFLAGS", remap.join("\x1f")))?;
    let bin = target_dir.join(TARGET).join("release").join("mt-agent");
    check_static(&bin)?;

    let name = tarball_name();
    fs::create_dir_all(&out_dir)?;
    let tarball = tarball_path(&out_dir);
    let mut entries: Vec<(String, PathBuf, u32)> = vec![(format!("{name}/mt-agent"), bin, 0o755)];
    for (src, dst, mode) in EXTRA {
        entries.push((format!("{name}/{dst}"), ws.join(src), *mode));
    }
    entries.sort();
    write_tarball(&tarball, &name, &entries, epoch)?;

    let digest = hex(&Sha256::digest(fs::read(&tarball)?));
    let sums = out_dir.join("SHA256SUMS");
    fs::write(
        &sums,
        format!(
            "{digest}  {}\n",
            tarball.file_name().unwrap().to_string_lossy()
        ),
    )?;
    println!("{}", tarball.display());
    eprintln!("xtask: {digest}  {}", tarball.display());
    Ok(tarball)
}

/// `SOURCE_DATE_EPOCH` if set, else the time of the last commit.
fn source_date_epoch() -> anyhow::Result<u64> {
    if let Ok(v) = std::env::var("SOURCE_DATE_EPOCH") {
        return v
            .trim()
            .parse()
            .context("SOURCE_DATE_EPOCH is not a number");
    }
    let t = output(
        Command::new("git")
            .args(["log", "-1", "--format=%ct"])
            .current_dir(workspace()),
    )
    .context("git log: set SOURCE_DATE_EPOCH outside a git checkout")?;
    t.trim().parse().context("git log -1 --format=%ct")
}

/// The binary must not need a dynamic loader: an ELF64 file without a
/// `PT_INTERP` program header (a static or static-pie executable). Looking
/// for the string "ld-linux" instead misfired once the agent named the
/// loader in its own code (symbols/uretprobe_safety.rs).
fn check_static(bin: &Path) -> anyhow::Result<()> {
    let data = fs::read(bin).with_context(|| format!("reading {}", bin.display()))?;
    match interpreter(&data) {
        Ok(None) => Ok(()),
        Ok(Some(i)) => bail!(
            "{} asks for the dynamic loader {i}: it is not statically linked",
            bin.display()
        ),
        Err(why) => bail!("{}: {why}", bin.display()),
    }
}

/// The `PT_INTERP` path of a little-endian ELF64 file, if it has one. Pure.
fn interpreter(data: &[u8]) -> Result<Option<String>, &'static str> {
    const PT_INTERP: u32 = 3;
    let u16_at = |o: usize| data.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        data.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let u64_at = |o: usize| {
        data.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    if data.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        return Err("not a little-endian ELF64 file");
    }
    let (Some(phoff), Some(size), Some(n)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return Err("ELF header cut short");
    };
    for i in 0..n as usize {
        let ph = phoff as usize + i * size as usize;
        if u32_at(ph).ok_or("program headers cut short")? != PT_INTERP {
            continue;
        }
        let (off, len) = (u64_at(ph + 8), u64_at(ph + 32));
        let (Some(off), Some(len)) = (off, len) else {
            return Err("program headers cut short");
        };
        let path = data
            .get(off as usize..(off + len) as usize)
            .ok_or("PT_INTERP points outside the file")?;
        let path = String::from_utf8_lossy(path)
            .trim_end_matches('\0')
            .to_string();
        return Ok(Some(path));
    }
    Ok(None)
}

fn write_tarball(
    path: &Path,
    top: &str,
    entries: &[(String, PathBuf, u32)],
    epoch: u64,
) -> anyhow::Result<()> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    // No file name and a zero time in the gzip header.
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(file, flate2::Compression::best());
    let mut tar = tar::Builder::new(gz);
    tar.mode(tar::HeaderMode::Deterministic);
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_path(format!("{top}/"))?;
    meta(&mut dir, 0o755, 0, epoch);
    dir.set_cksum();
    tar.append(&dir, std::io::empty())?;
    for (name, src, mode) in entries {
        let data = fs::read(src).with_context(|| format!("reading {}", src.display()))?;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_path(name)?;
        meta(&mut h, *mode, data.len() as u64, epoch);
        h.set_cksum();
        tar.append(&h, data.as_slice())?;
    }
    let gz = tar.into_inner()?;
    gz.finish()?.flush()?;
    Ok(())
}

fn meta(h: &mut tar::Header, mode: u32, size: u64, epoch: u64) {
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(epoch);
    h.set_uid(0);
    h.set_gid(0);
    let _ = h.set_username("root");
    let _ = h.set_groupname("root");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamically_linked_executable_names_its_loader() {
        // xtask itself is linked against glibc's loader.
        let me = fs::read(std::env::current_exe().unwrap()).unwrap();
        let i = interpreter(&me).unwrap().expect("xtask has a PT_INTERP");
        assert!(i.contains("ld-linux"), "{i}");
        assert!(interpreter(b"not an ELF file").is_err());
        // The ELF header alone, with no program headers: static.
        let mut bare = me[..64].to_vec();
        bare[0x38] = 0;
        bare[0x39] = 0;
        assert_eq!(interpreter(&bare), Ok(None));
    }
}
