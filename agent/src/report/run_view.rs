//! The run as a whole (issue 26 §2), at the top of the page: every hit by
//! time and, for slow calls, by duration (a chart and a sortable table;
//! a click opens the hit's section), and what the moments have in common:
//! the moments of all hits merged, against every other sample of the same
//! threads, as one differential flame graph; per trigger and process when
//! the run has several (`--exe`, `--config`). Also `report --json`'s `run`
//! object, the same merge's top functions.
//!
//! The merge reads each snapshot's [`ThreadParts`]: a sample inside several
//! moments counts once, and a sample inside another hit's moment is never
//! part of the rest (a hit's own `rest` does not leave those out).

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    path::{Path, PathBuf},
};

use serde_json::{Value, json};

use super::{
    Page,
    embed::{embed, esc, options},
    model::{self, FileReport, HitReport, Status},
    moments::{self, Folded, ThreadParts},
};
use crate::output::{events::human_ns, run_file};

/// What the view groups hits by: the trigger (its function and object,
/// from `run.json`; "-" when the run left none) and the process.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    pub trigger: String,
    pub tgid: u32,
}

/// The merged moments of a group (or of the whole run).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Merged {
    /// Hits, and how many of them are slow calls (`--slower-than`).
    pub hits: usize,
    pub slow: usize,
    /// The samples inside any moment of the group's threads, each once.
    pub moment: Folded,
    /// Their samples outside every moment.
    pub rest: Folded,
}

/// Merges by group: each hit (`slow`: it has a duration) counts in its
/// group, each thread's `inside` joins its group's moment and `outside`
/// its rest. Pure.
pub fn merge<'a>(
    hits: impl IntoIterator<Item = (GroupKey, bool)>,
    parts: impl IntoIterator<Item = (GroupKey, &'a ThreadParts)>,
) -> BTreeMap<GroupKey, Merged> {
    let mut out: BTreeMap<GroupKey, Merged> = BTreeMap::new();
    for (k, slow) in hits {
        let m = out.entry(k).or_default();
        m.hits += 1;
        m.slow += usize::from(slow);
    }
    for (k, t) in parts {
        let m = out.entry(k).or_default();
        m.moment.extend(t.inside.iter().cloned());
        m.rest.extend(t.outside.iter().cloned());
    }
    for m in out.values_mut() {
        moments::sort_merged(&mut m.moment);
        moments::sort_merged(&mut m.rest);
    }
    out
}

/// Every group together. Pure.
pub fn whole<'a>(groups: impl IntoIterator<Item = &'a Merged>) -> Merged {
    let mut all = Merged::default();
    for g in groups {
        all.hits += g.hits;
        all.slow += g.slow;
        all.moment.extend(g.moment.iter().cloned());
        all.rest.extend(g.rest.iter().cloned());
    }
    moments::sort_merged(&mut all.moment);
    moments::sort_merged(&mut all.rest);
    all
}

/// One hit of the view.
struct Row<'a> {
    f: &'a FileReport,
    h: &'a HitReport,
    /// Index in [`View::keys`].
    group: usize,
    /// Seconds from the run's first sample (of every directory) to the hit.
    t_s: f64,
}

/// The view, computed once for the page or the JSON.
struct View<'a> {
    rows: Vec<Row<'a>>,
    keys: Vec<GroupKey>,
    /// The groups' merges, in the order of `keys`, and their directories.
    groups: Vec<(Merged, Vec<PathBuf>)>,
    whole: Merged,
}

