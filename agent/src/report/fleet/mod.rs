//! `mt-agent report s3://BUCKET/PREFIX --output DIR`: the fleet report.
//!
//! It lists the prefix (or `PREFIX/HOST/` for each `--host`), reads the
//! keys back with the store's layout (`upload::keys`, docs/upload.md),
//! fetches each run's `clock.json` and `run.json` and the index lines of the
//! directories `--trigger` selects, filters the lines ([`select`]), and then
//! fetches only what the kept lines need: their snapshots, and the run's
//! build-id objects (`objects/<id>.json`, `.debug/<id>/elf`), and what the
//! kept snapshots kept of `.jit/` (`jit/<snapshot>.jsonl` and the chunks
//! of the kept copies they reach, [`select::plan_jit`]). Every fetch
//! goes through the cache in `DIR/.store` ([`fetch`]). It then lays the
//! runs out as `DIR/<host>/<run>/` ([`mirror`]) and writes today's report
//! of DIR, whose page and `--json` name each hit's directory,
//! `<host>/<run>/<REL>`.
//!
//! Exit codes: 2 bad usage (no `--output`, a bad URL, DIR not a report's
//! directory) or nothing selected; 3 the environment (no credentials, no
//! bucket, access denied); 4 a runtime failure (the store unreachable, DIR
//! not writable); then the report's own.

pub mod fetch;
pub mod mirror;
pub mod select;

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    os::unix::fs::DirBuilderExt as _,
    path::{Path, PathBuf},
    time::SystemTime,
};

use serde_json::json;

use crate::{
    error::{ExitCode, Failure},
    flags::defs::ReportArgs,
    output::run_file::{self, Trigger},
    upload::{
        keys::{self, RunKey},
        store,
    },
};
use fetch::{Fetcher, STORE_DIR, Stats};
use mirror::{MirrorDir, MirrorJit, MirrorRun, ObjectRef};
use select::{Clock, Filters, ListedDir, Listing};

/// Whether `out` names a store (`s3://…`) rather than a local directory.
pub fn is_store(out: &Path) -> bool {
    out.to_str().is_some_and(|s| s.starts_with("s3://"))
}

/// `mt-agent report s3://…`.
pub fn run(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    let url = args.out.to_str().expect("an s3:// URL is text");
    let Some(dir) = &args.output else {
        return Err(Failure::usage(format!(
            "report {url} needs --output DIR: the directory the selected runs are fetched into \
             and the page is written in"
        ))
        .into());
    };
    let filters = filters(args)?;
    let store = store::open(url)?;
    prepare_dir(dir)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::runtime(format!("cannot start the report's runtime: {e}")))?;
    let fetcher = Fetcher::new(store.clone(), dir)?;
    let runs = rt.block_on(gather(&fetcher, &store.prefix, &args.host, &filters))?;
    mirror::build(dir, &runs)?;
    let stats = fetcher.stats();
    say_fetched(args.json, url, dir, &runs, &stats);
    if runs.is_empty() {
        return Err(Failure::usage(format!(
            "{url}: nothing matches the filters ({} keys listed); widen --host, --trigger, \
             --since, --until or --slower-than",
            stats.listed
        ))
        .into());
    }
    let mut local = args.clone();
    local.out = dir.clone();
    super::run(&local)
}

/// The filters, `--since` and `--until` resolved against now.
fn filters(args: &ReportArgs) -> Result<Filters, Failure> {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    let f = Filters {
        trigger: args.trigger.clone(),
        since_ns: args.since.map(|w| w.unix_ns(now)),
        until_ns: args.until.map(|w| w.unix_ns(now)),
        slower_than_ns: args.slower_than.map(|d| d.as_nanos() as u64),
    };
    if let (Some(s), Some(u)) = (f.since_ns, f.until_ns)
        && s > u
    {
        return Err(Failure::usage(
            "--since is later than --until: nothing is between them",
        ));
    }
    for h in &args.host {
        if !keys::plain_segment(h) {
            return Err(Failure::usage(format!(
                "--host {h:?} is not a host name as the store keeps it (one key segment: no '/', \
                 not starting with '.')"
            )));
        }
    }
    Ok(f)
}

