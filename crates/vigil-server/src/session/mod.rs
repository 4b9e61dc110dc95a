//! Stateful sessions (LayerScale's Gen 2 API and Vigil's extensions; see docs/sessions.md):
//! the registry of live sessions (ids to handles), their creation, deletion and idle expiry.
//! Each session is an actor (`actor.rs`) that owns its state; routes hold its handle
//! (`handle.rs`).

pub mod actor;
pub mod budget;
pub mod engine_work;
pub mod events;
pub mod flash;
pub mod generate;
pub mod handle;
pub mod ingest;
pub mod journal;
pub mod layout;
pub mod offload;
pub mod restore;
pub mod routes;
pub mod state;
pub mod stream;
#[cfg(test)]
pub mod testing;
#[cfg(test)]
mod tests;
pub mod turn;

use crate::error::ApiError;
use crate::state::SharedState;
use axum::http::StatusCode;
pub use budget::queued_cost;
use budget::QueueBudget;
use engine_work::SessionDeps;
pub use handle::Session;
use state::{Identity, SessionSettings};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct SessionRegistry {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    next_pin: AtomicU64,
    pub ttl: Duration,
    pub max_sessions: usize,
    /// Bytes queued in every session's pending queue (`queued_cost` each), and the most the
    /// server holds (`--max-pending-bytes-total`); a push past it is a 429.
    pub budget: Arc<QueueBudget>,
    /// Where every session's changes are logged (`--state-dir`; in memory with `--no-persist`).
    pub journal: journal::Journal,
    /// Where idle sessions' KV is written (`--kv-disk`), if anywhere.
    pub kv_disk: Option<Arc<journal::kv_disk::KvDisk>>,
}

pub fn conflict(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "conflict_error", message)
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("session `{id}` not found"))
}

