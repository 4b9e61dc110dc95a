//! Agent turns and warm turns. A chat or messages request with `x-layerscale-session-id` runs
//! on the session's KV: the engine keeps the longest common prefix of the rendered
//! conversation with the session's pin, computes only the rest, and on a normal finish keeps
//! the prompt and reply as the session's durable history. `warm` prefills a conversation ahead
//! as background work; a turn cancels it at a step boundary and keeps what it computed.

use super::conflict;
use super::state::{Layout, Session};
use crate::error::{ApiError, Flavor};
use crate::extract::parse_body;
use crate::generate::{self, FinishHook, GenEvent, GenParams};
use crate::openai::messages::{template_messages, template_tools};
use crate::openai::types::ChatCompletionRequest;
use crate::prompt::{render_chat, template_kwargs, ChatPromptSpec};
use crate::routes::error_response;
use crate::state::SharedState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::sync::Arc;
use tokio::sync::{oneshot, watch, OwnedMutexGuard};
use vigil_engine::pins::{PinSave, PinUse};
use vigil_engine::sampling::SamplingParams;
use vigil_engine::sequence::{FinishReason, Priority};

pub const SESSION_HEADER: &str = "x-layerscale-session-id";

/// What a route needs to run a request as a turn on a session.
pub struct Turn {
    pub pin: PinUse,
    pub on_finish: FinishHook,
}

/// Clears `turn_active` when the turn ends, however it ends.
struct TurnGuard(Arc<Session>);

impl Drop for TurnGuard {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.turn_active = false;
        st.touch();
    }
}

/// The session named by the request's header, if any (404 when it does not exist).
pub fn session_of(
    state: &SharedState,
    headers: &HeaderMap,
) -> Result<Option<Arc<Session>>, ApiError> {
    let Some(v) = headers.get(SESSION_HEADER) else {
        return Ok(None);
    };
    let id = v.to_str().map_err(|_| {
        ApiError::invalid(SESSION_HEADER, "the session id header is not valid text")
    })?;
    state.sessions.get(id).map(Some)
}

/// Claim the session for a turn: 409 if a turn is in flight; a warm turn in flight is
/// cancelled and waited for (it keeps what it computed).
pub async fn begin(session: &Arc<Session>, prompt: &[u32]) -> Result<Turn, ApiError> {
    {
        let mut st = session.lock();
        if st.turn_active {
            return Err(conflict(format!(
                "session `{}` is busy: a turn is in flight; one turn runs per session at a time",
                session.id
            )));
        }
        st.turn_active = true;
        if let Some(c) = st.warm_cancel.take() {
            let _ = c.send(true);
        }
    }
    let guard = TurnGuard(session.clone());
    let writer = session.writer.clone().lock_owned().await;
    if session.is_deleted() {
        return Err(ApiError::not_found(format!(
            "session `{}` not found",
            session.id
        )));
    }
    let s = session.clone();
    let prompt = prompt.to_vec();
    let on_finish: FinishHook = Box::new(move |f| {
        if let Some(f) = f.filter(|f| f.reason != FinishReason::Abort) {
            let mut history = prompt;
            history.extend(&f.output_ids);
            settle(&s, history, true);
        }
        drop(writer);
        drop(guard);
    });
    Ok(Turn {
        pin: PinUse {
            key: session.pin,
            save: Some(PinSave::All),
            save_on_abort: false,
        },
        on_finish,
    })
}

/// Make `history` the session's durable context (a closed turn) and announce it.
fn settle(session: &Session, history: Vec<u32>, completed_turn: bool) {
    let data = {
        let mut st = session.lock();
        st.base = history;
        st.entries.clear();
        st.data_tokens = 0;
        st.layout = Layout::Chat;
        st.data_version += 1;
        if completed_turn {
            st.turns += 1;
        }
        st.touch();
        json!({"data_version": st.data_version, "tokens": st.data_end(), "pending": st.pending.len()})
    };
    session.events.publish("data_updated", data);
    session.flash_wake.notify_one();
}

pub async fn warm(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match warm_inner(&state, &id, body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => error_response(&state, e),
    }
}