/// Creates DIR (mode 0700), or accepts one that is empty or that an
/// earlier fleet report made (it holds `.store`): a report removes stale
/// indexes in DIR, so it must not be someone else's directory.
fn prepare_dir(dir: &Path) -> Result<(), Failure> {
    let bad = |why: String| Failure::usage(format!("--output {}: {why}", dir.display()));
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| fetch::local_failure(dir, e)),
        Err(e) => Err(bad(e.to_string())),
        Ok(m) if !m.is_dir() => Err(bad("not a directory".into())),
        Ok(_) => {
            let mut entries = fs::read_dir(dir).map_err(|e| bad(e.to_string()))?;
            if entries.next().is_none() || dir.join(STORE_DIR).is_dir() {
                Ok(())
            } else {
                Err(bad(format!(
                    "not empty and not a fleet report's directory (no {STORE_DIR} in it); give a \
                     new or empty directory"
                )))
            }
        }
    }
}

/// One line (or a `fetch` JSON event) saying what was fetched and what the
/// cache answered.
fn say_fetched(json: bool, url: &str, dir: &Path, runs: &[MirrorRun], s: &Stats) {
    let hosts: BTreeSet<&str> = runs.iter().map(|r| r.host.as_str()).collect();
    let snapshots: usize = runs
        .iter()
        .flat_map(|r| &r.dirs)
        .map(|d| d.snapshots.len())
        .sum();
    if json {
        let event = json!({
            "event": "fetch", "source": url, "output": dir,
            "hosts": hosts.len(), "runs": runs.len(), "snapshots": snapshots,
            "lists": s.lists, "listed": s.listed,
            "fetched": {"objects": s.fetched, "bytes": s.fetched_bytes},
            "cached": {"objects": s.cached, "bytes": s.cached_bytes},
        });
        println!("{event}");
    } else {
        println!(
            "{url}: {} host(s), {} run(s), {snapshots} snapshot(s) selected; fetched {} \
             object(s) ({} bytes), {} from the cache in {} ({} bytes)",
            hosts.len(),
            runs.len(),
            s.fetched,
            s.fetched_bytes,
            s.cached,
            dir.join(STORE_DIR).display(),
            s.cached_bytes
        );
    }
}

/// What one run in the listing gives once its small objects are read.
struct RunInfo {
    clock: Option<(Clock, PathBuf)>,
    run_file: Option<(Vec<Trigger>, PathBuf)>,
}

/// Lists, reads the small objects, filters, and fetches what the kept
/// lines need; the runs with at least one kept line.
async fn gather(
    f: &Fetcher,
    prefix: &str,
    hosts: &[String],
    filters: &Filters,
) -> Result<Vec<MirrorRun>, Failure> {
    let mut listed = Vec::new();
    if hosts.is_empty() {
        listed = f.list(&keys::list_prefix(prefix, None)).await?;
    }
    for h in hosts.iter().collect::<BTreeSet<_>>() {
        listed.extend(f.list(&keys::list_prefix(prefix, Some(h))).await?);
    }
    let listing = select::catalog(prefix, listed);
    let infos = run_infos(f, &listing).await?;
    let mut runs = Vec::new();
    for (id, run) in &listing.runs {
        let info = &infos[id];
        let triggers = info.run_file.as_ref().map(|(t, _)| t.as_slice());
        let clock = info.clock.as_ref().map(|(c, _)| c);
        let mut dirs = Vec::new();
        for (rel, d) in &run.dirs {
            if d.lines.is_empty() || !filters.trigger_matches(rel, triggers) {
                continue;
            }
            let keys = d
                .lines
                .iter()
                .map(|&n| (run.key.index_line(rel, n), None))
                .collect();
            let texts = read_all(&f.get_all(keys).await?)?;
            let stored: Vec<&str> = texts.iter().map(String::as_str).collect();
            let c = select::compose(
                &stored,
                |l| filters.keeps(l, clock),
                |file| d.snapshots.contains_key(file),
            );
            if c.kept == 0 {
                continue;
            }
            let keys = c
                .snapshots
                .iter()
                .map(|file| (run.key.snapshot(rel, file), d.snapshots.get(file).copied()))
                .collect();
            let cached = f.get_all(keys).await?;
            let jit = jit(f, &run.key, rel, d, &c.snapshots).await?;
            dirs.push(MirrorDir {
                rel: rel.clone(),
                lines: c.lines,
                snapshots: c.snapshots.into_iter().zip(cached).collect(),
                jit,
            });
        }
        if dirs.is_empty() {
            continue;
        }
        runs.push(MirrorRun {
            host: run.key.host.clone(),
            run: run.key.run.clone(),
            run_file: info.run_file.as_ref().map(|(_, p)| p.clone()),
            clock: info.clock.as_ref().map(|(_, p)| p.clone()),
            objects: objects(f, prefix, run).await?,
            dirs,
        });
    }
    Ok(runs)
}

