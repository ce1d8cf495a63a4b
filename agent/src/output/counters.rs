//! The kernel's counters of a trigger as a run reports them: `seen`, `dropped` by reason, `accepted` and `lost`.
//!
//! The drop reasons are listed once, in [`DROP_REASONS`]: the JSON fields of
//! `dropped` (summary, index), the summary's text, the sum and the reading
//! of the `COUNTERS` map ([`crate::probe::counters`]) all go through that
//! table.

use agent_common::Counter;
use serde::{Deserialize, Serialize, ser::SerializeStruct};

/// One reason a hit is dropped in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropReason {
    /// The kernel's counter.
    pub counter: Counter,
    /// The field in JSON (`dropped.<field>`).
    pub field: &'static str,
    /// The word in the text summary.
    pub word: &'static str,
}

/// Every drop reason, in the order the filters check them (and the order of
/// the JSON fields).
pub const DROP_REASONS: [DropReason; 8] = [
    DropReason::new(Counter::DropTid, "tid", "tid"),
    DropReason::new(Counter::DropWhen, "when", "when"),
    DropReason::new(Counter::DropDuration, "duration", "duration"),
    DropReason::new(Counter::DropEvery, "every", "every"),
    DropReason::new(Counter::DropRate, "rate", "rate"),
    DropReason::new(Counter::DropCooldown, "cooldown", "cooldown"),
    // `--slower-than` calls that left without a probed `ret`.
    DropReason::new(Counter::DropNoReturn, "no_return", "no-return"),
    // A map was full or a read failed.
    DropReason::new(Counter::DropError, "error", "error"),
];

impl DropReason {
    const fn new(counter: Counter, field: &'static str, word: &'static str) -> Self {
        Self {
            counter,
            field,
            word,
        }
    }
}

/// Counter values of one trigger, summed over CPUs.
/// Every field defaults to 0 when an index line read back lacks it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CounterValues {
    /// Entries of the function in the traced scope.
    pub seen: u64,
    /// Dropped, by reason.
    pub dropped: Dropped,
    /// Passed every filter.
    pub accepted: u64,
    /// Accepted but lost: the ring buffer was full.
    pub lost: u64,
}

impl CounterValues {
    /// Adds another trigger's values (for a summary over several triggers).
    pub fn add(&mut self, other: &CounterValues) {
        self.seen += other.seen;
        self.accepted += other.accepted;
        self.lost += other.lost;
        for (a, b) in self.dropped.0.iter_mut().zip(other.dropped.0) {
            *a += b;
        }
    }
}

/// Hits dropped in the kernel, per reason, in [`DROP_REASONS`] order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped(pub [u64; DROP_REASONS.len()]);

impl Dropped {
    /// The count for one reason, by its JSON field name (0 for an unknown
    /// name).
    pub fn get(&self, field: &str) -> u64 {
        DROP_REASONS
            .iter()
            .position(|r| r.field == field)
            .map_or(0, |i| self.0[i])
    }

    /// Counts given by JSON field name; the others are 0.
    pub fn from_fields(fields: &[(&str, u64)]) -> Self {
        let mut d = Self::default();
        for (field, n) in fields {
            let i = DROP_REASONS
                .iter()
                .position(|r| r.field == *field)
                .unwrap_or_else(|| panic!("no drop reason {field}"));
            d.0[i] = *n;
        }
        d
    }

    /// All drops.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// `cooldown 9990, when 3`: the non-zero reasons.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = DROP_REASONS
            .iter()
            .zip(self.0)
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{} {n}", r.word))
            .collect();
        parts.join(", ")
    }
}

impl Serialize for Dropped {
    /// `{"tid":0,"when":3,...}`: one field per reason.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Dropped", DROP_REASONS.len())?;
        for (r, n) in DROP_REASONS.iter().zip(self.0) {
            st.serialize_field(r.field, &n)?;
        }
        st.end()
    }
}

impl<'de> Deserialize<'de> for Dropped {
    /// One field per reason, as [`Dropped`] serializes; a reason missing
    /// is 0 and an unknown field is ignored (an index of another version).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let fields = std::collections::HashMap::<String, u64>::deserialize(d)?;
        Ok(Dropped(
            DROP_REASONS.map(|r| fields.get(r.field).copied().unwrap_or(0)),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_drop_counter_has_exactly_one_reason() {
        let drops: Vec<Counter> = Counter::ALL
            .iter()
            .copied()
            .filter(|c| format!("{c:?}").starts_with("Drop"))
            .collect();
        assert_eq!(drops.len(), DROP_REASONS.len());
        for c in drops {
            assert_eq!(DROP_REASONS.iter().filter(|r| r.counter == c).count(), 1);
        }
    }

    #[test]
    fn dropped_serializes_one_field_per_reason_in_filter_order() {
        let mut d = Dropped::default();
        d.0[1] = 3;
        d.0[5] = 9990;
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"tid":0,"when":3,"duration":0,"every":0,"rate":0,"cooldown":9990,"no_return":0,"error":0}"#
        );
        assert_eq!(d.total(), 9993);
        assert_eq!(d.describe(), "when 3, cooldown 9990");
    }

    #[test]
    fn values_add_up_per_reason() {
        let mut a = CounterValues {
            seen: 5,
            accepted: 2,
            lost: 1,
            dropped: Dropped([1, 0, 0, 0, 0, 2, 0, 0]),
        };
        a.add(&a.clone());
        assert_eq!((a.seen, a.accepted, a.lost), (10, 4, 2));
        assert_eq!(a.dropped, Dropped([2, 0, 0, 0, 0, 4, 0, 0]));
    }

    #[test]
    fn values_read_back_as_written_and_missing_fields_are_zero() {
        let v = CounterValues {
            seen: 7,
            accepted: 3,
            lost: 1,
            dropped: Dropped([0, 2, 0, 0, 0, 1, 0, 0]),
        };
        let text = serde_json::to_string(&v).unwrap();
        assert_eq!(serde_json::from_str::<CounterValues>(&text).unwrap(), v);
        let old: CounterValues =
            serde_json::from_str(r#"{"seen":4,"dropped":{"when":1,"gone":9}}"#).unwrap();
        assert_eq!((old.seen, old.accepted, old.dropped.total()), (4, 0, 1));
    }
}
