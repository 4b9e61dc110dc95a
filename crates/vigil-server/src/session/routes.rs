//! HTTP handlers for session lifecycle, push, the data view and flash query registration.
//! (`generate`, turns and warm, and the event streams have their own files.)

use super::flash::{FlashSpec, Wrapped, DEFAULT_FLASH_MAX_TOKENS};
use super::ingest;
use super::layout;
use super::state::{Overflow, SessionParams, SessionSettings, WindowMode};
use super::Session;
use crate::error::{ApiError, Flavor};
use crate::extract::parse_body;
use crate::routes::error_response;
use crate::state::SharedState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

pub const DEFAULT_MAX_PENDING: usize = 4096;
pub const DEFAULT_MAX_PENDING_BYTES: usize = 4 << 20;

type Body = Result<Bytes, BytesRejection>;

pub(super) fn respond(state: &SharedState, r: Result<Value, ApiError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => error_response(state, e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRequest {
    id: Option<String>,
    pre_decode: Option<bool>,
    window: Option<i64>,
    evict_to: Option<i64>,
    window_mode: Option<WindowMode>,
    prompt: Option<String>,
    overflow: Option<Overflow>,
    max_pending: Option<i64>,
    max_pending_bytes: Option<i64>,
}

/// The most entries a session's pending queue may be set to hold.
pub const MAX_PENDING_LIMIT: usize = 65_536;

fn bounded(field: &str, v: Option<i64>, default: usize, max: usize) -> Result<usize, ApiError> {
    match v {
        None => Ok(default.min(max)),
        Some(n) if n >= 1 && n as u64 <= max as u64 => Ok(n as usize),
        Some(n) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be between 1 and {max} (this server's maximum), got {n}"),
        )),
    }
}

pub async fn create(
    State(state): State<SharedState>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Response {
    let r = create_inner(&state, &headers, body).await;
    respond(&state, r)
}

/// The id a new session takes: the body's `id`, else the `x-layerscale-session-id` header
/// (behind a router that routes sessions by that header, the router names a session it
/// creates: see docs/deploy.md), else one generated here. Both, differing, is a 400: the
/// session would live where the router does not look for it.
pub fn chosen_id(
    headers: &axum::http::HeaderMap,
    body_id: Option<String>,
) -> Result<Option<String>, ApiError> {
    let header = match headers.get(super::turn::SESSION_HEADER) {
        None => None,
        Some(v) => Some(v.to_str().map_err(|_| {
            ApiError::invalid(
                super::turn::SESSION_HEADER,
                "the session header is not ASCII",
            )
        })?),
    };
    match (body_id, header) {
        (Some(b), Some(h)) if b != h => Err(ApiError::invalid(
            "id",
            format!("the session id in the body (`{b}`) differs from the x-layerscale-session-id header (`{h}`); a router routes the session by the header, so send the same id in both (or only the header)"),
        )),
        (Some(b), _) => Ok(Some(b)),
        (None, h) => Ok(h.map(str::to_string)),
    }
}

/// What a session's template gives its settings: the opening and the question wrappings,
/// tokenized.
pub struct TemplateTokens {
    opening: Vec<u32>,
    wraps: layout::Wraps,
    chat_data_prefix: Vec<u32>,
    ready_suffix: Vec<u32>,
}

impl TemplateTokens {
    /// Render and tokenize the template around `prompt` (CPU work: off the async workers).
    pub async fn build(state: &SharedState, prompt: Option<&str>) -> Result<Self, ApiError> {
        let (st, prompt) = (state.clone(), prompt.map(str::to_string));
        crate::cpu_jobs::check_length(state, prompt.as_deref().map_or(0, str::len), "prompt")?;
        crate::cpu_jobs::run(state, move || {
            let text = layout::opening(&st, prompt.as_deref())?;
            let wraps = layout::Wraps::build(&st, prompt.as_deref())?;
            let encode = |t: &str| {
                (st.tokenizer.encode(t, false)).map_err(|e| {
                    ApiError::invalid("prompt", format!("could not tokenize the prompt: {e}"))
                })
            };
            Ok(TemplateTokens {
                opening: encode(&text)?,
                chat_data_prefix: encode(&layout::data_prefix(&st, super::state::Layout::Chat)?)?,
                ready_suffix: encode(&wraps.data.after)?,
                wraps,
            })
        })
        .await
    }

    /// The settings of a session created with `p`.
    pub fn settings(self, p: SessionParams) -> SessionSettings {
        SessionSettings {
            params: p,
            wraps: self.wraps,
            opening: self.opening,
            chat_data_prefix: self.chat_data_prefix,
            ready_suffix: self.ready_suffix,
        }
    }
}

async fn create_inner(
    state: &SharedState,
    headers: &axum::http::HeaderMap,
    body: Body,
) -> Result<Value, ApiError> {
    let mut req: CreateRequest = parse_body(body, Flavor::OpenAi)?;
    req.id = chosen_id(headers, req.id.take())?;
    let tokens = TemplateTokens::build(state, req.prompt.as_deref()).await?;
    let opening = &tokens.opening;
    let room = state
        .max_model_len
        .saturating_sub(opening.len() + ingest::QUESTION_ROOM.min(state.max_model_len / 4));
    let window = match req.window {
        None => None,
        Some(w) if w >= 1 && (w as usize) <= room => Some(w as usize),
        Some(w) => {
            return Err(ApiError::invalid(
                "window",
                format!("`window` must be between 1 and {room} tokens (the context, {} tokens, minus the opening and room for a question), got {w}", state.max_model_len),
            ))
        }
    };
    let evict_to = match (req.evict_to, window) {
        (None, None) => None,
        // Amortized by default: a recompute of the retained half buys room for the other half.
        (None, Some(w)) => Some(w / 2),
        (Some(_), None) => {
            return Err(ApiError::invalid("evict_to", "`evict_to` needs a `window`"))
        }
        (Some(e), Some(w)) if e >= 0 && (e as usize) <= w => Some(e as usize),
        (Some(e), Some(w)) => {
            return Err(ApiError::invalid(
                "evict_to",
                format!("`evict_to` must be between 0 and the window ({w}), got {e}"),
            ))
        }
    };
    if room == 0 {
        return Err(ApiError::context_length(opening.len(), state.max_model_len));
    }
    if req.window_mode.is_some() && window.is_none() {
        return Err(ApiError::invalid(
            "window_mode",
            "`window_mode` needs a `window`",
        ));
    }
    let params = SessionParams {
        window,
        evict_to,
        window_mode: req.window_mode.unwrap_or_default(),
        pre_decode: req.pre_decode.unwrap_or(false),
        prompt: req.prompt,
        overflow: req.overflow.unwrap_or(Overflow::DropOldest),
        max_pending: bounded(
            "max_pending",
            req.max_pending,
            DEFAULT_MAX_PENDING,
            MAX_PENDING_LIMIT,
        )?,
        max_pending_bytes: bounded(
            "max_pending_bytes",
            req.max_pending_bytes,
            DEFAULT_MAX_PENDING_BYTES,
            state.sessions.budget.max,
        )?,
    };
    let (s, durable) = state
        .sessions
        .create(state, req.id, tokens.settings(params))?;
    durable.wait().await?;
    s.describe(false).await
}

pub async fn list(State(state): State<SharedState>) -> Response {
    let mut data = Vec::new();
    for s in state.sessions.list() {
        // One deleted meanwhile is no longer listed.
        if let Ok(v) = s.describe(false).await {
            data.push(v);
        }
    }
    Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

pub async fn get(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    let r = async { state.sessions.peek(&id)?.describe(true).await }.await;
    respond(&state, r)
}

pub async fn delete(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    let r = state
        .sessions
        .delete(&state, &id)
        .await
        .map(|()| serde_json::json!({"id": id, "object": "session.deleted", "deleted": true}));
    respond(&state, r)
}

#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "expected a string or a non-empty array of strings"
)]
pub enum PushData {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PushRequest {
    data: PushData,
    /// Vigil: answer once the entries are KV-resident (or dropped), not at once.
    wait: Option<bool>,
    /// Seconds `wait` waits at most (default 30).
    wait_timeout: Option<f64>,
}

/// Longest a push may wait for its entries (`wait_timeout`).
const MAX_PUSH_WAIT_S: f64 = 600.0;

/// The entries of a push body (`data` is a string or a non-empty list of strings).
pub fn push_entries(data: PushData) -> Result<Vec<String>, ApiError> {
    match data {
        PushData::One(s) => Ok(vec![s]),
        PushData::Many(v) if v.is_empty() => Err(ApiError::invalid(
            "data",
            "`data` must be a string or a non-empty list of strings",
        )),
        PushData::Many(v) => Ok(v),
    }
}

pub async fn push(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    body: Body,
) -> Response {
    let r = async {
        let session = state.sessions.get(&id)?;
        let req: PushRequest = parse_body(body, Flavor::OpenAi)?;
        let wait = push_wait(&req)?;
        let entries = ingest::tokenize_entries(&state, push_entries(req.data)?).await?;
        let ack = session.push(entries).await?;
        match wait {
            Some(timeout) => wait_resident(&session, ack, timeout).await,
            None => Ok(ack),
        }
    }
    .await;
    respond(&state, r)
}

/// How long a push waits for its entries, if it waits.
fn push_wait(req: &PushRequest) -> Result<Option<std::time::Duration>, ApiError> {
    if req.wait != Some(true) {
        if req.wait_timeout.is_some() {
            return Err(ApiError::invalid(
                "wait_timeout",
                "`wait_timeout` needs `wait: true`",
            ));
        }
        return Ok(None);
    }
    let s = req.wait_timeout.unwrap_or(30.0);
    if !(s.is_finite() && s > 0.0 && s <= MAX_PUSH_WAIT_S) {
        return Err(ApiError::invalid(
            "wait_timeout",
            format!(
                "`wait_timeout` must be a number of seconds above 0 and at most {MAX_PUSH_WAIT_S}"
            ),
        ));
    }
    Ok(Some(std::time::Duration::from_secs_f64(s)))
}

/// The ack of a waiting push once its entries settled (ingested or dropped, in push order):
/// `resident` says whether every one of them is in the KV. It is false when the timeout came
/// first, when this push's own overflow dropped some of them, or when any entry was dropped
/// while it waited (counts cannot tell whose). `data_version`, `pending` and `total_dropped`
/// are the session's at that moment.
async fn wait_resident(
    session: &Session,
    mut ack: Value,
    timeout: std::time::Duration,
) -> Result<Value, ApiError> {
    let n = |k: &str| ack[k].as_u64().unwrap_or(0);
    let (target, dropped_before) = (n("total_pushed"), n("total_dropped"));
    let own_kept = n("pending") >= n("pushed");
    let p = session
        .wait_progress(timeout, |p| p.total_ingested + p.total_dropped >= target)
        .await
        .ok_or_else(|| ApiError::not_found(format!("session `{}` was deleted", session.id)))?;
    let settled = p.total_ingested + p.total_dropped >= target;
    ack["resident"] = json!(settled && own_kept && p.total_dropped == dropped_before);
    ack["data_version"] = json!(p.data_version);
    ack["total_dropped"] = json!(p.total_dropped);
    ack["pending"] = json!(p.pending);
    Ok(ack)
}

/// Vigil: the retained entries, in order (what the session's KV holds as data).
pub async fn data(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    let r = async { state.sessions.peek(&id)?.data().await }.await;
    respond(&state, r)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FlashRequest {
    query: String,
    max_tokens: Option<i64>,
}

pub async fn add_flash(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    body: Body,
) -> Response {
    let r = async {
        let session = state.sessions.get(&id)?;
        let req: FlashRequest = parse_body(body, Flavor::OpenAi)?;
        if req.query.trim().is_empty() {
            return Err(ApiError::invalid("query", "`query` must not be empty"));
        }
        let max_tokens = req
            .max_tokens
            .unwrap_or(DEFAULT_FLASH_MAX_TOKENS as i64)
            .clamp(1, 256) as usize;
        let (tokens, wrapped) = flash_fits(&state, &session.settings, &req.query).await?;
        let spec = FlashSpec {
            query: req.query,
            max_tokens,
            tokens,
            wrapped,
        };
        session.add_flash(spec).await
    }
    .await;
    respond(&state, r)
}

/// The query's own token count and its wrapped tokens at each layout, after checking that it
/// can be answered at all: the opening, the question's wrapping and the query must leave room
/// for one generated token even on empty data (else 400 `context_length_exceeded` naming
/// `query`). Tokenized off the async workers.
pub async fn flash_fits(
    state: &SharedState,
    settings: &SessionSettings,
    query: &str,
) -> Result<(usize, Wrapped), ApiError> {
    let wraps = settings.wraps.clone();
    let (tokenizer, query) = (state.tokenizer.clone(), query.to_string());
    crate::cpu_jobs::check_length(state, query.len(), "query")?;
    let (own, wrapped) = crate::cpu_jobs::run(state, move || {
        let bad = |e: vigil_model::ModelError| {
            ApiError::invalid("query", format!("could not tokenize the query: {e}"))
        };
        let own = tokenizer.encode(&query, false).map_err(bad)?.len();
        let wrap = |w: &layout::QuestionText| {
            let text = format!("{}{query}{}", w.before, w.after);
            tokenizer.encode(&text, false).map_err(bad)
        };
        let wrapped = Wrapped {
            data: wrap(&wraps.data)?,
            chat: wrap(&wraps.chat)?,
        };
        Ok((own, wrapped))
    })
    .await?;
    let needed = settings.opening.len() + wrapped.data.len();
    if needed >= state.max_model_len {
        return Err(ApiError::too_long(
            "query",
            format!(
                "the flash query cannot be answered: the opening and the query take {needed} tokens, and this model's context is {} tokens (one more is needed for the answer, before any data)",
                state.max_model_len
            ),
        ));
    }
    Ok((own, wrapped))
}

pub async fn list_flash(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    let r = async { state.sessions.get(&id)?.list_flash().await }.await;
    respond(&state, r)
}

pub async fn delete_flash(
    State(state): State<SharedState>,
    Path((id, fid)): Path<(String, String)>,
) -> Response {
    let r = async {
        let session = state.sessions.get(&id)?;
        let not_found =
            || ApiError::not_found(format!("flash query `{fid}` not found on session `{id}`"));
        let fid_n: u64 = fid.parse().map_err(|_| not_found())?;
        session.delete_flash(fid_n).await
    }
    .await;
    respond(&state, r)
}
