//! The agent and tool loops: one conversation per prefix, each turn re-sending the whole
//! conversation with the model's reply and a short user message appended; with `tools`, tool
//! definitions ride on every request; with `held`, the loop is bound to a session
//! (`x-layerscale-session-id`) that keeps its KV between turns, created before and deleted
//! after the loop (neither timed).

use crate::client::Streamed;
use crate::exec::{to_sample, Ctx, Progress};
use crate::result::Sample;
use crate::run::chat_body;
use serde_json::{json, Value};
use std::time::Instant;

/// Header that binds a chat request to a session (LayerScale's agent turns).
pub const SESSION_HEADER: &str = "x-layerscale-session-id";

#[derive(Debug, Clone, Copy)]
pub struct LoopShape {
    pub turns: u32,
    pub turn_tokens: u32,
    pub tools: bool,
    pub held: bool,
}

/// Three tools of the shapes agent frameworks send: a lookup, a search with options, and an
/// action with a nested object. Their definitions are part of every tool-loop prompt.
pub fn tool_definitions() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
            }, "required": ["city"]}
        }},
        {"type": "function", "function": {
            "name": "search_documents",
            "description": "Full-text search over the team's documents; returns the best matches.",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50},
                "since": {"type": "string", "description": "ISO date; only newer documents"}
            }, "required": ["query"]}
        }},
        {"type": "function", "function": {
            "name": "create_ticket",
            "description": "Open a ticket in the issue tracker.",
            "parameters": {"type": "object", "properties": {
                "title": {"type": "string"},
                "priority": {"type": "string", "enum": ["low", "medium", "high"]},
                "fields": {"type": "object", "properties": {
                    "component": {"type": "string"},
                    "assignee": {"type": "string"}
                }}
            }, "required": ["title"]}
        }}
    ])
}

/// A chat request of the loop's kind (tools attached when the loop has them).
pub fn loop_body(model: &str, messages: &[Value], turn_tokens: u32, tools: bool) -> Value {
    let mut body = chat_body(model, messages, turn_tokens, true);
    if tools {
        body["tools"] = tool_definitions();
    }
    body
}

/// Runs one loop per prefix, one after another. A failed turn ends its loop (the turns it did
/// not send count as failures).
pub async fn agent_loops(
    ctx: &Ctx<'_>,
    prefixes: Vec<String>,
    shape: LoopShape,
    warmup: bool,
    progress: &Progress,
) -> (Vec<Sample>, f64) {
    let phase = if warmup { "warm-up" } else { "measured" };
    let total = prefixes.len() as u32 * shape.turns;
    progress.phase(phase, total);
    let t0 = Instant::now();
    let mut samples = Vec::new();
    for (i, prefix) in prefixes.into_iter().enumerate() {
        samples.extend(one_loop(ctx, i as u32, prefix, shape, t0, warmup).await);
        progress.tick(phase, samples.len() as u32, total, t0);
    }
    (samples, t0.elapsed().as_secs_f64())
}

/// One conversation on `prefix`: its turns' samples, ending early at a failed turn.
pub async fn one_loop(
    ctx: &Ctx<'_>,
    iteration: u32,
    prefix: String,
    shape: LoopShape,
    t0: Instant,
    warmup: bool,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    let session = if shape.held {
        match ctx.client.post_json("/v1/sessions", &json!({})).await {
            Ok(v) => v.get("id").and_then(Value::as_str).map(str::to_string),
            Err(e) => {
                let failed = Streamed::failed(format!("creating the loop's session: {e}"));
                samples.push(to_sample(&failed, t0, iteration, Some(1), 0, warmup));
                return samples;
            }
        }
    } else {
        None
    };
    let headers: Vec<(&str, &str)> = session
        .as_deref()
        .map(|id| (SESSION_HEADER, id))
        .into_iter()
        .collect();
    let mut messages = vec![json!({"role": "user", "content": prefix})];
    for turn in 1..=shape.turns {
        let body = loop_body(ctx.model, &messages, shape.turn_tokens, shape.tools);
        let s = (ctx.client)
            .stream_with("/v1/chat/completions", &body, &headers)
            .await;
        let sample = to_sample(&s, t0, iteration, Some(turn), shape.turn_tokens, warmup);
        let failed = sample.error.is_some();
        samples.push(sample);
        if failed {
            break;
        }
        // A reply that called a tool is re-sent as text with a made-up result, so every
        // engine sees the same kind of conversation whatever the model chose to emit.
        let (reply, next) = if s.text.is_empty() && !s.tool_text.is_empty() {
            (
                s.tool_text.clone(),
                format!("Tool result: ok. Turn {}: go on.", turn + 1),
            )
        } else {
            (s.text.clone(), format!("Turn {}: go on.", turn + 1))
        };
        messages.push(json!({"role": "assistant", "content": reply}));
        messages.push(json!({"role": "user", "content": next}));
    }
    if let Some(id) = &session {
        let _ = ctx.client.delete_json(&format!("/v1/sessions/{id}")).await;
    }
    samples
}
