//! `POST /v1/chat/completions`: render → generate → split reasoning and tool calls, as one
//! JSON reply or as SSE `chat.completion.chunk`s ending in `data: [DONE]`.

use super::messages::{template_messages, template_tools, tool_mode, ToolMode};
use super::params::{max_tokens, prediction_text, sampling_params, stop_strings, MAX_TOP_LOGPROBS};
use super::types::ChatCompletionRequest;
use crate::error::{ApiError, Flavor};
use crate::extract::parse_body;
use crate::generate::{self, Finish, GenEvent, GenParams, TokenInfo, Usage};
use crate::output::{CollectedText, OutDelta, OutputParser, ToolCall};
use crate::prompt::{render_chat_opening, template_kwargs, ChatPromptSpec};
use crate::sse;
use crate::state::SharedState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

pub async fn chat_completions(
    State(state): State<SharedState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match handle(state.clone(), headers, body).await {
        Ok(r) => r,
        Err(e) => crate::routes::error_response(&state, e),
    }
}

/// How a chat request's choices are read back: what the parser splits and what the reply lists.
pub(crate) struct Plan {
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) logprobs: bool,
    pub(crate) thinking: Option<bool>,
    pub(crate) tool_format: Option<vigil_model::tool_parser::ToolCallFormat>,
    pub(crate) forced: Option<crate::output::ForcedCall>,
    pub(crate) parallel_tool_calls: bool,
    pub(crate) include_reasoning: bool,
    /// The request sent a `prediction`: usage reports its accepted and rejected tokens.
    pub(crate) predicted: bool,
    /// `top_logprobs`: alternatives listed per generated token (the sampler may keep more for
    /// `prompt_logprobs`).
    pub(crate) top_logprobs: usize,
    /// vLLM's `prompt_logprobs`: the rendered prompt's scores, this many alternatives each.
    pub(crate) prompt_logprobs: Option<u32>,
}

/// A chat request's choices, started: one event stream per choice, and how to read them.
pub(crate) struct Started {
    pub(crate) rxs: Vec<tokio::sync::mpsc::UnboundedReceiver<GenEvent>>,
    pub(crate) plan: Plan,
}

async fn handle(
    state: SharedState,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = parse_body(body, Flavor::OpenAi)?;
    let session = crate::session::turn::session_of(&state, &headers)?;
    let Started { rxs, plan } = start(&state, &req, session.as_ref(), None).await?;
    let id = crate::ids::new_id("chatcmpl-");
    let created = crate::ids::unix_now();
    if plan.stream {
        return Ok(stream_response(state, rxs, plan, id, created));
    }
    if rxs.len() == 1 {
        let Some(rx) = rxs.into_iter().next() else {
            return Err(ApiError::internal("no choice was started"));
        };
        return whole_response(state, rx, plan, id, created).await;
    }
    let mut choices = Vec::with_capacity(rxs.len());
    let mut usage = Usage::default();
    for (index, rx) in rxs.into_iter().enumerate() {
        let (mut choice, u) = collect_choice(&state, rx, &plan).await?;
        choice["index"] = json!(index);
        choices.push(choice);
        usage.add_choice(&u, index == 0);
    }
    let body = json!({
        "id": id, "object": "chat.completion", "created": created,
        "model": state.model_id, "choices": choices, "usage": chat_usage(&usage, &plan),
    });
    Ok(axum::Json(body).into_response())
}

