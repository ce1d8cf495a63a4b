//! The upload thread: a tokio runtime of its own, at a lower priority than
//! the data path, that sends what the run writes (and what earlier runs
//! beside it left unsent) as the store accepts it. The driver never waits
//! on it: the thread only reads the files the run has completed.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use serde::Serialize;
use tokio::sync::watch;

use super::{
    UploadPlan,
    journal::{Clock, Journal},
    keys::RunKey,
    run_state::{RunState, Sent, Sink},
    send::SendError,
    store::{Refusal, Store},
};
use crate::output::events::Printer;

/// How often the run's output is looked at for new index lines.
const POLL: Duration = Duration::from_millis(300);
/// First wait after a refusal; doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest wait between two tries, so that a store back from an outage is
/// used within this long.
const MAX_BACKOFF: Duration = Duration::from_secs(8);

/// What the uploads did: the `upload` object of the end of a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UploadStats {
    pub url: String,
    /// Snapshots the store confirmed.
    pub snapshots: u64,
    /// Objects sent (snapshots, index lines, build-id objects, ...).
    pub objects: u64,
    pub bytes: u64,
    /// Bytes of kept JIT files (`.jit/`) among them.
    pub jit_bytes: u64,
    /// Build-id objects the store already held, not sent.
    pub shared: u64,
    /// Tries that failed and were retried.
    pub retries: u64,
    /// Index lines not confirmed when the uploads stopped.
    pub pending: u64,
    /// Snapshots deleted locally (--max-disk, --keep) before they were sent.
    pub lost: u64,
    /// Snapshots deleted locally once the store confirmed them (--upload-delete).
    pub deleted: u64,
    /// Earlier runs whose unsent moments this agent sent.
    pub resumed_runs: u64,
    /// The last refusal, in words, if the store ever refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_refusal: Option<String>,
    /// The store was refusing when the uploads stopped.
    pub failing: bool,
}

/// Prints the `upload_summary` event, or its line.
pub fn print_summary(printer: &Printer, s: &UploadStats) {
    use crate::output::events::human_bytes;
    let mut text = format!(
        "upload: {} snapshot(s), {} object(s), {} to {}; {} retries; {} pending",
        s.snapshots,
        s.objects,
        human_bytes(s.bytes),
        s.url,
        s.retries,
        s.pending
    );
    if s.shared > 0 {
        text.push_str(&format!(
            "; {} build-id object(s) already in the store",
            s.shared
        ));
    }
    if s.lost > 0 {
        text.push_str(&format!(
            "; {} deleted locally before they were sent",
            s.lost
        ));
    }
    if s.deleted > 0 {
        text.push_str(&format!("; {} deleted locally once sent", s.deleted));
    }
    if s.resumed_runs > 0 {
        text.push_str(&format!("; {} earlier run(s) resumed", s.resumed_runs));
    }
    if s.pending > 0 || s.failing {
        let why = s
            .last_refusal
            .as_deref()
            .unwrap_or("time ran out (--upload-wait)");
        text.push_str(&format!(
            ". Left unsent: {why}; they stay in OUT and the next agent started on the same \
             output root sends them"
        ));
    }
    printer.line("upload_summary", s, &text);
}

/// The `upload` event: a snapshot is in the store.
#[derive(Debug, Serialize)]
struct UploadEvent<'a> {
    file: &'a str,
    key: &'a str,
    bytes: u64,
    uploaded: u64,
    pending: u64,
    retries: u64,
}

/// The running upload thread.
pub struct Uploader {
    stop: watch::Sender<Option<Instant>>,
    thread: JoinHandle<UploadStats>,
}

