//! A session's actor: the one task that owns the session's state (TGI's router pattern).
//! Routes send it commands through the handle (`handle.rs`) and await replies; its engine
//! work (an ingest batch, a flash round, a warm prefill) runs in tasks it spawns, which report
//! back on its job channel, and the state changes only when the actor applies that report. So
//! every commit of the durable context happens here, in one place, in order.
//!
//! Writes to the durable context are serialized by `writer`: one ingest batch, warm prefill
//! or client turn at a time, each starting from the context the previous one left. A flash
//! round runs beside them on a fork of the KV. After a batch lands, the next one waits for
//! the flash round at the new version (bounded: `FLASH_ROUND_WAIT`, and `FLASH_QUEUE_WAIT`
//! from the oldest queued entry's push), so answers lag at most one version.

use super::engine_work::SessionDeps;
use super::events::EventBus;
use super::flash::RoundResult;
use super::ingest::Batch;
use super::journal::model::Op;
use super::journal::{Durable, EVENT_RESERVE};
use super::queued_cost;
use super::state::{Identity, Layout, SessionSettings, SessionState};
use super::turn::{WarmRequest, WarmResult};
use crate::error::ApiError;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

type Reply<T> = oneshot::Sender<T>;

/// What the handle asks of the actor.
pub enum Command {
    Touch,
    /// `kv`: the pin's KV tokens, read by the caller (the actor never waits on the engine).
    Describe {
        touch: bool,
        kv: usize,
        reply: Reply<Value>,
    },
    Data {
        reply: Reply<Value>,
    },
    /// Replies with the ack and its record's durability (the route awaits both).
    Push {
        entries: Vec<super::state::Entry>,
        reply: Reply<Result<(Value, Durable), ApiError>>,
    },
    AddFlash {
        spec: super::flash::FlashSpec,
        reply: Reply<Result<(Value, Durable), ApiError>>,
    },
    ListFlash {
        reply: Reply<Value>,
    },
    DeleteFlash {
        id: u64,
        reply: Reply<Result<(Value, Durable), ApiError>>,
    },
    Ready {
        reply: Reply<(Option<(u32, f32)>, u64)>,
    },
    Context {
        reply: Reply<Context>,
    },
    StreamOpening {
        reply: Reply<(Value, Vec<Value>)>,
    },
    /// A request or stream started (`delta` 1) or ended (-1).
    Hold {
        what: super::handle::Held,
        delta: isize,
    },
    BeginTurn {
        id: u64,
        reply: Reply<Result<(), ApiError>>,
    },
    EndTurn {
        id: u64,
        history: Option<Vec<u32>>,
    },
    /// `kv`: the pin's KV tokens, read by the caller (as for `Describe`).
    Warm {
        prompt: Vec<u32>,
        kv: usize,
        reply: Reply<Result<Value, ApiError>>,
    },
    Delete {
        reply: Reply<Result<(), ApiError>>,
    },
    ExpireIfIdle {
        ttl: Duration,
        reply: Reply<bool>,
    },
    Shutdown,
}

/// The durable context a question runs against.
pub struct Context {
    pub mirror: Vec<u32>,
    pub data_version: u64,
    pub layout: Layout,
}

/// What engine work reports back.
pub enum JobResult {
    Batch(Batch, Result<Option<super::engine_work::JobDone>, ApiError>),
    FlashRound(RoundResult),
    Warm(WarmResult),
    Offloaded(super::offload::Offloaded),
    Restored(super::offload::Restored),
}

/// Who is rewriting the durable context.
pub enum Writer {
    Idle,
    Ingest,
    /// A warm prefill; sending `true` cancels it (it keeps what it computed).
    Warm(watch::Sender<bool>),
    /// A client turn, by ticket id.
    Turn(u64),
    /// A restored session's KV is being read back from disk (`offload.rs`).
    Restore,
}

/// Longest the next batch waits for the flash queries to answer the newest version.
pub const FLASH_ROUND_WAIT: Duration = Duration::from_secs(2);
/// Longest an entry, counted from its push, waits in the queue on flash queries.
pub const FLASH_QUEUE_WAIT: Duration = Duration::from_secs(1);
/// Longest a deletion waits for engine work in flight to let go before dropping the KV.
const DELETE_WAIT: Duration = Duration::from_secs(2);

/// What the actor tells the handles without a message: the data's progress and the flash
/// rounds, the session is gone, the flash answers.
pub struct Signals {
    pub progress: watch::Sender<Progress>,
    pub gone: watch::Sender<bool>,
    pub flash_view: watch::Sender<Arc<super::flash::FlashView>>,
}

