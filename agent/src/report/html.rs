//! The report page: one self-contained HTML file. Each flame graph is an
//! inferno SVG (its own script gives hover, click-to-zoom and search) in an
//! `<iframe srcdoc>`, so that the graphs' scripts and element ids stay apart
//! and the page needs nothing but itself, from `file://` too.

use std::fmt::Write as _;

use super::{
    Page,
    embed::{Lazy, embed, esc, options},
    model::{FileReport, HitReport, Status, anchor},
    moments::{self, Folded},
    offcpu_page, runinfo, timeline_page,
};
use crate::output::events::human_ns;

/// Below this many samples a moment says little; the page says so.
pub const FEW_SAMPLES: u64 = 20;

const STYLE: &str = "body{font:14px sans-serif;margin:1em 2em;color:#222}\
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}\
th{background:#eee}.bad{color:#b00}.warn{background:#fff3cd;padding:6px 10px;border:1px solid #e0c060}\
.note{color:#555}iframe{width:100%;border:1px solid #ddd;margin:4px 0 12px}\
code{background:#f4f4f4;padding:0 3px}h3{margin-top:2em}";

/// The page's script: searching every graph, building a hit's section
/// when it opens.
const SCRIPT: &str = include_str!("lazy.js");

/// The whole page.
pub fn page(p: &Page) -> String {
    let mut h = String::with_capacity(1 << 20);
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    let _ = write!(
        h,
        "<title>mt-agent report: {}</title><style>{STYLE}{}{}</style><script>{SCRIPT}{}</script></head><body>",
        esc(&p.out.display().to_string()),
        offcpu_page::STYLE,
        timeline_page::STYLE,
        timeline_page::SCRIPT
    );
    let _ = write!(
        h,
        "<h1>mt-agent report</h1><p>Output directory <code>{}</code>.</p>",
        esc(&p.out.display().to_string())
    );
    run_section(&mut h, p);
    super::run_view::section(&mut h, p);
    warnings(&mut h, p);
    table(&mut h, p);
    h.push_str(
        "<p><label>Search every flame graph: <input id=\"search\" type=\"search\" \
         oninput=\"searchAll(this.value)\" placeholder=\"function name (regex)\"></label></p>",
    );
    let mut lazy = Lazy::default();
    for f in &p.files {
        for hit in &f.hits {
            hit_section(&mut h, &mut lazy, p, f, hit);
        }
    }
    lazy.finish(&mut h);
    h.push_str("</body></html>\n");
    h
}

fn run_section(h: &mut String, p: &Page) {
    h.push_str("<h2>The run</h2><table><tr><th>directory</th><th>target</th><th>trigger</th><th>event</th><th>freq (Hz)</th><th>time span</th><th>counters (last snapshot)</th></tr>");
    for r in &p.runs {
        let info = runinfo::of(p, r);
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            esc(&display_dir(&r.rel)),
            esc(&info.target),
            esc(&info.trigger),
            esc(&info.event),
            esc(&info.freq),
            esc(&info.span),
            esc(&info.counters),
        );
    }
    h.push_str("</table>");
    if let Some(c) = p.files.iter().find_map(|f| f.cmdline.as_ref()) {
        let _ = write!(
            h,
            "<p class=\"note\">perf ran as <code>{}</code>.</p>",
            esc(c)
        );
    }
}

