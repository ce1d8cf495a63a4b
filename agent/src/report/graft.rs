//! Cut DWARF stacks completed from other stacks, in two ways.
//!
//! A DWARF sample holds a fixed copy of the thread's stack (`dwarf,SIZE`),
//! and perf's unwinder stops where the copy ends. What lies beyond it is
//! the outer part of the stack: the frames from the thread's start to its
//! main loop (`_start; main; PostmasterMain; ...; PostgresMain`), which
//! hold big frames and stay the same for the thread's whole life, and, in
//! a program with deep stacks, the frames of the work in hand (PostgreSQL's
//! executor, planner and parser). Measured (docs/unwinding.md, "How much
//! stack a sample needs"): at 2048 bytes, every cut nginx sample still
//! named `ngx_http_core_run_phases` or `main`, and lost only the frames
//! below; PostgreSQL at 4096 lost 1 to 5 frames below `PostgresMain`.
//!
//! * [`Links`]: by the frames' places on the stack, their CFAs
//!   (report/cfa.rs). The cut stack's outermost frame is followed out
//!   through the callers other stacks had at the same place, in any thread
//!   or process whose stack lies at the same addresses (a forked one).
//! * [`Complete`]: by names, from a complete stack of the same thread (one
//!   that ends in a thread-start frame) that passes through the cut
//!   stack's outermost frames. Only the same thread's stacks are used:
//!   another thread's outer frames are another start.
//!
//! report/cut_stacks.rs tries the first, then the second. The report
//! counts the stacks it completed (`Samples::grafted`, shown on the page
//! and as `file_grafted_stacks` in `--json`).

use std::{collections::HashMap, hash::Hash};

/// Outermost frames of a complete stack: a thread's or a process's start
/// (C, C++, Rust and Go). A stack that ends elsewhere was cut short (no
/// frame pointers, or deeper than perf's limit).
pub const START_FRAMES: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_call_main",
    "main",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "thread_start",
    "runtime.goexit",
    "runtime.goexit.abi0",
    "runtime.main",
    "runtime.mstart",
    "runtime.rt0_go",
    "std::rt::lang_start",
    "ret_from_fork",
    "ret_from_fork_asm",
];

/// Whether `name` is a frame a thread's stack starts with (`START_FRAMES`,
/// with or without a symbol version: `__libc_start_main@@GLIBC_2.34`).
pub fn is_start(name: &str) -> bool {
    let base = name.split('@').next().unwrap_or(name);
    START_FRAMES.contains(&base)
}

/// How many of the cut stack's outermost named frames are matched, in
/// order, in a complete stack: up to 3, and at least 2, so that one common
/// frame (`malloc`) does not pick a stack that only shares it.
const ANCHOR: usize = 3;
const MIN_ANCHOR: usize = 2;

/// A cut stack with one named frame (a function with a big frame, such as
/// a parser's stack-allocated tables) is completed from that frame alone
/// only where at least this many distinct complete stacks pass through it
/// and all go on the same way below it: one caller chain, whatever the
/// frames above.
const ONE_FRAME_AGREEING: usize = 2;

/// One thread's complete stacks (leaf first, each ending in a start
/// frame), in order of preference, indexed by each pair of neighbouring
/// frames: a report's file has thousands of samples, and each cut one
/// looks its anchor up instead of scanning every stack.
pub struct Complete<'a, T> {
    stacks: Vec<&'a [T]>,
    /// (frame, its outer neighbour) → (stack, position of the frame).
    pairs: HashMap<(&'a T, &'a T), Vec<(usize, usize)>>,
    /// frame → (stack, its outermost position there).
    outermost: HashMap<&'a T, Vec<(usize, usize)>>,
}

