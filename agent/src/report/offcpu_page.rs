//! A hit's off-CPU part of the page: a bar of its window in four kinds (on
//! CPU, runnable, blocked, and unknown where the snapshot file does not
//! show the thread), a flame graph of its blocked time (weights in
//! µs) and its heaviest blocked stacks.

use std::fmt::Write as _;

use inferno::flamegraph::color::{BasicPalette, Palette};

use super::{
    embed::{embed, esc, options},
    model::HitReport,
    offcpu::{self, OffCpuView},
};

/// The bar's style, added to the page's.
pub const STYLE: &str = ".ocbar{display:flex;height:20px;max-width:900px;border:1px solid #888;margin:4px 0}\
.ocbar span{display:block;height:100%}.oc-on{background:#e0793a}.oc-rq{background:#f2c14e}\
.oc-bl{background:#4f7fc9}.oc-un{background:repeating-linear-gradient(45deg,#ccc 0 4px,#eee 4px 8px)}.oclegend span{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px}\
ol.blocked li{margin:2px 0}ol.blocked code{background:none}";

/// How many frames of a blocked stack the list shows.
const LIST_FRAMES: usize = 8;

/// What the figures of a Go target describe (docs/off-cpu.md).
pub const GO_THREADS: &str = "The target is a Go binary: these figures describe the OS thread \
     that made the call, not the goroutine. The Go scheduler moves goroutines between threads: \
     a goroutine that sleeps leaves its thread to run others (its time then reads as on CPU), \
     and a blocked stack may be the thread's idle loop or another goroutine's.";

/// The bar of the four kinds, with their figures (`go`: the target is a Go
/// binary).
pub fn bar(h: &mut String, hit: &HitReport, go: bool) {
    let Some(o) = &hit.off_cpu else { return };
    let total = o.on_cpu_ns + o.runnable_ns + o.blocked_ns + o.unknown_ns;
    let ms = |ns: u64| format!("{:.1} ms", ns as f64 / 1e6);
    let pct = |ns: u64| 100.0 * ns as f64 / total.max(1) as f64;
    let all = [
        ("oc-on", "on CPU", o.on_cpu_ns),
        ("oc-rq", "runnable", o.runnable_ns),
        ("oc-bl", "blocked", o.blocked_ns),
        ("oc-un", "unknown", o.unknown_ns),
    ];
    // Unknown is shown only when there is some.
    let parts = &all[..if o.unknown_ns > 0 { 4 } else { 3 }];
    let _ = write!(
        h,
        "<h4>Where thread {} spent the {} window</h4><div class=\"ocbar\" role=\"img\" aria-label=\"off-CPU breakdown\">",
        hit.hit.tid,
        ms(o.to_ns - o.from_ns)
    );
    for &(class, what, ns) in parts {
        let _ = write!(
            h,
            "<span class=\"{class}\" style=\"width:{:.3}%\" title=\"{what}: {} ({:.0}%)\"></span>",
            pct(ns),
            ms(ns),
            pct(ns)
        );
    }
    h.push_str("</div><p class=\"oclegend\">");
    for &(class, what, ns) in parts {
        let _ = write!(
            h,
            "<span class=\"{class}\"></span>{what} <b>{}</b> ({:.0}%)",
            ms(ns),
            pct(ns)
        );
    }
    h.push_str(
        "</p><p class=\"note\">On CPU: running. Runnable: preempted, waiting for a CPU. \
         Blocked: asleep until woken (a lock, I/O, a timer), the wake-up latency included. \
         From the scheduler's switch records of this thread.",
    );
    if o.unknown_ns > 0 {
        h.push_str(
            " Unknown: the snapshot file does not show it: the window began before the file's \
             oldest record, perf lost records there, or the thread was off CPU with its switch \
             out not in the file. It is not counted in any other kind.",
        );
    }
    h.push_str("</p>");
    if go {
        let _ = write!(h, "<p class=\"note\"><b>Go:</b> {}</p>", esc(GO_THREADS));
    }
}

/// The flame graph of the blocked time and the heaviest blocked stacks
/// (for a snapshot that was read).
pub fn graph(h: &mut String, hit: &HitReport) {
    let Some(o) = &hit.off_cpu else { return };
    let title = "Blocked time of the hit's thread (off-CPU)";
    let _ = write!(
        h,
        "<p>The off-CPU flame graph weighs each stack at which thread {} blocked by how long it \
         stayed blocked, in µs: {} blocked interval(s), {:.1} ms (folded: <code>report/{}</code>).</p>",
        hit.hit.tid,
        o.intervals,
        o.graphed_ns as f64 / 1e6,
        esc(&o.file.display().to_string())
    );
    if o.unstacked_ns > 0 {
        let _ = write!(
            h,
            "<p class=\"note\">{:.1} ms of the blocked time has no stack: the \
             <code>sched:sched_switch</code> sample of its switch out is not in the snapshot \
             (lost, or taken before the file began). It is left out of the flame graph.</p>",
            o.unstacked_ns as f64 / 1e6
        );
    }
    if o.folded.is_empty() {
        let _ = write!(
            h,
            "<h4>{title}</h4><p class=\"note\">No blocked interval of this thread in the snapshot's \
             switch records for the window.</p>"
        );
        return;
    }
    let lines: Vec<String> = o.folded.iter().map(|(l, n)| format!("{l} {n}")).collect();
    let mut opt = options(format!(
        "{title}: {:.1} ms blocked, weights in µs",
        o.graphed_ns as f64 / 1e6
    ));
    opt.count_name = "µs".into();
    opt.colors = Palette::Basic(BasicPalette::Io);
    embed(h, title, &lines, &mut opt, "offcpu");
    top_list(h, o);
}

