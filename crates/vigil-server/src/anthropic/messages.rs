//! `POST /v1/messages` and `/v1/messages/count_tokens`: Anthropic's shape over the same
//! generation path as chat completions. Streams use dialect B: `message_start`, blocks
//! (thinking, text, one per tool call), `message_delta`, `message_stop`.

use super::convert::{convert, Converted};
use super::types::MessagesRequest;
use crate::error::{ApiError, Flavor};
use crate::extract::parse_body;
use crate::generate::{self, Finish, GenEvent, GenParams, Usage};
use crate::openai::messages::ToolMode;
use crate::openai::params::{sampling_params, stop_strings};
use crate::openai::types::{CommonParams, StopField};
use crate::output::{CollectedText, OutDelta, OutputParser, ToolCall};
use crate::prompt::{render_chat, ChatPrompt, ChatPromptSpec};
use crate::sse;
use crate::state::SharedState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

pub async fn messages(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match handle(state.clone(), headers, body).await {
        Ok(r) => r,
        Err(e) => crate::routes::error_response(&state, e.with_flavor(Flavor::Anthropic)),
    }
}

pub async fn count_tokens(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let req: MessagesRequest = parse_body(body, Flavor::Anthropic)?;
        let conv = convert(&req)?;
        let (prompt, _) = build_prompt(&state, &conv).await?;
        Ok::<_, ApiError>(axum::Json(json!({"input_tokens": prompt.ids.len()})).into_response())
    }
    .await;
    result
        .unwrap_or_else(|e| crate::routes::error_response(&state, e.with_flavor(Flavor::Anthropic)))
}

async fn build_prompt(
    state: &SharedState,
    conv: &Converted,
) -> Result<(ChatPrompt, Option<vigil_model::tool_parser::ToolCallFormat>), ApiError> {
    let mut kwargs = Map::new();
    let forced = matches!(conv.mode, ToolMode::Required | ToolMode::Named(_));
    if state.supports_thinking {
        let on = conv.thinking.unwrap_or(false) && !forced;
        kwargs.insert("enable_thinking".into(), Value::Bool(on));
    }
    let tool_format = if conv.tools.is_some() {
        state.tool_format
    } else {
        None
    };
    let forced = if forced {
        if state.tool_format.is_none() {
            return Err(ApiError::invalid(
                "tool_choice",
                "this model's chat template has no tool-call format, so a call cannot be forced",
            ));
        }
        let name = match &conv.mode {
            ToolMode::Named(n) => Some(n.clone()),
            _ => None,
        };
        Some(crate::output::ForcedCall::new(name, conv.tools.as_ref()))
    } else {
        None
    };
    let prompt = render_chat(
        state,
        ChatPromptSpec {
            messages: &conv.messages,
            tools: conv.tools.as_ref(),
            kwargs,
            // A trailing assistant message is a prefill: the reply continues it.
            continue_final: forced.is_none()
                && crate::prompt::final_assistant_text(&conv.messages).is_some(),
            forced,
        },
    )
    .await?;
    Ok((prompt, tool_format))
}

