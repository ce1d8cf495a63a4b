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
//! It also says which stretches of time the file does not show (its
//! [`Gap`]s): before its oldest record, and where perf lost records
//! (`PERF_RECORD_LOST`, `PERF_RECORD_LOST_SAMPLES`), so that the off-CPU
//! breakdown does not read them as a state (docs/off-cpu.md).
//!
//! Parsing uses the `linux-perf-data` crate (docs/dependencies.md).

use std::{collections::HashMap, fs::File, io::BufReader};

use linux_perf_data::{
    PerfFileReader, PerfFileRecord,
    linux_perf_event_reader::{
        ContextSwitchRecord, EventRecord, RawEventRecord, RecordType, TaskWasPreempted,
    },
};
use serde::{Deserialize, Serialize};

use crate::perf::offcpu::{ContextSwitch, ContextSwitchKind, Gap};

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
    /// What the file shows of time, record by record.
    pub coverage: Coverage,
}

/// The most bytes one perf record takes: its header's size is a `u16`.
const MAX_RECORD_BYTES: u64 = 1 << 16;

/// The records of one CPU's ring in the file.
#[derive(Debug, Clone, Copy)]
struct Ring {
    first_ns: u64,
    last_ns: u64,
    bytes: u64,
    /// The ring lost records in this file.
    lossy: bool,
}

/// Which stretches of time a file shows, from its timed records in file
/// order (pure). perf keeps one ring per CPU and copies each ring in time
/// order, so a CPU's records come in time order (docs/off-cpu.md); records
/// without a CPU (a file recorded without `--sample-cpu`) count as one ring.
#[derive(Debug, Default, Clone)]
pub struct Coverage {
    rings: HashMap<Option<u32>, Ring>,
    lost: Vec<Gap>,
    /// Records perf counted as lost, from `PERF_RECORD_LOST` and
    /// `PERF_RECORD_LOST_SAMPLES`.
    pub lost_records: u64,
}

impl Coverage {
    /// A record the kernel wrote into `cpu`'s ring at `time_ns`, `bytes`
    /// long (header included).
    pub fn record(&mut self, cpu: Option<u32>, time_ns: u64, bytes: u64) {
        let r = self.rings.entry(cpu).or_insert(Ring {
            first_ns: time_ns,
            last_ns: time_ns,
            bytes: 0,
            lossy: false,
        });
        r.first_ns = r.first_ns.min(time_ns);
        r.last_ns = r.last_ns.max(time_ns);
        r.bytes += bytes;
    }

    /// A loss record written at `time_ns` into `cpu`'s ring: the kernel
    /// writes it once the ring has room again, so the records lost lie
    /// between the ring's previous record and it (with no CPU, between the
    /// file's start and it).
    pub fn lost(&mut self, cpu: Option<u32>, time_ns: u64, count: u64) {
        self.lost_records += count;
        let from = match cpu {
            Some(_) => self.rings.get(&cpu).map_or(0, |r| r.last_ns),
            None => 0,
        };
        self.lost.push([from, time_ns]);
        self.record(cpu, time_ns, 0);
        if let Some(r) = self.rings.get_mut(&cpu) {
            r.lossy = true;
        }
    }

    /// The time from which every ring is whole, CLOCK_MONOTONIC ns (`None`:
    /// no timed record). That is the oldest record, except that a
    /// flight-recorder ring (`ring_bytes`) that holds about a ring-full has
    /// overwritten older records: it shows only its own stretch.
    pub fn start_ns(&self, ring_bytes: Option<u64>) -> Option<u64> {
        let oldest = self.rings.values().map(|r| r.first_ns).min()?;
        let wrapped = self
            .rings
            .values()
            .filter(|r| ring_bytes.is_some_and(|b| r.bytes + MAX_RECORD_BYTES >= b))
            .map(|r| r.first_ns)
            .max();
        Some(wrapped.map_or(oldest, |w| w.max(oldest)))
    }

    /// The stretches the file does not show: all time before
    /// [`Self::start_ns`] (all time, for a file without a timed record),
    /// each loss, and all time after the last record of a ring that lost
    /// records. A loss still going on when perf switches files is reported
    /// by the kernel at the ring's next write, in the next file; a ring
    /// that was losing in this file may be losing at its end.
    pub fn gaps(&self, ring_bytes: Option<u64>) -> Vec<Gap> {
        let start = self.start_ns(ring_bytes).unwrap_or(u64::MAX);
        let mut v = vec![[0, start]];
        v.extend(self.lost.iter().copied());
        let mut tails: Vec<u64> = self
            .rings
            .values()
            .filter(|r| r.lossy)
            .map(|r| r.last_ns)
            .collect();
        tails.sort_unstable();
        v.extend(tails.first().map(|&t| [t, u64::MAX]));
        v
    }
}