impl<'a, T: Eq + Hash + Clone> Complete<'a, T> {
    pub fn new(stacks: impl IntoIterator<Item = &'a [T]>) -> Self {
        let stacks: Vec<&'a [T]> = stacks.into_iter().collect();
        let mut pairs: HashMap<(&'a T, &'a T), Vec<(usize, usize)>> = HashMap::new();
        let mut outermost: HashMap<&'a T, Vec<(usize, usize)>> = HashMap::new();
        for (n, s) in stacks.iter().enumerate() {
            for (at, w) in s.windows(2).enumerate() {
                pairs.entry((&w[0], &w[1])).or_default().push((n, at));
            }
            let mut seen = std::collections::HashSet::new();
            for (at, f) in s.iter().enumerate().rev() {
                if seen.insert(f) {
                    outermost.entry(f).or_default().push((n, at));
                }
            }
        }
        Complete {
            stacks,
            pairs,
            outermost,
        }
    }

    /// `cut` (leaf first) completed from the first stack that holds the cut
    /// stack's outermost named frames (`unknown` ones dropped from its end)
    /// in a row, the most of them first ([`ANCHOR`] down to
    /// [`MIN_ANCHOR`]): the cut stack's named frames, then that stack's
    /// frames beyond them. Where they occur more than once in it
    /// (recursion), the outermost place is taken, so no frame is added
    /// twice. Failing that, from its outermost frame alone
    /// ([`ONE_FRAME_AGREEING`]), unless that frame is `nameless`: named by
    /// its object only (`[postgres]`), it stands for many functions.
    /// `None`: nothing to add (the stack is not cut, or no complete stack
    /// passes through it).
    pub fn graft(
        &self,
        cut: &[T],
        is_start: impl Fn(&T) -> bool,
        is_unknown: impl Fn(&T) -> bool,
        nameless: impl Fn(&T) -> bool,
    ) -> Option<Vec<T>> {
        if cut.last().is_none_or(&is_start) {
            return None;
        }
        let named = cut.len() - cut.iter().rev().take_while(|f| is_unknown(f)).count();
        for k in (MIN_ANCHOR..=named.min(ANCHOR)).rev() {
            let anchor = &cut[named - k..named];
            let Some(places) = self.pairs.get(&(&anchor[0], &anchor[1])) else {
                continue;
            };
            // The first stack with the anchor, at its outermost place.
            let mut best: Option<(usize, usize)> = None;
            for &(n, at) in places {
                let full = self.stacks[n];
                if full.get(at..at + k) != Some(anchor) || full.len() == at + k {
                    continue;
                }
                if best.is_none_or(|(bn, bat)| n < bn || (n == bn && at > bat)) {
                    best = Some((n, at));
                }
            }
            if let Some((n, at)) = best {
                let mut out = cut[..named].to_vec();
                out.extend_from_slice(&self.stacks[n][at + k..]);
                return Some(out);
            }
        }
        let last = cut
            .get(named.checked_sub(1)?)
            .filter(|f| !is_unknown(f) && !nameless(f))?;
        let below = self.one_frame(last)?;
        let mut out = cut[..named].to_vec();
        out.extend_from_slice(below);
        Some(out)
    }

    /// What lies below `frame` in every complete stack that holds it (from
    /// its outermost place in each), if at least [`ONE_FRAME_AGREEING`]
    /// do and all agree.
    fn one_frame(&self, frame: &T) -> Option<&'a [T]> {
        let places = self.outermost.get(frame)?;
        if places.len() < ONE_FRAME_AGREEING {
            return None;
        }
        let mut below = places.iter().map(|&(n, at)| &self.stacks[n][at + 1..]);
        let first = below.next()?;
        (!first.is_empty() && below.all(|b| b == first)).then_some(first)
    }
}

/// A frame at its place on the stack: (frame, CFA).
type Node<F> = (F, u64);

/// (the callee's node, the callee's address, the node).
type AfterCallee<F> = (Node<F>, u64, Node<F>);

/// A node's caller (`None`: the node was a thread's first frame) and how
/// many stacks had it.
type Caller<F> = (Option<Node<F>>, u32);