/// Each run's `clock.json` and `run.json`, fetched together (or from the
/// cache); one that does not parse counts as absent.
async fn run_infos(
    f: &Fetcher,
    listing: &Listing,
) -> Result<BTreeMap<(String, String), RunInfo>, Failure> {
    let mut keys = Vec::new();
    for run in listing.runs.values() {
        if run.clock {
            keys.push((run.key.clock(), None));
        }
        if run.run_file {
            keys.push((run.key.run_file(), None));
        }
    }
    let mut cached = f.get_all(keys).await?.into_iter();
    let mut infos = BTreeMap::new();
    for (id, run) in &listing.runs {
        let mut next = |listed: bool| listed.then(|| cached.next().expect("one per key"));
        let (clock, run_file) = (next(run.clock), next(run.run_file));
        let read = |p: &PathBuf| fs::read(p).ok();
        let info = RunInfo {
            clock: clock.and_then(|p| {
                let c = serde_json::from_slice::<Clock>(&read(&p)?).ok()?;
                Some((c, p))
            }),
            run_file: run_file.and_then(|p| Some((run_file::parse_triggers(&read(&p)?)?, p))),
        };
        infos.insert(id.clone(), info);
    }
    Ok(infos)
}

/// The run's build-id objects: its `objects/<id>.json`, then each one's
/// `.debug/<id>/elf` (shared by the fleet, so cached once for every run).
async fn objects(
    f: &Fetcher,
    prefix: &str,
    run: &select::ListedRun,
) -> Result<Vec<(ObjectRef, PathBuf)>, Failure> {
    let keys = run
        .objects
        .iter()
        .map(|id| (run.key.object_ref(id), None))
        .collect();
    let refs: Vec<ObjectRef> = f
        .get_all(keys)
        .await?
        .iter()
        .filter_map(|p| ObjectRef::parse(&fs::read(p).ok()?))
        .collect();
    let keys = refs
        .iter()
        .map(|o| (keys::debug_object(prefix, &o.id), None))
        .collect();
    Ok(refs.into_iter().zip(f.get_all(keys).await?).collect())
}

/// What `snapshots` of the directory `rel` kept of `.jit/`: their
/// `jit/<snapshot>.jsonl`, then the chunks of each kept copy up to the
/// longest length they name. None when none of them kept anything.
async fn jit(
    f: &Fetcher,
    run: &RunKey,
    rel: &str,
    d: &ListedDir,
    snapshots: &[String],
) -> Result<Option<MirrorJit>, Failure> {
    let keys: Vec<_> = snapshots
        .iter()
        .filter(|s| d.jit_lines.contains(*s))
        .map(|s| (run.jit_lines(rel, s), None))
        .collect();
    if keys.is_empty() {
        return Ok(None);
    }
    let texts = read_all(&f.get_all(keys).await?)?;
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let plan = select::plan_jit(&texts, &d.jit_chunks);
    let mut files = Vec::new();
    for (file, chunks) in plan.files {
        let keys = chunks
            .iter()
            .map(|&(start, end)| (run.jit_chunk(rel, &file, start, end), Some(end - start)))
            .collect();
        files.push((file, f.get_all(keys).await?));
    }
    Ok(Some(MirrorJit {
        lines: plan.lines,
        files,
    }))
}

/// The text of cached files (index lines, kept JIT lines).
fn read_all(paths: &[PathBuf]) -> Result<Vec<String>, Failure> {
    paths
        .iter()
        .map(|p| {
            fs::read(p)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .map_err(|e| Failure::runtime(format!("cannot read {}: {e}", p.display())))
        })
        .collect()
}
