//! A headless Chromium driven over the DevTools protocol, for the report's
//! browser test.
//!
//! Chromium (Debian's `chromium`, installed by `cargo xtask setup
//! --with-test-deps`) runs with `--remote-debugging-pipe`: it reads
//! protocol messages on fd 3 and writes them on fd 4, each ended by a NUL
//! byte. No port is opened and nothing is downloaded. The browser's process
//! group is killed on drop (see [`crate::Proc`]).

use std::{
    fs::File,
    io::{BufRead, BufReader, Write},
    os::{
        fd::{AsRawFd, OwnedFd},
        unix::process::CommandExt,
    },
    process::Command,
    sync::mpsc::{Receiver, channel},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::Proc;

/// How long one protocol call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A headless Chromium with one page.
pub struct Browser {
    proc: Proc,
    to: File,
    from: Receiver<Value>,
    next_id: u64,
    session: String,
    /// Console errors, exceptions and error log entries seen so far.
    errors: Vec<String>,
    /// URLs of every request the page (and its frames) made.
    requests: Vec<String>,
    _profile: tempfile::TempDir,
}

fn pipe() -> (OwnedFd, OwnedFd) {
    nix::unistd::pipe().expect("pipe")
}

impl Browser {
    /// Starts Chromium and opens a blank page. Panics, saying what to
    /// install, when there is no `chromium`.
    pub fn start() -> Browser {
        let bin = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| std::path::Path::new(p).is_file())
            .expect("chromium is missing: install it (cargo xtask setup --with-test-deps)");
        let profile = tempfile::tempdir().unwrap();
        let (to_chrome_r, to_chrome_w) = pipe();
        let (from_chrome_r, from_chrome_w) = pipe();
        let mut cmd = Command::new(bin);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--remote-debugging-pipe",
            "--window-size=1400,1400",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()));
        let (r, w) = (to_chrome_r.as_raw_fd(), from_chrome_w.as_raw_fd());
        // SAFETY: dup2 is async-signal-safe; the new fds 3 and 4 have no
        // FD_CLOEXEC, so Chromium inherits them.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(r, 3) == -1 || libc::dup2(w, 4) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let proc = Proc::spawn(cmd);
        drop(to_chrome_r);
        drop(from_chrome_w);
        let (tx, rx) = channel();
        let reader = File::from(from_chrome_r);
        std::thread::spawn(move || {
            let mut r = BufReader::new(reader);
            let mut buf = Vec::new();
            while r.read_until(0, &mut buf).is_ok_and(|n| n > 0) {
                buf.pop_if(|b| *b == 0);
                if let Ok(v) = serde_json::from_slice::<Value>(&buf)
                    && tx.send(v).is_err()
                {
                    break;
                }
                buf.clear();
            }
        });
        let mut b = Browser {
            proc,
            to: File::from(to_chrome_w),
            from: rx,
            next_id: 0,
            session: String::new(),
            errors: Vec::new(),
            requests: Vec::new(),
            _profile: profile,
        };
        let target = b.call(None, "Target.createTarget", json!({"url": "about:blank"}));
        let id = target["targetId"].as_str().expect("targetId").to_string();
        let att = b.call(
            None,
            "Target.attachToTarget",
            json!({"targetId": id, "flatten": true}),
        );
        b.session = att["sessionId"].as_str().expect("sessionId").to_string();
        for m in [
            "Runtime.enable",
            "Page.enable",
            "Log.enable",
            "Network.enable",
        ] {
            b.page(m, json!({}));
        }
        b
    }

    /// Sends a command and waits for its answer; events met on the way are
    /// checked for errors.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).expect("write to chromium");
        let end = Instant::now() + CALL_TIMEOUT;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let v = self.from.recv_timeout(left).unwrap_or_else(|_| {
                panic!(
                    "chromium did not answer {method} within {CALL_TIMEOUT:?}; stderr: {:?}",
                    self.proc.stderr()
                )
            });
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
            self.event(&v);
        }
    }

    fn page(&mut self, method: &str, params: Value) -> Value {
        let s = self.session.clone();
        self.call(Some(&s), method, params)
    }

    /// Keeps what counts as an error in the page, and the requests.
    fn event(&mut self, v: &Value) {
        let p = &v["params"];
        match v["method"].as_str() {
            Some("Network.requestWillBeSent") => self
                .requests
                .push(p["request"]["url"].as_str().unwrap_or("?").to_string()),
            Some("Runtime.exceptionThrown") => self.errors.push(p["exceptionDetails"].to_string()),
            Some("Runtime.consoleAPICalled") if p["type"] == "error" => {
                self.errors.push(p["args"].to_string())
            }
            Some("Log.entryAdded") if p["entry"]["level"] == "error" => {
                self.errors.push(p["entry"].to_string())
            }
            _ => {}
        }
    }

    /// Opens `url` and waits for its load event and two frames more (the
    /// flame graphs lay themselves out in a timeout after load).
    pub fn open(&mut self, url: &str) {
        self.page("Page.navigate", json!({"url": url}));
        let end = Instant::now() + CALL_TIMEOUT;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let v = self
                .from
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("{url} did not load within {CALL_TIMEOUT:?}"));
            self.event(&v);
            if v["method"] == "Page.loadEventFired" {
                break;
            }
        }
        self.eval(
            "new Promise(r => requestAnimationFrame(() => setTimeout(() => requestAnimationFrame(() => r(0)), 50)))",
        );
    }

    /// Evaluates an expression in the page (awaiting a promise) and
    /// returns its value.
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.page(
            "Runtime.evaluate",
            json!({"expression": expr, "returnByValue": true, "awaitPromise": true}),
        );
        assert!(
            r.get("exceptionDetails").is_none(),
            "{expr}: {}",
            r["exceptionDetails"]
        );
        r["result"]["value"].clone()
    }

    /// A PNG of the whole page.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let r = self.page(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        base64_decode(r["data"].as_str().expect("screenshot data"))
    }

    /// Closes the browser; returns the errors the page met, and the URLs
    /// of the requests it made (the page's own included).
    pub fn close(mut self) -> (Vec<String>, Vec<String>) {
        // Events still queued.
        while let Ok(v) = self.from.try_recv() {
            self.event(&v);
        }
        self.call(None, "Browser.close", json!({}));
        let _ = self.proc.wait(Duration::from_secs(10));
        (
            std::mem::take(&mut self.errors),
            std::mem::take(&mut self.requests),
        )
    }
}

/// Standard base64, as the protocol sends binary data.
fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=' && c != b'\n').collect();
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= (val(c) as u32) << (18 - 6 * i);
        }
        for i in 0..chunk.len().saturating_sub(1) {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64() {
        assert_eq!(super::base64_decode("aGVsbG8="), b"hello");
        assert_eq!(super::base64_decode("aGk="), b"hi");
        assert_eq!(super::base64_decode("YWJj"), b"abc");
    }
}
