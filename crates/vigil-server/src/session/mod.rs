//! Stateful sessions (LayerScale's Gen 2 API and Vigil's extensions; see docs/sessions.md):
//! the registry of live sessions, their creation, deletion and idle expiry. Each session has
//! two tasks: its ingest worker (`ingest.rs`) and its flash evaluator (`flash.rs`).

pub mod events;
pub mod flash;
pub mod generate;
pub mod ingest;
pub mod layout;
pub mod routes;
pub mod state;
pub mod stream;
pub mod turn;

use crate::error::ApiError;
use crate::state::SharedState;
use axum::http::StatusCode;
use state::{Session, SessionSettings};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct SessionRegistry {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    next_pin: AtomicU64,
    pub ttl: Duration,
    pub max_sessions: usize,
    /// Bytes queued in every session's pending queue (`queued_cost` each), and the most the
    /// server holds (`--max-pending-bytes-total`); a push past it is a 429.
    pub queued_bytes: AtomicUsize,
    pub max_queued_bytes: usize,
}

/// Bookkeeping a queued entry costs beyond its text (its token vector and queue slot).
const ENTRY_OVERHEAD: usize = 64;

/// What one queued entry counts against `--max-pending-bytes-total`.
pub fn queued_cost(e: &state::Entry) -> usize {
    e.text.len() + 4 * e.tokens.len() + ENTRY_OVERHEAD
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
    pub fn new(ttl: Duration, max_sessions: usize, max_queued_bytes: usize) -> Self {
        SessionRegistry {
            sessions: Mutex::new(HashMap::new()),
            next_pin: AtomicU64::new(1),
            ttl,
            max_sessions,
            queued_bytes: AtomicUsize::new(0),
            max_queued_bytes,
        }
    }

    /// Take `bytes` of the server-wide queue budget, or say how full it is.
    pub fn reserve_queued(&self, bytes: usize) -> Result<(), ApiError> {
        let r = self
            .queued_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q + bytes <= self.max_queued_bytes).then_some(q + bytes)
            });
        match r {
            Ok(_) => Ok(()),
            Err(q) => {
                let mut e = ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    format!(
                        "the server holds {q} bytes of queued session data and this push adds {bytes}; the limit is {} (--max-pending-bytes-total); nothing was queued, retry once ingest catches up",
                        self.max_queued_bytes
                    ),
                );
                e.retry_after = Some(1);
                Err(e)
            }
        }
    }

    /// Give back queue budget of entries that left a pending queue.
    pub fn release_queued(&self, bytes: usize) {
        let _ = self
            .queued_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                Some(q.saturating_sub(bytes))
            });
    }

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
        s.lock().touch();
        Ok(s)
    }

    /// Every session, in creation order (pin keys are issued in that order, so sessions made
    /// within the same millisecond keep it too).
    pub fn list(&self) -> Vec<Arc<Session>> {
        let mut v: Vec<_> = self.map().values().cloned().collect();
        v.sort_by_key(|s| (s.created_ms, s.pin));
        v
    }

    /// Register a session and start its tasks.
    pub fn create(
        &self,
        state: &SharedState,
        id: Option<String>,
        settings: SessionSettings,
        opening_tokens: Vec<u32>,
    ) -> Result<Arc<Session>, ApiError> {
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
        let session = {
            let mut map = self.map();
            if map.contains_key(&id) {
                return Err(conflict(format!("session `{id}` already exists")));
            }
            if map.len() >= self.max_sessions {
                return Err(conflict(format!(
                    "{} live sessions, the most this server keeps (--max-sessions); delete one first",
                    map.len()
                )));
            }
            let pin = self.next_pin.fetch_add(1, Ordering::Relaxed);
            let s = Arc::new(Session::new(id.clone(), pin, settings, opening_tokens));
            map.insert(id, s.clone());
            state
                .metrics
                .sessions_live
                .store(map.len(), Ordering::Relaxed);
            s
        };
        tokio::spawn(ingest::run_ingest(state.clone(), session.clone()));
        tokio::spawn(flash::run_evaluator(state.clone(), session.clone()));
        Ok(session)
    }

    /// Delete a session: refused with 409 while a foreground request is in flight. Background
    /// work is cancelled, then its KV is released.
    pub async fn delete(&self, state: &SharedState, id: &str) -> Result<(), ApiError> {
        let session = self.peek(id)?;
        if session.lock().busy() {
            return Err(conflict(format!(
                "session `{id}` is busy: a request on it is in flight; retry when it ends"
            )));
        }
        self.remove(state, &session).await;
        Ok(())
    }

    async fn remove(&self, state: &SharedState, session: &Arc<Session>) {
        {
            let mut map = self.map();
            if map
                .get(&session.id)
                .is_some_and(|s| Arc::ptr_eq(s, session))
            {
                map.remove(&session.id);
            }
            state
                .metrics
                .sessions_live
                .store(map.len(), Ordering::Relaxed);
        }
        // Published before the streams are told to end, so each one sends it as its last event.
        session
            .events
            .publish("deleted", serde_json::json!({"session_id": session.id}));
        session.mark_deleted();
        let queued: usize = {
            let mut st = session.lock();
            let q = st.pending.iter().map(queued_cost).sum();
            st.pending.clear();
            st.pending_bytes = 0;
            q
        };
        self.release_queued(queued);
        // Wait (briefly) for the batch or warm in flight to let go, so no request saves to
        // the pin after it is dropped; their aborts reach the engine first either way.
        let _ = tokio::time::timeout(Duration::from_secs(2), session.writer.lock()).await;
        let _ = state.engine.drop_pin(session.pin);
    }

    /// End every session's event streams and workers (at shutdown): each stream's last event
    /// is `shutdown`, saying why.
    pub fn close_streams(&self) {
        for s in self.map().values() {
            s.events.publish(
                "shutdown",
                serde_json::json!({"message": "the server is shutting down; reconnect to a running server"}),
            );
            s.mark_deleted();
        }
    }

    /// Delete every session idle past the TTL (not one with a request, pending data or an
    /// attached event stream).
    pub async fn expire_idle(&self, state: &SharedState) -> usize {
        let expired: Vec<Arc<Session>> = (self.map().values())
            .filter(|s| {
                let st = s.lock();
                !st.busy()
                    && st.pending.is_empty()
                    && st.subscribers == 0
                    && st.last_used.elapsed() >= self.ttl
            })
            .cloned()
            .collect();
        for s in &expired {
            self.remove(state, s).await;
        }
        expired.len()
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