impl Uploader {
    /// Starts uploading the run writing into `out` (and unsent earlier runs
    /// in `out`'s parent directory).
    pub fn start(
        plan: &UploadPlan,
        store: Store,
        out: &Path,
        printer: Arc<Printer>,
    ) -> std::io::Result<Uploader> {
        let (stop, rx) = watch::channel(None);
        let run = run_name(out);
        let key = RunKey {
            prefix: store.prefix.clone(),
            host: plan.host.clone(),
            run: run.clone(),
        };
        let clock = Clock::now(&plan.host, &run, &store.url);
        let (out, delete, host) = (out.to_path_buf(), plan.delete, plan.host.clone());
        let thread = std::thread::Builder::new()
            .name("mt-agent-upload".into())
            .spawn(move || {
                crate::sys::sched::set_batch();
                crate::sys::sched::lower_priority(10);
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                let mut u = Uploading::new(store, printer, host);
                u.runs = u.open_runs(&out, key, clock, delete);
                rt.block_on(u.serve(rx))
            })?;
        Ok(Uploader { stop, thread })
    }

    /// The run has ended: sends what is left for at most `wait`, then
    /// returns the counts.
    pub fn finish(self, wait: Duration) -> UploadStats {
        let _ = self.stop.send(Some(Instant::now() + wait));
        self.thread.join().unwrap_or_default()
    }
}

/// A run's name in the store: its output directory's name.
pub fn run_name(out: &Path) -> String {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if super::keys::plain_segment(&name) {
        name
    } else {
        "run".into()
    }
}

struct Uploading {
    store: Store,
    printer: Arc<Printer>,
    runs: Vec<RunState>,
    stats: UploadStats,
    /// The refusal being reported, so it is said once, not at every retry.
    refused: Option<Refusal>,
    host: String,
}

impl Uploading {
    fn new(store: Store, printer: Arc<Printer>, host: String) -> Self {
        let stats = UploadStats {
            url: store.url.clone(),
            ..Default::default()
        };
        Uploading {
            store,
            printer,
            runs: Vec::new(),
            stats,
            refused: None,
            host,
        }
    }

    /// This run, then the earlier runs beside it that started uploading to
    /// the same store and are not done.
    fn open_runs(&mut self, out: &Path, key: RunKey, clock: Clock, delete: bool) -> Vec<RunState> {
        let mut runs = Vec::new();
        match RunState::open(out, key.clone(), clock, delete, true) {
            Ok(Some(r)) => runs.push(r),
            Ok(None) => self.printer.warning(&format!(
                "upload: another agent uploads {}; not uploading it",
                out.display()
            )),
            Err(e) => self.printer.warning(&format!(
                "upload: cannot keep upload state in {}: {e}",
                out.display()
            )),
        }
        for old in earlier_runs(out) {
            let Some(clock) = Journal::open(&old).clock_if_any() else {
                continue;
            };
            let key = RunKey {
                run: clock.run.clone(),
                host: clock.host.clone(),
                ..key.clone()
            };
            if clock.url.as_deref() != Some(self.store.url.as_str()) {
                continue;
            }
            if let Ok(Some(r)) = RunState::open(&old, key, clock, delete, false) {
                self.stats.resumed_runs += 1;
                self.printer
                    .verbose(&format!("upload: resuming {}", old.display()));
                runs.push(r);
            }
        }
        runs
    }

