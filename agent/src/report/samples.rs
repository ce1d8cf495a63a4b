//! A snapshot's samples, read through `perf script`.
//!
//! Every perf command the report runs goes through [`perf_command`], which
//! points perf at the run's build-id cache (`--buildid-dir OUT/.debug`)
//! when the run kept one. Why `perf script` rather than a Rust reader of
//! perf.data: see docs/report.md.

use std::{
    collections::HashMap,
    fs::File,
    io::{self, BufRead, BufReader, Read},
    os::{fd::AsRawFd, unix::process::CommandExt},
    path::Path,
    process::{Command, Stdio},
};

/// The fields asked of `perf script`: thread, time (ns with `--ns`), and
/// the call chain as address, symbol and object.
const FIELDS: &str = "tid,time,ip,sym,dso";

/// One sample: a thread, a time and a call chain.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub tid: u32,
    /// perf's sample time: CLOCK_MONOTONIC (`-k CLOCK_MONOTONIC`), ns.
    pub time_ns: u64,
    /// Range in [`Samples::frames`], leaf first.
    start: u32,
    len: u32,
}

/// The samples of one snapshot file, with interned frame names.
#[derive(Debug, Default)]
pub struct Samples {
    pub samples: Vec<Sample>,
    /// Frame ids of every call chain, leaf first, back to back.
    frames: Vec<u32>,
    names: Vec<String>,
    ids: HashMap<String, u32>,
    /// perf's command line, from the header (`# cmdline : ...`).
    pub cmdline: Option<String>,
}

impl Samples {
    /// A sample's call chain, leaf first, as frame ids.
    pub fn stack(&self, s: &Sample) -> &[u32] {
        &self.frames[s.start as usize..(s.start + s.len) as usize]
    }

    /// A frame id's name.
    pub fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }

    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        id
    }
}

/// A perf command for the report: perf's top-level `--buildid-dir` is set
/// to the run's build-id cache when there is one, so that symbols come from
/// the objects the run kept, not from whatever is at their paths now.
pub fn perf_command(perf: &Path, buildid_dir: Option<&Path>) -> Command {
    let mut cmd = crate::perf::command(perf);
    if let Some(home) = std::env::var_os("HOME") {
        // perf's default cache, ~/.debug, when the run kept none.
        cmd.env("HOME", home);
    }
    if let Some(dir) = buildid_dir {
        cmd.arg("--buildid-dir").arg(dir);
    }
    cmd
}

/// Runs `perf script` on an open snapshot file and parses its output.
/// perf reads the file through `/proc/self/fd/N`, the descriptor already
/// checked to be a regular file. Errors carry perf's last message.
pub fn read(perf: &Path, buildid_dir: Option<&Path>, file: &File) -> Result<Samples, String> {
    let fd = file.as_raw_fd();
    let mut cmd = perf_command(perf, buildid_dir);
    cmd.args(["script", "--header", "--ns", "-F", FIELDS, "-i"])
        .arg(format!("/proc/self/fd/{fd}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: fcntl is async-signal-safe; it clears FD_CLOEXEC on the
    // child's copy of the descriptor only.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", perf.display()))?;
    let stderr = child.stderr.take().expect("piped");
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut s);
        s
    });
    let parsed = parse(BufReader::with_capacity(
        1 << 20,
        child.stdout.take().expect("piped"),
    ));
    let status = child.wait().map_err(|e| e.to_string())?;
    let errs = errs.join().unwrap_or_default();
    let samples = parsed.map_err(|e| format!("reading perf script's output: {e}"))?;
    if !status.success() {
        let last = errs
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(format!("perf script failed ({status}): {}", last.trim()));
    }
    Ok(samples)
}

