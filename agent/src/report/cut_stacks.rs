//! A snapshot's cut DWARF stacks completed (docs/unwinding.md, "When
//! stacks stop short"): first by their frames' places on the stack
//! ([`graft::Links`], from the CFAs report/cfa.rs finds), then, for those
//! that cannot be, by their outermost frames' names ([`graft::Complete`]).
//! Both learn from the snapshot's own stacks and from the run's donors,
//! the whole stacks of `auto`'s measurement kept in run.json.

use std::collections::{HashMap, HashSet};

use super::{
    cfa,
    graft::{self, Complete, Links},
    samples::{Sample, Samples},
};
use crate::output::run_file::{DonorStack, StackDonors};

/// A frame as [`Links`] know it: (frame, object) ids, and where its
/// function starts where perf could not name it (0 otherwise).
type LinkFrame = ((u32, u32), u64);

/// A donor's stack as (frame, object) ids; its thread, and each frame's
/// CFA, address and function start where run.json has them, are the
/// donor's.
struct Donated<'a> {
    frames: Vec<(u32, u32)>,
    donor: &'a DonorStack,
}

/// Each thread's distinct complete stacks, in the order given (the first
/// a cut stack passes through is the one grafted from).
fn complete_by_thread<'a>(
    stacks: impl Iterator<Item = (u32, &'a [(u32, u32)])>,
) -> HashMap<u32, Complete<'a, (u32, u32)>> {
    let mut by_thread: HashMap<u32, Vec<&'a [(u32, u32)]>> = HashMap::new();
    let mut seen = HashSet::new();
    for (tid, s) in stacks {
        if seen.insert((tid, s)) {
            by_thread.entry(tid).or_default().push(s);
        }
    }
    by_thread
        .into_iter()
        .map(|(tid, s)| (tid, Complete::new(s)))
        .collect()
}

impl Samples {
    /// Each frame's CFA, from `unwinds` (this file's samples unwound
    /// again, report/cfa.rs): a sample is found by its thread and time,
    /// and its frames matched to perf's by address ([`cfa::align`]).
    pub fn attach_cfas(&mut self, mut unwinds: cfa::Unwinds) {
        for k in 0..self.sample_count() {
            let s = *self.sample_at(k);
            let Some(u) = unwinds.take(s.tid, s.time_ns) else {
                continue;
            };
            let range = s.range();
            let perf: Vec<(u64, &str)> = range
                .clone()
                .map(|i| {
                    let object = &self.objects[self.frame_objects[i] as usize];
                    (self.frame_ips[i], object.as_str())
                })
                .collect();
            let (at, whole) = cfa::align(&perf, &u, &unwinds.objects);
            for (i, k) in range.zip(at) {
                let f = k.map(|k| u.frames[k]);
                self.frame_cfas[i] = f.map_or(0, |f| f.cfa);
                self.frame_functions[i] = f.map_or(0, |f| f.function);
            }
            let s = self.sample_at_mut(k);
            s.reached_end = whole;
            s.user_sp = u.sp;
        }
    }

    /// These samples as a recording with copies of `bytes` bytes would
    /// have them, from their frames' CFAs ([`cfa::frames_in_copy`]): each
    /// stack keeps the frames perf would have unwound. Samples without a
    /// stack pointer are left whole.
    pub fn as_if_copied(&self, bytes: u64) -> Samples {
        let mut out = self.clone();
        for k in 0..out.sample_count() {
            let s = *out.sample_at(k);
            if s.user_sp == 0 {
                continue;
            }
            let range = s.range();
            let kernel = range
                .clone()
                .take_while(|&i| {
                    let object = &out.objects[out.frame_objects[i] as usize];
                    cfa::is_kernel(out.frame_ips[i], object)
                })
                .count();
            let kept = cfa::frames_in_copy(&out.frame_cfas[range], kernel, s.user_sp, bytes);
            if kept < s.len as usize {
                let s = out.sample_at_mut(k);
                s.len = kept as u32;
                s.reached_end = false;
            }
        }
        out
    }