fn view(p: &Page) -> View<'_> {
    let trigger: HashMap<&Path, String> = p
        .runs
        .iter()
        .map(|r| {
            let t = run_file::trigger_of(&p.out, r).map_or("-".into(), |t| {
                format!("{} in {}", t.symbol, t.object.display())
            });
            (r.rel.as_path(), t)
        })
        .collect();
    let key = |f: &FileReport, tgid: u32| GroupKey {
        trigger: trigger.get(f.dir.as_path()).cloned().unwrap_or("-".into()),
        tgid,
    };
    let hits = || {
        p.files
            .iter()
            .flat_map(|f| f.hits.iter().map(move |h| (f, h)))
    };
    let tgid: HashMap<(&Path, u32), u32> = hits()
        .map(|(f, h)| ((f.dir.as_path(), h.hit.tid), h.hit.tgid))
        .collect();
    let parts = p.files.iter().flat_map(|f| {
        f.threads.iter().filter_map(|t| {
            let g = *tgid.get(&(f.dir.as_path(), t.tid))?;
            Some((key(f, g), t))
        })
    });
    let merged = merge(
        hits().map(|(f, h)| (key(f, h.hit.tgid), h.hit.duration_ns.is_some())),
        parts,
    );
    let keys: Vec<GroupKey> = merged.keys().cloned().collect();
    let mut dirs: Vec<Vec<PathBuf>> = vec![Vec::new(); keys.len()];
    let t0 = p.starts.values().min().copied().unwrap_or(0);
    let rows: Vec<Row> = hits()
        .map(|(f, h)| {
            let group = keys.binary_search(&key(f, h.hit.tgid)).expect("merged");
            if !dirs[group].contains(&f.dir) {
                dirs[group].push(f.dir.clone());
            }
            let t_s = h.hit.ktime_ns.saturating_sub(t0) as f64 / 1e9;
            Row { f, h, group, t_s }
        })
        .collect();
    let whole = whole(merged.values());
    let groups = merged.into_values().zip(dirs).collect();
    View {
        rows,
        keys,
        groups,
        whole,
    }
}

/// `report --json`'s `run` object, printed after the hits: the whole run's
/// merge and each group's.
pub fn json(p: &Page, page: &Path) -> Value {
    let v = view(p);
    let groups: Vec<Value> = v
        .keys
        .iter()
        .zip(&v.groups)
        .map(|(k, (m, dirs))| {
            let mut o = merged_json(m);
            o["trigger"] = json!(k.trigger);
            o["tgid"] = json!(k.tgid);
            o["dirs"] = json!(dirs);
            o
        })
        .collect();
    let mut o = merged_json(&v.whole);
    o["event"] = json!("run");
    o["report"] = json!(page);
    o["groups"] = json!(groups);
    o
}

fn merged_json(m: &Merged) -> Value {
    json!({
        "hits": m.hits,
        "slow_calls": m.slow,
        "moment_samples": moments::total(&m.moment),
        "rest_samples": moments::total(&m.rest),
        "top": moments::shares(&m.moment, 20),
        "diff": moments::deltas(&m.moment, &m.rest, 10),
    })
}

/// At most this many groups get a graph of their own on the page (the
/// largest by hits); `--json` has them all.
const MAX_GROUP_GRAPHS: usize = 8;

/// Colours of the groups in the chart and the table.
const COLOURS: &[&str] = &[
    "#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

const STYLE: &str = "#run-view svg{max-width:900px;width:100%;border:1px solid #ddd;cursor:pointer}\
#run-hits tbody tr{cursor:pointer}#run-hits tbody tr:hover{background:#f4f8ff}\
#run-hits th{cursor:pointer;user-select:none}#run-hits th[data-dir=asc]::after{content:' \\25b2'}\
#run-hits th[data-dir=desc]::after{content:' \\25bc'}.swatch{display:inline-block;width:.8em;\
height:.8em;margin-right:4px;vertical-align:middle}#run-view .scroll{max-height:24em;overflow:auto;\
display:inline-block}";

/// Sorting the table (numbers by `data-v`, unknown ones last either
/// way) and opening a hit: its section's `<details>`, if any, is opened
/// and it is scrolled to.
const SCRIPT: &str = "function openHit(id){const e=document.getElementById(id);if(!e)return false;\
const d=e.closest('details');if(d)d.open=true;e.scrollIntoView({block:'start'});return true;}\
function runViewClick(ev){const t=ev.target.closest('[data-hit]');if(!t)return;ev.preventDefault();\
openHit(t.dataset.hit);}\
function sortRuns(ev){const th=ev.target.closest('th');if(!th)return;const tr=th.parentNode;\
const i=Array.prototype.indexOf.call(tr.children,th);const b=document.querySelector('#run-hits tbody');\
const asc=th.dataset.dir!=='asc';for(const x of tr.children)delete x.dataset.dir;\
th.dataset.dir=asc?'asc':'desc';const key=r=>{const c=r.cells[i];\
if(c.dataset.v===undefined)return c.textContent;return c.dataset.v===''?null:+c.dataset.v;};\
const rows=Array.from(b.rows);rows.sort((x,y)=>{const a=key(x),z=key(y);\
if(a===null||z===null)return a===z?0:(a===null?1:-1);\
const c=typeof a==='number'?a-z:String(a).localeCompare(String(z));return asc?c:-c;});\
for(const r of rows)b.appendChild(r);}";

/// The view's part of the page.
pub fn section(h: &mut String, p: &Page) {
    let v = view(p);
    let _ = write!(
        h,
        "<style>{STYLE}</style><script>{SCRIPT}</script><div id=\"run-view\"><h2>Every hit</h2>"
    );
    summary(h, &v);
    chart(h, &v);
    table(h, &v);
    graphs(h, &v);
    h.push_str("</div>");
}

fn summary(h: &mut String, v: &View) {
    let durations: Vec<u64> = v.rows.iter().filter_map(|r| r.h.hit.duration_ns).collect();
    let _ = write!(h, "<p>{} hit(s)", v.rows.len());
    if let (Some(lo), Some(hi)) = (durations.iter().min(), durations.iter().max()) {
        let mut sorted = durations.clone();
        sorted.sort_unstable();
        let _ = write!(
            h,
            ", {} slow call(s): {} to {}, median {}",
            durations.len(),
            human_ns(*lo),
            human_ns(*hi),
            human_ns(sorted[sorted.len() / 2])
        );
    }
    if v.keys.len() > 1 {
        let _ = write!(h, ", in {} groups (trigger, process)", v.keys.len());
    }
    h.push_str(". Click a hit in the chart or the table to open it; click a column to sort.</p>");
}

fn colour(group: usize) -> &'static str {
    COLOURS[group % COLOURS.len()]
}