/// Parses `perf script -F tid,time,ip,sym,dso --ns` output: a header line
/// per sample (`  TID SECONDS.NANOS:`), then one line per frame
/// (`\tADDR SYM (DSO)`), leaf first, then a blank line.
pub fn parse(mut reader: impl BufRead) -> io::Result<Samples> {
    let mut out = Samples::default();
    let mut line = Vec::new();
    let mut current: Option<Sample> = None;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&line);
        let text = text.trim_end_matches(['\n', '\r']);
        if let Some(h) = text.strip_prefix('#') {
            if let Some(c) = h.trim_start().strip_prefix("cmdline :") {
                out.cmdline = Some(c.trim().to_string());
            }
            continue;
        }
        if text.trim().is_empty() {
            if let Some(s) = current.take() {
                out.samples.push(s);
            }
            continue;
        }
        if text.starts_with('\t') {
            if let Some(s) = current.as_mut() {
                let name = frame_name(text.trim_start());
                let id = out.intern(&name);
                out.frames.push(id);
                s.len += 1;
            }
            continue;
        }
        if let Some(s) = current.take() {
            out.samples.push(s);
        }
        current = header(text).map(|(tid, time_ns)| Sample {
            tid,
            time_ns,
            start: out.frames.len() as u32,
            len: 0,
        });
    }
    if let Some(s) = current.take() {
        out.samples.push(s);
    }
    Ok(out)
}

/// `  4243 330734.672679123:` → (4243, 330734672679123).
fn header(text: &str) -> Option<(u32, u64)> {
    let mut it = text.split_whitespace();
    let tid = it.next()?.parse().ok()?;
    let time = it.next()?.strip_suffix(':')?;
    Some((tid, parse_ns(time)?))
}

/// `SECONDS.NANOS` → ns.
fn parse_ns(t: &str) -> Option<u64> {
    let (s, frac) = t.split_once('.').unwrap_or((t, "0"));
    let mut ns: u64 = frac.parse().ok()?;
    for _ in frac.len()..9 {
        ns *= 10;
    }
    s.parse::<u64>()
        .ok()?
        .checked_mul(1_000_000_000)?
        .checked_add(ns)
}

/// `55d0c3a1b139 slow_part (/path/t)` → `slow_part`; an unknown symbol is
/// named by its object, as inferno's collapse-perf does: `[libc.so.6]`.
fn frame_name(line: &str) -> String {
    let rest = line.split_once(' ').map_or("", |(_, r)| r.trim());
    let (sym, dso) = match rest.rfind(" (") {
        Some(i) if rest.ends_with(')') => (&rest[..i], &rest[i + 2..rest.len() - 1]),
        _ => (rest, ""),
    };
    // `;` separates frames in the folded format.
    let sym = sym.replace(';', ":");
    if sym.is_empty() || sym == "[unknown]" {
        let base = dso.rsplit('/').next().unwrap_or("");
        if base.is_empty() || base == "[unknown]" {
            return "[unknown]".into();
        }
        return format!("[{}]", base.trim_matches(['[', ']']));
    }
    sym
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "# ========\n# cmdline : /usr/bin/perf record -p 42 -e cpu-clock -F 999 -g\n# ========\n#\n  4243 330734.672679123: \n\t    55d0c3a1b139 slow_part (/t/target)\n\t    55d0c3a1b1f0 ns::f(int) const (/t/target)\n\t    7f00 [unknown] (/usr/lib/libc.so.6)\n\t    7f01 [unknown] ([unknown])\n\n     7 1.5: \n\t    ffffffff81000000 do_syscall_64 ([kernel.kallsyms])\n\n";

    #[test]
    fn perf_script_output_is_parsed() {
        let s = parse(OUT.as_bytes()).unwrap();
        assert_eq!(
            s.cmdline.as_deref(),
            Some("/usr/bin/perf record -p 42 -e cpu-clock -F 999 -g")
        );
        assert_eq!(s.samples.len(), 2);
        let a = s.samples[0];
        assert_eq!((a.tid, a.time_ns), (4243, 330_734_672_679_123));
        let names: Vec<&str> = s.stack(&a).iter().map(|&i| s.name(i)).collect();
        assert_eq!(
            names,
            ["slow_part", "ns::f(int) const", "[libc.so.6]", "[unknown]"]
        );
        let b = s.samples[1];
        assert_eq!((b.tid, b.time_ns), (7, 1_500_000_000));
        assert_eq!(s.name(s.stack(&b)[0]), "do_syscall_64");
    }
}
