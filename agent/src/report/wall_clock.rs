//! A snapshot's times on the wall clock, from perf's file name: perf names
//! a file by the local time of its switch, to the centisecond
//! (`perf.data.YYYYmmddHHMMSScc`, docs/perf-switch-output.md), which
//! follows the first hit by `hit_to_kill_ns` plus perf's switch. So a time
//! on the hits' clock (CLOCK_MONOTONIC) is the switch time less its
//! distance from the switch, to about 10 ms (docs/pprof.md, "Time").

use crate::output::index::Snapshot;

/// The stamp of the snapshot `file` names, as a `tm` and centiseconds.
fn stamp(file: &str) -> Option<(libc::tm, i64)> {
    let stamp = file.strip_prefix("perf.data.")?;
    if stamp.len() != 16 || !stamp.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let num = |a: usize, b: usize| stamp[a..b].parse::<i64>().ok();
    // SAFETY: a zeroed tm is valid.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = num(0, 4)? as i32 - 1900;
    tm.tm_mon = num(4, 6)? as i32 - 1;
    tm.tm_mday = num(6, 8)? as i32;
    tm.tm_hour = num(8, 10)? as i32;
    tm.tm_min = num(10, 12)? as i32;
    tm.tm_sec = num(12, 14)? as i32;
    Some((tm, num(14, 16)?))
}

/// The switch time of the snapshot `file` names, as its digits say it
/// (the local time of the host that recorded it), in ms counted as if
/// that were UTC: what the page shows. `None` for another name.
pub fn switch_ms(file: &str) -> Option<i64> {
    let (mut tm, cs) = stamp(file)?;
    // SAFETY: timegm gets a valid pointer.
    Some(unsafe { libc::timegm(&mut tm) } * 1000 + cs * 10)
}

/// The switch time of the snapshot `file` names, ms since the epoch: the
/// stamp read in this host's time zone (`TZ`), which is right when the
/// report runs in the zone of the host that recorded it.
fn switch_epoch_ms(file: &str) -> Option<i64> {
    let (mut tm, cs) = stamp(file)?;
    tm.tm_isdst = -1;
    // SAFETY: mktime gets a valid pointer.
    let secs = unsafe { libc::mktime(&mut tm) };
    (secs != -1).then_some(secs * 1000 + cs * 10)
}

/// `ktime_ns` (CLOCK_MONOTONIC) on the wall clock, ns since the epoch,
/// from the snapshot's name (see [`switch_epoch_ms`]); `None` when the
/// name has no stamp or the snapshot lists no hit.
pub fn wall_ns(s: &Snapshot, ktime_ns: u64) -> Option<i64> {
    let switch_ns = switch_epoch_ms(&s.file)?.checked_mul(1_000_000)?;
    let first = s.hits.first()?.ktime_ns;
    let switch_ktime = first as i128 + s.hit_to_kill_ns.unwrap_or(0) as i128;
    let wall = switch_ns as i128 - (switch_ktime - ktime_ns as i128);
    i64::try_from(wall).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_is_read_to_the_centisecond() {
        // 2026-12-01 00:00:00.07 UTC.
        assert_eq!(
            switch_ms("perf.data.2026120100000007"),
            Some(1_796_083_200_070)
        );
        assert_eq!(switch_ms("perf.data.20261201000000"), None);
        assert_eq!(switch_ms("perf.data"), None);
    }

    #[test]
    fn a_time_before_the_switch_is_earlier_by_as_much() {
        let s: Snapshot = serde_json::from_value(serde_json::json!({
            "kind": "hit", "file": "perf.data.2026120100000007",
            "hit_to_kill_ns": 2_000_000,
            "hits": [{"seq": 1, "tgid": 1, "tid": 1, "cpu": 0, "ktime_ns": 10_000_000_000u64,
                      "args": [0, 0, 0, 0, 0, 0]}],
        }))
        .unwrap();
        let switch = switch_epoch_ms(&s.file).unwrap() * 1_000_000;
        // The stamp in this host's zone: within a day of its digits as UTC.
        let utc = switch_ms(&s.file).unwrap() * 1_000_000;
        assert!(
            (switch - utc).abs() <= 26 * 3_600_000_000_000,
            "{switch} {utc}"
        );
        assert_eq!(wall_ns(&s, 10_002_000_000), Some(switch));
        assert_eq!(wall_ns(&s, 9_000_000_000), Some(switch - 1_002_000_000));
    }
}