/// Validate and render a chat request and start its choices. A session turn runs on the
/// session's KV; otherwise `pin_use` (a stored response chain's, `/v1/responses`) may name
/// the KV the request starts from and saves to.
pub(crate) async fn start(
    state: &SharedState,
    req: &ChatCompletionRequest,
    session: Option<&std::sync::Arc<crate::session::handle::Session>>,
    pin_use: Option<vigil_engine::pins::PinUse>,
) -> Result<Started, ApiError> {
    let messages = template_messages(&req.messages)?;
    let mode = tool_mode(
        req.tool_choice.as_ref(),
        req.tools.as_deref(),
        "tool_choice",
    )?;
    let tools = match (&req.tools, &mode) {
        (Some(t), m) if !t.is_empty() && *m != ToolMode::None => Some(template_tools(t)?),
        _ => None,
    };
    let mut kwargs = template_kwargs(
        req.chat_template_kwargs.as_ref(),
        req.reasoning_effort.as_deref(),
        "chat_template_kwargs",
    )?;
    let thinking_asked = kwargs.get("enable_thinking").and_then(Value::as_bool);
    let forced = matches!(mode, ToolMode::Required | ToolMode::Named(_));
    let structured = req.structured().spec()?;
    if let Some((field, _)) = &structured {
        if forced {
            return Err(ApiError::invalid(
                *field,
                "cannot be combined with a forced tool call (`tool_choice`), which has its own constraint",
            ));
        }
        if thinking_asked == Some(true) {
            return Err(ApiError::invalid(
                *field,
                "cannot be combined with thinking (`enable_thinking`): the constraint would apply to the reasoning too",
            ));
        }
        if state.supports_thinking {
            kwargs.insert("enable_thinking".into(), Value::Bool(false));
        }
    }
    let tool_format = if tools.is_some() {
        state.tool_format
    } else {
        None
    };
    let mut forced_call = None;
    if forced {
        if state.tool_format.is_none() {
            return Err(ApiError::invalid(
                "tool_choice",
                "this model's chat template has no tool-call format, so a call cannot be forced",
            ));
        };
        if thinking_asked != Some(true) {
            if state.supports_thinking {
                kwargs.insert("enable_thinking".into(), Value::Bool(false));
            }
            let name = match &mode {
                ToolMode::Named(n) => Some(n.clone()),
                _ => None,
            };
            forced_call = Some(crate::output::ForcedCall::new(name, tools.as_ref()));
        }
    }
    let grammar = grammar_for(state, &structured, forced_call.as_ref()).await?;
    let logprobs = req.logprobs.unwrap_or(false);
    if let Some(n) = req.top_logprobs {
        if n > MAX_TOP_LOGPROBS {
            return Err(ApiError::invalid("top_logprobs", "must be in [0, 20]"));
        }
        if !logprobs {
            return Err(ApiError::invalid(
                "top_logprobs",
                "requires `logprobs: true`",
            ));
        }
    }
    if let Some(k) = req.prompt_logprobs {
        if k > MAX_TOP_LOGPROBS {
            return Err(ApiError::invalid("prompt_logprobs", "must be in [0, 20]"));
        }
        let refused = if req.stream == Some(true) {
            Some("prompt scores are not streamed: ask without `stream`")
        } else if req.stop.is_some() {
            Some("prompt scores cannot be combined with `stop` strings")
        } else if req.n.is_some_and(|n| n > 1) {
            Some("prompt scores are given for one choice: ask without `n`")
        } else if session.is_some() {
            Some("a session turn resumes its prompt from held KV, so its rows are not scored")
        } else {
            None
        };
        if let Some(why) = refused {
            return Err(ApiError::invalid("prompt_logprobs", why));
        }
    }
    // The sampler's top list serves both the completion's and the prompt's alternatives.
    let top = logprobs
        .then_some(req.top_logprobs.unwrap_or(0))
        .max(req.prompt_logprobs);
    let mut sampling = sampling_params(&req.common(), state.tokenizer.vocab_size(), top)?;
    super::params::check_speculative(&sampling, state.draft_model)?;
    if let Some(text) = prediction_text(req.prediction.as_ref())? {
        // A prediction is what speculative decoding drafts from: it turns it on for this
        // request unless the request turned it off.
        let ids = crate::cpu_jobs::encode(state, text, false, "prediction").await?;
        let spec = &mut sampling.speculative;
        spec.prediction = Some(std::sync::Arc::from(ids));
        spec.method
            .get_or_insert(vigil_engine::speculative::SpecMethod::Suffix);
    }
    let stop = stop_strings(&req.stop, "stop")?;
    let max_tokens = match req.max_tokens {
        Some(_) => max_tokens(req.max_tokens, "max_tokens")?,
        None => max_tokens(req.max_completion_tokens, "max_completion_tokens")?,
    };
    let continue_final = req.continue_final_message.unwrap_or(false);
    if continue_final && req.add_generation_prompt == Some(true) {
        return Err(ApiError::invalid(
            "add_generation_prompt",
            "must be false with `continue_final_message` (the final message is continued, no new turn is opened)",
        ));
    }
    if continue_final && forced_call.is_some() {
        return Err(ApiError::invalid(
            "continue_final_message",
            "cannot be combined with a forced tool call, whose opening ends the prompt",
        ));
    }
    let prompt = render_chat_opening(
        state,
        ChatPromptSpec {
            messages: &messages,
            tools: tools.as_ref(),
            kwargs,
            forced: forced_call.clone(),
            continue_final,
        },
        req.add_generation_prompt.unwrap_or(true),
    )
    .await?;
    let thinking = state.supports_thinking.then_some(prompt.starts_in_thinking);
    let plan = Plan {
        stream: req.stream.unwrap_or(false),
        include_usage: req.stream_options.as_ref().and_then(|o| o.include_usage) == Some(true),
        logprobs,
        thinking,
        tool_format,
        forced: forced_call,
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        include_reasoning: req.include_reasoning.unwrap_or(true),
        predicted: sampling.speculative.prediction.is_some(),
        top_logprobs: req.top_logprobs.unwrap_or(0) as usize,
        prompt_logprobs: req.prompt_logprobs,
    };
    let n = req.n.unwrap_or(1) as usize;
    if n > 1 && session.is_some() {
        return Err(ApiError::invalid("n", "a session turn has one choice"));
    }
    let (mut pin, on_finish) = crate::session::turn::begin_if(session, &prompt.ids).await?;
    if session.is_none() {
        pin = pin_use;
    }
    let (first_tx, first_rx) = tokio::sync::oneshot::channel();
    let ignore_eos = req.ignore_eos.unwrap_or(false);
    let params = |sampling, grammar, first_token| GenParams {
        prompt: prompt.ids.clone(),
        sampling,
        max_tokens,
        stop_strings: stop.clone(),
        ignore_eos,
        want_token_text: logprobs,
        forced_call: plan.forced.clone(),
        grammar,
        score_prompt: plan.prompt_logprobs.is_some(),
        priority: vigil_engine::sequence::Priority::Foreground,
        first_token,
        pin: None,
        on_finish: None,
    };
    let mut first = params(sampling.clone(), grammar, (n > 1).then_some(first_tx));
    (first.pin, first.on_finish) = (pin, on_finish);
    let mut rxs = vec![generate::start(state, first)?];
    if n > 1 {
        // The other choices start once the first one's prompt is computed: its full KV blocks
        // are then in the prefix cache, and they share them.
        let _ = first_rx.await;
        for i in 1..n {
            let mut s = sampling.clone();
            s.seed = s.seed.map(|seed| seed.wrapping_add(i as u64));
            let grammar = grammar_for(state, &structured, plan.forced.as_ref()).await?;
            rxs.push(generate::start(state, params(s, grammar, None))?);
        }
    }
    Ok(Started { rxs, plan })
}