/// The callers each frame had at its place on the stack, from every
/// stack whose frames' CFAs are known (report/cfa.rs): a frame is the
/// node `(F, CFA)`, and a stack links each of its frames to the next one
/// out. A cut stack's last frame is then followed out, caller by caller,
/// to a frame that was a stack's first (the unwinder found the end there).
///
/// A thread's outer frames stay where they are while its inner ones come
/// and go, and a process forked from another (a pre-fork server's
/// workers, PostgreSQL's backends) starts with its parent's stack at the
/// same addresses. So the same function at the same CFA is, nearly
/// always, the same call with the same callers. The names are not
/// enough: the same function is called from many places, and the two or
/// three frames [`Complete::graft`] matches do not tell which.
///
/// Where a node had several callers, the one seen most often after the
/// same callee at its place is taken, else the one seen most often: the
/// callee tells paths apart that meet at one place. PostgreSQL's
/// `LockAcquireExtended` is called at the same place by
/// `XactLockTableInsert`, in every transaction, and by
/// `XactLockTableWait`, which then sleeps in `ProcSleep`: the stacks that
/// went on to sleep are `XactLockTableWait`'s.
pub struct Links<F> {
    /// node → (its caller's node, or `None` where the node was a stack's
    /// first frame; how many stacks had that).
    next: HashMap<Node<F>, Vec<Caller<F>>>,
    /// (callee's node, the callee's address, node) → the same, for the
    /// stacks where the node had called that callee from that address.
    after: HashMap<AfterCallee<F>, Vec<Caller<F>>>,
}

impl<F> Default for Links<F> {
    fn default() -> Self {
        Links {
            next: HashMap::new(),
            after: HashMap::new(),
        }
    }
}

/// The most frames a completion adds.
const MAX_ADDED: usize = 1024;

/// Counts one more `to` in `list`.
fn count<N: PartialEq>(list: &mut Vec<(Option<N>, u32)>, to: Option<N>) {
    match list.iter_mut().find(|(t, _)| *t == to) {
        Some((_, n)) => *n += 1,
        None => list.push((to, 1)),
    }
}

/// The most frequent of `list` (the first seen among equals).
fn most<N>(list: &[(Option<N>, u32)]) -> &Option<N> {
    let mut best = &list[0];
    for c in &list[1..] {
        if c.1 > best.1 {
            best = c;
        }
    }
    &best.0
}

impl<F: Eq + Hash + Clone> Links<F> {
    /// Adds a stack (leaf first): each frame with its CFA, 0 where it is not
    /// known, and its address (`ips`, parallel). Neighbours whose CFAs are
    /// both known are linked (a caller's CFA is never below its callee's:
    /// the stack grows down); where `reached_end`, the last frame was the
    /// thread's first.
    pub fn add(&mut self, stack: &[(F, u64)], ips: &[u64], reached_end: bool) {
        let linked = |inner: &(F, u64), outer: &(F, u64)| inner.1 != 0 && outer.1 >= inner.1;
        let callee_of = |i: usize| {
            let c = i.checked_sub(1)?;
            linked(&stack[c], &stack[i]).then(|| (stack[c].clone(), ips[c], stack[i].clone()))
        };
        for (i, w) in stack.windows(2).enumerate() {
            if !linked(&w[0], &w[1]) {
                continue;
            }
            let to = Some(w[1].clone());
            count(self.next.entry(w[0].clone()).or_default(), to.clone());
            if let Some(key) = callee_of(i) {
                count(self.after.entry(key).or_default(), to);
            }
        }
        let Some(last) = stack.last().filter(|l| reached_end && l.1 != 0) else {
            return;
        };
        count(self.next.entry(last.clone()).or_default(), None);
        if let Some(key) = callee_of(stack.len() - 1) {
            count(self.after.entry(key).or_default(), None);
        }
    }

