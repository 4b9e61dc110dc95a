//! `POST /v1/completions`: a raw prompt (text or token ids) continued as-is.

use super::params::{max_tokens, sampling_params, stop_strings};
use super::types::{CompletionRequest, PromptField};
use crate::error::{ApiError, Flavor};
use crate::extract::parse_body;
use crate::generate::{self, Finish, GenEvent, GenParams, TokenInfo};
use crate::openai::chat::usage_json;
use crate::sse;
use crate::state::SharedState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

const MAX_LOGPROBS: u32 = 20;

pub async fn completions(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match handle(state.clone(), headers, body).await {
        Ok(r) => r,
        Err(e) => crate::routes::error_response(&state, e),
    }
}

async fn handle(
    state: SharedState,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_body(body, Flavor::OpenAi)?;
    crate::routes::refuse_session_header(&headers)?;
    if req.suffix.is_some() {
        return Err(ApiError::invalid("suffix", "`suffix` is not supported"));
    }
    if req.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::invalid(
            "best_of",
            "only best_of = 1 is supported",
        ));
    }
    if req.echo == Some(true) {
        return Err(ApiError::invalid("echo", "`echo` is not supported"));
    }
    let logprobs = req.logprobs;
    if logprobs.is_some_and(|n| n > MAX_LOGPROBS) {
        return Err(ApiError::invalid("logprobs", "must be in [0, 20]"));
    }
    let vocab = state.tokenizer.vocab_size();
    let sampling = sampling_params(&req.common(), vocab, logprobs)?;
    let structured = req.structured().spec()?;
    let prompt = match req.prompt {
        PromptField::Text(t) => encode(&state, t).await?,
        PromptField::TextBatch(mut v) if v.len() == 1 => encode(&state, v.remove(0)).await?,
        PromptField::Tokens(ids) => ids,
        PromptField::TokenBatch(mut v) if v.len() == 1 => v.remove(0),
        _ => {
            return Err(ApiError::invalid(
                "prompt",
                "only one prompt per request is supported",
            ))
        }
    };
    if let Some(bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::invalid(
            "prompt",
            format!("token id {bad} is outside the vocabulary ({vocab} tokens)"),
        ));
    }
    let grammar = match structured {
        Some((field, spec)) => Some(crate::structured::compile(&state, field, spec).await?),
        None => None,
    };
    let rx = generate::start(
        &state,
        GenParams {
            prompt,
            sampling,
            max_tokens: max_tokens(req.max_tokens, "max_tokens")?.or(Some(16)),
            stop_strings: stop_strings(&req.stop, "stop")?,
            ignore_eos: req.ignore_eos.unwrap_or(false),
            want_token_text: logprobs.is_some(),
            forced_call: None,
            grammar,
            priority: vigil_engine::sequence::Priority::Foreground,
            pin: None,
            on_finish: None,
        },
    )?;
    let include_usage = req.stream_options.as_ref().and_then(|o| o.include_usage) == Some(true);
    let id = crate::ids::new_id("cmpl-");
    let created = crate::ids::unix_now();
    if req.stream.unwrap_or(false) {
        Ok(stream(
            state,
            rx,
            id,
            created,
            include_usage,
            logprobs.is_some(),
        ))
    } else {
        whole(state, rx, id, created, logprobs.is_some()).await
    }
}

async fn encode(state: &SharedState, text: String) -> Result<Vec<u32>, ApiError> {
    crate::cpu_jobs::encode(state, text, true, "prompt").await
}

fn finish_reason(f: &Finish) -> &'static str {
    match f {
        Finish::Eos | Finish::StopString(_) => "stop",
        Finish::Length { .. } => "length",
    }
}

/// The legacy completions logprobs shape.
fn logprobs_json(tokens: &[TokenInfo]) -> Value {
    let mut offset = 0;
    let mut offsets = Vec::new();
    for t in tokens {
        offsets.push(offset);
        offset += t.text.len();
    }
    json!({
        "tokens": tokens.iter().map(|t| t.text.clone()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": tokens.iter().map(|t| {
            t.top.iter().map(|(_, s, lp)| (s.clone(), json!(lp))).collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

async fn whole(
    state: SharedState,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<GenEvent>,
    id: String,
    created: u64,
    logprobs: bool,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            GenEvent::Delta {
                text: t,
                tokens: tk,
            } => {
                text.push_str(&t);
                tokens.extend(tk);
            }
            GenEvent::Failed(e) => return Err(e),
            GenEvent::Done { finish, usage } => {
                return Ok(axum::Json(json!({
                    "id": id, "object": "text_completion", "created": created,
                    "model": state.model_id,
                    "choices": [{
                        "index": 0, "text": text,
                        "logprobs": if logprobs { logprobs_json(&tokens) } else { Value::Null },
                        "finish_reason": finish_reason(&finish),
                    }],
                    "usage": usage_json(&usage),
                }))
                .into_response())
            }
        }
    }
    Err(ApiError::internal("generation ended without a result"))
}

fn stream(
    state: SharedState,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<GenEvent>,
    id: String,
    created: u64,
    include_usage: bool,
    logprobs: bool,
) -> Response {
    let (tx, events) = tokio::sync::mpsc::unbounded_channel::<String>();
    let response = sse::data_stream(events, &state.closing);
    tokio::spawn(async move {
        let chunk = |text: &str, finish: Value, lp: Value| {
            let mut c = json!({
                "id": id, "object": "text_completion", "created": created, "model": state.model_id,
                "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}],
            });
            if include_usage {
                c["usage"] = Value::Null;
            }
            c.to_string()
        };
        while let Some(ev) = rx.recv().await {
            match ev {
                GenEvent::Delta { text, tokens } => {
                    let lp = if logprobs {
                        logprobs_json(&tokens)
                    } else {
                        Value::Null
                    };
                    if tx.send(chunk(&text, Value::Null, lp)).is_err() {
                        return;
                    }
                }
                GenEvent::Failed(e) => {
                    let _ = tx.send(e.body().to_string());
                    let _ = tx.send("[DONE]".into());
                    return;
                }
                GenEvent::Done { finish, usage } => {
                    let _ = tx.send(chunk("", json!(finish_reason(&finish)), Value::Null));
                    if include_usage {
                        let _ = tx.send(
                            json!({"id": id, "object": "text_completion", "created": created,
                                "model": state.model_id, "choices": [], "usage": usage_json(&usage)})
                            .to_string(),
                        );
                    }
                    let _ = tx.send("[DONE]".into());
                    return;
                }
            }
        }
    });
    response
}
