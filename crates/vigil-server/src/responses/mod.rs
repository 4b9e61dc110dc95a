//! OpenAI's Responses API: `POST /v1/responses` (text or items in, output items out, streamed
//! as typed events), and the stored responses `previous_response_id` continues
//! (`GET`/`DELETE /v1/responses/{id}`, `GET …/input_items`).
//!
//! A request runs as a chat request (`convert.rs`), so validation, templates, tools, structured
//! outputs and sampling are the chat path's. A stored response keeps its conversation and a KV
//! pin for its chain (`store.rs`): a continuation computes only its new input.

pub mod convert;
pub mod output;
pub mod store;
pub mod stream;
pub mod types;

use crate::error::{ApiError, Flavor};
use crate::extract::parse_body;
use crate::openai::chat::{self, Started};
use crate::routes::error_response;
use crate::state::SharedState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use output::{Echo, Produced};
use serde_json::{json, Value};
use store::{ChainHold, StoredResponse};
use stream::Reader;
use types::ResponsesRequest;
use vigil_engine::pins::{PinKey, PinSave, PinUse};

pub async fn create(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match handle(state.clone(), headers, body).await {
        Ok(r) => r,
        Err(e) => error_response(&state, e),
    }
}

/// What is kept of a finished response when it is stored.
struct Keep {
    store: bool,
    pin: Option<PinKey>,
    /// Held until the response is stored, so the chain's pin outlives the request.
    _hold: Option<ChainHold>,
    input_items: Vec<Value>,
    /// The conversation before this response's output (without `instructions`).
    conversation: Vec<Value>,
    max_tool_calls: Option<u32>,
}

