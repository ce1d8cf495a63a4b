//! What a snapshot file holds, read from the perf.data file itself: how many
//! samples, and the times of the first and last one.
//!
//! perf records with `-k CLOCK_MONOTONIC`, so sample times are on the clock
//! of the hits' `ktime_ns` (`bpf_ktime_get_ns`), and the two can be compared
//! directly. perf 6.1 leaves the header's own first/last sample times at 0
//! under `--switch-output` (they are filled only while build-ids are
//! processed or with `--timestamp-boundary`), so the samples are read.
//!
//! With the off-CPU breakdown on, it also holds the context-switch records
//! of the target's threads (`--switch-events`), read here for the threads
//! that hit.
//!
//! Parsing uses the `linux-perf-data` crate (docs/dependencies.md).

use std::{collections::HashMap, fs::File, io::BufReader, path::Path};

use linux_perf_data::{
    PerfFileReader, PerfFileRecord,
    linux_perf_event_reader::{ContextSwitchRecord, EventRecord, TaskWasPreempted},
};
use serde::{Deserialize, Serialize};

use crate::perf::offcpu::{ContextSwitch, ContextSwitchKind};

/// The samples of one snapshot file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleSpan {
    /// Number of samples in the file.
    pub samples: u64,
    /// Time of the oldest sample, CLOCK_MONOTONIC ns.
    pub first_sample_ns: u64,
    /// Time of the newest sample, CLOCK_MONOTONIC ns.
    pub last_sample_ns: u64,
}

impl SampleSpan {
    /// Folds one sample time into the span (`None` starts it).
    pub fn add(span: Option<Self>, time_ns: u64) -> Self {
        match span {
            None => Self {
                samples: 1,
                first_sample_ns: time_ns,
                last_sample_ns: time_ns,
            },
            Some(s) => Self {
                samples: s.samples + 1,
                first_sample_ns: s.first_sample_ns.min(time_ns),
                last_sample_ns: s.last_sample_ns.max(time_ns),
            },
        }
    }

    /// Whether something that started at `start_ns` lies before the oldest
    /// sample, so the file cannot show its beginning.
    pub fn starts_after(&self, start_ns: u64) -> bool {
        start_ns < self.first_sample_ns
    }
}

/// What the recorder reads from a completed snapshot file.
#[derive(Debug, Default)]
pub struct FileFacts {
    /// `None`: no timed samples.
    pub span: Option<SampleSpan>,
    /// Context switches of the threads asked for, by tid, in file order.
    pub context_switches: HashMap<u32, Vec<ContextSwitch>>,
}

/// Reads the sample span of a perf.data file and the context-switch records
/// of the threads in `tids`. Errors: unreadable or malformed files.
pub fn read_facts(path: &Path, tids: &[u32]) -> anyhow::Result<FileFacts> {
    let file = BufReader::new(File::open(path)?);
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(file)?;
    let mut facts = FileFacts::default();
    while let Some(record) = record_iter.next_record(&mut perf_file)? {
        let PerfFileRecord::EventRecord { record, .. } = record else {
            continue;
        };
        match record.parse() {
            Ok(EventRecord::Sample(s)) => {
                if let Some(t) = s.timestamp {
                    facts.span = Some(SampleSpan::add(facts.span, t));
                }
            }
            Ok(EventRecord::ContextSwitch(c)) if !tids.is_empty() => {
                let common = record.common_data().ok();
                let tid = common.as_ref().and_then(|c| c.tid).map(|t| t as u32);
                let time = common.as_ref().and_then(|c| c.timestamp);
                if let (Some(tid), Some(time_ns)) = (tid, time)
                    && tids.contains(&tid)
                {
                    let kind = context_switch_kind(c);
                    facts
                        .context_switches
                        .entry(tid)
                        .or_default()
                        .push(ContextSwitch { time_ns, kind });
                }
            }
            _ => {}
        }
    }
    Ok(facts)
}

fn context_switch_kind(c: ContextSwitchRecord) -> ContextSwitchKind {
    match c {
        ContextSwitchRecord::In { .. } => ContextSwitchKind::In,
        ContextSwitchRecord::Out { preempted, .. } => ContextSwitchKind::Out {
            preempted: preempted == TaskWasPreempted::Yes,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_covers_its_samples_in_any_order() {
        let span = [30, 10, 20]
            .into_iter()
            .fold(None, |s, t| Some(SampleSpan::add(s, t)))
            .unwrap();
        assert_eq!(
            span,
            SampleSpan {
                samples: 3,
                first_sample_ns: 10,
                last_sample_ns: 30
            }
        );
        assert!(span.starts_after(9));
        assert!(!span.starts_after(10));
    }

    #[test]
    fn a_file_that_is_not_perf_data_is_an_error() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), b"not a perf file").unwrap();
        assert!(read_facts(tmp.path(), &[]).is_err());
    }
}
