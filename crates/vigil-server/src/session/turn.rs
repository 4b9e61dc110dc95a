//! Agent turns and warm turns. A chat or messages request with `x-layerscale-session-id` runs
//! on the session's KV: the engine keeps the longest common prefix of the rendered
//! conversation with the session's pin, computes only the rest, and on a normal finish keeps
//! the prompt and reply as the session's durable history. `warm` prefills a conversation ahead
//! as background work; a turn cancels it at a step boundary and keeps what it computed. The
//! routes are here, and the actor's side of both (claiming the writer, settling the history).

use super::actor::{JobResult, SessionActor, Writer};
use super::engine_work::Job;
use super::handle::Session;
use super::journal::model::Op;
use super::state::{Identity, Layout, SessionState};
use crate::error::{ApiError, Flavor};
use crate::extract::parse_body;
use crate::generate::FinishHook;
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
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::{oneshot, watch};
use vigil_engine::pins::{PinSave, PinUse};
use vigil_engine::sampling::SamplingParams;
use vigil_engine::sequence::{FinishReason, Priority};

pub const SESSION_HEADER: &str = "x-layerscale-session-id";

/// What a route needs to run a request as a turn on a session.
pub struct Turn {
    pub pin: PinUse,
    pub on_finish: FinishHook,
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
    let ticket = session.begin_turn().await?;
    let prompt = prompt.to_vec();
    let on_finish: FinishHook = Box::new(move |f| {
        if let Some(f) = f.filter(|f| f.reason != FinishReason::Abort) {
            let mut history = prompt;
            history.extend(&f.output_ids);
            ticket.keep(history);
        }
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

/// `begin` when the request names a session: the pin and hook its `GenParams` take.
pub async fn begin_if(
    session: Option<&Arc<Session>>,
    prompt: &[u32],
) -> Result<(Option<PinUse>, Option<FinishHook>), ApiError> {
    match session {
        Some(s) => {
            let t = begin(s, prompt).await?;
            Ok((Some(t.pin), Some(t.on_finish)))
        }
        None => Ok((None, None)),
    }
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
            continue_final: false,
        },
    )
    .await?
    .ids;
    if prompt.len() >= state.max_model_len {
        return Err(ApiError::context_length(prompt.len(), state.max_model_len));
    }
    session.warm(prompt).await
}

/// A warm waiting for the writer, or running.
pub struct WarmRequest {
    pub prompt: Vec<u32>,
    /// The pin's KV tokens when the warm was asked (read by the caller: the actor never
    /// waits on the engine's pin map). A stale figure costs a redundant prefill (all cached),
    /// or reports covered a prefix evicted meanwhile (the next turn recomputes it).
    pub kv: usize,
    pub reply: oneshot::Sender<Result<Value, ApiError>>,
}

impl WarmRequest {
    /// Answer a warm that never ran: a newer warm, a turn or a deletion took over.
    pub fn cancelled(self, st: &SessionState, head: &Identity) {
        let v = warm_json(st, head, "cancelled", self.prompt.len(), 0);
        let _ = self.reply.send(Ok(v));
    }
}

/// How a warm prefill ended.
pub struct WarmResult {
    request: WarmRequest,
    /// The data version it started from, and whether the prompt diverged from the mirror.
    version: u64,
    diverged: bool,
    /// `Ok(Some(cached))` finished, `Ok(None)` cancelled (it kept what it computed).
    outcome: Result<Option<usize>, ApiError>,
}

impl SessionActor {
    pub(super) fn begin_turn(&mut self, id: u64, reply: oneshot::Sender<Result<(), ApiError>>) {
        if self.st.turn_active {
            let _ = reply.send(Err(super::conflict(format!(
                "session `{}` is busy: a turn is in flight; one turn runs per session at a time",
                self.head.id
            ))));
            return;
        }
        self.st.turn_active = true;
        self.cancel_warm();
        self.turn_waiting = Some((id, reply));
    }

    /// The turn's ticket dropped: keep its history if it finished normally, free the writer.
    pub(super) fn end_turn(&mut self, id: u64, history: Option<Vec<u32>>) {
        let ours = match (&self.writer, &self.turn_waiting) {
            (Writer::Turn(t), _) if *t == id => {
                self.writer = Writer::Idle;
                true
            }
            (_, Some((t, _))) if *t == id => {
                self.turn_waiting = None;
                true
            }
            _ => false,
        };
        if !ours {
            return; // A refused claim's ticket.
        }
        self.st.turn_active = false;
        self.st.touch();
        if let Some(h) = history {
            self.settle(h, true);
            self.kv_changed();
        }
    }

