//! Durable sessions: every change to a session that a client was told of is logged, and a
//! push, a creation, a flash registration or removal and a deletion are acknowledged only once
//! their record is on disk (fsync). One writer thread owns the log (the actors send it
//! records, in the order they apply them) and commits in groups: every record that arrived
//! while the previous fsync ran goes into the next one, so concurrent pushes share an fsync.
//!
//! The thread also keeps the journal's model of every session current (`model.rs`), so a
//! snapshot and an export are that model, and a restart rebuilds it through the same fold.
//! With `--no-persist` the thread keeps the model and writes nothing (exports still work).

pub mod frame;
pub mod kv_disk;
pub mod model;
pub mod store;
#[cfg(test)]
mod tests;

use crate::error::ApiError;
use axum::http::StatusCode;
use model::{DurableSession, Model, Op, Record};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use store::Store;
use tokio::sync::oneshot;

/// Default size past which a log segment is closed by a snapshot.
pub const SEGMENT_LIMIT: u64 = 64 << 20;
/// Event ids a session may use before it logs a new reservation (`Op::Events`).
pub const EVENT_RESERVE: u64 = 1024;

/// The journal's counters (`/metrics`).
#[derive(Debug, Default)]
pub struct JournalStats {
    pub records: AtomicU64,
    pub syncs: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
}

impl JournalStats {
    /// The journal's Prometheus series (records per sync shows the group commit at work).
    pub fn render(&self, out: &mut String, persistent: bool) {
        use std::fmt::Write;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (name, help, v) in [
            (
                "vigil_state_log_records_total",
                "Session records logged to the journal.",
                l(&self.records),
            ),
            (
                "vigil_state_log_syncs_total",
                "Journal writes made durable (one fsync each, shared by every record that waited).",
                l(&self.syncs),
            ),
            (
                "vigil_state_log_bytes_total",
                "Bytes written to the journal's log.",
                l(&self.bytes),
            ),
            (
                "vigil_state_log_failed_acks_total",
                "Acknowledgements refused because the journal could not write.",
                l(&self.errors),
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP vigil_state_persistent 1 when sessions are journaled to disk (--state-dir).\n# TYPE vigil_state_persistent gauge\nvigil_state_persistent {}",
            u8::from(persistent)
        );
    }
}

enum Msg {
    Log {
        rec: Record,
        done: Option<oneshot::Sender<Result<(), String>>>,
    },
    Export {
        id: String,
        reply: oneshot::Sender<Option<DurableSession>>,
    },
}

/// The handle actors and routes hold: sends records to the writer thread.
#[derive(Clone)]
pub struct Journal {
    tx: mpsc::Sender<Msg>,
    pub persistent: bool,
    pub stats: Arc<JournalStats>,
}

/// A record's acknowledgement: resolves once it is on disk.
pub struct Durable(Option<oneshot::Receiver<Result<(), String>>>);

impl Durable {
    /// Nothing to wait for.
    pub fn done() -> Durable {
        Durable(None)
    }

    /// Wait until the record is durable; a failed write is a 503 naming the cause.
    pub async fn wait(self) -> Result<(), ApiError> {
        let Some(rx) = self.0 else {
            return Ok(());
        };
        let failed = |why: String| {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                format!("the change could not be made durable ({why}); it was not acknowledged"),
            );
            e.retry_after = Some(1);
            e
        };
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(why)) => Err(failed(why)),
            Err(_) => Err(failed("the journal stopped".into())),
        }
    }
}

impl Journal {
    /// Start the writer thread over `store` (none: keep the model only) holding `model`.
    pub fn start(store: Option<Store>, model: Model) -> std::io::Result<Journal> {
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(JournalStats::default());
        let persistent = store.is_some();
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name("vigil-journal".into())
            .spawn(move || run(rx, store, model, &thread_stats))?;
        Ok(Journal {
            tx,
            persistent,
            stats,
        })
    }

    /// A journal that writes nothing (`--no-persist`, and tests).
    pub fn in_memory() -> Journal {
        Self::start(None, Model::default()).expect("the journal thread starts")
    }

    /// Log `op` on session `id` (durable soon, no acknowledgement awaited).
    pub fn log(&self, id: &str, op: Op) {
        let rec = Record {
            session: id.to_string(),
            op,
        };
        let _ = self.tx.send(Msg::Log { rec, done: None });
    }

