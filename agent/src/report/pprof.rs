//! pprof profiles: the messages of pprof's `profile.proto`, a builder that
//! interns strings, functions, mappings and locations, and gzip. Pure.
//!
//! The messages are written here by hand for prost's derive, with the field
//! numbers of google/pprof's `proto/profile.proto` (package
//! `perftools.profiles`); docs/pprof.md says why not generated, and which
//! fields are left out. A unit test decodes what is encoded.

use std::{collections::HashMap, io::Write as _};

/// `perftools.profiles.Profile`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// `string_table[0]` is `""`.
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    /// Start, ns since the epoch (UTC).
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Indices into the string table.
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// `ValueType`: indices into the string table.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// `Sample`: locations leaf first, one value per sample type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// `Label`: a string (`str`) or a number (`num`, in `num_unit`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// `Mapping`: an object file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// `Location`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// `Line`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// `Function`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

/// A label to put on a sample.
#[derive(Debug, Clone, Copy)]
pub enum Tag<'a> {
    Str(&'a str, &'a str),
    /// Key, number, unit (`""` for none).
    Num(&'a str, i64, &'a str),
}

/// Builds one profile: `samples`/`count`, and `cpu`/`nanoseconds` (each
/// sample weighs one period) when the sampling period is known.
pub struct Builder {
    p: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<i64, u64>,
    mappings: HashMap<i64, u64>,
    locations: HashMap<(u64, u64), u64>,
    /// Samples by (locations, labels), so that equal ones add up.
    samples: HashMap<(Vec<u64>, Vec<Label>), usize>,
}

impl Builder {
    /// `period_ns`: the time between two samples (1e9 / the sampling
    /// frequency), or `None` for a profile of counts only.
    pub fn new(period_ns: Option<u64>) -> Self {
        let mut b = Builder {
            p: Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            samples: HashMap::new(),
        };
        b.string("");
        let count = b.value_type("samples", "count");
        b.p.sample_type.push(count);
        match period_ns {
            Some(ns) => {
                let cpu = b.value_type("cpu", "nanoseconds");
                b.p.sample_type.push(cpu);
                b.p.period_type = Some(cpu);
                b.p.period = ns as i64;
            }
            None => {
                b.p.period_type = Some(count);
                b.p.period = 1;
            }
        }
        b
    }

    /// The profile's sampling period in ns, when it has a `cpu` value.
    pub fn period_ns(&self) -> Option<u64> {
        (self.p.sample_type.len() > 1).then_some(self.p.period as u64)
    }

    /// A string's index in the string table.
    pub fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn value_type(&mut self, ty: &str, unit: &str) -> ValueType {
        ValueType {
            r#type: self.string(ty),
            unit: self.string(unit),
        }
    }

    /// A free-form comment on the profile.
    pub fn comment(&mut self, text: &str) {
        let i = self.string(text);
        self.p.comment.push(i);
    }

    /// The location of a function in an object file.
    fn location(&mut self, function: &str, object: &str) -> u64 {
        let name = self.string(function);
        let file = self.string(object);
        let next = self.p.function.len() as u64 + 1;
        let function_id = *self.functions.entry(name).or_insert(next);
        if function_id == next {
            self.p.function.push(Function {
                id: function_id,
                name,
                system_name: name,
                ..Function::default()
            });
        }
        let next = self.p.mapping.len() as u64 + 1;
        let mapping_id = *self.mappings.entry(file).or_insert(next);
        if mapping_id == next {
            self.p.mapping.push(Mapping {
                id: mapping_id,
                filename: file,
                // Functions are named here: a reader has nothing to
                // symbolize.
                has_functions: true,
                ..Mapping::default()
            });
        }
        let next = self.p.location.len() as u64 + 1;
        let id = *self
            .locations
            .entry((function_id, mapping_id))
            .or_insert(next);
        if id == next {
            self.p.location.push(Location {
                id,
                mapping_id,
                line: vec![Line {
                    function_id,
                    line: 0,
                }],
                ..Location::default()
            });
        }
        id
    }

    fn label(&mut self, t: &Tag) -> Label {
        match *t {
            Tag::Str(k, v) => Label {
                key: self.string(k),
                str: self.string(v),
                ..Label::default()
            },
            Tag::Num(k, n, unit) => Label {
                key: self.string(k),
                num: n,
                num_unit: if unit.is_empty() {
                    0
                } else {
                    self.string(unit)
                },
                ..Label::default()
            },
        }
    }