/// Reads the sample span of an open perf.data file (read from its start)
/// and the context-switch records of the threads in `tids`. Errors:
/// unreadable or malformed files.
pub fn read_facts(file: File, tids: &[u32]) -> anyhow::Result<FileFacts> {
    let file = BufReader::new(file);
    let PerfFileReader {
        mut perf_file,
        mut record_iter,
    } = PerfFileReader::parse_file(file)?;
    let mut facts = FileFacts::default();
    while let Some(record) = record_iter.next_record(&mut perf_file)? {
        let PerfFileRecord::EventRecord { record, .. } = record else {
            continue;
        };
        let common = record.common_data().ok();
        let cpu = common.as_ref().and_then(|c| c.cpu);
        let time = common.as_ref().and_then(|c| c.timestamp).filter(|&t| t > 0);
        let bytes = record.data.len() as u64 + 8;
        match record.parse() {
            Ok(EventRecord::Sample(_)) => {
                if let Some(t) = time {
                    facts.span = Some(SampleSpan::add(facts.span, t));
                    facts.coverage.record(cpu, t, bytes);
                }
            }
            Ok(EventRecord::ContextSwitch(c)) => {
                let Some(time_ns) = time else { continue };
                facts.coverage.record(cpu, time_ns, bytes);
                let tid = common.as_ref().and_then(|c| c.tid).map(|t| t as u32);
                if let Some(tid) = tid
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
            Ok(EventRecord::Lost(l)) => {
                if let Some(t) = time {
                    facts.coverage.lost(cpu, t, l.count);
                } else {
                    facts.coverage.lost(None, u64::MAX, l.count);
                }
            }
            Ok(EventRecord::Raw(r)) if r.record_type == RecordType::LOST_SAMPLES => {
                lost_samples(&mut facts.coverage, &r, cpu, time);
            }
            _ => {}
        }
    }
    Ok(facts)
}

/// `PERF_RECORD_LOST_SAMPLES` (`u64 lost`, then the sample id). perf
/// writes one per event at the end of a recording, from the event's lost
/// count, with no time of its own: those samples were lost somewhere in
/// the run, and the `PERF_RECORD_LOST` records place them, so only the
/// count is kept. A timed one is a loss like `PERF_RECORD_LOST`.
fn lost_samples(c: &mut Coverage, r: &RawEventRecord<'_>, cpu: Option<u32>, time: Option<u64>) {
    let head = r.data.as_slice();
    let Some(count) = head
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    else {
        return;
    };
    if count == 0 {
        return;
    }
    match time {
        Some(t) => c.lost(cpu, t, count),
        None => c.lost_records += count,
    }
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
    fn a_file_shows_time_from_its_oldest_record() {
        let mut c = Coverage::default();
        assert_eq!(c.gaps(None), [[0, u64::MAX]]);
        c.record(Some(1), 500, 100);
        c.record(Some(0), 300, 100);
        c.record(Some(0), 400, 100);
        assert_eq!(c.start_ns(None), Some(300));
        assert_eq!(c.gaps(None), [[0, 300]]);
    }

    #[test]
    fn a_wrapped_flight_recorder_ring_shows_only_its_own_stretch() {
        let ring = 1 << 20;
        let mut c = Coverage::default();
        c.record(Some(0), 300, 1000);
        c.record(Some(1), 700, ring - 1000);
        c.record(Some(1), 900, 1000);
        // CPU 1's ring is full: what it held before 700 was overwritten.
        assert_eq!(c.start_ns(Some(ring)), Some(700));
        // Continuous recording overwrites nothing.
        assert_eq!(c.start_ns(None), Some(300));
    }

    #[test]
    fn a_loss_runs_from_its_rings_previous_record_to_the_loss_record() {
        let mut c = Coverage::default();
        c.record(Some(0), 100, 64);
        c.record(Some(1), 150, 64);
        c.record(Some(0), 200, 64);
        c.record(Some(1), 220, 64);
        c.lost(Some(0), 400, 7);
        // A second loss on the same ring starts after the first.
        c.lost(Some(0), 450, 2);
        // A ring with no record before its loss lost from the file's start.
        c.lost(Some(2), 300, 1);
        c.record(Some(0), 480, 64);
        c.record(Some(1), 500, 64);
        assert_eq!(c.lost_records, 10);
        // After the last record of a ring that lost records, it may be
        // losing still: the kernel reports that in the next file.
        // Rings 0 and 2 lost records; ring 2's last record is at 300.
        assert_eq!(
            c.gaps(None),
            [[0, 100], [200, 400], [400, 450], [0, 300], [300, u64::MAX]]
        );
        // Without a CPU, from the file's start.
        let mut c = Coverage::default();
        c.record(None, 100, 64);
        c.lost(None, 250, 1);
        c.record(None, 260, 64);
        assert_eq!(c.gaps(None), [[0, 100], [0, 250], [260, u64::MAX]]);
        // A file that lost nothing shows everything after its start.
        let mut c = Coverage::default();
        c.record(Some(0), 100, 64);
        c.record(Some(0), 900, 64);
        assert_eq!(c.gaps(None), [[0, 100]]);
    }

    #[test]
    fn a_file_that_is_not_perf_data_is_an_error() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), b"not a perf file").unwrap();
        assert!(read_facts(File::open(tmp.path()).unwrap(), &[]).is_err());
    }
}
