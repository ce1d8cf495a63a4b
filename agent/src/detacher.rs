//! Dropping uprobe links off the driver thread.
//!
//! Closing a uprobe's perf event unregisters it, and the kernel then waits
//! for the uprobe SRCU and RCU-tasks-trace grace periods
//! (`uprobe_unregister_sync()` in kernel/events/uprobes.c) before the close
//! returns: milliseconds, against microseconds for the rest of a hit's
//! path. The driver takes a disarmed trigger's links out of the programs
//! ([`crate::probe::Probes::take_trigger_links`]) and hands them to this
//! thread, which drops them and times each one.
//!
//! The uprobe perf event is closed under the kernel's `event_mutex`
//! (`perf_uprobe_destroy()` in kernel/trace/trace_event_perf.c), and opening
//! one takes the same mutex: an attach made while a detach waits for its
//! grace periods waits too. So the driver attaches only while no detach is
//! in flight ([`Detacher::idle`]); the thread wakes the driver when it is
//! done.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::Instant,
};

use aya::programs::uprobe::UProbeLink;
use nix::sys::eventfd::EventFd;

/// The thread and its measurements.
pub struct Detacher {
    tx: Option<mpsc::Sender<Vec<UProbeLink>>>,
    thread: Option<JoinHandle<()>>,
    /// Time to drop each link, ns.
    per_link_ns: Arc<Mutex<Vec<u64>>>,
    /// Batches handed over and not yet dropped.
    in_flight: Arc<AtomicUsize>,
}

impl Detacher {
    /// Starts the thread; it writes `wake` after each batch.
    pub fn spawn(wake: Arc<EventFd>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<Vec<UProbeLink>>();
        let per_link_ns = Arc::new(Mutex::new(Vec::new()));
        let times = per_link_ns.clone();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let pending = in_flight.clone();
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
                    pending.fetch_sub(1, Ordering::AcqRel);
                    let _ = wake.write(1);
                }
            })?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            per_link_ns,
            in_flight,
        })
    }

    /// Hands links over to be dropped; never blocks.
    pub fn detach(&self, links: Vec<UProbeLink>) {
        if links.is_empty() {
            return;
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        if let Some(tx) = &self.tx
            && let Err(mpsc::SendError(links)) = tx.send(links)
        {
            // The thread is gone: detach here rather than leave them.
            drop(links);
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether every link handed over is detached.
    pub fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
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