/// What a request waiting on the session watches (a push waiting for its entries, a
/// generate waiting for a version or a fresher flash answer). Published after the flash
/// view, so a waiter woken by a change reads a view at least as new.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    pub data_version: u64,
    pub total_ingested: u64,
    pub total_dropped: u64,
    /// Entries queued, not yet in a batch.
    pub pending: usize,
    /// Entries are queued or a batch is in flight: the version will move on.
    pub ingesting: bool,
    /// Flash rounds ended so far.
    pub rounds: u64,
}

struct Deleting {
    reply: Option<Reply<Result<(), ApiError>>>,
    expired: Option<Reply<bool>>,
    deadline: Instant,
    /// The session is deleted (not shut down with the server): the journal forgets it.
    forget: bool,
}

pub struct SessionActor {
    pub head: Identity,
    pub settings: Arc<SessionSettings>,
    pub deps: SessionDeps,
    pub st: SessionState,
    pub events: Arc<EventBus>,
    pub progress: watch::Sender<Progress>,
    /// Flash rounds ended so far (published in `progress`).
    pub rounds_done: u64,
    pub gone: watch::Sender<bool>,
    pub flash_view: watch::Sender<Arc<super::flash::FlashView>>,
    /// Bumped when the flash queries or their answers change; with the data version, what
    /// the published view was built from.
    pub flash_epoch: u64,
    pub published_flash: Option<(u64, u64)>,
    commands: mpsc::UnboundedReceiver<Command>,
    commands_closed: bool,
    pub jobs_tx: mpsc::UnboundedSender<JobResult>,
    jobs: mpsc::UnboundedReceiver<JobResult>,
    pub writer: Writer,
    pub flash_running: bool,
    /// A turn waiting for the writer: its id and its grant.
    pub turn_waiting: Option<(u64, Reply<Result<(), ApiError>>)>,
    pub warm_waiting: Option<WarmRequest>,
    /// The next batch waits for the flash round until then (see the module doc).
    pub hold: Option<Instant>,
    deleting: Option<Deleting>,
    /// Restored or imported: its KV is being recomputed from the mirror, and flash rounds
    /// wait for that.
    pub rebuilding: bool,
    /// The reply of the rebuild's warm, which no client awaits.
    pub rebuild_reply: Option<oneshot::Receiver<Result<Value, ApiError>>>,
    /// Event ids the journal has reserved for this session (`Op::Events`).
    events_reserved: u64,
    /// Since when the KV changed without being offloaded (`offload.rs`).
    pub kv_dirty: Option<Instant>,
    pub offloading: bool,
    /// Which tokens the KV file on disk holds (a hash), to skip rewriting it unchanged.
    pub offloaded_hash: Option<u64>,
}

impl SessionActor {
    pub fn new(
        head: Identity,
        settings: Arc<SessionSettings>,
        deps: SessionDeps,
        events: Arc<EventBus>,
        commands: mpsc::UnboundedReceiver<Command>,
        signals: Signals,
    ) -> Self {
        let Signals {
            progress,
            gone,
            flash_view,
        } = signals;
        let (jobs_tx, jobs) = mpsc::unbounded_channel();
        SessionActor {
            st: SessionState::new(settings.opening.clone()),
            head,
            settings,
            deps,
            events,
            progress,
            rounds_done: 0,
            gone,
            flash_view,
            flash_epoch: 0,
            published_flash: None,
            commands,
            commands_closed: false,
            jobs_tx,
            jobs,
            writer: Writer::Idle,
            flash_running: false,
            turn_waiting: None,
            warm_waiting: None,
            hold: None,
            deleting: None,
            rebuilding: false,
            rebuild_reply: None,
            events_reserved: 0,
            kv_dirty: None,
            offloading: false,
            offloaded_hash: None,
        }
    }

    /// Recompute the KV of a restored session from its mirror before anything else: a data
    /// layout re-ingests the opening and the retained entries (with whatever is pending), a
    /// closed turn is warmed again.
    pub fn rebuild(&mut self) {
        self.rebuilding = true;
        self.start_restore();
        // An ingest batch would open a user turn after a closed one: a closed turn is warmed.
        self.st.opening_due = self.st.layout == Layout::Data;
        match self.st.layout {
            Layout::Data => {}
            Layout::Chat => {
                // Held until the warm ends: a warm whose reply is dropped counts as abandoned.
                let (reply, held) = oneshot::channel();
                self.rebuild_reply = Some(held);
                self.warm_waiting = Some(WarmRequest {
                    prompt: self.st.base.clone(),
                    kv: 0,
                    reply,
                });
            }
        }
    }