    /// Completes the stacks cut where their DWARF copy ended, from this
    /// file's stacks (CPU and `sched_switch` ones alike) and the run's
    /// `donors`: by the frames' places on the stack where the cut stack's
    /// outermost frame has a known CFA and a way out to a thread's first
    /// frame ([`Links`]), else by the names of its outermost frames, from
    /// the complete stacks of its thread ([`Complete`]). Which samples have
    /// DWARF copies comes from perf's command line: the CPU samples with
    /// `--call-graph dwarf`, the `sched_switch` ones then and when their
    /// event has its own (`sched:sched_switch/call-graph=dwarf,...`, the
    /// off-CPU breakdown of a frame-pointer run). A frame-pointer stack is
    /// not cut by a copy's size, and is left as it is.
    pub fn graft_cut_stacks(&mut self, donors: &StackDonors) {
        let Some(copied) = self.dwarf_copies() else {
            return;
        };
        let donated = self.intern_donors(donors);
        let start: Vec<bool> = self.names.iter().map(|n| graft::is_start(n)).collect();
        let unknown = self.ids.get("[unknown]").copied();
        // Frames with their objects: a grafted frame brings its own.
        let pairs: Vec<(u32, u32)> = self
            .frames
            .iter()
            .copied()
            .zip(self.frame_objects.iter().copied())
            .collect();
        let all: Vec<Sample> = (0..self.sample_count())
            .map(|k| *self.sample_at(k))
            .collect();
        let ends_at_start = |s: &[(u32, u32)]| s.last().is_some_and(|&(f, _)| start[f as usize]);
        let links = self.links(
            all.iter()
                .enumerate()
                .filter(|(k, _)| copied(*k))
                .map(|(_, s)| s),
            &donated,
        );
        // Every complete stack is a reference, a frame-pointer one too.
        let own = all.iter().map(|s| (s.tid, &pairs[s.range()]));
        let given = donated.iter().map(|d| (d.donor.tid, d.frames.as_slice()));
        let complete = complete_by_thread(own.chain(given).filter(|(_, s)| ends_at_start(s)));
        let mut grown = Vec::new();
        for (k, s) in all.iter().enumerate().filter(|(k, _)| copied(*k)) {
            if s.reached_end {
                continue;
            }
            if let Some(stack) = self.complete_by_places(&links, s, unknown) {
                grown.push((k, stack));
                continue;
            }
            let cut = &pairs[s.range()];
            let Some(refs) = complete.get(&s.tid).filter(|_| !ends_at_start(cut)) else {
                continue;
            };
            let stack = refs.graft(
                cut,
                |&(f, _)| start[f as usize],
                |&(f, _)| Some(f) == unknown,
                |&(f, _)| self.names[f as usize].starts_with('['),
            );
            if let Some(stack) = stack {
                grown.push((k, stack));
            }
        }
        self.grafted = grown.len();
        self.replace_stacks(grown);
    }

    /// Sample `s`'s stack completed by its frames' places ([`Links`]), as
    /// (frame, object) ids: its frames, less perf's garbage one after a cut
    /// copy (an address it could not name, `[unknown]`, with no CFA), then
    /// the callers of the last one out to a thread's first frame.
    fn complete_by_places(
        &self,
        links: &Links<LinkFrame>,
        s: &Sample,
        unknown: Option<u32>,
    ) -> Option<Vec<(u32, u32)>> {
        let range = s.range();
        let garbage = |i: &usize| Some(self.frames[*i]) == unknown && self.frame_cfas[*i] == 0;
        let kept = range.len() - range.clone().rev().take_while(garbage).count();
        let last = (range.start + kept)
            .checked_sub(1)
            .filter(|&i| i >= range.start)?;
        let node = |i: usize| (self.link_frame(i), self.frame_cfas[i]);
        if self.frame_cfas[last] == 0 {
            return None;
        }
        let callee = (last > range.start).then(|| (node(last - 1), self.frame_ips[last - 1]));
        let tail = links.complete(callee.as_ref().map(|(n, ip)| (n, *ip)), &node(last))?;
        let frames = (range.start..=last).map(|i| (self.frames[i], self.frame_objects[i]));
        Some(frames.chain(tail.into_iter().map(|(f, _)| f)).collect())
    }

    /// Frame `i` as the links know it: (frame, object), and where its
    /// function starts where perf could not name it (`[postgres]` is many
    /// functions).
    fn link_frame(&self, i: usize) -> LinkFrame {
        let f = (self.frames[i], self.frame_objects[i]);
        self.link_key(f, self.frame_functions[i])
    }

    /// (frame, object) `f` with its function's start where perf named it
    /// by its object only.
    fn link_key(&self, f: (u32, u32), function: u64) -> LinkFrame {
        let unnamed = self.names[f.0 as usize].starts_with('[');
        (f, if unnamed { function } else { 0 })
    }

    /// Which samples (CPU ones first, then `sched_switch` ones, by index)
    /// carry DWARF copies, from perf's command line; `None`: none do.
    fn dwarf_copies(&self) -> Option<impl Fn(usize) -> bool + use<>> {
        let (cpu_dwarf, switch_dwarf) =
            super::samples::dwarf_copies(self.cmdline.as_deref().unwrap_or(""));
        let cpu = self.samples.len();
        switch_dwarf.then_some(move |k: usize| if k < cpu { cpu_dwarf } else { switch_dwarf })
    }

