//! `POST /v1/completions`: a raw prompt (text or token ids) continued as-is.

use super::params::{max_tokens, sampling_params, stop_strings};
use super::types::{CompletionRequest, PromptField};
use crate::error::{ApiError, Flavor};
use crate::extract::parse_body;
use crate::generate::{self, Finish, GenEvent, GenParams, TokenInfo, Usage};
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
    let logprobs = req.logprobs;
    if logprobs.is_some_and(|n| n > MAX_LOGPROBS) {
        return Err(ApiError::invalid("logprobs", "must be in [0, 20]"));
    }
    let echo = req.echo == Some(true);
    let prompt_logprobs = req.prompt_logprobs;
    if prompt_logprobs.is_some_and(|n| n > MAX_LOGPROBS) {
        return Err(ApiError::invalid("prompt_logprobs", "must be in [0, 20]"));
    }
    let score_prompt = echo || prompt_logprobs.is_some();
    let scoring_field = if echo { "echo" } else { "prompt_logprobs" };
    if score_prompt && req.stream == Some(true) {
        return Err(ApiError::invalid(
            scoring_field,
            "prompt scores are not streamed: ask without `stream`",
        ));
    }
    if score_prompt && req.stop.is_some() {
        return Err(ApiError::invalid(
            scoring_field,
            "prompt scores cannot be combined with `stop` strings",
        ));
    }
    let vocab = state.tokenizer.vocab_size();
    // The sampler's top list serves both the completion's and the prompt's alternatives.
    let top = logprobs.max(prompt_logprobs);
    let sampling = sampling_params(&req.common(), vocab, top)?;
    super::params::check_speculative(&sampling, state.draft_model)?;
    let structured = req.structured().spec()?;
    let prompts = match req.prompt {
        PromptField::Text(t) => vec![encode(&state, t).await?],
        PromptField::TextBatch(v) => {
            let mut out = Vec::with_capacity(v.len());
            for t in v {
                out.push(encode(&state, t).await?);
            }
            out
        }
        PromptField::Tokens(ids) => vec![ids],
        PromptField::TokenBatch(v) => v,
    };
    if prompts.is_empty() || prompts.len() > MAX_PROMPTS {
        return Err(ApiError::invalid(
            "prompt",
            format!("give between 1 and {MAX_PROMPTS} prompts"),
        ));
    }
    for prompt in &prompts {
        if let Some(bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
            return Err(ApiError::invalid(
                "prompt",
                format!("token id {bad} is outside the vocabulary ({vocab} tokens)"),
            ));
        }
    }
    let n = req.n.unwrap_or(1) as usize;
    let stream_asked = req.stream.unwrap_or(false);
    let max_tokens = max_tokens(req.max_tokens, "max_tokens")?.or(Some(16));
    let stops = stop_strings(&req.stop, "stop")?;
    let include_usage = req.stream_options.as_ref().and_then(|o| o.include_usage) == Some(true);
    let id = crate::ids::new_id("cmpl-");
    let created = crate::ids::unix_now();
    // Choice `p * n + i` is prompt `p`'s `i`-th. A prompt's first choice starts alone; the
    // others start once its first token is out, so its prompt's KV blocks are in the prefix
    // cache and they share them instead of computing the prompt again.
    let mut choices = Vec::with_capacity(prompts.len() * n);
    for prompt in prompts {
        let scoring = score_prompt.then(|| Scoring {
            echo,
            logprobs,
            prompt_logprobs,
            first: prompt.first().copied().unwrap_or(0),
            text: state.tokenizer.decode(&prompt, false).unwrap_or_default(),
        });
        let scoring = std::sync::Arc::new(scoring);
        for i in 0..n {
            let grammar = match &structured {
                Some((field, spec)) => {
                    Some(crate::structured::compile(&state, field, spec.clone()).await?)
                }
                None => None,
            };
            let mut sampling = sampling.clone();
            sampling.seed = sampling.seed.map(|s| s.wrapping_add(i as u64));
            let (first_tx, first_rx) = tokio::sync::oneshot::channel();
            let rx = generate::start(
                &state,
                GenParams {
                    prompt: prompt.clone(),
                    sampling,
                    max_tokens,
                    stop_strings: stops.clone(),
                    ignore_eos: req.ignore_eos.unwrap_or(false),
                    want_token_text: logprobs.is_some(),
                    forced_call: None,
                    grammar,
                    score_prompt,
                    priority: vigil_engine::sequence::Priority::Foreground,
                    first_token: (i == 0 && n > 1).then_some(first_tx),
                    pin: None,
                    on_finish: None,
                },
            )?;
            if i == 0 && n > 1 {
                // Err: it ended or failed before a token; the others start anyway.
                let _ = first_rx.await;
            }
            choices.push((rx, scoring.clone(), i == 0));
        }
    }
    if stream_asked {
        let choices = (choices.into_iter())
            .map(|(rx, _, first_of_prompt)| (rx, first_of_prompt))
            .collect();
        return Ok(stream(state, choices, id, created, include_usage, logprobs));
    }
    let mut out = Vec::with_capacity(choices.len());
    let mut usage = Usage::default();
    for (index, (rx, scoring, first_of_prompt)) in choices.into_iter().enumerate() {
        let (mut choice, u) = collect(&state, rx, logprobs, scoring.as_ref().as_ref()).await?;
        choice["index"] = json!(index);
        out.push(choice);
        usage.add_choice(&u, first_of_prompt);
    }
    Ok(axum::Json(json!({
        "id": id, "object": "text_completion", "created": created,
        "model": state.model_id,
        "choices": out,
        "usage": usage_json(&usage),
    }))
    .into_response())
}

