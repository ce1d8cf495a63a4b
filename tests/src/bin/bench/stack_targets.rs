//! The programs the stack-need table measures (stack_need.rs), each under a
//! load: Debian's nginx and PostgreSQL 15, the demo workload and the test
//! targets. Every server listens on 127.0.0.1 or a socket in the run's
//! temporary directory and is killed when its guard drops.

use std::{
    fs,
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::Path,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use mt_agent_tests::{Proc, Target, rust_bin, target_path};

/// A measured program: what keeps it running and loaded, and the pids to
/// record.
pub struct Loaded {
    pub pids: Vec<u32>,
    /// Killed on drop (process groups).
    _procs: Vec<Proc>,
    stop: Arc<AtomicBool>,
    load: Vec<thread::JoinHandle<()>>,
}

impl Loaded {
    /// Programs that need no load of ours.
    fn idle(pids: Vec<u32>, procs: Vec<Proc>) -> Loaded {
        Loaded {
            pids,
            _procs: procs,
            stop: Arc::new(AtomicBool::new(false)),
            load: Vec::new(),
        }
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.load.drain(..) {
            let _ = t.join();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn children(pid: u32) -> Vec<u32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Waits up to 30 s for `ready`.
fn wait_for(what: &str, ready: impl Fn() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what} did not start in 30 s"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// nginx with two workers serving a 16 KiB file, and two clients fetching
/// it over and over (a new connection each time). Records the workers.
pub fn nginx(dir: &Path) -> Loaded {
    let port = free_port();
    let d = dir.display();
    fs::create_dir_all(dir.join("www")).unwrap();
    fs::write(dir.join("www/index.html"), vec![b'x'; 16384]).unwrap();
    let conf = format!(
        "user root; worker_processes 2; daemon off; pid {d}/nginx.pid; error_log {d}/error.log;\n\
         events {{ worker_connections 64; }}\n\
         http {{ access_log off; client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
         server {{ listen 127.0.0.1:{port}; root {d}/www; }} }}\n"
    );
    fs::write(dir.join("nginx.conf"), conf).unwrap();
    let mut cmd = Command::new("/usr/sbin/nginx");
    cmd.arg("-p").arg(dir).arg("-c").arg(dir.join("nginx.conf"));
    let master = Proc::spawn(cmd);
    let mpid = master.pid() as u32;
    wait_for("nginx", || {
        children(mpid).len() == 2 && TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let stop = Arc::new(AtomicBool::new(false));
    let load = (0..2)
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) else {
                        continue;
                    };
                    let _ = c.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n");
                    let _ = c.read_to_end(&mut Vec::new());
                }
            })
        })
        .collect();
    Loaded {
        pids: children(mpid),
        _procs: vec![master],
        stop,
        load,
    }
}

fn as_postgres(program: &str) -> Command {
    let mut c = Command::new("runuser");
    c.args(["-u", "postgres", "--"]).arg(program);
    c
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// PostgreSQL 15 in a fresh cluster (a Unix socket in `dir`, no TCP), and
/// `pgbench -c 2` (TPC-B-like transactions) for `seconds` + 10 s. Records
/// every process of the server: the two backends and the helpers.
pub fn postgres(dir: &Path, seconds: u64) -> Loaded {
    let data = dir.join("data");
    let ok = Command::new("chown")
        .arg("postgres")
        .arg(dir)
        .status()
        .unwrap()
        .success();
    assert!(ok, "chown postgres {}", dir.display());
    let ok = as_postgres(&format!("{PG_BIN}/initdb"))
        .args(["-A", "trust", "-D"])
        .arg(&data)
        .output()
        .expect("initdb")
        .status
        .success();
    assert!(ok, "initdb failed");
    let port = free_port().to_string();
    let mut cmd = as_postgres(&format!("{PG_BIN}/postgres"));
    cmd.arg("-D").arg(&data).args(["-p", &port, "-k"]).arg(dir);
    cmd.args(["-c", "listen_addresses=", "-c", "fsync=off"]);
    let server = Proc::spawn(cmd);
    let pgbench = |args: &[&str]| {
        let mut c = as_postgres("/usr/bin/pgbench");
        c.arg("-h")
            .arg(dir)
            .args(["-p", &port])
            .args(args)
            .arg("postgres");
        c
    };
    wait_for("postgres", || {
        pgbench(&["-i", "-q", "-s", "1"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let run = Proc::spawn(pgbench(&["-c", "2", "-T", &(seconds + 120).to_string()]));
    // runuser → postgres; its children are the server's processes.
    let root = children(server.pid() as u32);
    let postmaster = *root.first().expect("postgres under runuser");
    wait_for("pgbench's backends", || children(postmaster).len() >= 7);
    thread::sleep(Duration::from_secs(1));
    Loaded::idle(children(postmaster), vec![run, server])
}

/// A program of this repository started with `args`, which runs on its
/// own once it gets its go line. Records it (every thread: `-p`).
pub fn own(path: &Path, args: &[&str]) -> Loaded {
    let mut t = Target::start(path, args);
    t.go();
    Loaded::idle(vec![t.pid() as u32], vec![t.proc])
}

/// The test targets and the demo, by name, with arguments that keep them
/// busy for `seconds` or more.
pub fn own_targets(seconds: u64) -> Vec<(&'static str, std::path::PathBuf, Vec<String>)> {
    // Long enough for the recording, its unwinding at each size (slow in a
    // debug build) and `auto`'s measurement after it; killed when done.
    let ms = (seconds * 1000 + 120_000).to_string();
    vec![
        (
            "demo_workload",
            rust_bin("demo_workload"),
            vec![(seconds + 120).to_string(), "--wait-for-go".into()],
        ),
        (
            "unwind_nofp",
            target_path("unwind_nofp"),
            vec!["1".into(), ms.clone()],
        ),
        (
            "unwind_old (fp)",
            target_path("unwind_old"),
            vec!["1".into(), ms],
        ),
    ]
}
