//! A session's handle: what routes hold. It names the session and sends its actor commands
//! (`actor.rs`), awaiting the reply; it never touches the session's state. Guards that count
//! a request or a stream on the session tell the actor when they drop, so a client that goes
//! away releases what it held.

use super::actor::{Command, Context, Progress, SessionActor, Signals};
use super::engine_work::SessionDeps;
use super::events::EventBus;
use super::flash::{FlashSpec, Lookup};
use super::state::{Entry, Identity, SessionSettings, SessionState};
use crate::error::ApiError;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};

pub struct Session {
    pub id: String,
    pub pin: vigil_engine::pins::PinKey,
    pub created_ms: u128,
    pub settings: Arc<SessionSettings>,
    pub events: Arc<EventBus>,
    commands: mpsc::UnboundedSender<Command>,
    /// Read for `kv_tokens` here, not in the actor: the engine's pin map is behind a mutex
    /// the engine thread (at compute priority) holds while it publishes, and the actor must
    /// never wait on it (a flash hit queued behind it would).
    engine: vigil_engine::engine_thread::EngineHandle,
    /// The flash queries and answers the actor last published.
    flash_view: watch::Receiver<Arc<super::flash::FlashView>>,
    /// The data's progress and the flash rounds (what waiting requests watch).
    progress: watch::Receiver<Progress>,
    /// Set once the session is deleted (or the server shuts down).
    gone: watch::Receiver<bool>,
    next_turn: AtomicU64,
}

impl Session {
    /// Start the session's actor and return its handle.
    pub fn spawn(head: Identity, settings: SessionSettings, deps: SessionDeps) -> Session {
        let st = SessionState::new(settings.opening.clone());
        Self::spawn_with(head, settings, deps, st, EventBus::new(), false)
    }

    /// Start an actor over `st` (a restored or imported session: `rebuild` recomputes its KV
    /// from the mirror before anything else runs on it).
    pub fn spawn_with(
        head: Identity,
        settings: SessionSettings,
        deps: SessionDeps,
        st: SessionState,
        events: EventBus,
        rebuild: bool,
    ) -> Session {
        let (commands, rx) = mpsc::unbounded_channel();
        let (progress_tx, progress) = watch::channel(Progress::default());
        let (gone_tx, gone) = watch::channel(false);
        let (view_tx, flash_view) = watch::channel(Arc::default());
        let settings = Arc::new(settings);
        let events = Arc::new(events);
        let handle = Session {
            id: head.id.clone(),
            pin: head.pin,
            created_ms: head.created_ms,
            settings: settings.clone(),
            events: events.clone(),
            commands,
            engine: deps.engine.clone(),
            flash_view,
            progress,
            gone,
            next_turn: AtomicU64::new(1),
        };
        let mut actor = SessionActor::new(
            head,
            settings,
            deps,
            events,
            rx,
            Signals {
                progress: progress_tx,
                gone: gone_tx,
                flash_view: view_tx,
            },
        );
        actor.st = st;
        if rebuild {
            actor.rebuild();
        }
        tokio::spawn(actor.run());
        handle
    }

    fn gone_error(&self) -> ApiError {
        ApiError::not_found(format!("session `{}` not found", self.id))
    }

    fn send(&self, cmd: Command) {
        let _ = self.commands.send(cmd);
    }