    /// The frames beyond `last` (a cut stack's outermost frame, with its
    /// CFA; `callee`, the frame before it with its address, where its CFA
    /// is known) out to a thread's first frame, each node's caller in turn:
    /// at the first, the most frequent after the same callee at the same
    /// address, if seen; else, and beyond, the most frequent. `None` where a
    /// node on the way has no known caller: the stack is then left as it
    /// is.
    pub fn complete(&self, callee: Option<(&(F, u64), u64)>, last: &(F, u64)) -> Option<Vec<F>> {
        let mut out = Vec::new();
        let mut prev = callee
            .filter(|(c, _)| c.1 != 0 && last.1 >= c.1)
            .map(|(c, ip)| (c.clone(), ip));
        let mut at = last.clone();
        let mut seen = std::collections::HashSet::new();
        while out.len() < MAX_ADDED {
            let after = prev
                .take()
                .and_then(|(p, ip)| self.after.get(&(p, ip, at.clone())));
            let list = after.or_else(|| self.next.get(&at))?;
            let Some(next) = most(list) else {
                return Some(out);
            };
            if !seen.insert(next.clone()) {
                return None;
            }
            out.push(next.0.clone());
            at = next.clone();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<&str> {
        s.split(';').collect()
    }

    fn g(cut: &str, complete: &[&str]) -> Option<String> {
        let complete: Vec<Vec<&str>> = complete.iter().map(|c| v(c)).collect();
        Complete::new(complete.iter().map(Vec::as_slice))
            .graft(
                &v(cut),
                |f| is_start(f),
                |f| *f == "[unknown]",
                |f| f.starts_with('['),
            )
            .map(|s| s.join(";"))
    }

    #[test]
    fn a_cut_stack_gets_the_outer_frames_of_a_complete_one() {
        let full = "writev;ngx_http_write;ngx_http_core_run_phases;ngx_process_events;\
                    ngx_worker_process_cycle;main;__libc_start_main@@GLIBC_2.34;_start";
        assert_eq!(
            g(
                "sendfile;ngx_http_write;ngx_http_core_run_phases;[unknown]",
                &[full]
            ),
            Some(
                "sendfile;ngx_http_write;ngx_http_core_run_phases;ngx_process_events;\
                 ngx_worker_process_cycle;main;__libc_start_main@@GLIBC_2.34;_start"
                    .into()
            )
        );
    }

    #[test]
    fn complete_stacks_and_unmatched_ones_are_left_alone() {
        let full = "a;b;c;main;_start";
        assert_eq!(g("x;b;c;main;_start", &[full]), None);
        // Its outermost frames are in no complete stack.
        assert_eq!(g("x;y;z", &[full]), None);
        // One common frame is not enough: two in a row must match...
        assert_eq!(g("q;r;c", &[full]), None);
        assert_eq!(g("c", &[full]), None);
        // ...unless several complete stacks hold it, and all go on alike
        // below it.
        let other = "d;c;main;_start";
        assert_eq!(g("q;r;c", &[full, other]), Some("q;r;c;main;_start".into()));
        // Not a frame named by its object only: it is many functions.
        let nameless = ["d;[srv];main;_start", "e;[srv];main;_start"];
        assert_eq!(g("q;[srv]", &nameless), None);
        assert_eq!(g("q;r;c", &[full, "d;c;run;main;_start"]), None);
        assert_eq!(g("[unknown];[unknown]", &[full]), None);
        // The first complete stack that matches is taken, the longest
        // match first.
        assert_eq!(
            g("x;b;c", &["p;q;main;_start", "y;b;c;run;main;_start", full]),
            Some("x;b;c;run;main;_start".into())
        );
        assert_eq!(
            g("a;b;c", &["y;b;c;run;main;_start", full]),
            Some("a;b;c;main;_start".into())
        );
    }

    #[test]
    fn recursion_takes_the_outermost_place() {
        let full = "f;f;f;f;run;main;_start";
        assert_eq!(
            g("leaf;f;f;f", &[full]),
            Some("leaf;f;f;f;run;main;_start".into())
        );
    }

    #[test]
    fn start_frames_with_and_without_versions() {
        assert!(is_start("__libc_start_main@@GLIBC_2.34"));
        assert!(is_start("clone3") && is_start("runtime.goexit.abi0"));
        assert!(is_start("main") && !is_start("_start_worker") && !is_start("malloc"));
    }

    fn links(stacks: &[(&str, bool)]) -> Links<String> {
        let mut l = Links::default();
        for (s, end) in stacks {
            let frames: Vec<(String, u64)> = s
                .split(';')
                .map(|f| {
                    let (name, cfa) = f.split_once('@').unwrap_or((f, "0"));
                    (name.to_string(), cfa.parse().unwrap())
                })
                .collect();
            let ips: Vec<u64> = frames.iter().map(|f| f.1 + 1).collect();
            l.add(&frames, &ips, *end);
        }
        l
    }

    fn node(name: &str, cfa: u64) -> (String, u64) {
        (name.to_string(), cfa)
    }

    #[test]
    fn a_cut_stack_is_followed_out_by_its_frames_places() {
        // A whole stack, and a cut one that went through run@300 by
        // another path: its links below run@300 are the whole one's.
        let l = links(&[
            ("f@100;g@200;run@300;main@400;_start@500", true),
            ("x@120;y@250;run@300", false),
        ]);
        let tail = |s: Option<Vec<String>>| s.map(|v| v.join(";"));
        assert_eq!(
            tail(l.complete(None, &node("y", 250))),
            Some("run;main;_start".into())
        );
        // The same name at another place is another frame.
        assert_eq!(l.complete(None, &node("run", 310)), None);
        // A node on the way with no known caller: nothing.
        let cut_only = links(&[("a@10;b@20;c@30", false)]);
        assert_eq!(cut_only.complete(None, &node("a", 10)), None);
        // An unknown CFA links nothing.
        let unknown = links(&[("a@10;b@0;main@40;_start@50", true)]);
        assert_eq!(unknown.complete(None, &node("a", 10)), None);
        assert_eq!(
            tail(unknown.complete(None, &node("main", 40))),
            Some("_start".into())
        );
    }

    #[test]
    fn the_caller_seen_most_often_is_taken() {
        let l = links(&[
            ("w@10;serve@20;main@30;_start@40", true),
            ("w@10;poll@25;main@30;_start@40", true),
            ("w@10;poll@25;main@30;_start@40", true),
        ]);
        let got = l.complete(None, &node("w", 10)).map(|v| v.join(";"));
        assert_eq!(got, Some("poll;main;_start".into()));
        // After a callee seen at its place, that callee's caller: the
        // rarer path that went on to sleep.
        let l = links(&[
            ("lock@10;insert@20;update@40;main@50;_start@60", true),
            ("lock@10;insert@20;update@40;main@50;_start@60", true),
            ("sleep@5;lock@10;wait@20;update@40;main@50;_start@60", true),
        ]);
        // The helper gives each frame the address CFA + 1.
        let tail = |c: Option<&(String, u64)>| {
            l.complete(c.map(|c| (c, c.1 + 1)), &node("lock", 10))
                .map(|v| v.join(";"))
        };
        assert_eq!(tail(None), Some("insert;update;main;_start".into()));
        assert_eq!(
            tail(Some(&node("sleep", 5))),
            Some("wait;update;main;_start".into())
        );
        // A callee never seen there, or seen from another address: the
        // most frequent.
        assert_eq!(
            tail(Some(&node("read", 7))),
            Some("insert;update;main;_start".into())
        );
        let elsewhere = l.complete(Some((&node("sleep", 5), 99)), &node("lock", 10));
        assert_eq!(
            elsewhere.map(|v| v.join(";")),
            Some("insert;update;main;_start".into())
        );
        // A link that goes back up the stack is not one.
        let bad = links(&[("a@50;b@40;main@60;_start@70", true)]);
        assert_eq!(bad.complete(None, &node("a", 50)), None);
    }
}
