//! Sessions back from the journal: at start-up every session the state directory holds, and
//! on `POST /v1/sessions/import` one exported from another server. The durable record keeps
//! texts and settings; this turns it into a session's state again (tokenizing the entries and
//! flash queries with the same tokenizer, which the journal's fingerprint guarantees) and
//! hands it to the registry, whose actor recomputes the KV in the background. Requests meanwhile
//! are served from the mirror: a generate computes what the KV does not yet hold.

use super::flash::{FlashAnswer, FlashQuery, MAX_FLASH_QUERIES};
use super::ingest::{tokenize_entries, QUESTION_ROOM};
use super::journal::model::{DurableSession, Op};
use super::routes::{flash_fits, respond, TemplateTokens, MAX_PENDING_LIMIT};
use super::state::{Entry, Layout, SessionSettings, SessionState};
use super::Session;
use crate::error::{ApiError, Flavor};
use crate::extract::parse_body;
use crate::state::SharedState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use vigil_engine::sequence::FinishReason;

/// The export format's version.
pub const EXPORT_FORMAT: u32 = 1;

/// A session's state rebuilt from its durable record.
pub struct Restored {
    pub id: String,
    pub created_ms: u64,
    pub settings: SessionSettings,
    pub st: SessionState,
    pub next_event_id: u64,
}

/// Rebuild the state `d` describes.
pub async fn rebuild(state: &SharedState, d: &DurableSession) -> Result<Restored, ApiError> {
    let settings = TemplateTokens::build(state, d.params.prompt.as_deref())
        .await?
        .settings(d.params.clone());
    let mut st = SessionState::new(settings.opening.clone());
    if let Some(base) = &d.base {
        st.base = base.clone();
    }
    st.layout = if d.chat_layout {
        Layout::Chat
    } else {
        Layout::Data
    };
    let entries = tokenize_entries(state, d.entries.iter().cloned().collect()).await?;
    st.data_tokens = entries.iter().map(|e| e.tokens.len()).sum();
    st.entries = entries.into();
    // An ingest batch in flight at the crash was never committed: it is pending again.
    let queued = d.in_flight.iter().chain(&d.pending).cloned().collect();
    let pending: Vec<Entry> = tokenize_entries(state, queued).await?;
    st.pending_bytes = pending.iter().map(|e| e.text.len()).sum();
    st.pending = pending.into();
    st.data_version = d.data_version;
    st.total_pushed = d.total_pushed;
    st.total_dropped = d.total_dropped;
    st.total_ingested = d.total_ingested;
    st.evicted = d.evicted;
    st.evicted_tokens = d.evicted_tokens;
    st.window_recomputes = d.window_recomputes;
    st.window_shifts = d.window_shifts;
    st.turns = d.turns;
    for q in &d.flash {
        let (tokens, wrapped) = flash_fits(state, &settings, &q.query).await?;
        let answer = q.answer.as_ref().map(|a| FlashAnswer {
            value: a.value.clone(),
            ids: a.ids.clone(),
            finish: if a.stopped {
                FinishReason::Stop
            } else {
                FinishReason::Length
            },
            data_version: a.data_version,
            confidence: a.confidence,
            evaluated_at: a.evaluated_at,
        });
        st.flash.push(FlashQuery {
            id: q.id,
            query: q.query.clone(),
            max_tokens: q.max_tokens,
            tokens,
            restored: answer.is_some(),
            answer,
            evaluations: 0,
            skipped: 0,
            eval_ms: 0.0,
            error: None,
            wrapped,
        });
    }
    st.next_flash_id = d.next_flash_id;
    Ok(Restored {
        id: d.id.clone(),
        created_ms: d.created_ms,
        settings,
        st,
        next_event_id: d.next_event_id,
    })
}

/// Start every session the journal restored; one that cannot be rebuilt is reported and
/// skipped (the journal keeps it). The number started.
pub async fn restore_all(state: &SharedState, sessions: Vec<DurableSession>) -> usize {
    let mut started = 0;
    for d in sessions {
        let r = match rebuild(state, &d).await {
            Ok(r) => state.sessions.adopt(state, r, None),
            Err(e) => Err(e),
        };
        match r {
            Ok(_) => started += 1,
            Err(e) => tracing::warn!(session = %d.id, "not restored: {}", e.message),
        }
    }
    started
}