    /// Log `op` on session `id`; the returned `Durable` resolves once it is on disk.
    pub fn log_durable(&self, id: &str, op: Op) -> Durable {
        if !self.persistent {
            self.log(id, op);
            return Durable(None);
        }
        let (done, rx) = oneshot::channel();
        let rec = Record {
            session: id.to_string(),
            op,
        };
        let _ = self.tx.send(Msg::Log {
            rec,
            done: Some(done),
        });
        Durable(Some(rx))
    }

    /// The session as every record logged before this call left it.
    pub async fn export(&self, id: &str) -> Option<DurableSession> {
        let (reply, rx) = oneshot::channel();
        let _ = self.tx.send(Msg::Export {
            id: id.to_string(),
            reply,
        });
        rx.await.ok().flatten()
    }
}

/// Longest a record that no acknowledgement waits for (a batch landed, a turn, a flash answer)
/// stays written but not yet synced.
pub const LAZY_SYNC: Duration = Duration::from_millis(50);

/// The writer thread: take every message waiting, apply and frame its records, write them, and
/// sync once if an acknowledgement waits (group commit), else within `LAZY_SYNC`.
fn run(rx: mpsc::Receiver<Msg>, store: Option<Store>, mut model: Model, stats: &JournalStats) {
    let mut log = Log {
        store,
        broken: None,
        unsynced: false,
        stats,
    };
    let mut buf = Vec::new();
    let mut acks = Vec::new();
    loop {
        let first = if log.unsynced {
            match rx.recv_timeout(LAZY_SYNC) {
                Ok(m) => m,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = log.sync();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = log.sync();
                    return;
                }
            }
        } else {
            match rx.recv() {
                Ok(m) => m,
                Err(_) => return,
            }
        };
        buf.clear();
        let mut next = Some(first);
        let mut records = 0u64;
        while let Some(msg) = next {
            match msg {
                Msg::Log { rec, done } => {
                    if log.store.is_some() {
                        match serde_json::to_vec(&rec) {
                            Ok(bytes) => frame::frame(&bytes, &mut buf),
                            Err(e) => tracing::error!("journal: a record did not serialize: {e}"),
                        }
                    }
                    model.apply(rec);
                    records += 1;
                    acks.extend(done);
                }
                Msg::Export { id, reply } => {
                    let _ = reply.send(model.sessions.get(&id).cloned());
                }
            }
            // Bounded, so one burst cannot hold its first acknowledgements for long.
            next = if records < 4096 {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        stats.records.fetch_add(records, Ordering::Relaxed);
        let result = log.write(&buf, !acks.is_empty());
        if result.is_err() {
            stats.errors.fetch_add(acks.len() as u64, Ordering::Relaxed);
        }
        for done in acks.drain(..) {
            let _ = done.send(result.clone());
        }
        log.maybe_rotate(&model);
    }
}

/// The writer thread's side of the store: what is written, what is synced, and whether a
/// write failed (then nothing more is appended after it: what was written may be partial).
struct Log<'a> {
    store: Option<Store>,
    broken: Option<String>,
    unsynced: bool,
    stats: &'a JournalStats,
}

impl Log<'_> {
    fn fail(&mut self, e: impl std::fmt::Display) -> String {
        let dir = (self.store.as_ref()).map_or_else(String::new, |s| s.dir().display().to_string());
        let why = format!("writing {dir}: {e}");
        tracing::error!("journal: {why}; later changes are not acknowledged");
        self.broken = Some(why.clone());
        why
    }

    /// Append `framed`; sync now if `durable_now`.
    fn write(&mut self, framed: &[u8], durable_now: bool) -> Result<(), String> {
        if let Some(why) = &self.broken {
            return Err(why.clone());
        }
        let Some(s) = self.store.as_mut() else {
            return Ok(());
        };
        if !framed.is_empty() {
            if let Err(e) = s.append(framed) {
                return Err(self.fail(e));
            }
            self.stats
                .bytes
                .fetch_add(framed.len() as u64, Ordering::Relaxed);
            self.unsynced = true;
        }
        if durable_now {
            self.sync()?;
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<(), String> {
        if let Some(why) = &self.broken {
            return Err(why.clone());
        }
        let (Some(s), true) = (self.store.as_mut(), self.unsynced) else {
            return Ok(());
        };
        let r = s.sync();
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        self.unsynced = false;
        r.map_err(|e| self.fail(e))
    }

    /// Close the segment with a snapshot once it is past its size (synced first).
    fn maybe_rotate(&mut self, model: &Model) {
        if !self.store.as_ref().is_some_and(Store::should_rotate) || self.sync().is_err() {
            return;
        }
        if let Some(Err(e)) = self.store.as_mut().map(|s| s.rotate(model)) {
            self.fail(format!("closing a log segment: {e}"));
        }
    }
}