async fn handle(
    state: SharedState,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ResponsesRequest = parse_body(body, Flavor::OpenAi)?;
    refuse_unsupported(&req)?;
    let session = crate::session::turn::session_of(&state, &headers)?;
    let previous = match &req.previous_response_id {
        Some(id) => Some(state.responses.get(id).await.ok_or_else(|| {
            ApiError::not_found(format!(
                "no stored response `{id}` (stored responses are kept {} s, in memory)",
                state.responses.ttl().as_secs()
            ))
            .with_param("previous_response_id")
        })?),
        None => None,
    };
    let input = convert::input(req.input.as_ref())?;
    let mut conversation = previous
        .as_ref()
        .map(|p| p.conversation.clone())
        .unwrap_or_default();
    conversation.extend(input.messages);
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(text) = &req.instructions {
        messages.push(json!({"role": "system", "content": text}));
    }
    messages.extend(conversation.iter().cloned());
    let chat_req = convert::chat_request(&req, messages)?;
    // A session turn runs on the session's KV and is not stored (its history is the session's).
    let store = req.store.unwrap_or(true) && state.responses.enabled() && session.is_none();
    let pin = match &previous {
        Some(p) => Some(p.pin),
        None if store => Some(state.responses.new_chain_pin()),
        None => None,
    };
    let hold = pin.map(|p| state.responses.hold(p));
    let pin_use = pin.map(|key| PinUse {
        key,
        save: store.then_some(PinSave::All),
        save_on_abort: false,
    });
    let Started { rxs, plan } = chat::start(&state, &chat_req, session.as_ref(), pin_use)
        .await
        .map_err(convert::rename_param)?;
    let Some(rx) = rxs.into_iter().next() else {
        return Err(ApiError::internal("no generation was started"));
    };
    let id = crate::ids::new_id("resp");
    let created = crate::ids::unix_now();
    let echo = Echo::new(&req, store);
    let keep = Keep {
        store,
        pin,
        _hold: hold,
        input_items: with_ids(input.items),
        conversation,
        max_tool_calls: req.max_tool_calls,
    };
    if !plan.stream {
        let mut reader = Reader::new(&plan, None);
        let Some((output, produced, usage)) = reader.read(&state, rx, keep.max_tool_calls).await?
        else {
            return Err(ApiError::internal("generation ended without a result"));
        };
        let body = finish(&state, &echo, &id, created, output, produced, usage, keep).await;
        return Ok(axum::Json(body).into_response());
    }
    let (tx, events) = tokio::sync::mpsc::unbounded_channel::<String>();
    let response = crate::sse::responses_event_stream(events, &state.closing);
    tokio::spawn(async move {
        let mut reader = Reader::new(&plan, Some(tx));
        let opening = echo.response(&id, created, &state.model_id, Vec::new(), None);
        reader.emit("response.created", json!({"response": opening}));
        reader.emit("response.in_progress", json!({"response": opening}));
        match reader.read(&state, rx, keep.max_tool_calls).await {
            Ok(Some((output, produced, usage))) => {
                let kind = if produced.cut {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                let body = finish(&state, &echo, &id, created, output, produced, usage, keep).await;
                reader.emit(kind, json!({"response": body}));
            }
            Ok(None) => {}
            Err(e) => {
                let err = e.body()["error"].clone();
                reader.emit(
                    "error",
                    json!({"code": err["code"], "message": err["message"], "param": err["param"]}),
                );
                let mut failed = echo.response(&id, created, &state.model_id, Vec::new(), None);
                failed["status"] = json!("failed");
                failed["error"] = json!({"code": err["code"], "message": err["message"]});
                reader.emit("response.failed", json!({"response": failed}));
            }
        }
    });
    Ok(response)
}

fn refuse_unsupported(req: &ResponsesRequest) -> Result<(), ApiError> {
    if req.background == Some(true) {
        return Err(ApiError::invalid(
            "background",
            "background responses are not supported: the response is returned (or streamed) on this request",
        ));
    }
    if req.conversation.is_some() {
        return Err(ApiError::invalid(
            "conversation",
            "the Conversations API is not served: continue with `previous_response_id`",
        ));
    }
    if req.prompt.is_some() {
        return Err(ApiError::invalid(
            "prompt",
            "prompt templates are not supported: send `instructions` and `input`",
        ));
    }
    if let Some(t) = req.truncation.as_deref() {
        if t != "disabled" && t != "auto" {
            return Err(ApiError::invalid(
                "truncation",
                format!("unknown value `{t}` (disabled, auto)"),
            ));
        }
    }
    if req.max_tool_calls == Some(0) {
        return Err(ApiError::invalid("max_tool_calls", "must be at least 1"));
    }
    Ok(())
}

/// Input items as stored: each with an id, as `input_items` lists them.
fn with_ids(items: Vec<Value>) -> Vec<Value> {
    items
        .into_iter()
        .map(|mut item| {
            if item.get("id").is_none() {
                let prefix = match item["type"].as_str() {
                    Some("function_call") => "fc",
                    Some("function_call_output") => "fco",
                    Some("reasoning") => "rs",
                    _ => "msg",
                };
                item["id"] = json!(crate::ids::new_id(prefix));
                if item.get("type").is_none() {
                    item["type"] = json!("message");
                }
            }
            item
        })
        .collect()
}

/// The finished Response object; stored when asked (before the chain's hold is released).
#[allow(clippy::too_many_arguments)]
async fn finish(
    state: &SharedState,
    echo: &Echo,
    id: &str,
    created: u64,
    output: Vec<Value>,
    produced: Produced,
    usage: crate::generate::Usage,
    keep: Keep,
) -> Value {
    let reasoning_tokens = if produced.reasoning.is_empty() {
        0
    } else {
        crate::cpu_jobs::encode(state, produced.reasoning.clone(), false, "reasoning")
            .await
            .map_or(0, |ids| ids.len())
    };
    let usage = output::usage_json(&usage, reasoning_tokens);
    let body = echo.response(
        id,
        created,
        &state.model_id,
        output,
        Some((&produced, usage)),
    );
    if let (true, Some(pin)) = (keep.store, keep.pin) {
        let mut conversation = keep.conversation;
        conversation.push(output::assistant_message(&produced));
        state.responses.put(
            id.to_string(),
            StoredResponse {
                response: body.clone(),
                input_items: keep.input_items,
                conversation,
                pin,
            },
        );
    }
    body
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("no stored response `{id}`"))
}

pub async fn retrieve(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id).await {
        Some(r) => axum::Json(r.response.clone()).into_response(),
        None => error_response(&state, not_found(&id)),
    }
}

pub async fn delete(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    if state.responses.delete(&id).await {
        axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
    } else {
        error_response(&state, not_found(&id))
    }
}

pub async fn input_items(State(state): State<SharedState>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id).await {
        Some(r) => axum::Json(json!({
            "object": "list",
            "data": r.input_items,
            "first_id": r.input_items.first().map(|i| i["id"].clone()),
            "last_id": r.input_items.last().map(|i| i["id"].clone()),
            "has_more": false,
        }))
        .into_response(),
        None => error_response(&state, not_found(&id)),
    }
}