fn top_list(h: &mut String, o: &OffCpuView) {
    let _ = write!(
        h,
        "<h4>The heaviest blocked stacks</h4><ol class=\"blocked\">"
    );
    for b in &o.top {
        let frames = offcpu::interesting(&b.frames, LIST_FRAMES);
        let _ = write!(
            h,
            "<li><b>{}</b> (state <code>{}</code>): <code>{}</code></li>",
            us(b.time_us),
            esc(&b.state),
            esc(&frames.join(" ← "))
        );
    }
    h.push_str(
        "</ol><p class=\"note\">Leaf first: the kernel's reason, then the thread's own frames. State: the \
         thread's state as it left the CPU (<code>S</code> sleeping, <code>D</code> \
         uninterruptible, usually disk I/O).</p>",
    );
}

/// `1234` µs → `1.2 ms`; under a millisecond in µs.
fn us(t: u64) -> String {
    if t < 1000 {
        format!("{t} µs")
    } else {
        format!("{:.1} ms", t as f64 / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        output::index::IndexedHit,
        report::{moments, offcpu::BlockedStack},
    };

    fn report() -> HitReport {
        let hit = IndexedHit {
            tid: 7,
            ktime_ns: 100_000_000,
            off_cpu: Some(crate::perf::offcpu::OffCpu {
                off_cpu_from_ns: 0,
                breakdown: crate::perf::offcpu::Breakdown {
                    on_cpu_ns: 20_000_000,
                    runnable_ns: 0,
                    blocked_ns: 60_000_000,
                    unknown_ns: 20_000_000,
                },
                reaches_start: false,
            }),
            ..IndexedHit::default()
        };
        let file = std::path::PathBuf::from("perf.data.1.moment.folded");
        let mut o = offcpu::from_index(&hit, &file, Vec::new()).unwrap();
        o.folded = vec![("main;wait_part;__schedule".into(), 79_500)];
        o.top = vec![BlockedStack {
            frames: vec!["__schedule".into(), "wait_part".into(), "main".into()],
            time_us: 79_500,
            state: "S".into(),
        }];
        HitReport {
            span: moments::span(&hit, 1),
            hit,
            moment: vec![],
            rest: vec![],
            moment_file: file,
            off_cpu: Some(o),
            timeline: None,
            thread_samples: Default::default(),
        }
    }

    #[test]
    fn a_go_target_is_told_the_figures_are_its_threads_and_all_known_has_no_unknown_part() {
        let mut r = report();
        let o = r.off_cpu.as_mut().unwrap();
        (o.blocked_ns, o.unknown_ns) = (80_000_000, 0);
        let mut h = String::new();
        bar(&mut h, &r, true);
        assert!(h.contains("describe the OS thread"), "{h}");
        assert!(h.contains("not the goroutine"), "{h}");
        assert!(!h.contains("oc-un"), "{h}");
        assert!(!h.contains("Unknown:"), "{h}");
    }

    #[test]
    fn the_bar_is_in_proportion_and_the_graph_in_microseconds() {
        let r = report();
        let mut h = String::new();
        bar(&mut h, &r, false);
        assert!(h.contains("class=\"oc-on\" style=\"width:20.000%\""), "{h}");
        assert!(h.contains("class=\"oc-rq\" style=\"width:0.000%\""), "{h}");
        assert!(h.contains("class=\"oc-bl\" style=\"width:60.000%\""), "{h}");
        assert!(h.contains("blocked <b>60.0 ms</b>"), "{h}");
        // What the file does not show has its own part, named.
        assert!(h.contains("class=\"oc-un\" style=\"width:20.000%\""), "{h}");
        assert!(h.contains("unknown <b>20.0 ms</b>"), "{h}");
        assert!(
            h.contains("Unknown: the snapshot file does not show it"),
            "{h}"
        );
        assert!(!h.contains("Go:"), "{h}");
        let mut g = String::new();
        graph(&mut g, &r);
        assert!(!g.contains("has no stack"), "{g}");
        assert!(g.contains("class=\"fg offcpu\""), "{g}");
        assert!(g.contains("perf.data.1.offcpu.folded"));
        assert!(g.contains("µs"));
        assert!(
            g.contains("<b>79.5 ms</b> (state <code>S</code>): <code>wait_part ← main</code>"),
            "{g}"
        );
        let mut r = r;
        let o = r.off_cpu.as_mut().unwrap();
        o.unstacked_ns = 2_000_000;
        let mut g = String::new();
        graph(&mut g, &r);
        assert!(g.contains("2.0 ms of the blocked time has no stack"), "{g}");
        assert!(!g.contains("sched_switch sample]"), "{g}");
        assert_eq!(
            (us(999), us(1_250)),
            ("999 µs".to_string(), "1.2 ms".to_string())
        );
    }
}