fn warnings(h: &mut String, p: &Page) {
    for f in p.files.iter().filter(|f| f.status.is_bad()) {
        let _ = write!(
            h,
            "<p class=\"warn bad\">{}: {}. The other snapshots are reported.</p>",
            esc(&display_file(f)),
            esc(&f.status.describe())
        );
    }
    for r in p.runs.iter().filter(|r| r.bad_lines > 0) {
        let _ = write!(
            h,
            "<p class=\"warn\">{}: {} index line(s) could not be read and are left out.</p>",
            esc(&display_dir(&r.rel)),
            r.bad_lines
        );
    }
    for g in &p.go_replaced {
        let now = match &g.now {
            Some(id) => format!("a Go binary with another Go build ID ({id})"),
            None => "no Go binary".into(),
        };
        let _ = write!(
            h,
            "<p class=\"warn\">{} is now {now}: it has no GNU build-id, so perf named its frames \
             from that file, not from the build that ran. The build that ran is kept as \
             <code>{}</code>; put it back at that path to read the snapshots.</p>",
            esc(&g.path.display().to_string()),
            esc(&g.kept.display().to_string())
        );
    }
    if p.grafted > 0 {
        let _ = write!(
            h,
            "<p>{} stacks cut where their DWARF copy of the stack ended were completed with the \
             outer frames of a complete stack of the same thread (docs/unwinding.md, \
             \"How much stack a sample needs\").</p>",
            p.grafted
        );
    }
    for f in p.files.iter().filter(|f| f.returns_error.is_some()) {
        let _ = write!(
            h,
            "<p class=\"warn\">{}: the return addresses a uretprobe hid from its DWARF stack \
             copies could not be put back, so stacks sampled during the slow calls end at \
             the uretprobe's trampoline: {}.</p>",
            esc(&f.line.snapshot.file),
            esc(f.returns_error.as_deref().unwrap_or(""))
        );
    }
    for f in p.files.iter().filter(|f| f.jitdump_error.is_some()) {
        let _ = write!(
            h,
            "<p class=\"warn\">{}: the kept jitdump files could not be read, so its JIT \
             frames are unnamed: {}.</p>",
            esc(&f.line.snapshot.file),
            esc(f.jitdump_error.as_deref().unwrap_or(""))
        );
    }
    let (cut, all) = p.truncated;
    if all > 0 && cut * 2 > all {
        let used = p
            .files
            .iter()
            .find_map(|f| f.cmdline.as_deref())
            .and_then(runinfo::unwinding);
        let _ = write!(
            h,
            "<p class=\"warn\">{cut} of {all} stacks ({:.0}%) do not reach their thread's start \
             (<code>main</code>, <code>start_thread</code>, <code>_start</code>, <code>clone</code>, \
             <code>runtime.goexit</code>): {}</p>",
            100.0 * cut as f64 / all as f64,
            runinfo::truncation_advice(used.as_deref())
        );
    }
}

/// Above this many rows the snapshots table starts folded: laying out a
/// 1,000-row table of 12 columns took 0.3-0.5 s of the page's 0.95-1.6 s
/// open in headless Chromium (docs/report.md, "Page size"), and the run
/// view above lists the hits already.
const FOLD_TABLE_ROWS: usize = 30;

fn table(h: &mut String, p: &Page) {
    h.push_str("<h2>Snapshots</h2>");
    let rows: usize = p.files.iter().map(|f| f.hits.len().max(1)).sum();
    let folded = rows > FOLD_TABLE_ROWS;
    if folded {
        let _ = write!(
            h,
            "<details class=\"snapshots\"><summary>{rows} rows, one per hit (and one per snapshot without a hit): open to see them</summary>"
        );
    }
    h.push_str("<table><tr><th>kind</th><th>file</th><th>hit</th><th>hit time (host local time, ±10 ms)</th><th>s into run</th><th>tid</th><th>args</th><th>duration</th><th>retval</th><th>hit → kill</th><th>samples in file</th><th>samples in moment</th></tr>");
    for f in &p.files {
        let status = match &f.status {
            Status::Read => String::new(),
            s => format!(" <span class=\"bad\">({})</span>", esc(&s.describe())),
        };
        let unlisted = match f.line.snapshot.unlisted_hits {
            0 => String::new(),
            n => format!(" (+{n} merged hits not listed)"),
        };
        let file = format!("{}{status}{unlisted}", esc(&display_file(f)));
        let samples = if f.status == Status::Read {
            f.samples.to_string()
        } else {
            "-".into()
        };
        if f.hits.is_empty() {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{file}</td><td colspan=\"8\"></td><td>{samples}</td><td>-</td></tr>",
                esc(f.line.snapshot.kind.name())
            );
        }
        for hit in &f.hits {
            hit_row(h, p, f, hit, &file, &samples);
        }
    }
    h.push_str("</table>");
    if folded {
        h.push_str("</details>");
    }
}