/// What an import must hold beyond a well-formed record: the limits a created session has.
fn check_import(state: &SharedState, r: &Restored) -> Result<(), ApiError> {
    let bad = |m: String| ApiError::invalid("session", m);
    if !super::valid_id(&r.id) {
        return Err(ApiError::invalid(
            "id",
            "a session id is 1 to 128 characters of A-Z, a-z, 0-9, `_` and `-`",
        ));
    }
    let vocab = state.tokenizer.vocab_size() as u32;
    if r.st.base.iter().any(|&t| t >= vocab) {
        return Err(bad(format!(
            "`base` holds a token id outside the vocabulary ({vocab})"
        )));
    }
    let s = &r.settings.params;
    let room = state
        .max_model_len
        .saturating_sub(r.settings.opening.len() + QUESTION_ROOM.min(state.max_model_len / 4));
    if s.window.is_some_and(|w| w == 0 || w > room) || s.evict_to > s.window {
        return Err(bad(format!("`window` must be between 1 and {room} tokens on this server, and `evict_to` at most the window")));
    }
    if !(1..=MAX_PENDING_LIMIT).contains(&s.max_pending)
        || !(1..=state.sessions.budget.max).contains(&s.max_pending_bytes)
    {
        return Err(bad(
            "`max_pending` or `max_pending_bytes` is outside this server's limits".into(),
        ));
    }
    let held = r.st.data_end() + r.st.pending_tokens();
    if held + QUESTION_ROOM.min(state.max_model_len / 4) > state.max_model_len && s.window.is_none()
    {
        return Err(ApiError::context_length(held, state.max_model_len));
    }
    if r.st.base.len() >= state.max_model_len {
        return Err(ApiError::context_length(
            r.st.base.len(),
            state.max_model_len,
        ));
    }
    if r.st.flash.len() > MAX_FLASH_QUERIES {
        return Err(bad(format!(
            "a session holds at most {MAX_FLASH_QUERIES} flash queries"
        )));
    }
    if r.st.pending.len() > s.max_pending || r.st.pending_bytes > s.max_pending_bytes {
        return Err(bad(
            "the pending entries exceed the session's own limits".into()
        ));
    }
    Ok(())
}

/// `GET /v1/sessions/{id}/export`: the session as a self-contained record (settings, entries,
/// pending data, conversation, counters, flash queries) that `import` recreates.
pub async fn export(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    let r = async {
        state.sessions.peek(&id)?;
        let session = (state.sessions.journal.export(&id).await)
            .ok_or_else(|| ApiError::not_found(format!("session `{id}` not found")))?;
        Ok(json!({
            "object": "session.export",
            "format": EXPORT_FORMAT,
            "model": state.model_id,
            "vocab_size": state.tokenizer.vocab_size(),
            "session": session,
        }))
    }
    .await;
    respond(&state, r)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImportRequest {
    #[serde(default)]
    object: Option<String>,
    format: u32,
    model: String,
    vocab_size: usize,
    session: DurableSession,
    /// Import under another id.
    id: Option<String>,
}

/// `POST /v1/sessions/import`: recreate an exported session here (same model, else 400). Its
/// KV is recomputed in the background; the reply is the session object.
pub async fn import(
    State(state): State<SharedState>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = import_inner(&state, &headers, body).await;
    respond(&state, r)
}

async fn import_inner(
    state: &SharedState,
    headers: &axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Value, ApiError> {
    let req: ImportRequest = parse_body(body, Flavor::OpenAi)?;
    let target = req.id.clone().unwrap_or_else(|| req.session.id.clone());
    let id = super::routes::chosen_id(headers, Some(target))?;
    if req.object.as_deref().is_some_and(|o| o != "session.export") {
        return Err(ApiError::invalid(
            "object",
            "`object` must be `session.export`",
        ));
    }
    if req.format != EXPORT_FORMAT {
        return Err(ApiError::invalid(
            "format",
            format!(
                "export format {} is not one this server reads ({EXPORT_FORMAT})",
                req.format
            ),
        ));
    }
    let vocab = state.tokenizer.vocab_size();
    if req.model != state.model_id || req.vocab_size != vocab {
        return Err(ApiError::invalid(
            "model",
            format!(
                "the session was exported from model `{}` (vocabulary {}); this server serves `{}` (vocabulary {vocab}): a session moves only between servers of the same model",
                req.model, req.vocab_size, state.model_id
            ),
        ));
    }
    let mut d = req.session;
    if let Some(id) = id {
        d.id = id;
    }
    let restored = rebuild(state, &d).await?;
    check_import(state, &restored)?;
    let op = Op::Import { state: Box::new(d) };
    let (session, durable): (Arc<Session>, _) = state.sessions.adopt(state, restored, Some(op))?;
    durable.wait().await?;
    session.describe(false).await
}