/// Most prompts one completions request may carry.
const MAX_PROMPTS: usize = 64;

async fn encode(state: &SharedState, text: String) -> Result<Vec<u32>, ApiError> {
    crate::cpu_jobs::encode(state, text, true, "prompt").await
}

fn finish_reason(f: &Finish) -> &'static str {
    match f {
        Finish::Eos | Finish::StopString(_) => "stop",
        Finish::Length { .. } => "length",
    }
}

/// The legacy completions logprobs shape, with `n` alternatives per token.
fn logprobs_json(tokens: &[TokenInfo], n: u32) -> Value {
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
            (t.top.iter().take(n as usize)).map(|(_, s, lp)| (s.clone(), json!(lp))).collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
        "text_offset": offsets,
    })
}

/// What a request that scores its prompt asked for, and the prompt's first token and text.
struct Scoring {
    echo: bool,
    logprobs: Option<u32>,
    prompt_logprobs: Option<u32>,
    first: u32,
    text: String,
}

/// `echo` with `logprobs`: the prompt's tokens come first, the first without a log-probability
/// (nothing precedes it), each list trimmed to the asked number of alternatives.
fn echo_logprobs_json(
    state: &SharedState,
    s: &Scoring,
    prompt: &[(TokenInfo, u32)],
    generated: &[TokenInfo],
) -> Value {
    let n = s.logprobs.unwrap_or(0) as usize;
    let first = state
        .tokenizer
        .decode(&[s.first], false)
        .unwrap_or_default();
    let rest = prompt.iter().map(|(t, _)| t).chain(generated);
    let mut texts = vec![first.clone()];
    let mut lps = vec![Value::Null];
    let mut tops = vec![Value::Null];
    for t in rest {
        texts.push(t.text.clone());
        lps.push(json!(t.logprob));
        let top: serde_json::Map<String, Value> = (t.top.iter().take(n))
            .map(|(_, s, lp)| (s.clone(), json!(lp)))
            .collect();
        tops.push(Value::Object(top));
    }
    let mut offset = 0;
    let offsets: Vec<usize> = (texts.iter())
        .map(|t| {
            let o = offset;
            offset += t.len();
            o
        })
        .collect();
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// vLLM's `prompt_logprobs`: `null` for the first token, then per position the prompt's token
/// and the top alternatives, each `{id: {logprob, rank, decoded_token}}`.
pub(crate) fn prompt_logprobs_json(k: u32, prompt: &[(TokenInfo, u32)]) -> Value {
    let mut out = vec![Value::Null];
    for (t, rank) in prompt {
        let mut m = serde_json::Map::new();
        for (i, (id, text, lp)) in t.top.iter().take(k as usize).enumerate() {
            m.insert(
                id.to_string(),
                json!({"logprob": lp, "rank": i + 1, "decoded_token": text}),
            );
        }
        m.insert(
            t.id.to_string(),
            json!({"logprob": t.logprob, "rank": rank, "decoded_token": t.text}),
        );
        out.push(Value::Object(m));
    }
    Value::Array(out)
}

/// One choice's generation, as the `choices` entry (without its `index`) and its usage.
async fn collect(
    state: &SharedState,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<GenEvent>,
    logprobs: Option<u32>,
    scoring: Option<&Scoring>,
) -> Result<(Value, Usage), ApiError> {
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
            GenEvent::Done {
                finish,
                usage,
                prompt,
            } => {
                let mut lp = match logprobs {
                    Some(n) => logprobs_json(&tokens, n),
                    None => Value::Null,
                };
                let mut choice = json!({});
                if let Some(s) = scoring {
                    if s.echo {
                        text = format!("{}{text}", s.text);
                        if logprobs.is_some() {
                            lp = echo_logprobs_json(state, s, &prompt, &tokens);
                        }
                    }
                    if let Some(k) = s.prompt_logprobs {
                        choice["prompt_logprobs"] = prompt_logprobs_json(k, &prompt);
                    }
                }
                choice["text"] = json!(text);
                choice["logprobs"] = lp;
                choice["finish_reason"] = json!(finish_reason(&finish));
                return Ok((choice, usage));
            }
        }
    }
    Err(ApiError::internal("generation ended without a result"))
}