async fn handle(
    state: SharedState,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: MessagesRequest = parse_body(body, Flavor::Anthropic)?;
    let session = crate::session::turn::session_of(&state, &headers)?;
    let Some(max_tokens) = req.max_tokens else {
        return Err(ApiError::invalid("max_tokens", "`max_tokens` is required"));
    };
    if max_tokens == 0 {
        return Err(ApiError::invalid("max_tokens", "must be at least 1"));
    }
    let conv = convert(&req)?;
    let common = CommonParams {
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        seed: req.seed,
        ignore_eos: req.ignore_eos,
        stop: req.stop_sequences.clone().map(StopField::Many),
        ..CommonParams::default()
    };
    let sampling = sampling_params(&common, state.tokenizer.vocab_size(), None)?;
    let stops = stop_strings(&common.stop, "stop_sequences")?;
    let (prompt, tool_format) = build_prompt(&state, &conv).await?;
    let grammar = match &prompt.forced {
        Some(call) => Some(crate::structured::compile_forced(&state, "tools", call).await?),
        None => None,
    };
    let thinking = state.supports_thinking.then_some(prompt.starts_in_thinking);
    let parser = OutputParser::new(thinking, tool_format, prompt.forced.as_ref());
    let num_prompt = prompt.ids.len();
    let (pin, on_finish) = crate::session::turn::begin_if(session.as_ref(), &prompt.ids).await?;
    let rx = generate::start(
        &state,
        GenParams {
            prompt: prompt.ids,
            sampling,
            max_tokens: Some(usize::try_from(max_tokens).unwrap_or(usize::MAX)),
            stop_strings: stops,
            ignore_eos: req.ignore_eos.unwrap_or(false),
            want_token_text: false,
            forced_call: prompt.forced.clone(),
            grammar,
            score_prompt: false,
            priority: vigil_engine::sequence::Priority::Foreground,
            first_token: None,
            pin,
            on_finish,
        },
    )
    .map_err(|e| {
        if e.code == Some("context_length_exceeded") {
            ApiError::invalid(
                "messages",
                format!(
                    "prompt is too long: {num_prompt} tokens > {} maximum",
                    state.max_model_len.saturating_sub(1)
                ),
            )
        } else {
            e
        }
    })?;
    let id = crate::ids::new_id("msg");
    if req.stream.unwrap_or(false) {
        Ok(stream(state, rx, parser, conv.parallel, id, num_prompt))
    } else {
        whole(state, rx, parser, conv.parallel, id).await
    }
}

/// Cut by `max_tokens` wins over `tool_use`: a cut call must never read as a finished one.
fn stop_reason(finish: &Finish, has_calls: bool) -> (&'static str, Value) {
    if has_calls && !matches!(finish, Finish::Length { .. }) {
        return ("tool_use", Value::Null);
    }
    match finish {
        Finish::Eos => ("end_turn", Value::Null),
        Finish::StopString(s) => ("stop_sequence", json!(s)),
        Finish::Length { context_full: true } => ("model_context_window_exceeded", Value::Null),
        Finish::Length {
            context_full: false,
        } => ("max_tokens", Value::Null),
    }
}

fn usage_json(u: &Usage) -> Value {
    let mut v = json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "output_tokens": u.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached_tokens,
    });
    if u.cached_tokens > 0 {
        v["prefix_cached_tokens"] = json!(u.cached_tokens);
    }
    v
}

fn tool_use_block(c: &ToolCall) -> Value {
    let input = c.arguments.clone().into_value();
    json!({"type": "tool_use", "id": c.id.replace("call_", "toolu_"), "name": c.name, "input": input})
}

async fn whole(
    state: SharedState,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<GenEvent>,
    mut parser: OutputParser,
    parallel: bool,
    id: String,
) -> Result<Response, ApiError> {
    let mut collected = CollectedText::default();
    while let Some(ev) = rx.recv().await {
        match ev {
            GenEvent::Delta { text: t, .. } => collected.push(parser.push(&t)),
            GenEvent::Failed(e) => return Err(e),
            GenEvent::Done { finish, usage, .. } => {
                let (rest, mut calls) = parser.finish();
                collected.push(rest);
                let CollectedText {
                    content: text,
                    reasoning: thinking,
                } = collected;
                if !parallel {
                    calls.truncate(1);
                }
                crate::openai::chat::count_malformed(&state, &calls);
                let mut content = Vec::new();
                if !thinking.is_empty() {
                    content.push(json!({"type": "thinking", "thinking": thinking, "signature": signature(&id)}));
                }
                if !text.is_empty() || (calls.is_empty() && thinking.is_empty()) {
                    content.push(json!({"type": "text", "text": text}));
                }
                content.extend(calls.iter().map(tool_use_block));
                let (reason, seq) = stop_reason(&finish, !calls.is_empty());
                return Ok(axum::Json(json!({
                    "id": id, "type": "message", "role": "assistant", "model": state.model_id,
                    "content": content, "stop_reason": reason, "stop_sequence": seq,
                    "usage": usage_json(&usage),
                }))
                .into_response());
            }
        }
    }
    Err(ApiError::internal("generation ended without a result"))
}

/// Thinking signatures are opaque to clients and never checked on the way back in.
fn signature(id: &str) -> String {
    format!("vigil-{id}")
}