pub fn valid_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl SessionRegistry {
    pub fn new(
        ttl: Duration,
        max_sessions: usize,
        max_queued_bytes: usize,
        journal: journal::Journal,
        kv_disk: Option<Arc<journal::kv_disk::KvDisk>>,
    ) -> Self {
        SessionRegistry {
            journal,
            kv_disk,
            sessions: Mutex::new(HashMap::new()),
            next_pin: AtomicU64::new(1),
            ttl,
            max_sessions,
            budget: Arc::new(QueueBudget::new(max_queued_bytes)),
        }
    }

    /// The map of ids to handles: held only to look up, insert or remove a handle.
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Session>>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }

    /// The session, without touching its idle clock.
    pub fn peek(&self, id: &str) -> Result<Arc<Session>, ApiError> {
        self.map().get(id).cloned().ok_or_else(|| not_found(id))
    }

    /// The session, restarting its idle clock.
    pub fn get(&self, id: &str) -> Result<Arc<Session>, ApiError> {
        let s = self.peek(id)?;
        s.touch();
        Ok(s)
    }

    /// Every session, in creation order (pin keys are issued in that order, so sessions made
    /// within the same millisecond keep it too).
    pub fn list(&self) -> Vec<Arc<Session>> {
        let mut v: Vec<_> = self.map().values().cloned().collect();
        v.sort_by_key(|s| (s.created_ms, s.pin));
        v
    }

    /// Register a session and start its actor; the creation is logged (the `Durable` resolves
    /// once it is on disk).
    pub fn create(
        &self,
        state: &SharedState,
        id: Option<String>,
        settings: SessionSettings,
    ) -> Result<(Arc<Session>, journal::Durable), ApiError> {
        let id = match id {
            Some(id) if !valid_id(&id) => {
                return Err(ApiError::invalid(
                    "id",
                    "a session id is 1 to 128 characters of A-Z, a-z, 0-9, `_` and `-`",
                ))
            }
            Some(id) => id,
            None => crate::ids::new_id("sess_"),
        };
        let created_ms = crate::ids::unix_now_ms();
        let op = journal::model::Op::Create {
            created_ms: created_ms as u64,
            params: settings.params.clone(),
        };
        self.register(state, id.clone(), Some(op), |pin, deps| {
            Session::spawn(Identity::at(id, pin, created_ms), settings, deps)
        })
    }

    /// Insert the session `spawn` starts under `id` (when there is room), after logging `op`:
    /// logged under the map's lock, so a later session with this id is logged after it.
    fn register(
        &self,
        state: &SharedState,
        id: String,
        op: Option<journal::model::Op>,
        spawn: impl FnOnce(vigil_engine::pins::PinKey, SessionDeps) -> Session,
    ) -> Result<(Arc<Session>, journal::Durable), ApiError> {
        let mut map = self.map();
        self.room_for(&map, &id)?;
        let pin = self.next_pin.fetch_add(1, Ordering::Relaxed);
        let durable = match op {
            Some(op) => self.journal.log_durable(&id, op),
            None => journal::Durable::done(),
        };
        let s = Arc::new(spawn(pin, self.deps(state)));
        map.insert(id, s.clone());
        (state.metrics.sessions_live).store(map.len(), Ordering::Relaxed);
        Ok((s, durable))
    }

    fn room_for(&self, map: &HashMap<String, Arc<Session>>, id: &str) -> Result<(), ApiError> {
        if map.contains_key(id) {
            return Err(conflict(format!("session `{id}` already exists")));
        }
        if map.len() >= self.max_sessions {
            return Err(conflict(format!(
                "{} live sessions, the most this server keeps (--max-sessions); delete one first",
                map.len()
            )));
        }
        Ok(())
    }

    fn deps(&self, state: &SharedState) -> SessionDeps {
        SessionDeps {
            engine: state.engine.clone(),
            tokenizer: state.tokenizer.clone(),
            max_model_len: state.max_model_len,
            metrics: state.metrics.clone(),
            budget: self.budget.clone(),
            journal: self.journal.clone(),
            kv_disk: self.kv_disk.clone(),
        }
    }

    /// Register a restored or imported session (its state rebuilt by `restore.rs`) and start
    /// its actor, which recomputes its KV. `log`: the record that makes it durable here (an
    /// import's), none for a session restored from this server's own journal.
    pub fn adopt(
        &self,
        state: &SharedState,
        restored: restore::Restored,
        log: Option<journal::model::Op>,
    ) -> Result<(Arc<Session>, journal::Durable), ApiError> {
        let id = restored.id.clone();
        let budget = self.budget.clone();
        self.register(state, id.clone(), log, move |pin, deps| {
            let queued: usize = restored.st.pending.iter().map(queued_cost).sum();
            budget.force(queued);
            let head = Identity::at(id, pin, restored.created_ms as u128);
            let events = events::EventBus::starting_at(restored.next_event_id);
            Session::spawn_with(head, restored.settings, deps, restored.st, events, true)
        })
    }

    fn unregister(&self, state: &SharedState, session: &Arc<Session>) {
        let mut map = self.map();
        if map
            .get(&session.id)
            .is_some_and(|s| Arc::ptr_eq(s, session))
        {
            map.remove(&session.id);
        }
        (state.metrics.sessions_live).store(map.len(), Ordering::Relaxed);
    }

    /// Delete a session: refused with 409 while a foreground request is in flight. Background
    /// work is cancelled, then its KV is released.
    pub async fn delete(&self, state: &SharedState, id: &str) -> Result<(), ApiError> {
        let session = self.peek(id)?;
        session.delete().await?;
        self.unregister(state, &session);
        Ok(())
    }

    /// End every session's event streams and work (at shutdown): each stream's last event is
    /// `shutdown`, saying why.
    pub fn close_streams(&self) {
        for s in self.map().values() {
            s.shutdown();
        }
    }

    /// Delete every session idle past the TTL (not one with a request, pending data or an
    /// attached event stream).
    pub async fn expire_idle(&self, state: &SharedState) -> usize {
        let sessions: Vec<Arc<Session>> = self.map().values().cloned().collect();
        let mut expired = 0;
        for s in &sessions {
            if s.expire_if_idle(self.ttl).await {
                self.unregister(state, s);
                expired += 1;
            }
        }
        expired
    }
}

/// Runs `expire_idle` every second (or TTL/4 when shorter) for the server's lifetime.
pub async fn run_reaper(state: SharedState) {
    let period = (state.sessions.ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        tokio::time::sleep(period).await;
        let n = state.sessions.expire_idle(&state).await;
        if n > 0 {
            tracing::info!("expired {n} idle session(s)");
        }
    }
}