    /// The links of the stacks with DWARF copies and of the donors.
    fn links<'a>(
        &self,
        with_copies: impl Iterator<Item = &'a Sample>,
        donated: &[Donated<'_>],
    ) -> Links<LinkFrame> {
        let mut links = Links::default();
        let mut stack = Vec::new();
        for s in with_copies {
            let range = s.range();
            stack.clear();
            stack.extend(
                range
                    .clone()
                    .map(|i| (self.link_frame(i), self.frame_cfas[i])),
            );
            links.add(&stack, &self.frame_ips[range], s.reached_end);
        }
        for (d, frames) in donated
            .iter()
            .map(|d| (d.donor, &d.frames))
            .filter(|(d, frames)| d.cfas.len() == frames.len())
        {
            let at = |v: &[u64], i: usize| v.get(i).copied();
            stack.clear();
            stack.extend(frames.iter().enumerate().map(|(i, &f)| {
                let function = at(&d.functions, i).unwrap_or(0);
                (self.link_key(f, function), d.cfas[i])
            }));
            let ips: Vec<u64> = (0..frames.len())
                .map(|i| at(&d.ips, i).unwrap_or(u64::MAX))
                .collect();
            links.add(&stack, &ips, d.reached_end);
        }
        links
    }

    /// `donors`' stacks as this file's (frame, object) ids; a stack naming
    /// an object `donors` does not hold is left out.
    fn intern_donors<'a>(&mut self, donors: &'a StackDonors) -> Vec<Donated<'a>> {
        let objects: Vec<u32> = donors.objects.iter().map(|o| self.object(o)).collect();
        let mut out = Vec::with_capacity(donors.stacks.len());
        for d in &donors.stacks {
            let frames: Option<Vec<(u32, u32)>> = d
                .frames
                .iter()
                .map(|(name, o)| Some((self.intern(name), *objects.get(*o as usize)?)))
                .collect();
            out.extend(frames.map(|frames| Donated { frames, donor: d }));
        }
        out
    }

    /// The distinct whole CPU-sample stacks of each thread (by their
    /// addresses, or ending in a thread-start frame), in file order, with
    /// their frames' CFAs, as [`StackDonors`], until they take about
    /// `max_bytes` of JSON.
    pub fn whole_stacks(&self, max_bytes: usize) -> StackDonors {
        self.whole_stacks_of(|_| true, max_bytes)
    }

    /// [`Self::whole_stacks`] of the CPU samples whose index is `kept`.
    pub fn whole_stacks_of(&self, kept: impl Fn(usize) -> bool, max_bytes: usize) -> StackDonors {
        let mut seen = HashSet::new();
        let mut out = StackDonors {
            objects: self.objects.clone(),
            stacks: Vec::new(),
        };
        let mut bytes = 0;
        for (_, s) in self.samples.iter().enumerate().filter(|(i, _)| kept(*i)) {
            let range = s.range();
            let stack = self.stack(s);
            let cfas = &self.frame_cfas[range.clone()];
            let named = stack.last().is_some_and(|&f| graft::is_start(self.name(f)));
            if !(s.reached_end || named) || !seen.insert((s.tid, stack, cfas)) {
                continue;
            }
            let frames: Vec<(String, u32)> = stack
                .iter()
                .map(|&f| self.name(f).to_string())
                .zip(self.frame_objects[range.clone()].iter().copied())
                .collect();
            let with_cfas = cfas.iter().any(|&c| c != 0);
            bytes += frames.iter().map(|(n, _)| n.len() + 8).sum::<usize>() + 24;
            // CFA, address and function: ~16, ~8 and ~2 digits.
            bytes += if with_cfas { 30 * cfas.len() } else { 0 };
            if bytes > max_bytes {
                break;
            }
            // Without places, the addresses and function starts serve
            // nothing either.
            let placed = |v: &[u64]| {
                if with_cfas {
                    v[range.clone()].to_vec()
                } else {
                    Vec::new()
                }
            };
            out.stacks.push(DonorStack {
                tid: s.tid,
                frames,
                cfas: placed(&self.frame_cfas),
                ips: placed(&self.frame_ips),
                functions: placed(&self.frame_functions),
                reached_end: s.reached_end,
            });
        }
        out
    }

    /// Gives sample `k` (CPU samples first, then `sched_switch` ones) the
    /// call chain `stack` of (frame, object) ids, appended to the frames.
    fn replace_stacks(&mut self, stacks: Vec<(usize, Vec<(u32, u32)>)>) {
        for (k, stack) in stacks {
            let old = *self.sample_at(k);
            let at = self.frames.len() as u32;
            for (i, (f, o)) in stack.iter().enumerate() {
                // The frames kept from the cut stack keep their address
                // and CFA.
                let j = old.start as usize + i;
                let kept =
                    i < old.len as usize && (self.frames[j], self.frame_objects[j]) == (*f, *o);
                let (ip, cfa, function) = if kept {
                    (
                        self.frame_ips[j],
                        self.frame_cfas[j],
                        self.frame_functions[j],
                    )
                } else {
                    (u64::MAX, 0, 0)
                };
                self.frames.push(*f);
                self.frame_objects.push(*o);
                self.frame_ips.push(ip);
                self.frame_cfas.push(cfa);
                self.frame_functions.push(function);
            }
            let s = self.sample_at_mut(k);
            s.start = at;
            s.len = stack.len() as u32;
        }
    }

    /// How many samples there are, CPU and `sched_switch` ones.
    fn sample_count(&self) -> usize {
        self.samples.len() + self.sched_switch_samples.len()
    }

    /// Sample `k` (below [`Self::sample_count`]): CPU samples first, then
    /// `sched_switch` ones.
    pub(super) fn sample_at(&self, k: usize) -> &Sample {
        match self.samples.get(k) {
            Some(s) => s,
            None => &self.sched_switch_samples[k - self.samples.len()].sample,
        }
    }

    fn sample_at_mut(&mut self, k: usize) -> &mut Sample {
        let cpu = self.samples.len();
        match self.samples.get_mut(k) {
            Some(s) => s,
            None => &mut self.sched_switch_samples[k - cpu].sample,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(samples: &[(u32, &str)]) -> Samples {
        super::super::samples::dwarf_run(samples)
    }

    /// Gives sample `k` its frames' CFAs, as `attach_cfas` would.
    fn place(s: &mut Samples, k: usize, cfas: &[u64], reached_end: bool) {
        let x = s.samples[k];
        let at = x.start as usize;
        s.frame_cfas[at..at + cfas.len()].copy_from_slice(cfas);
        s.samples[k].reached_end = reached_end;
    }

    fn names(s: &Samples, k: usize) -> String {
        let x = &s.samples[k];
        let n: Vec<&str> = s.stack(x).iter().map(|&i| s.name(i)).collect();
        n.join(";")
    }

    const END: u64 = cfa::FIRST_FRAME;

    #[test]
    fn cut_stacks_are_completed_by_their_frames_places_first() {
        let mut s = run(&[
            (5, "leaf;a;b;main;_start"),
            // Another process forked from the same parent: cut at a@200,
            // which the first stack passed through.
            (6, "x;a;[unknown]"),
            // The same names at another place: the names graft, from its
            // own thread's complete stack, does it.
            (5, "y;a;b;[unknown]"),
            // Whole by perf's names but not by the unwinder (main is
            // not the thread's first frame here): followed on.
            (5, "z;b;main"),
        ]);
        place(&mut s, 0, &[100, 200, 300, 400, END], true);
        place(&mut s, 1, &[150, 200, 0], false);
        place(&mut s, 2, &[120, 250, 350, 0], false);
        place(&mut s, 3, &[280, 300, 400], false);
        s.graft_cut_stacks(&StackDonors::default());
        assert_eq!(s.grafted, 3);
        assert_eq!(names(&s, 1), "x;a;b;main;_start");
        assert_eq!(names(&s, 2), "y;a;b;main;_start");
        assert_eq!(names(&s, 3), "z;b;main;_start");
        assert_eq!(names(&s, 0), "leaf;a;b;main;_start");
    }

    #[test]
    fn donors_bring_their_places_and_ends() {
        let mut whole = run(&[(5, "leaf;a;b;main;_start")]);
        place(&mut whole, 0, &[100, 200, 300, 400, END], true);
        let donors = whole.whole_stacks(1 << 20);
        assert_eq!(donors.stacks[0].cfas, [100, 200, 300, 400, END]);
        assert!(donors.stacks[0].reached_end);
        // A thread with no whole stack of its own, in the snapshot.
        let mut s = run(&[(9, "q;b;[unknown]")]);
        place(&mut s, 0, &[290, 300, 0], false);
        s.graft_cut_stacks(&donors);
        assert_eq!(names(&s, 0), "q;b;main;_start");
        // Without the places, the names graft has no stack of thread 9.
        let mut s = run(&[(9, "q;b;[unknown]")]);
        s.graft_cut_stacks(&donors);
        assert_eq!((s.grafted, names(&s, 0)), (0, "q;b;[unknown]".into()));
    }
}