/// Tracks which content block is open so deltas land in the right one.
#[derive(PartialEq)]
enum Open {
    None,
    Thinking(usize),
    Text(usize),
}

fn stream(
    state: SharedState,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<GenEvent>,
    mut parser: OutputParser,
    parallel: bool,
    id: String,
    num_prompt: usize,
) -> Response {
    let (tx, events) = tokio::sync::mpsc::unbounded_channel::<String>();
    let response = sse::event_stream(events, &state.closing);
    tokio::spawn(async move {
        let send = |name: &str, mut payload: Value| -> bool {
            payload["type"] = json!(name);
            tx.send(format!("{name}\n{payload}")).is_ok()
        };
        let start = json!({"message": {
            "id": id, "type": "message", "role": "assistant", "model": state.model_id,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": num_prompt, "output_tokens": 0,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }});
        if !send("message_start", start) {
            return;
        }
        let mut open = Open::None;
        let mut next_index = 0usize;
        let close = |open: &mut Open, send: &dyn Fn(&str, Value) -> bool| {
            match *open {
                Open::Thinking(i) => {
                    send(
                        "content_block_delta",
                        json!({"index": i, "delta": {"type": "signature_delta", "signature": signature(&id)}}),
                    );
                    send("content_block_stop", json!({"index": i}));
                }
                Open::Text(i) => {
                    send("content_block_stop", json!({"index": i}));
                }
                Open::None => {}
            }
            *open = Open::None;
        };
        let emit = |deltas: Vec<OutDelta>, open: &mut Open, next_index: &mut usize| -> bool {
            for d in deltas {
                let ok = match d {
                    OutDelta::Reasoning(s) => {
                        if !matches!(open, Open::Thinking(_)) {
                            close(open, &send);
                            *open = Open::Thinking(*next_index);
                            send(
                                "content_block_start",
                                json!({"index": *next_index, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
                            );
                            *next_index += 1;
                        }
                        let Open::Thinking(i) = *open else { continue };
                        send(
                            "content_block_delta",
                            json!({"index": i, "delta": {"type": "thinking_delta", "thinking": s}}),
                        )
                    }
                    OutDelta::Content(s) => {
                        if !matches!(open, Open::Text(_)) {
                            close(open, &send);
                            *open = Open::Text(*next_index);
                            send(
                                "content_block_start",
                                json!({"index": *next_index, "content_block": {"type": "text", "text": ""}}),
                            );
                            *next_index += 1;
                        }
                        let Open::Text(i) = *open else { continue };
                        send(
                            "content_block_delta",
                            json!({"index": i, "delta": {"type": "text_delta", "text": s}}),
                        )
                    }
                };
                if !ok {
                    return false;
                }
            }
            true
        };
        while let Some(ev) = rx.recv().await {
            match ev {
                GenEvent::Delta { text, .. } => {
                    if !emit(parser.push(&text), &mut open, &mut next_index) {
                        return;
                    }
                }
                GenEvent::Failed(e) => {
                    let body = e.with_flavor(Flavor::Anthropic).body();
                    let _ = tx.send(format!("error\n{body}"));
                    return;
                }
                GenEvent::Done { finish, usage, .. } => {
                    let (rest, mut calls) = parser.finish();
                    emit(rest, &mut open, &mut next_index);
                    if !parallel {
                        calls.truncate(1);
                    }
                    crate::openai::chat::count_malformed(&state, &calls);
                    close(&mut open, &send);
                    for c in &calls {
                        let mut block = tool_use_block(c);
                        let input = block["input"].take();
                        block["input"] = json!({});
                        send(
                            "content_block_start",
                            json!({"index": next_index, "content_block": block}),
                        );
                        let partial = match &input {
                            Value::String(raw) => raw.clone(),
                            v => v.to_string(),
                        };
                        send(
                            "content_block_delta",
                            json!({"index": next_index, "delta": {"type": "input_json_delta", "partial_json": partial}}),
                        );
                        send("content_block_stop", json!({"index": next_index}));
                        next_index += 1;
                    }
                    let (reason, seq) = stop_reason(&finish, !calls.is_empty());
                    send(
                        "message_delta",
                        json!({"delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": usage_json(&usage)}),
                    );
                    send("message_stop", json!({}));
                    return;
                }
            }
        }
    });
    response
}
