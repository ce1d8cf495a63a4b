//! The fleet release: `cargo xtask dist`'s tarball is reproducible, holds a
//! static binary and valid systemd and Kubernetes units, and the binary
//! works on a bare Debian system (a debootstrap'ed root with only perf
//! added). Privileged (the chroot).
//!
//! `cargo xtask test` builds the release twice, each time into its own clean
//! target directory, and passes the two tarballs as MT_AGENT_DIST_A and
//! MT_AGENT_DIST_B.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use mt_agent_tests::*;

fn tarball(var: &str) -> PathBuf {
    let p = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        panic!("{var} is not set: run the release tests through `cargo xtask test`, which builds the release twice")
    });
    assert!(p.is_file(), "{var}={} does not exist", p.display());
    p
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

/// Unpacks tarball A into a temp dir; returns it and the top directory.
fn unpacked() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ok = Command::new("tar")
        .arg("xzf")
        .arg(tarball("MT_AGENT_DIST_A"))
        .arg("-C")
        .arg(dir.path())
        .status()
        .unwrap()
        .success();
    assert!(ok, "tar xzf failed");
    let top = fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .next()
        .expect("a top directory")
        .path();
    (dir, top)
}

#[test]
fn the_release_is_reproducible() {
    let (a, b) = (tarball("MT_AGENT_DIST_A"), tarball("MT_AGENT_DIST_B"));
    assert_ne!(a.parent(), b.parent(), "the two builds must be separate");
    let (ha, hb) = (sha256(&a), sha256(&b));
    assert_eq!(ha.len(), 64);
    assert_eq!(ha, hb, "{} and {} differ", a.display(), b.display());
    let sums =
        fs::read_to_string(a.with_file_name("SHA256SUMS")).expect("SHA256SUMS beside the tarball");
    assert_eq!(
        sums,
        format!("{ha}  {}\n", a.file_name().unwrap().to_string_lossy())
    );
}

#[test]
fn the_tarball_holds_a_static_binary_and_the_units() {
    let (_dir, top) = unpacked();
    let name = top.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("mt-agent-") && name.ends_with("-x86_64-linux-musl"),
        "{name}"
    );
    for f in [
        "mt-agent",
        "mt-agent.service",
        "mt-agent.env",
        "mt-agent.toml",
        "daemonset.yaml",
        "README.md",
        "GUIDE.md",
        "LICENSE",
    ] {
        assert!(top.join(f).is_file(), "{f} missing from the tarball");
    }
    let bin = top.join("mt-agent");
    let file = Command::new("file").arg(&bin).output().unwrap();
    let file = String::from_utf8_lossy(&file.stdout);
    assert!(file.contains("static"), "not statically linked: {file}");
    let out = Command::new(&bin).arg("--version").output().unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        v.starts_with(&format!("mt-agent {}", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    let commit = v
        .lines()
        .find_map(|l| l.strip_prefix("commit: "))
        .expect("commit line");
    assert!(
        commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{v}"
    );
    assert!(v.contains("target: x86_64-unknown-linux-musl"), "{v}");
    assert!(v.contains("aya: 0.14"), "{v}");
}

#[test]
fn the_systemd_unit_verifies() {
    let (_dir, top) = unpacked();
    // A root with the binary installed where ExecStart points, and systemd's
    // own units (verify resolves the unit's dependencies).
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    for d in [
        "usr/local/bin",
        "etc/systemd/system",
        "etc/mt-agent",
        "usr/lib/systemd",
    ] {
        fs::create_dir_all(r.join(d)).unwrap();
    }
    fs::copy(top.join("mt-agent"), r.join("usr/local/bin/mt-agent")).unwrap();
    fs::copy(
        top.join("mt-agent.toml"),
        r.join("etc/mt-agent/mt-agent.toml"),
    )
    .unwrap();
    let status = Command::new("cp")
        .arg("-r")
        .arg("/usr/lib/systemd/system")
        .arg(r.join("usr/lib/systemd/"))
        .status()
        .unwrap();
    assert!(status.success());
    let unit = r.join("etc/systemd/system/mt-agent.service");
    let verify = |text: &str| {
        fs::write(&unit, text).unwrap();
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(format!("--root={}", r.display()))
            .arg("/etc/systemd/system/mt-agent.service")
            .output()
            .expect("systemd-analyze (install systemd: cargo xtask setup --with-test-deps)")
    };
    let text = fs::read_to_string(top.join("mt-agent.service")).unwrap();
    let out = verify(&text);
    assert!(
        out.status.success(),
        "systemd-analyze verify: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for key in [
        "AmbientCapabilities=CAP_SYS_ADMIN CAP_SYS_PTRACE CAP_SYS_NICE",
        "CapabilityBoundingSet=CAP_SYS_ADMIN CAP_SYS_PTRACE CAP_SYS_NICE",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/mt-agent",
        "Restart=on-failure",
    ] {
        assert!(
            text.lines().any(|l| l == key),
            "{key} missing from the unit"
        );
    }
    // The check is real: a unit whose ExecStart is broken fails.
    let broken = text.replace(
        "ExecStart=/usr/local/bin/mt-agent",
        "ExecStart=/usr/local/bin/no-such-agent",
    );
    assert!(
        !verify(&broken).status.success(),
        "verify passed a unit with a missing binary"
    );
}

#[test]
fn the_daemonset_parses() {
    let (_dir, top) = unpacked();
    let text = fs::read_to_string(top.join("daemonset.yaml")).unwrap();
    let docs = yaml_rust2::YamlLoader::load_from_str(&text).expect("valid YAML");
    let ds = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("DaemonSet"))
        .expect("a DaemonSet");
    assert_eq!(ds["apiVersion"].as_str(), Some("apps/v1"));
    assert!(docs.iter().any(|d| d["kind"].as_str() == Some("ConfigMap")));
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostPID"].as_bool(), Some(true));
    let c = &spec["containers"][0];
    let add: Vec<&str> = c["securityContext"]["capabilities"]["add"]
        .as_vec()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(add, ["SYS_ADMIN", "SYS_PTRACE", "SYS_NICE"]);
    let host_paths: Vec<&str> = spec["volumes"]
        .as_vec()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    for p in [
        "/var/lib/mt-agent",
        "/sys/kernel/btf",
        "/sys/kernel/tracing",
    ] {
        assert!(
            host_paths.contains(&p),
            "no hostPath volume for {p}: {host_paths:?}"
        );
    }
    let mounts: Vec<&str> = c["volumeMounts"]
        .as_vec()
        .unwrap()
        .iter()
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    for p in [
        "/var/lib/mt-agent",
        "/sys/kernel/btf",
        "/sys/kernel/tracing",
    ] {
        assert!(mounts.contains(&p), "{p} is not mounted: {mounts:?}");
    }
}

