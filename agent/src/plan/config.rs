//! `--config FILE`: several triggers in one TOML file, served by one agent
//! (what the systemd unit runs). Each `[[trigger]]` has `exe` or `pid`, a
//! `symbol`, and the same conditions as the command line:
//!
//! ```toml
//! output = "/var/lib/mt-agent"   # each run writes into <output>/<local time>/
//! max_targets = 8
//! event = "cpu-clock"            # also: perf, freq, keep, perf_args
//! max_disk = "2G"                # bounds this run and older runs under output
//! recording = "flight-recorder"  # or "continuous"; flight_ring = "2M"
//!
//! [upload]                       # docs/upload.md
//! url = "s3://moments/prod"
//! delete = true                  # --upload-delete; also: wait = "30s", host = "web-1"
//!
//! [[trigger]]
//! name = "api"                   # output subdirectory; default trigger<N>
//! exe = "/usr/local/bin/api-server"
//! symbol = "handle_request"
//! cooldown = "1s"
//! slower_than = "50ms"           # with the off-CPU breakdown; no_off_cpu = true
//!
//! [[trigger]]
//! name = "db"
//! pid = 4242
//! symbol = "sqlite3_step"
//! object = "libsqlite3"
//! when = ["arg1 == 7"]
//! ```
//!
//! Durations are strings (`"100ms"`); rates are strings (`"10/s"`).

use std::{fs, path::PathBuf};

use serde::Deserialize;

use crate::{error::Failure, flags::defs::TriggerOptions};

/// The whole file.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Parent of each run's output directory.
    pub output: Option<PathBuf>,
    /// At most this many processes recorded at once, across all triggers.
    pub max_targets: Option<u64>,
    pub perf: Option<PathBuf>,
    pub event: Option<String>,
    pub freq: Option<u32>,
    pub keep: Option<u32>,
    /// `"flight-recorder"` (the default for config runs) or `"continuous"`.
    pub recording: Option<String>,
    /// Size of each flight-recorder ring, e.g. `"2M"`.
    pub flight_ring: Option<String>,
    /// Budget for everything mt-agent wrote under `output`, this run and
    /// older ones, e.g. `"2G"`: the oldest snapshots are deleted first.
    pub max_disk: Option<String>,
    #[serde(default)]
    pub perf_args: Vec<String>,
    /// `[upload]`: the `--upload*` options.
    pub upload: Option<UploadConfig>,
    /// Each `[[trigger]]`: the command line's trigger options.
    #[serde(default, rename = "trigger")]
    pub triggers: Vec<TriggerOptions>,
}

/// A config file's `[upload]` table.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UploadConfig {
    pub url: String,
    #[serde(default)]
    pub delete: bool,
    /// A duration, e.g. `"30s"`.
    pub wait: Option<String>,
    pub host: Option<String>,
}

/// Reads and checks a config file. Errors (exit code 2): unreadable, not
/// TOML, unknown keys, a trigger without exactly one of `exe` and `pid`, or
/// without `symbol`.
pub fn load(path: &std::path::Path) -> Result<Config, Failure> {
    let text = read_regular(path)
        .map_err(|e| Failure::usage(format!("cannot read --config {}: {e}", path.display())))?;
    parse(&text).map_err(|f| {
        Failure::usage(format!("--config {}: {}", path.display(), f.message)).with_detail(f.detail)
    })
}

/// Reads a regular file; anything else (a FIFO, a device, a directory) is
/// refused at once. The open does not block: `O_NONBLOCK` makes opening a
/// FIFO with no writer return, and the file type is checked on the fd.
fn read_regular(path: &std::path::Path) -> std::io::Result<String> {
    use std::{io::Read, os::unix::fs::OpenOptionsExt};
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let kind = f.metadata()?.file_type();
    if !kind.is_file() {
        return Err(std::io::Error::other(
            "not a regular file (a FIFO, device or directory); give a TOML file",
        ));
    }
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    Ok(text)
}