fn hit_row(h: &mut String, p: &Page, f: &FileReport, hit: &HitReport, file: &str, samples: &str) {
    let x = &hit.hit;
    let seq = if x.merged {
        format!("<a href=\"#{}\">#{}</a> (merged)", anchor(f, hit), x.seq)
    } else {
        format!("<a href=\"#{}\">#{}</a>", anchor(f, hit), x.seq)
    };
    let opt = |v: Option<u64>, hum: bool| match v {
        Some(n) if hum => format!("{} ({n} ns)", human_ns(n)),
        Some(n) => format!("{n:#x}"),
        None => "-".into(),
    };
    let _ = write!(
        h,
        "<tr><td>{}</td><td>{file}</td><td>{seq}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{samples}</td><td>{}</td></tr>",
        esc(f.line.snapshot.kind.name()),
        esc(&runinfo::wall_clock(f, x).unwrap_or_else(|| "-".into())),
        p.seconds_into_run(f, x)
            .map_or("-".into(), |s| format!("{s:.3}")),
        x.tid,
        esc(&format!("{:?}", x.args)),
        opt(x.duration_ns, true),
        opt(x.retval, false),
        opt(f.line.snapshot.hit_to_kill_ns.filter(|_| !x.merged), true),
        if f.status == Status::Read {
            moments::total(&hit.moment).to_string()
        } else {
            "-".into()
        },
    );
}

/// A hit's section: a `<details>` whose summary and figures are in the
/// page, and whose timeline and graphs are built when it opens.
fn hit_section(h: &mut String, lazy: &mut Lazy, p: &Page, f: &FileReport, hit: &HitReport) {
    let x = &hit.hit;
    let what = match x.duration_ns {
        Some(d) => format!(": a {} call", human_ns(d)),
        None => String::new(),
    };
    let _ = write!(
        h,
        "<details class=\"hit\" id=\"{}\"><summary><h3>Hit #{} in {}: tid {}</h3>{}{}</summary>",
        anchor(f, hit),
        x.seq,
        esc(&display_file(f)),
        x.tid,
        esc(&what),
        if f.status == Status::Read {
            format!(", {} samples in the moment", moments::total(&hit.moment))
        } else {
            String::new()
        }
    );
    hit_body(h, lazy, p, f, hit);
    h.push_str("</details>");
}

fn hit_body(h: &mut String, lazy: &mut Lazy, p: &Page, f: &FileReport, hit: &HitReport) {
    offcpu_page::bar(h, hit, is_go(p, f));
    if f.status != Status::Read {
        let _ = write!(
            h,
            "<p class=\"bad\">No flame graphs: the snapshot is {}.</p>",
            esc(&f.status.describe())
        );
        return;
    }
    let sp = hit.span;
    let what = if sp.call {
        format!(
            "the slow call itself, {} long",
            human_ns(sp.end_ns - sp.start_ns)
        )
    } else {
        format!(
            "the last {} before the hit",
            human_ns(sp.end_ns - sp.start_ns)
        )
    };
    let n = moments::total(&hit.moment);
    let _ = write!(
        h,
        "<p>The moment is {what} on thread {}: {n} samples (folded: <code>report/{}</code>).</p>",
        sp.tid,
        esc(&hit.moment_file.display().to_string())
    );
    if n < FEW_SAMPLES {
        let on_cpu = hit.off_cpu.as_ref().map(|o| o.on_cpu_ns);
        let longer_window = p.window_ns > 0 && !sp.call;
        let _ = write!(
            h,
            "<p class=\"warn\">{}</p>",
            few_samples_advice(n, on_cpu, longer_window)
        );
    }
    lazy.part(h, &built_on_open(f, hit));
}

/// What a hit's section builds when it opens: its timeline and graphs.
fn built_on_open(f: &FileReport, hit: &HitReport) -> String {
    let mut h = String::new();
    if let Some(t) = &hit.timeline {
        timeline_page::section(&mut h, t, hit.hit.tid, &hit.thread_samples);
    }
    graph(
        &mut h,
        "The moment on the hit's thread",
        &hit.moment,
        "moment",
    );
    offcpu_page::graph(&mut h, hit);
    graph(
        &mut h,
        "The whole process over the whole snapshot",
        &f.all,
        "all",
    );
    diff_graph(&mut h, hit);
    h
}