/// Bind mounts into the chroot, undone on drop.
struct Mounts(Vec<PathBuf>);

impl Mounts {
    fn bind(root: &Path) -> Mounts {
        let mut done = Vec::new();
        for d in ["proc", "sys", "dev"] {
            let target = root.join(d);
            fs::create_dir_all(&target).unwrap();
            let ok = Command::new("mount")
                .args(["--rbind", &format!("/{d}")])
                .arg(&target)
                .status()
                .unwrap()
                .success();
            assert!(ok, "mount --rbind /{d}");
            let _ = Command::new("mount")
                .args(["--make-rslave"])
                .arg(&target)
                .status();
            done.push(target);
        }
        Mounts(done)
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for t in self.0.iter().rev() {
            let _ = Command::new("umount").args(["-R", "-l"]).arg(t).status();
        }
    }
}

/// A minimal Debian (debootstrap minbase) plus linux-perf, cached under
/// target/ so reruns are fast.
fn bare_debian() -> PathBuf {
    let target = agent_bin()
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let root = target.join("dist-root").join("bookworm-perf");
    if root.join(".complete").exists() {
        return root;
    }
    let tmp = target.join("dist-root").join("bookworm-perf.tmp");
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(tmp.parent().unwrap()).unwrap();
    let started = Instant::now();
    let out = Command::new("debootstrap")
        .args(["--variant=minbase", "--include=linux-perf", "bookworm"])
        .arg(&tmp)
        .arg("http://deb.debian.org/debian")
        .output()
        .expect("debootstrap (cargo xtask setup --with-test-deps installs it)");
    assert!(
        out.status.success(),
        "debootstrap failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("debootstrap took {:.0} s", started.elapsed().as_secs_f64());
    let _ = fs::remove_dir_all(&root);
    fs::rename(&tmp, &root).unwrap();
    fs::write(root.join(".complete"), "").unwrap();
    root
}

#[test]
fn the_static_binary_works_on_a_bare_debian() {
    preflight();
    let (_dir, top) = unpacked();
    let root = bare_debian();
    fs::copy(top.join("mt-agent"), root.join("usr/local/bin/mt-agent")).unwrap();
    fs::copy(target_path("target"), root.join("usr/local/bin/mt-target")).unwrap();
    let out_in_root = "/var/tmp/mt-agent-dist-test";
    let _ = fs::remove_dir_all(root.join(out_in_root.trim_start_matches('/')));
    let _mounts = Mounts::bind(&root);

    // The preflight passes there.
    let check = Command::new("chroot")
        .arg(&root)
        .args(["/usr/local/bin/mt-agent", "check", "--output", "/var/tmp"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "check failed in the chroot:\n{text}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(text.lines().any(|l| l.starts_with("PASS  perf")), "{text}");

    // An end-to-end capture of a target copied in.
    let mut cmd = Command::new("chroot");
    cmd.arg(&root)
        .args(["/usr/local/bin/mt-target", "calls", "3", "300"]);
    let mut t = Target::start_cmd(cmd);
    let mut agent = Command::new("chroot");
    agent.arg(&root).args([
        "/usr/local/bin/mt-agent",
        "--pid",
        &t.pid().to_string(),
        "--symbol",
        "trigger",
    ]);
    agent.args(["--max-snapshots", "3", "--json", "--output", out_in_root]);
    let mut a = Proc::spawn(agent);
    assert!(
        a.wait_line(Duration::from_secs(30), |l| l
            .contains("\"event\":\"armed\""))
            .is_some(),
        "not armed in the chroot: {:?}",
        a.stderr()
    );
    t.go();
    let status = a.wait(FINISH).expect("agent exits");
    assert_eq!(status.code(), Some(0), "{:?}\n{:?}", a.stdout(), a.stderr());
    let out = root.join(out_in_root.trim_start_matches('/'));
    let index = read_index(&out.join("snapshots.jsonl"));
    assert_eq!(
        index.iter().filter(|v| v["kind"] == "hit").count(),
        3,
        "{index:?}"
    );
    for v in &index {
        assert!(out.join(v["file"].as_str().unwrap()).is_file());
    }
    assert_no_programs_loaded("after the chroot run");
    assert_no_perf_for(Path::new(out_in_root), "after the chroot run");
    let _ = fs::remove_dir_all(&out);
}