/// The constraint of one choice: its structured output, or its forced call's.
async fn grammar_for(
    state: &SharedState,
    structured: &Option<(&'static str, vigil_engine::grammar::GrammarSpec)>,
    forced: Option<&crate::output::ForcedCall>,
) -> Result<Option<vigil_engine::grammar::GrammarConstraint>, ApiError> {
    Ok(match (structured, forced) {
        (Some((field, spec)), _) => {
            Some(crate::structured::compile(state, field, spec.clone()).await?)
        }
        (None, Some(call)) => Some(crate::structured::compile_forced(state, "tools", call).await?),
        (None, None) => None,
    })
}

/// Cut by `max_tokens` (or the context) is `length` even when the text holds tool calls: the
/// last one may be unfinished, and a cut call must never read as a finished one.
fn finish_reason(finish: &Finish, has_calls: bool) -> &'static str {
    match finish {
        Finish::Length { .. } => "length",
        _ if has_calls => "tool_calls",
        Finish::Eos | Finish::StopString(_) => "stop",
    }
}

pub(crate) fn usage_json(u: &Usage) -> Value {
    let mut details = json!({"cached_tokens": u.cached_tokens});
    if u.cached_tokens > 0 {
        details["prefix_cached_tokens"] = json!(u.cached_tokens);
    }
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": details,
    })
}

/// Chat usage. With a `prediction`, `completion_tokens_details` carries OpenAI's
/// predicted-output counts: the draft tokens the output kept and those it did not. Beside them
/// `reasoning_tokens`, which LayerScale's client requires wherever the details appear: 0 on a
/// model that does not think (exact), absent on one that does (not counted yet). Without a
/// prediction the details stay absent, as LayerScale's client expects of a model that does
/// not think; speculation's counts are in `/metrics`.
fn chat_usage(u: &Usage, plan: &Plan) -> Value {
    let mut usage = usage_json(u);
    if plan.predicted {
        let mut details = json!({
            "accepted_prediction_tokens": u.accepted_draft_tokens,
            "rejected_prediction_tokens": u.draft_tokens - u.accepted_draft_tokens,
        });
        if plan.thinking.is_none() {
            details["reasoning_tokens"] = json!(0);
        }
        usage["completion_tokens_details"] = details;
    }
    usage
}