    /// Adds one sample: its frames leaf first, as (function, object file).
    pub fn add<'a>(&mut self, frames: impl IntoIterator<Item = (&'a str, &'a str)>, tags: &[Tag]) {
        let locations: Vec<u64> = frames
            .into_iter()
            .map(|(f, o)| self.location(f, o))
            .collect();
        let labels = tags.iter().map(|t| self.label(t)).collect();
        let values: Vec<i64> = match self.period_ns() {
            Some(ns) => vec![1, ns as i64],
            None => vec![1],
        };
        self.add_values(locations, labels, &values);
    }

    fn add_values(&mut self, locations: Vec<u64>, labels: Vec<Label>, values: &[i64]) {
        use std::collections::hash_map::Entry;
        let n = self.p.sample_type.len();
        match self.samples.entry((locations, labels)) {
            Entry::Occupied(e) => {
                for (v, add) in self.p.sample[*e.get()].value.iter_mut().zip(values) {
                    *v += add;
                }
            }
            Entry::Vacant(e) => {
                let (location_id, label) = e.key().clone();
                e.insert(self.p.sample.len());
                self.p.sample.push(Sample {
                    location_id,
                    value: values
                        .iter()
                        .copied()
                        .chain(std::iter::repeat(0))
                        .take(n)
                        .collect(),
                    label,
                });
            }
        }
    }

    /// Adds every sample of `other`, with its labels and values (the
    /// values of sample types this profile has, by position).
    pub fn add_profile(&mut self, other: &Profile) {
        let s = |i: i64| {
            other
                .string_table
                .get(i as usize)
                .map_or("", String::as_str)
        };
        let functions: HashMap<u64, &Function> = other.function.iter().map(|f| (f.id, f)).collect();
        let mappings: HashMap<u64, &Mapping> = other.mapping.iter().map(|m| (m.id, m)).collect();
        let mut locations: HashMap<u64, u64> = HashMap::new();
        for l in &other.location {
            let function = l
                .line
                .first()
                .and_then(|x| functions.get(&x.function_id))
                .map_or("", |f| s(f.name));
            let object = mappings.get(&l.mapping_id).map_or("", |m| s(m.filename));
            locations.insert(l.id, self.location(function, object));
        }
        for sample in &other.sample {
            let ids = sample
                .location_id
                .iter()
                .filter_map(|i| locations.get(i).copied())
                .collect();
            let labels = sample
                .label
                .iter()
                .map(|l| Label {
                    key: self.string(s(l.key)),
                    str: if l.str == 0 { 0 } else { self.string(s(l.str)) },
                    num: l.num,
                    num_unit: if l.num_unit == 0 {
                        0
                    } else {
                        self.string(s(l.num_unit))
                    },
                })
                .collect();
            self.add_values(ids, labels, &sample.value);
        }
    }

    /// The profile, spanning `duration_nanos` from `time_nanos` (ns since
    /// the epoch).
    pub fn finish(mut self, time_nanos: i64, duration_nanos: i64) -> Profile {
        self.p.time_nanos = time_nanos;
        self.p.duration_nanos = duration_nanos;
        self.p
    }
}