/// The SSE response: every choice's chunks as they come, each with its `index`; the usage
/// chunk (each prompt counted once) and `[DONE]` after the last choice finishes.
fn stream(
    state: SharedState,
    choices: Vec<(tokio::sync::mpsc::UnboundedReceiver<GenEvent>, bool)>,
    id: String,
    created: u64,
    include_usage: bool,
    logprobs: Option<u32>,
) -> Response {
    let (tx, events) = tokio::sync::mpsc::unbounded_channel::<String>();
    let response = sse::data_stream(events, &state.closing);
    let n = choices.len();
    let (rxs, first_of_prompt): (Vec<_>, Vec<bool>) = choices.into_iter().unzip();
    let mut merged = generate::merge(rxs);
    tokio::spawn(async move {
        let chunk = |index: usize, text: &str, finish: Value, lp: Value| {
            let mut c = json!({
                "id": id, "object": "text_completion", "created": created, "model": state.model_id,
                "choices": [{"index": index, "text": text, "logprobs": lp, "finish_reason": finish}],
            });
            if include_usage {
                c["usage"] = Value::Null;
            }
            c.to_string()
        };
        let mut total = Usage::default();
        let mut finished = 0;
        while let Some((index, ev)) = merged.recv().await {
            match ev {
                GenEvent::Delta { text, tokens } => {
                    let lp = match logprobs {
                        Some(n) => logprobs_json(&tokens, n),
                        None => Value::Null,
                    };
                    if tx.send(chunk(index, &text, Value::Null, lp)).is_err() {
                        return;
                    }
                }
                GenEvent::Failed(e) => {
                    let _ = tx.send(e.body().to_string());
                    let _ = tx.send("[DONE]".into());
                    return;
                }
                GenEvent::Done { finish, usage, .. } => {
                    let finish = json!(finish_reason(&finish));
                    let _ = tx.send(chunk(index, "", finish, Value::Null));
                    total.add_choice(&usage, first_of_prompt[index]);
                    finished += 1;
                    if finished < n {
                        continue;
                    }
                    if include_usage {
                        let _ = tx.send(
                            json!({"id": id, "object": "text_completion", "created": created,
                                "model": state.model_id, "choices": [], "usage": usage_json(&total)})
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