    /// Log a new reservation of event ids before the session can use them all.
    fn reserve_events(&mut self) {
        let next = self.events.next_id();
        if next + EVENT_RESERVE / 2 > self.events_reserved {
            self.events_reserved = next + EVENT_RESERVE;
            let reserved = self.events_reserved;
            self.deps
                .journal
                .log(&self.head.id, Op::Events { reserved });
        }
    }

    pub async fn run(mut self) {
        loop {
            self.schedule();
            self.publish_flash();
            self.publish_progress();
            if self.deleting.is_none() {
                self.reserve_events();
                self.maybe_offload();
            }
            if self.deletion_done() {
                self.finish_delete();
                return;
            }
            let wake = self.wake_at();
            tokio::select! {
                cmd = self.commands.recv(), if !self.commands_closed => match cmd {
                    Some(cmd) => self.command(cmd),
                    // Every handle is gone: release the session as a deletion would (the
                    // journal keeps it: only a delete or an expiry forgets a session).
                    None => {
                        self.commands_closed = true;
                        if self.deleting.is_none() {
                            self.begin_delete(None, None, None);
                        }
                    }
                },
                Some(done) = self.jobs.recv() => self.job_done(done),
                () = sleep_until(wake) => {}
            }
        }
    }

    fn command(&mut self, cmd: Command) {
        // A session being deleted answers nothing: dropped replies read as "not found".
        if self.deleting.is_some() {
            return;
        }
        match cmd {
            Command::Touch => self.st.touch(),
            Command::Describe { touch, kv, reply } => {
                let last = self.st.last_used_unix;
                if touch {
                    self.st.touch();
                }
                let _ = reply.send(self.st.to_json(&self.head, &self.settings, kv, last));
            }
            Command::Data { reply } => {
                let _ = reply.send(self.st.data_json());
            }
            Command::Push { entries, reply } => {
                let _ = reply.send(self.push(entries));
            }
            // The view is published before the reply, so a generate the client sends after
            // the reply finds the query there.
            Command::AddFlash { spec, reply } => {
                let r = self.add_flash(spec);
                self.publish_flash();
                let _ = reply.send(r);
            }
            Command::ListFlash { reply } => {
                let _ = reply.send(self.list_flash());
            }
            Command::DeleteFlash { id, reply } => {
                let r = self.delete_flash(id);
                self.publish_flash();
                let _ = reply.send(r);
            }
            Command::Ready { reply } => {
                let _ = reply.send((self.st.ready, self.st.data_version));
            }
            Command::Context { reply } => {
                let _ = reply.send(Context {
                    mirror: self.st.mirror(),
                    data_version: self.st.data_version,
                    layout: self.st.layout,
                });
            }
            Command::StreamOpening { reply } => {
                let connected = json!({
                    "session_id": self.head.id,
                    "data_version": self.st.data_version,
                    "flash_queries": self.st.flash.len(),
                });
                let replay = self
                    .st
                    .flash
                    .iter()
                    .filter_map(|q| q.ready_event())
                    .collect();
                let _ = reply.send((connected, replay));
            }
            Command::Hold { what, delta } => {
                let count = match what {
                    super::handle::Held::Foreground => &mut self.st.foreground,
                    super::handle::Held::Subscriber => &mut self.st.subscribers,
                };
                *count = count.saturating_add_signed(delta);
                self.st.touch();
            }
            Command::BeginTurn { id, reply } => self.begin_turn(id, reply),
            Command::EndTurn { id, history } => self.end_turn(id, history),
            Command::Warm { prompt, kv, reply } => self.queue_warm(prompt, kv, reply),
            Command::Delete { reply } => {
                if self.st.busy() {
                    let _ = reply.send(Err(super::conflict(format!(
                        "session `{}` is busy: a request on it is in flight; retry when it ends",
                        self.head.id
                    ))));
                    return;
                }
                self.begin_delete(Some(reply), None, Some("deleted"));
            }
            Command::ExpireIfIdle { ttl, reply } => {
                let idle = !self.st.busy()
                    && self.st.pending.is_empty()
                    && self.st.subscribers == 0
                    && self.st.last_used.elapsed() >= ttl;
                if idle {
                    self.begin_delete(None, Some(reply), Some("deleted"));
                } else {
                    let _ = reply.send(false);
                }
            }
            Command::Shutdown => self.begin_delete(None, None, Some("shutdown")),
        }
    }

    fn job_done(&mut self, done: JobResult) {
        match done {
            JobResult::Batch(batch, result) => self.batch_landed(batch, result),
            JobResult::FlashRound(r) => self.round_done(r),
            JobResult::Warm(w) => self.warm_done(w),
            JobResult::Offloaded(r) => self.offload_done(r),
            JobResult::Restored(r) => self.restore_done(r),
        }
    }