fn graph(h: &mut String, title: &str, folded: &Folded, class: &str) {
    let lines: Vec<String> = folded.iter().map(|(l, n)| format!("{l} {n}")).collect();
    let total = moments::total(folded);
    let mut opt = options(format!("{title} ({total} samples)"));
    embed(h, title, &lines, &mut opt, class);
}

fn diff_graph(h: &mut String, hit: &HitReport) {
    let title = "What is different about the moment";
    if hit.rest.is_empty() {
        let _ = write!(
            h,
            "<h4>{title}</h4><p class=\"note\">The thread has no samples outside the moment in this \
             snapshot: nothing to compare with.</p>"
        );
        return;
    }
    let lines = moments::differential(&hit.moment, &hit.rest);
    let mut opt = options(format!(
        "{title}: the moment ({} samples) against the rest of the thread ({} samples, scaled)",
        moments::total(&hit.moment),
        moments::total(&hit.rest)
    ));
    opt.subtitle =
        Some("red: more of the moment's time than in the rest of the thread; blue: less".into());
    embed(h, title, &lines, &mut opt, "diff");
}

/// Whether the file's trigger is in a Go binary, from `run.json` (false
/// when the run left none).
fn is_go(p: &Page, f: &FileReport) -> bool {
    p.runs
        .iter()
        .find(|r| r.rel == f.dir)
        .and_then(|r| crate::output::run_file::trigger_of(&p.out, r))
        .is_some_and(|t| t.go)
}

fn display_dir(rel: &std::path::Path) -> String {
    if rel.as_os_str().is_empty() {
        ".".into()
    } else {
        rel.display().to_string()
    }
}

fn display_file(f: &FileReport) -> String {
    f.dir.join(&f.line.snapshot.file).display().to_string()
}

/// The highest `--freq` the advice names, Hz.
const HIGH_FREQ: u64 = 4999;

/// What to say of a moment with `n` (< [`FEW_SAMPLES`]) samples. A thread
/// that was on CPU for `on_cpu_ns` of it (from the off-CPU breakdown, when
/// recorded) gives samples only for that time: when even [`HIGH_FREQ`]
/// would give fewer than [`FEW_SAMPLES`] there, no frequency helps and the
/// off-CPU breakdown is where the time went.
fn few_samples_advice(n: u64, on_cpu_ns: Option<u64>, longer_window: bool) -> String {
    let head = format!("Only {n} samples in this moment: too few to mean much.");
    if let Some(on) = on_cpu_ns
        && on.saturating_mul(HIGH_FREQ) / 1_000_000_000 < FEW_SAMPLES
    {
        return format!(
            "{head} The thread was on CPU for only {} of it, so a CPU profile has little to \
             show at any <code>--freq</code>: its time is in the off-CPU breakdown below.",
            human_ns(on)
        );
    }
    format!(
        "{head} Record with a higher <code>--freq</code> (e.g. <code>-F {HIGH_FREQ}</code>){}.",
        if longer_window {
            " or report with a longer --window"
        } else {
            ""
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_moment_is_not_told_to_raise_the_frequency() {
        // 100% blocked: no frequency gives samples.
        let blocked = few_samples_advice(0, Some(0), false);
        assert!(!blocked.contains("--freq</code> (e.g."), "{blocked}");
        assert!(blocked.contains("off-CPU breakdown"), "{blocked}");
        // 2 ms on CPU: 9 samples even at 4999 Hz.
        assert!(few_samples_advice(1, Some(2_000_000), false).contains("off-CPU"));
        // 50 ms on CPU at a low frequency: a higher one helps.
        let low = few_samples_advice(5, Some(50_000_000), true);
        assert!(low.contains("-F 4999") && low.contains("--window"), "{low}");
        // No breakdown recorded: the frequency advice as before.
        assert!(few_samples_advice(3, None, false).contains("-F 4999"));
    }
}