/// The `logprobs.content` list, `n` alternatives per token.
pub(crate) fn logprobs_json(tokens: &[TokenInfo], n: usize) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            json!({
                "token": t.text,
                "logprob": t.logprob,
                "bytes": t.text.as_bytes(),
                "top_logprobs": t.top.iter().take(n).map(|(_, text, lp)| json!({
                    "token": text, "logprob": lp, "bytes": text.as_bytes(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "content": content })
}

fn tool_calls_json(calls: &[ToolCall]) -> Value {
    Value::Array(
        calls
            .iter()
            .map(|c| {
                json!({
                    "id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_string()},
                })
            })
            .collect(),
    )
}

fn limit_calls(mut calls: Vec<ToolCall>, plan: &Plan) -> Vec<ToolCall> {
    if !plan.parallel_tool_calls {
        calls.truncate(1);
    }
    calls
}

async fn whole_response(
    state: SharedState,
    rx: tokio::sync::mpsc::UnboundedReceiver<GenEvent>,
    plan: Plan,
    id: String,
    created: u64,
) -> Result<Response, ApiError> {
    let (mut choice, usage) = collect_choice(&state, rx, &plan).await?;
    choice["index"] = json!(0);
    let prompt_logprobs = choice
        .as_object_mut()
        .and_then(|c| c.remove("prompt_logprobs"));
    let mut body = json!({
        "id": id, "object": "chat.completion", "created": created,
        "model": state.model_id, "choices": [choice], "usage": chat_usage(&usage, &plan),
    });
    if let Some(p) = prompt_logprobs {
        body["prompt_logprobs"] = p;
    }
    Ok(axum::Json(body).into_response())
}

/// One choice's generation as its `choices` entry (without `index`), and its usage.
pub(crate) async fn collect_choice(
    state: &SharedState,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<GenEvent>,
    plan: &Plan,
) -> Result<(Value, Usage), ApiError> {
    let mut parser = OutputParser::new(plan.thinking, plan.tool_format, plan.forced.as_ref());
    let mut collected = CollectedText::default();
    let mut tokens = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            GenEvent::Delta { text, tokens: t } => {
                tokens.extend(t);
                collected.push(parser.push(&text));
            }
            GenEvent::Failed(e) => return Err(e),
            GenEvent::Done {
                finish,
                usage,
                prompt,
            } => {
                let (rest, calls) = parser.finish();
                collected.push(rest);
                let CollectedText { content, reasoning } = collected;
                let calls = limit_calls(calls, plan);
                count_malformed(state, &calls);
                let mut message = json!({"role": "assistant"});
                let empty_next_to_other =
                    content.is_empty() && (!calls.is_empty() || !reasoning.is_empty());
                message["content"] = if empty_next_to_other {
                    Value::Null
                } else {
                    json!(content)
                };
                if !calls.is_empty() {
                    message["tool_calls"] = tool_calls_json(&calls);
                }
                if plan.thinking.is_some() {
                    message["reasoning"] = if reasoning.is_empty() || !plan.include_reasoning {
                        Value::Null
                    } else {
                        json!(reasoning)
                    };
                }
                let mut choice = json!({
                    "message": message,
                    "logprobs": if plan.logprobs { logprobs_json(&tokens, plan.top_logprobs) } else { Value::Null },
                    "finish_reason": finish_reason(&finish, !calls.is_empty()),
                });
                if let Some(k) = plan.prompt_logprobs {
                    // Moved to the response's top level by `whole_response` (vLLM's place).
                    choice["prompt_logprobs"] =
                        super::completions::prompt_logprobs_json(k, &prompt);
                }
                return Ok((choice, usage));
            }
        }
    }
    Err(ApiError::internal("generation ended without a result"))
}

pub(crate) fn count_malformed(state: &SharedState, calls: &[ToolCall]) {
    let bad = calls.iter().filter(|c| c.is_malformed()).count() as u64;
    if bad > 0 {
        state
            .metrics
            .tool_calls_malformed
            .fetch_add(bad, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The SSE response for one or more choices (`n`): each choice's events are merged as they
/// come, its chunks carrying its `index`; the usage chunk (the prompt counted once) and
/// `[DONE]` follow the last choice's finish.
fn stream_response(
    state: SharedState,
    rxs: Vec<tokio::sync::mpsc::UnboundedReceiver<GenEvent>>,
    plan: Plan,
    id: String,
    created: u64,
) -> Response {
    let (tx, events) = tokio::sync::mpsc::unbounded_channel::<String>();
    let response = sse::data_stream(events, &state.closing);
    let n = rxs.len();
    let mut merged = generate::merge(rxs);
    tokio::spawn(async move {
        let model = state.model_id.clone();
        let chunk = |index: usize, delta: Value, finish: Value, logprobs: Value| {
            let mut c = json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
            });
            if plan.include_usage {
                c["usage"] = Value::Null;
            }
            c.to_string()
        };
        // Each content chunk carries the logprobs of the tokens behind it: those received since
        // the last content chunk (text the parser held back goes out with the chunk that
        // releases it). What no content chunk took goes on the chunk with the finish reason.
        let send_deltas =
            |index: usize, deltas: Vec<OutDelta>, pending: &mut Vec<TokenInfo>| -> bool {
                for d in deltas {
                    let (delta, content) = match d {
                        OutDelta::Content(s) => (json!({"content": s}), true),
                        OutDelta::Reasoning(s) if plan.include_reasoning => {
                            (json!({"reasoning": s}), false)
                        }
                        OutDelta::Reasoning(_) => continue,
                    };
                    let lp = if plan.logprobs && content && !pending.is_empty() {
                        logprobs_json(&std::mem::take(pending), plan.top_logprobs)
                    } else {
                        Value::Null
                    };
                    if tx.send(chunk(index, delta, Value::Null, lp)).is_err() {
                        return false;
                    }
                }
                true
            };
        for index in 0..n {
            let role = json!({"role": "assistant", "content": ""});
            if tx
                .send(chunk(index, role, Value::Null, Value::Null))
                .is_err()
            {
                return;
            }
        }
        let mut parsers: Vec<OutputParser> = (0..n)
            .map(|_| OutputParser::new(plan.thinking, plan.tool_format, plan.forced.as_ref()))
            .collect();
        let mut tokens: Vec<Vec<TokenInfo>> = vec![Vec::new(); n];
        let mut total = Usage::default();
        let mut finished = 0;
        while let Some((index, ev)) = merged.recv().await {
            let (parser, tokens) = (&mut parsers[index], &mut tokens[index]);
            match ev {
                GenEvent::Delta { text, tokens: t } => {
                    tokens.extend(t);
                    if !send_deltas(index, parser.push(&text), tokens) {
                        return;
                    }
                }
                GenEvent::Failed(e) => {
                    let _ = tx.send(e.body().to_string());
                    let _ = tx.send("[DONE]".into());
                    return;
                }
                GenEvent::Done { finish, usage, .. } => {
                    let (rest, calls) = parser.finish();
                    if !send_deltas(index, rest, tokens) {
                        return;
                    }
                    let calls = limit_calls(calls, &plan);
                    count_malformed(&state, &calls);
                    for (i, c) in calls.iter().enumerate() {
                        let opener = json!({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                            "function": {"name": c.name, "arguments": ""}}]});
                        let args = json!({"tool_calls": [{"index": i,
                            "function": {"arguments": c.arguments_string()}}]});
                        let _ = tx.send(chunk(index, opener, Value::Null, Value::Null));
                        let _ = tx.send(chunk(index, args, Value::Null, Value::Null));
                    }
                    let lp = if plan.logprobs && !tokens.is_empty() {
                        logprobs_json(tokens, plan.top_logprobs)
                    } else {
                        Value::Null
                    };
                    let finish = json!(finish_reason(&finish, !calls.is_empty()));
                    let _ = tx.send(chunk(index, json!({}), finish, lp));
                    total.add_choice(&usage, finished == 0);
                    finished += 1;
                    if finished < n {
                        continue;
                    }
                    if plan.include_usage {
                        let last = json!({
                            "id": id, "object": "chat.completion.chunk", "created": created,
                            "model": model, "choices": [], "usage": chat_usage(&total, &plan),
                        });
                        let _ = tx.send(last.to_string());
                    }
                    let _ = tx.send("[DONE]".into());
                    return;
                }
            }
        }
    });
    response
}