/// The chart's size and margins, in SVG user units.
const W: f64 = 900.0;
const H: f64 = 220.0;
const LEFT: f64 = 70.0;
const BOTTOM: f64 = 30.0;

/// The hits by time (x: seconds since the run's first sample) and, for
/// slow calls, by duration (y); a hit without a duration is a tick on the
/// time axis.
fn chart(h: &mut String, v: &View) {
    let t_max = v.rows.iter().map(|r| r.t_s).fold(0.0, f64::max).max(1e-3);
    let d_max = v.rows.iter().filter_map(|r| r.h.hit.duration_ns).max();
    let x = |t: f64| LEFT + (W - LEFT - 10.0) * t / t_max;
    let base = H - BOTTOM;
    let y = |d: u64| base - (base - 10.0) * d as f64 / d_max.unwrap_or(1).max(1) as f64;
    let _ = write!(
        h,
        "<svg id=\"run-chart\" viewBox=\"0 0 {W} {H}\" onclick=\"runViewClick(event)\" \
         font-size=\"11\" role=\"img\" aria-label=\"hits by time and duration\">\
         <line x1=\"{LEFT}\" y1=\"{base}\" x2=\"{}\" y2=\"{base}\" stroke=\"#888\"/>\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{t_max:.3} s since the run's first sample</text>\
         <text x=\"{LEFT}\" y=\"{}\">0</text>",
        W - 10.0,
        W - 10.0,
        H - 8.0,
        H - 8.0
    );
    if let Some(d) = d_max {
        let _ = write!(
            h,
            "<line x1=\"{LEFT}\" y1=\"10\" x2=\"{LEFT}\" y2=\"{base}\" stroke=\"#888\"/>\
             <text x=\"{}\" y=\"16\" text-anchor=\"end\">{}</text>\
             <text x=\"{}\" y=\"{base}\" text-anchor=\"end\">0</text>",
            LEFT - 4.0,
            esc(&human_ns(d)),
            LEFT - 4.0
        );
    }
    for r in &v.rows {
        let (cx, c) = (x(r.t_s), colour(r.group));
        let id = model::anchor(r.f, r.h);
        let tip = esc(&tooltip(r, &v.keys[r.group]));
        match r.h.hit.duration_ns {
            Some(d) => {
                let _ = write!(
                    h,
                    "<circle data-hit=\"{id}\" cx=\"{cx:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{c}\" \
                     fill-opacity=\"0.8\"><title>{tip}</title></circle>",
                    y(d)
                );
            }
            None => {
                let _ = write!(
                    h,
                    "<rect data-hit=\"{id}\" x=\"{:.1}\" y=\"{}\" width=\"3\" height=\"14\" \
                     fill=\"{c}\"><title>{tip}</title></rect>",
                    cx - 1.5,
                    base - 14.0
                );
            }
        }
    }
    h.push_str("</svg>");
}

