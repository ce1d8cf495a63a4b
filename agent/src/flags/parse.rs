//! The values options take: durations, rates, sizes, numbers and `--call-graph` modes, parsed with one message each.

use std::time::Duration;

/// perf's own default stack copy for `--call-graph dwarf`, bytes.
pub const DEFAULT_DWARF_BYTES: u32 = 8192;

/// The stack copy `--call-graph auto` chooses DWARF with where it cannot
/// measure the target's (`report::stack_need`: a target that hardly runs,
/// or `--exe`), bytes. With the report's graft of cut stacks it keeps about
/// as many samples whole as 8192 did without it on every program measured,
/// at half the bytes per sample (docs/unwinding.md, "How much stack a
/// sample needs").
pub const AUTO_DWARF_BYTES: u32 = 4096;

/// What `--call-graph` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallGraph {
    /// Decide from the code (the default).
    Auto,
    Fp,
    /// DWARF with this stack copy, bytes.
    Dwarf(u32),
}

/// Parses `auto`, `fp`, `dwarf` or `dwarf,SIZE` (SIZE in bytes, a multiple
/// of 8 up to 65528, perf's limits in `parse_callchain_record`).
pub fn parse_request(s: &str) -> Result<CallGraph, String> {
    match s {
        "auto" => return Ok(CallGraph::Auto),
        "fp" => return Ok(CallGraph::Fp),
        "dwarf" => return Ok(CallGraph::Dwarf(DEFAULT_DWARF_BYTES)),
        _ => {}
    }
    let size = s
        .strip_prefix("dwarf,")
        .ok_or_else(|| format!("`{s}`: expected auto, fp, dwarf or dwarf,SIZE"))?;
    let n: u32 = size
        .parse()
        .map_err(|_| format!("`{size}` is not a size in bytes"))?;
    if n == 0 || !n.is_multiple_of(8) || n > 65528 {
        return Err(format!(
            "dwarf stack size {n}: must be a multiple of 8 between 8 and 65528 (perf's limits)"
        ));
    }
    Ok(CallGraph::Dwarf(n))
}

/// A duration option, checked and kept as written.
pub fn duration_text(s: &str) -> Result<String, String> {
    parse_duration(s).map(|_| s.to_string())
}

/// A rate option, checked and kept as written.
pub fn rate_text(s: &str) -> Result<String, String> {
    parse_rate(s).map(|_| s.to_string())
}

/// Parses a duration such as `100ms`, `5s`, `1m30s` or `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{e}; write a duration such as 250us, 100ms, 5s or 1m"))
}

/// A time a fleet report's `--since` or `--until` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// This long before the report starts.
    Ago(Duration),
    /// This wall-clock time: ns since the Unix epoch (UTC).
    At(i128),
}

impl When {
    /// The time as ns since the Unix epoch, `now_ns` being the report's start.
    pub fn unix_ns(self, now_ns: i128) -> i128 {
        match self {
            When::Ago(d) => now_ns - d.as_nanos() as i128,
            When::At(t) => t,
        }
    }
}

/// Parses a duration ago (`1h`, `30m`, as [`parse_duration`]) or an
/// RFC 3339 time (`2026-12-02T09:30:00Z`, `2026-12-02T10:30:00+01:00`).
pub fn parse_when(s: &str) -> Result<When, String> {
    let s = s.trim();
    if let Ok(d) = parse_duration(s) {
        return Ok(When::Ago(d));
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .and_then(|t| t.timestamp_nanos_opt())
        .map(|ns| When::At(ns.into()))
        .ok_or_else(|| {
            format!(
                "{s:?} is neither a duration ago (1h, 30m) nor an RFC 3339 time \
                 (2026-12-02T09:30:00Z, 2026-12-02T10:30:00+01:00)"
            )
        })
}

/// Parses a rate such as `10/s`, `10`, `600/m` or `0.5/s`, in hits per second.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let (num, per) = match s.split_once('/') {
        Some((n, unit)) => {
            let per = match unit.trim() {
                "s" | "sec" => 1.0,
                "m" | "min" => 60.0,
                "h" => 3600.0,
                other => return Err(format!("unknown rate unit `{other}`; use /s, /m or /h")),
            };
            (n, per)
        }
        None => (s, 1.0),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{num}` is not a number; write a rate such as 10/s"))?;
    if !(n.is_finite() && n > 0.0) {
        return Err("a rate must be greater than 0".into());
    }
    Ok(n / per)
}

/// Parses a size in bytes such as `4096`, `512K`, `2M` or `1G` (powers of
/// 1024; a trailing `B` or `iB` is accepted).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let upper = t.to_ascii_uppercase();
    let body = upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper);
    let (num, shift) = match body.chars().last() {
        Some('K') => (&body[..body.len() - 1], 10),
        Some('M') => (&body[..body.len() - 1], 20),
        Some('G') => (&body[..body.len() - 1], 30),
        Some('T') => (&body[..body.len() - 1], 40),
        _ => (body, 0),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size; write one such as 512K, 2M or 1G"))?;
    match n.checked_mul(1u64 << shift) {
        Some(0) => Err("a size must be greater than 0".into()),
        Some(v) => Ok(v),
        None => Err(format!("`{s}` is too large")),
    }
}

/// Parses an unsigned integer in decimal or `0x` hex.
pub fn parse_u64(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| format!("`{s}` is not a number (decimal or 0x hex)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_a_duration_ago_or_an_rfc3339_time() {
        assert_eq!(parse_when("1h"), Ok(When::Ago(Duration::from_secs(3600))));
        assert_eq!(
            parse_when("30m").unwrap().unix_ns(3_600e9 as i128),
            1_800e9 as i128
        );
        let utc = parse_when("2026-12-02T09:30:00Z").unwrap();
        assert_eq!(utc, When::At(1_796_203_800_000_000_000));
        assert_eq!(parse_when("2026-12-02T10:30:00+01:00"), Ok(utc));
        assert_eq!(utc.unix_ns(0), 1_796_203_800_000_000_000);
        for bad in ["yesterday", "2026-12-02", "2026-12-02T09:30:00", "-1h", ""] {
            let e = parse_when(bad).unwrap_err();
            assert!(e.contains("RFC 3339"), "{bad}: {e}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("fast").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("2M"), Ok(2 << 20));
        assert_eq!(parse_size("2MiB"), Ok(2 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn rates() {
        assert_eq!(parse_rate("10/s"), Ok(10.0));
        assert_eq!(parse_rate("10"), Ok(10.0));
        assert_eq!(parse_rate("120/m"), Ok(2.0));
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("10/fortnight").is_err());
    }

    #[test]
    fn numbers() {
        assert_eq!(parse_u64("0x10"), Ok(16));
        assert_eq!(parse_u64("4096"), Ok(4096));
        assert!(parse_u64("0xzz").is_err());
    }

    #[test]
    fn requests_parse() {
        assert_eq!(parse_request("auto"), Ok(CallGraph::Auto));
        assert_eq!(parse_request("fp"), Ok(CallGraph::Fp));
        assert_eq!(parse_request("dwarf"), Ok(CallGraph::Dwarf(8192)));
        assert_eq!(parse_request("dwarf,16384"), Ok(CallGraph::Dwarf(16384)));
        assert!(parse_request("dwarf,100").is_err());
        assert!(parse_request("dwarf,0").is_err());
        assert!(parse_request("lbr").is_err());
    }
}