async fn warm_inner(
    state: &SharedState,
    id: &str,
    body: Result<Bytes, BytesRejection>,
) -> Result<serde_json::Value, ApiError> {
    let session = state.sessions.get(id)?;
    let req: ChatCompletionRequest = parse_body(body, Flavor::OpenAi)?;
    let messages = template_messages(&req.messages)?;
    let tools = match &req.tools {
        Some(t) if !t.is_empty() => Some(template_tools(t)?),
        _ => None,
    };
    let kwargs = template_kwargs(
        req.chat_template_kwargs.as_ref(),
        req.reasoning_effort.as_deref(),
        "chat_template_kwargs",
    )?;
    let prompt = render_chat(
        state,
        ChatPromptSpec {
            messages: &messages,
            tools: tools.as_ref(),
            kwargs,
            forced: None,
        },
    )
    .await?
    .ids;
    if prompt.len() >= state.max_model_len {
        return Err(ApiError::context_length(prompt.len(), state.max_model_len));
    }
    let (cancel_tx, mut cancel_rx) = watch::channel(false);
    {
        let mut st = session.lock();
        if st.turn_active {
            return Err(conflict(format!(
                "session `{id}` is busy: a turn is in flight"
            )));
        }
        // A newer warm takes over from an older one.
        if let Some(old) = st.warm_cancel.replace(cancel_tx) {
            let _ = old.send(true);
        }
    }
    let writer: OwnedMutexGuard<()> = tokio::select! {
        w = session.writer.clone().lock_owned() => w,
        _ = cancel_rx.wait_for(|c| *c) => return Ok(warm_json(&session, "cancelled", prompt.len(), 0)),
    };
    let (mirror, version) = {
        let st = session.lock();
        (st.mirror(), st.data_version)
    };
    let common = mirror
        .iter()
        .zip(&prompt)
        .take_while(|(a, b)| a == b)
        .count();
    let held = state.engine.pin_kv_tokens(session.pin).min(mirror.len());
    if common == prompt.len() && held + 1 >= prompt.len() {
        drop(writer);
        return Ok(warm_json(&session, "covered", prompt.len(), prompt.len()));
    }
    let (tx, rx) = oneshot::channel();
    let mut gp = GenParams::new(prompt.clone(), SamplingParams::default(), Some(1));
    gp.priority = Priority::Background;
    gp.ignore_eos = true;
    gp.pin = Some(PinUse {
        key: session.pin,
        save: Some(PinSave::Prompt),
        save_on_abort: true,
    });
    gp.on_finish = Some(Box::new(move |f| {
        let _ = tx.send(f);
    }));
    let mut events = generate::start(state, gp)?;
    let mut cached = 0;
    let cancelled = loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(GenEvent::Done { usage, .. }) => cached = usage.cached_tokens,
                Some(GenEvent::Failed(e)) => return Err(e),
                Some(_) => {}
                None => break false,
            },
            _ = cancel_rx.wait_for(|c| *c) => break true,
        }
    };
    drop(events); // On cancel: the engine aborts at the step boundary and saves what it has.
    let finished = rx.await.ok().flatten();
    let diverged = common < mirror.len();
    if finished.is_some() || cancelled {
        let mut st = session.lock();
        st.base = prompt.clone();
        st.entries.clear();
        st.data_tokens = 0;
        st.layout = Layout::Chat;
        if diverged {
            st.data_version = version + 1;
        }
    }
    {
        let mut st = session.lock();
        if (st.warm_cancel.as_ref()).is_some_and(|c| c.subscribe().same_channel(&cancel_rx)) {
            st.warm_cancel = None;
        }
    }
    drop(writer);
    let reason = if cancelled { "cancelled" } else { "warmed" };
    Ok(warm_json(&session, reason, prompt.len(), cached))
}

fn warm_json(
    session: &Session,
    reason: &str,
    prompt_tokens: usize,
    cached: usize,
) -> serde_json::Value {
    let st = session.lock();
    json!({
        "id": crate::ids::new_id("warm-"),
        "object": "session.warm",
        "session_id": session.id,
        "finish_reason": reason,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "prefix_cached_tokens": cached,
        "data_version": st.data_version,
    })
}