    /// Start whatever work is due: a waiting turn or warm gets the idle writer before the
    /// next ingest batch; a flash round starts whenever none runs and a query is behind.
    fn schedule(&mut self) {
        if self.deleting.is_some() {
            return;
        }
        if matches!(self.writer, Writer::Idle) {
            if let Some((id, grant)) = self.turn_waiting.take() {
                if grant.send(Ok(())).is_ok() {
                    self.writer = Writer::Turn(id);
                } else {
                    self.st.turn_active = false; // Its client left before the grant.
                }
            }
        }
        if matches!(self.writer, Writer::Idle) {
            if let Some(w) = self.warm_waiting.take() {
                self.start_warm(w);
            }
        }
        if matches!(self.writer, Writer::Idle) && self.ingest_due() && !self.held() {
            self.start_batch();
        }
        if !self.flash_running {
            self.start_round();
        }
    }

    /// Tell waiters how far the data and the flash rounds are, if that changed.
    fn publish_progress(&mut self) {
        let now = Progress {
            data_version: self.st.data_version,
            total_ingested: self.st.total_ingested,
            total_dropped: self.st.total_dropped,
            pending: self.st.pending.len(),
            ingesting: !self.st.pending.is_empty() || matches!(self.writer, Writer::Ingest),
            rounds: self.rounds_done,
        };
        self.progress.send_if_modified(|p| {
            let changed = *p != now;
            *p = now;
            changed
        });
    }

    /// Until when the next batch waits for the flash round: the hold, cut short so the oldest
    /// queued entry waits at most `FLASH_QUEUE_WAIT` from its push.
    fn hold_until(&self) -> Option<Instant> {
        let until = self.hold?;
        let oldest = self.st.pending.front().map(|e| Instant::from_std(e.queued));
        Some(oldest.map_or(until, |q| until.min(q + FLASH_QUEUE_WAIT)))
    }

    /// Whether the next batch still waits for the flash round at the current version.
    fn held(&mut self) -> bool {
        let Some(until) = self.hold_until() else {
            return false;
        };
        let v = self.st.data_version;
        if Instant::now() >= until || !self.st.flash.iter().any(|q| q.due_at(v)) {
            self.hold = None;
            return false;
        }
        true
    }

    /// When the loop must wake without a message: the flash hold, the deletion deadline, or a
    /// KV offload falling due.
    fn wake_at(&self) -> Option<Instant> {
        let hold = self.hold_until();
        let deadline = self.deleting.as_ref().map(|d| d.deadline);
        [hold, deadline, self.offload_at()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Publish `event` (`deleted` or `shutdown`) as the streams' last, end every stream and
    /// every job, give back the queue budget, then wait for the engine work to let go.
    fn begin_delete(
        &mut self,
        reply: Option<Reply<Result<(), ApiError>>>,
        expired: Option<Reply<bool>>,
        event: Option<&'static str>,
    ) {
        match event {
            Some("shutdown") => self.events.publish(
                "shutdown",
                json!({"message": "the server is shutting down; reconnect to a running server"}),
            ),
            Some(kind) => self
                .events
                .publish(kind, json!({"session_id": self.head.id})),
            None => {}
        }
        self.gone.send_replace(true);
        let queued: usize = self.st.pending.iter().map(queued_cost).sum();
        self.st.pending.clear();
        self.st.pending_bytes = 0;
        self.deps.budget.release(queued);
        if let Writer::Warm(cancel) = &self.writer {
            let _ = cancel.send(true);
        }
        if let Some(w) = self.warm_waiting.take() {
            w.cancelled(&self.st, &self.head);
        }
        self.turn_waiting = None;
        self.deleting = Some(Deleting {
            reply,
            expired,
            deadline: Instant::now() + DELETE_WAIT,
            forget: event == Some("deleted"),
        });
    }

    fn deletion_done(&self) -> bool {
        let Some(d) = &self.deleting else {
            return false;
        };
        let writing = matches!(
            self.writer,
            Writer::Ingest | Writer::Warm(_) | Writer::Restore
        );
        !(writing || self.flash_running || self.offloading) || Instant::now() >= d.deadline
    }

    fn finish_delete(&mut self) {
        let _ = self.deps.engine.drop_pin(self.head.pin);
        if let Some(d) = self.deleting.take() {
            if d.forget {
                self.deps.journal.log(&self.head.id, Op::Delete);
                if let Some(disk) = self.deps.kv_disk.clone() {
                    let id = self.head.id.clone();
                    tokio::task::spawn_blocking(move || disk.remove(&id));
                }
            }
            if let Some(r) = d.reply {
                let _ = r.send(Ok(()));
            }
            if let Some(r) = d.expired {
                let _ = r.send(true);
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