    /// Send the command `make` builds around a reply channel and await the reply; a session
    /// whose actor has ended is not found.
    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, ApiError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(make(tx))
            .map_err(|_| self.gone_error())?;
        rx.await.map_err(|_| self.gone_error())
    }

    pub fn is_deleted(&self) -> bool {
        *self.gone.borrow()
    }

    /// Resolves once the session is deleted.
    pub async fn wait_deleted(&self) {
        let mut rx = self.gone.clone();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// A receiver of the session's progress (data version, settled entries, flash rounds).
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.progress.clone()
    }

    /// Wait until `done` holds of the progress, the session is deleted, or `timeout` passes;
    /// the progress then (`None`: the session was deleted).
    pub async fn wait_progress(
        &self,
        timeout: Duration,
        done: impl FnMut(&Progress) -> bool,
    ) -> Option<Progress> {
        let mut rx = self.progress.clone();
        let until = tokio::time::Instant::now() + timeout;
        tokio::select! {
            r = tokio::time::timeout_at(until, rx.wait_for(done)) => match r {
                Ok(Ok(p)) => Some(*p),
                // Timed out (or the actor ended: then `gone` is set too).
                _ => (!self.is_deleted()).then(|| *self.progress.borrow()),
            },
            () = self.wait_deleted() => None,
        }
    }

    /// Restart the idle clock.
    pub fn touch(&self) {
        self.send(Command::Touch);
    }

    /// The session object; `touch` restarts the idle clock (`last_used` is the value before).
    pub async fn describe(&self, touch: bool) -> Result<Value, ApiError> {
        let kv = self.engine.pin_kv_tokens(self.pin);
        self.call(|reply| Command::Describe { touch, kv, reply })
            .await
    }

    pub async fn data(&self) -> Result<Value, ApiError> {
        self.call(|reply| Command::Data { reply }).await
    }

    /// Queue entries; the ack, once the push is durable.
    pub async fn push(&self, entries: Vec<Entry>) -> Result<Value, ApiError> {
        let (ack, durable) = self
            .call(|reply| Command::Push { entries, reply })
            .await??;
        durable.wait().await?;
        Ok(ack)
    }

    pub async fn add_flash(&self, spec: FlashSpec) -> Result<Value, ApiError> {
        let (v, durable) = self
            .call(|reply| Command::AddFlash { spec, reply })
            .await??;
        durable.wait().await?;
        Ok(v)
    }

    pub async fn list_flash(&self) -> Result<Value, ApiError> {
        self.call(|reply| Command::ListFlash { reply }).await
    }

    pub async fn delete_flash(&self, id: u64) -> Result<Value, ApiError> {
        let (v, durable) = (self.call(|reply| Command::DeleteFlash { id, reply })).await??;
        durable.wait().await?;
        Ok(v)
    }

    /// A registered flash query's text, from the published view.
    pub fn flash_query(&self, id: u64) -> Option<String> {
        self.flash_view.borrow().query(id)
    }

    /// The flash query named by id (or else by its text), and its cached answer, from the
    /// view the actor published (no message: a hit never waits for the actor).
    pub fn flash_lookup(&self, id: Option<u64>, query: &str) -> Lookup {
        self.flash_view.borrow().lookup(id, query)
    }

    /// With `pre_decode`: the ready position's choice and the data version.
    pub async fn ready(&self) -> Result<(Option<(u32, f32)>, u64), ApiError> {
        self.call(|reply| Command::Ready { reply }).await
    }

    /// The durable context a question runs against.
    pub async fn context(&self) -> Result<Context, ApiError> {
        self.call(|reply| Command::Context { reply }).await
    }

    /// `connected` and a `flash_ready` for every cached answer, for a new stream.
    pub async fn stream_opening(&self) -> Result<(Value, Vec<Value>), ApiError> {
        self.call(|reply| Command::StreamOpening { reply }).await
    }

    /// Claim the session for a turn (409 when one is in flight). The ticket ends the turn
    /// when it drops, whether or not the turn ran.
    pub async fn begin_turn(self: &Arc<Self>) -> Result<TurnTicket, ApiError> {
        let id = self.next_turn.fetch_add(1, Ordering::Relaxed);
        let ticket = TurnTicket {
            session: self.clone(),
            id,
            history: None,
        };
        self.call(|reply| Command::BeginTurn { id, reply })
            .await??;
        Ok(ticket)
    }

    /// Prefill `prompt` onto the session as background work; the warm's JSON reply.
    pub async fn warm(&self, prompt: Vec<u32>) -> Result<Value, ApiError> {
        let kv = self.engine.pin_kv_tokens(self.pin);
        (self.call(|reply| Command::Warm { prompt, kv, reply }).await)?
    }

    /// Delete: refused with 409 while a client request runs on the session. Background work
    /// is cancelled, then its KV is released; resolves when it is.
    pub async fn delete(&self) -> Result<(), ApiError> {
        self.call(|reply| Command::Delete { reply }).await?
    }

    /// Delete if idle past `ttl` (no request, pending data or attached stream).
    pub async fn expire_if_idle(&self, ttl: Duration) -> bool {
        (self
            .call(|reply| Command::ExpireIfIdle { ttl, reply })
            .await)
            .unwrap_or(false)
    }

    /// Tell the session's streams the server is shutting down, and end its work.
    pub fn shutdown(&self) {
        self.send(Command::Shutdown);
    }
}

/// What a `Hold` counts on the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// A client request in flight: the session cannot be deleted meanwhile.
    Foreground,
    /// An attached event stream: the session never expires meanwhile.
    Subscriber,
}

/// Counts one `Held` on the session for as long as it lives; the count goes down when it
/// drops, however the request or stream ends.
pub struct Hold {
    pub session: Arc<Session>,
    what: Held,
}

impl Hold {
    pub fn new(session: Arc<Session>, what: Held) -> Self {
        session.send(Command::Hold { what, delta: 1 });
        Hold { session, what }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        (self.session).send(Command::Hold {
            what: self.what,
            delta: -1,
        });
    }
}

/// A turn on the session: its end (with the history to keep, on a normal finish) reaches the
/// actor when the ticket drops.
pub struct TurnTicket {
    session: Arc<Session>,
    id: u64,
    history: Option<Vec<u32>>,
}

impl TurnTicket {
    /// Keep `history` (the prompt and reply) as the session's durable context.
    pub fn keep(mut self, history: Vec<u32>) {
        self.history = Some(history);
    }
}

impl Drop for TurnTicket {
    fn drop(&mut self) {
        let history = self.history.take();
        self.session.send(Command::EndTurn {
            id: self.id,
            history,
        });
    }
}