/// A trigger's label with its object's file name only (the table's
/// cell; the whole label is its title).
fn short(trigger: &str) -> String {
    match trigger.split_once(" in ") {
        Some((f, obj)) => {
            let name = Path::new(obj).file_name().map(|n| n.to_string_lossy());
            format!("{f} in {}", name.as_deref().unwrap_or(obj))
        }
        None => trigger.to_string(),
    }
}

fn tooltip(r: &Row, k: &GroupKey) -> String {
    let x = &r.h.hit;
    let d = x
        .duration_ns
        .map_or(String::new(), |d| format!(", {}", human_ns(d)));
    format!(
        "#{} at {:.3} s{d}: {}, pid {}, tid {}",
        x.seq, r.t_s, k.trigger, x.tgid, x.tid
    )
}

fn table(h: &mut String, v: &View) {
    h.push_str(
        "<div class=\"scroll\"><table id=\"run-hits\"><thead onclick=\"sortRuns(event)\"><tr>\
         <th>hit</th><th>s since start</th><th>duration</th><th>samples in moment</th>\
         <th>trigger</th><th>pid</th><th>tid</th><th>file</th></tr></thead>\
         <tbody onclick=\"runViewClick(event)\">",
    );
    for r in &v.rows {
        let x = &r.h.hit;
        let id = model::anchor(r.f, r.h);
        let read = r.f.status == Status::Read;
        let samples = moments::total(&r.h.moment);
        let (d_v, d_text) = match x.duration_ns {
            Some(d) => (d.to_string(), human_ns(d)),
            None => (String::new(), "-".into()),
        };
        let _ = write!(
            h,
            "<tr data-hit=\"{id}\"><td data-v=\"{}\"><a href=\"#{id}\">#{}</a>{}</td>\
             <td data-v=\"{:.6}\">{:.3}</td><td data-v=\"{d_v}\">{}</td>\
             <td data-v=\"{}\">{}</td><td title=\"{}\"><span class=\"swatch\" style=\"background:{}\"></span>{}</td>\
             <td data-v=\"{}\">{}</td><td data-v=\"{}\">{}</td><td>{}</td></tr>",
            x.seq,
            x.seq,
            if x.merged { " (merged)" } else { "" },
            r.t_s,
            r.t_s,
            esc(&d_text),
            if read {
                samples.to_string()
            } else {
                String::new()
            },
            if read {
                samples.to_string()
            } else {
                "-".into()
            },
            esc(&v.keys[r.group].trigger),
            colour(r.group),
            esc(&short(&v.keys[r.group].trigger)),
            x.tgid,
            x.tgid,
            x.tid,
            x.tid,
            esc(&r.f.dir.join(&r.f.line.snapshot.file).display().to_string()),
        );
    }
    h.push_str("</tbody></table></div>");
}

/// The merged differential graphs: the whole run's, then (when the run
/// has several groups) the largest groups'.
fn graphs(h: &mut String, v: &View) {
    let slow_only = v.whole.slow == v.whole.hits;
    let _ = write!(
        h,
        "<p>What the moments have in common: every hit's moment merged (a sample in several \
         moments counts once) against all the samples of the same threads outside any moment. {}</p>",
        if slow_only {
            "The moments are the slow calls, so this is the slow calls against everything else \
             their threads did."
        } else {
            "A moment is the <code>--window</code> before its hit (the call itself for a slow call)."
        }
    );
    if v.keys.len() <= 1 {
        merged_graph(h, "What the moments have in common", &v.whole);
        return;
    }
    merged_graph(h, "What the moments have in common, every group", &v.whole);
    let mut order: Vec<usize> = (0..v.keys.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(v.groups[i].0.hits));
    for &i in order.iter().take(MAX_GROUP_GRAPHS) {
        let k = &v.keys[i];
        let title = format!(
            "{}, pid {}: {} hit(s)",
            k.trigger, k.tgid, v.groups[i].0.hits
        );
        let _ = write!(
            h,
            "<details open><summary><span class=\"swatch\" style=\"background:{}\"></span>{}</summary>",
            colour(i),
            esc(&title)
        );
        merged_graph(h, &title, &v.groups[i].0);
        h.push_str("</details>");
    }
    if v.keys.len() > MAX_GROUP_GRAPHS {
        let _ = write!(
            h,
            "<p class=\"note\">{} more group(s) with fewer hits: see <code>report --json</code>'s \
             <code>run</code> object.</p>",
            v.keys.len() - MAX_GROUP_GRAPHS
        );
    }
}

