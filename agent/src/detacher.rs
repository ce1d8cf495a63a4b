//! Dropping uprobe links off the driver thread.
//!
//! Closing a uprobe's perf event unregisters it, and the kernel then waits
//! for the uprobe SRCU and RCU-tasks-trace grace periods
//! (`uprobe_unregister_sync()` in kernel/events/uprobes.c) before the close
//! returns: milliseconds, against microseconds for the rest of a hit's
//! path. The driver takes a disarmed trigger's links out of the programs
//! ([`crate::probe::Probes::take_trigger_links`]) and hands them to this
//! thread, which drops them and times each batch.

use std::{
    sync::{Arc, Mutex, mpsc},
    thread::JoinHandle,
    time::Instant,
};

use aya::programs::uprobe::UProbeLink;

/// The thread and its measurements.
pub struct Detacher {
    tx: Option<mpsc::Sender<Vec<UProbeLink>>>,
    thread: Option<JoinHandle<()>>,
    /// Time to drop each link, ns.
    per_link_ns: Arc<Mutex<Vec<u64>>>,
}

impl Detacher {
    /// Starts the thread.
    pub fn spawn() -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Vec<UProbeLink>>();
        let per_link_ns = Arc::new(Mutex::new(Vec::new()));
        let times = per_link_ns.clone();
        let thread = std::thread::Builder::new()
            .name("mt-detach".into())
            .spawn(move || {
                for links in rx {
                    for link in links {
                        let t = Instant::now();
                        drop(link);
                        let ns = t.elapsed().as_nanos() as u64;
                        if let Ok(mut v) = times.lock() {
                            v.push(ns);
                        }
                    }
                }
            })?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            per_link_ns,
        })
    }

    /// Hands links over to be dropped; never blocks.
    pub fn detach(&self, links: Vec<UProbeLink>) {
        if links.is_empty() {
            return;
        }
        if let Some(tx) = &self.tx
            && let Err(mpsc::SendError(links)) = tx.send(links)
        {
            // The thread is gone: detach here rather than leave them.
            drop(links);
        }
    }

    /// Time to detach each link so far, ns.
    pub fn per_link_ns(&self) -> Vec<u64> {
        self.per_link_ns
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    /// Waits until every link handed over is detached.
    pub fn finish(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Detacher {
    fn drop(&mut self) {
        self.finish();
    }
}