/// Parses config text (see [`load`]).
pub fn parse(text: &str) -> Result<Config, Failure> {
    let mut c: Config = toml::from_str(text).map_err(|e| {
        let mut message = e.message().to_string();
        // serde stops at the first unknown key: name each trigger's too.
        for (i, key) in unknown_trigger_keys(text) {
            if !message.contains(&format!("`{key}`")) {
                message.push_str(&format!("; trigger {i}: unknown field `{key}`"));
            }
        }
        Failure::usage(message)
            .with_detail(e.span().map(|s| format!("at byte {} of the file", s.start)))
    })?;
    if c.triggers.is_empty() {
        return Err(Failure::usage("no [[trigger]] given; add at least one"));
    }
    let mut names = std::collections::HashSet::new();
    for (i, t) in c.triggers.iter_mut().enumerate() {
        let name = t.name.get_or_insert_with(|| format!("trigger{i}")).clone();
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(Failure::usage(format!(
                "trigger name {name:?} must be a plain file name"
            )));
        }
        if !names.insert(name.clone()) {
            return Err(Failure::usage(format!(
                "two triggers are named {name:?}; names must differ"
            )));
        }
        if t.pid.is_some() == t.exe.is_some() {
            return Err(Failure::usage(format!(
                "trigger {name}: give exactly one of exe = \"PATH\" or pid = N"
            )));
        }
        if t.symbol.is_none() {
            return Err(Failure::usage(format!(
                "trigger {name}: symbol is required"
            )));
        }
    }
    Ok(c)
}

/// The first unknown key of each `[[trigger]]` that has one, by trigger
/// index (0-based), as serde names it; empty when the text is not TOML.
fn unknown_trigger_keys(text: &str) -> Vec<(usize, String)> {
    let Ok(table) = toml::from_str::<toml::Table>(text) else {
        return Vec::new();
    };
    let Some(toml::Value::Array(triggers)) = table.get("trigger") else {
        return Vec::new();
    };
    triggers
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let err = TriggerOptions::deserialize(t.clone()).err()?.to_string();
            let key = err.split("unknown field `").nth(1)?.split('`').next()?;
            Some((i, key.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_with_two_triggers() {
        let c = parse(
            r#"
            output = "/var/lib/mt-agent"
            event = "cpu-clock"
            [[trigger]]
            name = "api"
            exe = "/usr/bin/api"
            symbol = "handle"
            cooldown = "1s"
            when = ["arg0 == 1"]
            [[trigger]]
            pid = 42
            symbol = "f"
            "#,
        )
        .unwrap();
        assert_eq!(c.triggers.len(), 2);
        assert_eq!(c.triggers[1].name.as_deref(), Some("trigger1"));
        assert_eq!(c.triggers[0].cooldown.as_deref(), Some("1s"));
        assert_eq!(c.triggers[0].when, ["arg0 == 1"]);
    }

    #[test]
    fn the_upload_table_gives_the_upload_options() {
        let c = parse(
            r#"
            [upload]
            url = "s3://moments/prod"
            delete = true
            wait = "10s"
            [[trigger]]
            pid = 1
            symbol = "f"
            "#,
        )
        .unwrap();
        let u = c.upload.unwrap();
        assert_eq!(
            (u.url.as_str(), u.delete, u.wait.as_deref(), u.host),
            ("s3://moments/prod", true, Some("10s"), None)
        );
        let bad = parse(
            "[upload]
url = \"s3://m/p\"
bucket = \"x\"
[[trigger]]
pid = 1
symbol = \"f\"",
        );
        assert!(bad.unwrap_err().message.contains("unknown field `bucket`"));
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        let err = |t: &str| parse(t).unwrap_err().message;
        assert!(err("").contains("no [[trigger]]"));
        assert!(err("[[trigger]]\nsymbol = \"f\"").contains("exactly one of exe"));
        assert!(
            err("[[trigger]]\npid = 1\nexe = \"/x\"\nsymbol = \"f\"")
                .contains("exactly one of exe")
        );
        assert!(err("[[trigger]]\npid = 1").contains("symbol is required"));
        assert!(err("[[trigger]]\npid = 1\nsymbol = \"f\"\ncolor = 3").contains("unknown field"));
        // A trigger's unknown key is named after an unknown key above it.
        let both = err("colour = 1\n[[trigger]]\npid = 1\nsymbol = \"f\"\ncolor = 3");
        assert!(both.contains("`colour`"), "{both}");
        assert!(both.contains("trigger 0: unknown field `color`"), "{both}");
        let second = err("[[trigger]]\npid = 1\nsymbol = \"f\"\n[[trigger]]\npid = 2\nflavor = 1");
        assert!(second.contains("`flavor`"), "{second}");
        assert!(err("[[trigger]]\nname=\"a\"\npid = 1\nsymbol = \"f\"\n[[trigger]]\nname=\"a\"\npid = 2\nsymbol = \"g\"").contains("named"));
    }
}