/// The profile as pprof stores it on disk: encoded, then gzipped.
pub fn gzipped(p: &Profile) -> Vec<u8> {
    let raw = prost::Message::encode_to_vec(p);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw).expect("writing to memory");
    gz.finish().expect("writing to memory")
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use prost::Message as _;

    use super::*;

    fn decode(gz: &[u8]) -> Profile {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(gz)
            .read_to_end(&mut raw)
            .unwrap();
        Profile::decode(raw.as_slice()).unwrap()
    }

    /// A sample as (frames leaf first, labels as `key=value`, values).
    fn samples(p: &Profile) -> Vec<(Vec<String>, Vec<String>, Vec<i64>)> {
        let s = |i: i64| p.string_table[i as usize].clone();
        let loc = |id: u64| {
            let l = p.location.iter().find(|l| l.id == id).unwrap();
            let f = p
                .function
                .iter()
                .find(|f| f.id == l.line[0].function_id)
                .unwrap();
            let m = p.mapping.iter().find(|m| m.id == l.mapping_id).unwrap();
            format!("{}@{}", s(f.name), s(m.filename))
        };
        let label = |l: &Label| match (l.str, l.num_unit) {
            (0, 0) => format!("{}={}", s(l.key), l.num),
            (0, u) => format!("{}={}{}", s(l.key), l.num, s(u)),
            (v, _) => format!("{}={}", s(l.key), s(v)),
        };
        p.sample
            .iter()
            .map(|x| {
                (
                    x.location_id.iter().map(|&i| loc(i)).collect(),
                    x.label.iter().map(label).collect(),
                    x.value.clone(),
                )
            })
            .collect()
    }

    fn two_hits() -> Profile {
        let mut b = Builder::new(Some(1_001_001));
        let stack = [
            ("slow_part", "/t/app"),
            ("main", "/t/app"),
            ("[libc.so.6]", "/lib/libc.so.6"),
        ];
        let tags = [
            Tag::Num("hit", 3, ""),
            Tag::Num("tid", 42, ""),
            Tag::Str("trigger", "handle"),
            Tag::Num("duration_ns", 70_000_000, "nanoseconds"),
        ];
        b.add(stack, &tags);
        b.add(stack, &tags);
        b.add(stack[1..].iter().copied(), &tags[..2]);
        b.comment("a moment");
        b.finish(1_796_083_200_070_000_000, 70_000_000)
    }

    #[test]
    fn what_is_encoded_decodes_with_its_stacks_labels_and_strings() {
        let p = decode(&gzipped(&two_hits()));
        assert_eq!(p.string_table[0], "");
        let st: Vec<(String, String)> = p
            .sample_type
            .iter()
            .map(|v| {
                (
                    p.string_table[v.r#type as usize].clone(),
                    p.string_table[v.unit as usize].clone(),
                )
            })
            .collect();
        assert_eq!(
            st,
            [
                ("samples".into(), "count".into()),
                ("cpu".into(), "nanoseconds".into())
            ]
        );
        assert_eq!(
            (p.period, p.period_type.unwrap()),
            (1_001_001, p.sample_type[1])
        );
        assert_eq!(
            (p.time_nanos, p.duration_nanos),
            (1_796_083_200_070_000_000, 70_000_000)
        );
        assert_eq!(p.string_table[p.comment[0] as usize], "a moment");
        let got = samples(&p);
        assert_eq!(got.len(), 2, "equal samples add up");
        assert_eq!(
            got[0].0,
            [
                "slow_part@/t/app",
                "main@/t/app",
                "[libc.so.6]@/lib/libc.so.6"
            ]
        );
        assert_eq!(
            got[0].1,
            [
                "hit=3",
                "tid=42",
                "trigger=handle",
                "duration_ns=70000000nanoseconds"
            ]
        );
        assert_eq!(got[0].2, [2, 2_002_002]);
        assert_eq!(got[1].0, ["main@/t/app", "[libc.so.6]@/lib/libc.so.6"]);
        assert_eq!(got[1].1, ["hit=3", "tid=42"]);
        assert_eq!(got[1].2, [1, 1_001_001]);
        // One function, mapping and location each, all with nonzero ids.
        assert_eq!(
            (p.function.len(), p.mapping.len(), p.location.len()),
            (3, 2, 3)
        );
        assert!(p.mapping.iter().all(|m| m.id > 0 && m.has_functions));
        // Each string once.
        let mut t = p.string_table.clone();
        t.sort();
        t.dedup();
        assert_eq!(t.len(), p.string_table.len());
    }

    #[test]
    fn profiles_merge_into_one_with_the_same_samples() {
        let a = two_hits();
        let mut c = Builder::new(None);
        c.add([("other", "/t/lib.so")], &[Tag::Num("tid", 7, "")]);
        let c = c.finish(0, 0);
        let mut m = Builder::new(Some(1_001_001));
        m.add_profile(&a);
        m.add_profile(&a);
        m.add_profile(&c);
        let m = decode(&gzipped(&m.finish(1, 2)));
        let got = samples(&m);
        let want = samples(&a);
        assert_eq!(got.len(), 3);
        assert_eq!((&got[0].0, &got[0].1), (&want[0].0, &want[0].1));
        assert_eq!(got[0].2, [4, 4_004_004]);
        assert_eq!(got[1].2, [2, 2_002_002]);
        // A profile of counts only adds its counts; its time is unknown.
        assert_eq!(
            got[2],
            (
                vec!["other@/t/lib.so".into()],
                vec!["tid=7".into()],
                vec![1, 0]
            )
        );
    }

    #[test]
    fn a_profile_without_a_period_counts_samples_only() {
        let mut b = Builder::new(None);
        b.add([("f", "[unknown]")], &[]);
        let p = b.finish(0, 0);
        assert_eq!(p.sample_type.len(), 1);
        assert_eq!((p.period, p.period_type), (1, Some(p.sample_type[0])));
        assert_eq!(p.sample[0].value, [1]);
    }

    /// The wire's (field number, varint) pairs of a message; a
    /// length-delimited field gives the varint it holds when it holds one
    /// (a packed list of one, a string of one byte), else the value of its
    /// first field (a nested message).
    fn fields(mut b: &[u8]) -> Vec<(u64, u64)> {
        fn varint(b: &mut &[u8]) -> u64 {
            let (mut v, mut shift) = (0, 0);
            loop {
                let byte = b[0];
                *b = &b[1..];
                v |= u64::from(byte & 0x7f) << shift;
                shift += 7;
                if byte < 0x80 {
                    return v;
                }
            }
        }
        let mut out = Vec::new();
        while !b.is_empty() {
            let tag = varint(&mut b);
            let v = match tag & 7 {
                0 => varint(&mut b),
                2 => {
                    let n = varint(&mut b) as usize;
                    let mut inner = &b[..n];
                    b = &b[n..];
                    let whole = inner;
                    let v = varint(&mut inner);
                    if inner.is_empty() {
                        v
                    } else {
                        fields(whole)[0].1
                    }
                }
                w => panic!("wire type {w}"),
            };
            out.push((tag >> 3, v));
        }
        out
    }

    /// Each numeric field set to its own number in profile.proto: the
    /// encoded field numbers are the proto's (bools are 1).
    #[test]
    fn field_numbers_are_profile_protos() {
        let enc = |m: &dyn Fn() -> Vec<u8>| fields(&m());
        let own = |f: &[(u64, u64)], bools: &[u64]| {
            for &(n, v) in f {
                let want = if bools.contains(&n) { 1 } else { n };
                assert_eq!(v, want, "field {n} in {f:?}");
            }
            f.iter().map(|x| x.0).collect::<Vec<_>>()
        };
        let l = Label {
            key: 1,
            str: 2,
            num: 3,
            num_unit: 4,
        };
        assert_eq!(own(&enc(&|| l.encode_to_vec()), &[]), [1, 2, 3, 4]);
        let v = ValueType { r#type: 1, unit: 2 };
        assert_eq!(own(&enc(&|| v.encode_to_vec()), &[]), [1, 2]);
        let f = Function {
            id: 1,
            name: 2,
            system_name: 3,
            filename: 4,
            start_line: 5,
        };
        assert_eq!(own(&enc(&|| f.encode_to_vec()), &[]), [1, 2, 3, 4, 5]);
        let m = Mapping {
            id: 1,
            memory_start: 2,
            memory_limit: 3,
            file_offset: 4,
            filename: 5,
            build_id: 6,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        };
        assert_eq!(
            own(&enc(&|| m.encode_to_vec()), &[7, 8, 9, 10]),
            (1..=10).collect::<Vec<_>>()
        );
        let line = Line {
            function_id: 1,
            line: 2,
        };
        assert_eq!(own(&enc(&|| line.encode_to_vec()), &[]), [1, 2]);
        // A nested message is checked on its own above; here it is field 4.
        let loc = Location {
            id: 1,
            mapping_id: 2,
            address: 3,
            line: vec![Line {
                function_id: 4,
                line: 0,
            }],
            is_folded: true,
        };
        assert_eq!(own(&enc(&|| loc.encode_to_vec()), &[5]), [1, 2, 3, 4, 5]);
        let s = Sample {
            location_id: vec![1],
            value: vec![2],
            label: vec![Label {
                key: 0,
                str: 0,
                num: 3,
                num_unit: 0,
            }],
        };
        assert_eq!(own(&enc(&|| s.encode_to_vec()), &[]), [1, 2, 3]);
        let one = |n: i64| ValueType { r#type: n, unit: 0 };
        let p = Profile {
            sample_type: vec![one(1)],
            sample: vec![Sample {
                location_id: vec![2],
                ..Sample::default()
            }],
            mapping: vec![Mapping {
                id: 3,
                ..Mapping::default()
            }],
            location: vec![Location {
                id: 4,
                ..Location::default()
            }],
            function: vec![Function {
                id: 5,
                ..Function::default()
            }],
            string_table: vec!["\u{6}".into()],
            drop_frames: 7,
            keep_frames: 8,
            time_nanos: 9,
            duration_nanos: 10,
            period_type: Some(one(11)),
            period: 12,
            comment: vec![13],
            default_sample_type: 14,
        };
        assert_eq!(
            own(&enc(&|| p.encode_to_vec()), &[]),
            (1..=14).collect::<Vec<_>>()
        );
    }
}