    /// Make `history` the session's durable context (a closed turn) and announce it.
    fn settle(&mut self, history: Vec<u32>, completed_turn: bool) {
        let op = Op::Settle {
            base: history.clone(),
            turn: completed_turn,
        };
        self.deps.journal.log(&self.head.id, op);
        let st = &mut self.st;
        st.base = history;
        st.entries.clear();
        st.data_tokens = 0;
        st.layout = Layout::Chat;
        st.data_version += 1;
        if completed_turn {
            st.turns += 1;
        }
        let data = json!({"data_version": st.data_version, "tokens": st.data_end(), "pending": st.pending.len()});
        self.events.publish("data_updated", data);
    }

    /// Cancel the warm in flight (it keeps what it computed) or the one waiting.
    fn cancel_warm(&mut self) {
        if let Writer::Warm(cancel) = &self.writer {
            let _ = cancel.send(true);
        }
        if let Some(w) = self.warm_waiting.take() {
            w.cancelled(&self.st, &self.head);
        }
    }

    pub(super) fn queue_warm(
        &mut self,
        prompt: Vec<u32>,
        kv: usize,
        reply: oneshot::Sender<Result<Value, ApiError>>,
    ) {
        if self.st.turn_active {
            let _ = reply.send(Err(super::conflict(format!(
                "session `{}` is busy: a turn is in flight",
                self.head.id
            ))));
            return;
        }
        // A newer warm takes over from an older one.
        self.cancel_warm();
        self.warm_waiting = Some(WarmRequest { prompt, kv, reply });
    }

    pub(super) fn start_warm(&mut self, w: WarmRequest) {
        let mirror = self.st.mirror();
        let common = (mirror.iter().zip(&w.prompt))
            .take_while(|(a, b)| a == b)
            .count();
        let held = w.kv.min(mirror.len());
        if common == w.prompt.len() && held + 1 >= w.prompt.len() {
            let v = warm_json(
                &self.st,
                &self.head,
                "covered",
                w.prompt.len(),
                w.prompt.len(),
            );
            let _ = w.reply.send(Ok(v));
            return;
        }
        let job = Job {
            prompt: w.prompt.clone(),
            sampling: SamplingParams::default(),
            max_tokens: 1,
            ignore_eos: true,
            priority: Priority::Background,
            pin: PinUse {
                key: self.head.pin,
                save: Some(PinSave::Prompt),
                save_on_abort: true,
            },
        };
        let (cancel_tx, mut cancel_rx) = watch::channel(false);
        self.writer = Writer::Warm(cancel_tx);
        let (deps, jobs, mut gone) = (
            self.deps.clone(),
            self.jobs_tx.clone(),
            self.gone.subscribe(),
        );
        let (version, diverged) = (self.st.data_version, common < mirror.len());
        let mut request = w;
        tokio::spawn(async move {
            // Cancelled by a turn, a newer warm, the session's deletion, or its client leaving:
            // the request is dropped, and the engine aborts at the step boundary and saves.
            let reply = &mut request.reply;
            let cancel = async move {
                tokio::select! {
                    _ = cancel_rx.wait_for(|c| *c) => {}
                    _ = gone.wait_for(|g| *g) => {}
                    () = reply.closed() => {}
                }
            };
            let outcome = (deps.run(job, cancel).await).map(|d| d.map(|d| d.cached_tokens));
            let _ = jobs.send(JobResult::Warm(WarmResult {
                request,
                version,
                diverged,
                outcome,
            }));
        });
    }

    pub(super) fn warm_done(&mut self, w: WarmResult) {
        self.writer = Writer::Idle;
        self.rebuilding = false;
        self.rebuild_reply = None;
        let (reason, cached) = match w.outcome {
            Ok(Some(cached)) => ("warmed", cached),
            Ok(None) => ("cancelled", 0),
            Err(e) => {
                let _ = w.request.reply.send(Err(e));
                return;
            }
        };
        let st = &mut self.st;
        st.base = w.request.prompt.clone();
        st.entries.clear();
        st.data_tokens = 0;
        st.layout = Layout::Chat;
        if w.diverged {
            st.data_version = w.version + 1;
        }
        let op = Op::Warmed {
            base: st.base.clone(),
            data_version: st.data_version,
        };
        self.deps.journal.log(&self.head.id, op);
        let v = warm_json(st, &self.head, reason, w.request.prompt.len(), cached);
        let _ = w.request.reply.send(Ok(v));
        self.kv_changed();
    }
}

fn warm_json(
    st: &SessionState,
    head: &Identity,
    reason: &str,
    prompt_tokens: usize,
    cached: usize,
) -> serde_json::Value {
    json!({
        "id": crate::ids::new_id("warm-"),
        "object": "session.warm",
        "session_id": head.id,
        "finish_reason": reason,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "prefix_cached_tokens": cached,
        "data_version": st.data_version,
    })
}