    async fn serve(mut self, mut stop: watch::Receiver<Option<Instant>>) -> UploadStats {
        let mut backoff = FIRST_BACKOFF;
        let mut contact = false;
        loop {
            let deadline = *stop.borrow_and_update();
            if deadline.is_some() {
                // The recorders have ended: what is deleted now is indexed here.
                self.runs.iter_mut().for_each(RunState::recorders_ended);
            }
            let wait = match self.step(&mut contact).await {
                Ok(()) => {
                    self.recovered();
                    backoff = FIRST_BACKOFF;
                    if deadline.is_some() {
                        break;
                    }
                    POLL
                }
                Err(e) => {
                    self.refusal(&e, backoff);
                    self.stats.retries += 1;
                    let w = backoff;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    w
                }
            };
            let wait = deadline.map_or(wait, |d| {
                wait.min(d.saturating_duration_since(Instant::now()))
            });
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stop.changed() => {}
            }
        }
        self.runs.iter_mut().for_each(RunState::scan);
        self.stats.pending = self.runs.iter().map(RunState::pending).sum();
        for r in &self.runs {
            if r.started() && r.pending() == 0 {
                let _ = r.mark_done();
            }
        }
        self.stats
    }

    /// The store's first answer (a written and deleted check object, so a
    /// missing bucket or a read-only identity is said at once), then rounds.
    async fn step(&mut self, contact: &mut bool) -> Result<(), SendError> {
        if !*contact {
            let said = super::store::preflight(&self.store, &self.host).await;
            let said = said.map_err(SendError::Store)?;
            self.printer.verbose(&format!("upload: {said}"));
            *contact = true;
        }
        self.round().await
    }

    /// One pass over every run; the first refusal ends it.
    async fn round(&mut self) -> Result<(), SendError> {
        let mut runs = std::mem::take(&mut self.runs);
        let mut result = Ok(());
        for r in &mut runs {
            let store = self.store.clone();
            let mut sink = Counting {
                stats: &mut self.stats,
                printer: &self.printer,
                pending: r.pending(),
            };
            if let Err(e) = r.round(&store, &mut sink).await {
                result = Err(e);
                break;
            }
            if !r.live && r.pending() == 0 && r.started() {
                let _ = r.mark_done();
            }
        }
        runs.retain(|r| r.live || !Journal::is_done(&r.out));
        self.runs = runs;
        result
    }

    fn refusal(&mut self, e: &SendError, backoff: Duration) {
        let kind = match e {
            SendError::Store(e) => Refusal::of(e),
            SendError::Local(_) | SendError::Mismatch { .. } => Refusal::Other,
        };
        let what = match e {
            SendError::Store(e) => super::store::short(e),
            other => other.to_string(),
        };
        let text = format!("{} ({what})", kind.advice());
        self.stats.last_refusal = Some(text.clone());
        self.stats.failing = true;
        if !self.refused.is_some_and(|r| r.same_kind(kind)) {
            self.refused = Some(kind);
            let pending: u64 = self.runs.iter().map(RunState::pending).sum();
            self.printer.warning(&format!(
                "upload to {}: {text}; {pending} index line(s) pending, retrying (every {} s at most); capture goes on",
                self.store.url,
                MAX_BACKOFF.as_secs().max(backoff.as_secs())
            ));
        }
    }

    fn recovered(&mut self) {
        self.stats.failing = false;
        if self.refused.take().is_some() {
            self.printer.warning(&format!(
                "upload to {}: the store accepts uploads again",
                self.store.url
            ));
        }
    }
}

/// Directories beside `out` (in its parent) with upload state not done.
fn earlier_runs(out: &Path) -> Vec<PathBuf> {
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| p.file_name() != out.file_name() && Journal::started(p) && !Journal::is_done(p))
        .collect();
    v.sort();
    v
}

/// Counts what a round reports, and prints the `upload` events.
struct Counting<'a> {
    stats: &'a mut UploadStats,
    printer: &'a Printer,
    pending: u64,
}

impl Sink for Counting<'_> {
    fn sent(&mut self, what: Sent, key: &str, file: &str, bytes: u64) {
        match what {
            Sent::Shared => {
                self.stats.shared += 1;
                return;
            }
            Sent::Snapshot => self.stats.snapshots += 1,
            Sent::Jit => self.stats.jit_bytes += bytes,
            Sent::Other => {}
        }
        self.stats.objects += 1;
        self.stats.bytes += bytes;
        if what == Sent::Snapshot {
            let e = UploadEvent {
                file,
                key,
                bytes,
                uploaded: self.stats.snapshots,
                pending: self.pending.saturating_sub(1),
                retries: self.stats.retries,
            };
            self.printer.line(
                "upload",
                &e,
                &format!(
                    "upload: {file} -> {key} ({})",
                    crate::output::events::human_bytes(bytes)
                ),
            );
        }
    }

    fn lost(&mut self, file: &str) {
        self.stats.lost += 1;
        self.printer.warning(&format!(
            "upload: {file} was deleted locally (--max-disk or --keep) before the store took it; its index line is sent without it"
        ));
    }

    fn deleted(&mut self, _file: &str) {
        self.stats.deleted += 1;
    }
}