fn merged_graph(h: &mut String, title: &str, m: &Merged) {
    if m.moment.is_empty() || m.rest.is_empty() {
        let why = if m.moment.is_empty() {
            "The moments have no samples (or their snapshots could not be read)"
        } else {
            "The threads have no samples outside the moments"
        };
        let _ = write!(
            h,
            "<h4>{}</h4><p class=\"note\">{why}: nothing to compare with.</p>",
            esc(title)
        );
        return;
    }
    let lines = moments::differential(&m.moment, &m.rest);
    let mut opt = options(format!(
        "{title}: {} hit(s), the moments ({} samples) against the rest of their threads ({} \
         samples, scaled)",
        m.hits,
        moments::total(&m.moment),
        moments::total(&m.rest)
    ));
    opt.subtitle =
        Some("red: more of the moments' time than of the rest of the threads'; blue: less".into());
    embed(h, title, &lines, &mut opt, "run-diff");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folded(v: &[(&str, u64)]) -> Folded {
        v.iter().map(|(s, n)| (s.to_string(), *n)).collect()
    }

    fn key(trigger: &str, tgid: u32) -> GroupKey {
        GroupKey {
            trigger: trigger.into(),
            tgid,
        }
    }

    fn part(tid: u32, inside: &[(&str, u64)], outside: &[(&str, u64)]) -> ThreadParts {
        ThreadParts {
            tid,
            inside: folded(inside),
            outside: folded(outside),
        }
    }

    #[test]
    fn groups_add_up_their_threads_and_snapshots() {
        // Two snapshots of process 10 (the same thread), one of process 20,
        // and a second trigger in process 10.
        let a1 = part(11, &[("main;slow", 5)], &[("main;idle", 10)]);
        let a2 = part(
            11,
            &[("main;slow", 3), ("main;parse", 1)],
            &[("main;idle", 2)],
        );
        let b = part(21, &[("main;other", 4)], &[]);
        let c = part(11, &[("main;g", 2)], &[("main;idle", 1)]);
        let hits = [
            (key("f in /x", 10), true),
            (key("f in /x", 10), true),
            (key("f in /x", 20), false),
            (key("g in /x", 10), true),
        ];
        let parts = [
            (key("f in /x", 10), &a1),
            (key("f in /x", 10), &a2),
            (key("f in /x", 20), &b),
            (key("g in /x", 10), &c),
        ];
        let m = merge(hits, parts);
        assert_eq!(m.len(), 3);
        let f10 = &m[&key("f in /x", 10)];
        assert_eq!((f10.hits, f10.slow), (2, 2));
        assert_eq!(f10.moment, folded(&[("main;parse", 1), ("main;slow", 8)]));
        assert_eq!(f10.rest, folded(&[("main;idle", 12)]));
        let f20 = &m[&key("f in /x", 20)];
        assert_eq!((f20.hits, f20.slow, f20.rest.len()), (1, 0, 0));
        let all = whole(m.values());
        assert_eq!((all.hits, all.slow), (4, 3));
        assert_eq!(moments::total(&all.moment), 15);
        assert_eq!(all.rest, folded(&[("main;idle", 13)]));
        // The merge's differential: the slow function has gained the most.
        let d = moments::deltas(&f10.moment, &f10.rest, 3);
        assert_eq!(d[0].name, "slow");
    }

    #[test]
    fn the_table_names_the_trigger_by_its_object_file() {
        assert_eq!(short("handle in /srv/bin/api"), "handle in api");
        assert_eq!(short("-"), "-");
    }

    #[test]
    fn a_hit_whose_snapshot_was_not_read_still_counts() {
        let m = merge([(key("-", 1), true)], []);
        let g = &m[&key("-", 1)];
        assert_eq!((g.hits, g.slow), (1, 1));
        assert!(g.moment.is_empty() && g.rest.is_empty());
    }
}
