//! Anthropic messages, system prompt and tools → the chat template's input, plus the
//! thinking switch and tool mode the request asks for.

use super::types::{InputMessage, MessagesRequest};
use crate::error::{ApiError, Flavor};
use crate::openai::messages::ToolMode;
use serde_json::{json, Map, Value};

pub struct Converted {
    pub messages: Value,
    pub tools: Option<Value>,
    pub mode: ToolMode,
    pub parallel: bool,
    /// `Some(on)` when the request said whether to think.
    pub thinking: Option<bool>,
}

fn bad(field: impl Into<String>, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(field, msg).with_flavor(Flavor::Anthropic)
}

pub fn convert(req: &MessagesRequest) -> Result<Converted, ApiError> {
    let mut messages = Vec::new();
    if let Some(system) = &req.system {
        let text = text_of(system, "system")?;
        messages.push(json!({"role": "system", "content": text}));
    }
    if req.messages.is_empty() {
        return Err(bad("messages", "must contain at least one message"));
    }
    for (i, m) in req.messages.iter().enumerate() {
        convert_message(m, i, &mut messages)?;
    }
    if req.top_k.is_some_and(|k| k < 1) {
        return Err(bad("top_k", "must be at least 1"));
    }
    let thinking = thinking_switch(req)?;
    let (mode, parallel) = match &req.tool_choice {
        None => (
            if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
                ToolMode::Auto
            } else {
                ToolMode::None
            },
            true,
        ),
        Some(tc) => {
            let parallel = !tc.disable_parallel_tool_use.unwrap_or(false);
            let mode = match tc.kind.as_str() {
                "auto" => ToolMode::Auto,
                "none" => ToolMode::None,
                "any" => ToolMode::Required,
                "tool" => match &tc.name {
                    Some(n) => ToolMode::Named(n.clone()),
                    None => return Err(bad("tool_choice.name", "required when type is \"tool\"")),
                },
                other => {
                    return Err(bad(
                        "tool_choice.type",
                        format!("unknown type `{other}` (auto, any, tool, none)"),
                    ))
                }
            };
            (mode, parallel)
        }
    };
    let tools = req.tools.as_deref().unwrap_or_default();
    if matches!(mode, ToolMode::Required | ToolMode::Named(_)) {
        if tools.is_empty() {
            return Err(bad(
                "tool_choice",
                "tool_choice forces a call but no `tools` were given",
            ));
        }
        if thinking == Some(true) {
            return Err(bad(
                "tool_choice",
                "thinking cannot be combined with a forced tool choice",
            ));
        }
    }
    if let ToolMode::Named(n) = &mode {
        if !tools.iter().any(|t| &t.name == n) {
            return Err(bad(
                "tool_choice.name",
                format!("tool `{n}` is not in `tools`"),
            ));
        }
    }
    let tools = if tools.is_empty() || mode == ToolMode::None {
        None
    } else {
        let mut out = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            if t.name.is_empty() {
                return Err(bad(format!("tools[{i}].name"), "must not be empty"));
            }
            let schema = t
                .input_schema
                .clone()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
            if !schema.is_object() {
                return Err(bad(
                    format!("tools[{i}].input_schema"),
                    "must be a JSON Schema object",
                ));
            }
            let mut f = json!({"name": t.name, "parameters": schema});
            if let Some(d) = &t.description {
                f["description"] = json!(d);
            }
            out.push(json!({"type": "function", "function": f}));
        }
        Some(Value::Array(out))
    };
    Ok(Converted {
        messages: Value::Array(messages),
        tools,
        mode,
        parallel,
        thinking,
    })
}

fn thinking_switch(req: &MessagesRequest) -> Result<Option<bool>, ApiError> {
    let mut on = None;
    if let Some(t) = &req.thinking {
        on = Some(match t.kind.as_str() {
            "enabled" => {
                match t.budget_tokens {
                    Some(b) if b >= 1024 => {}
                    Some(_) => return Err(bad("thinking.budget_tokens", "must be at least 1024")),
                    None => {
                        return Err(bad(
                            "thinking.budget_tokens",
                            "required when thinking is enabled",
                        ))
                    }
                }
                true
            }
            "adaptive" => true,
            "disabled" => false,
            other => {
                return Err(bad(
                    "thinking.type",
                    format!("unknown type `{other}` (enabled, adaptive, disabled)"),
                ))
            }
        });
        if let Some(d) = &t.display {
            if d != "summarized" && d != "omitted" {
                return Err(bad(
                    "thinking.display",
                    "must be \"summarized\" or \"omitted\"",
                ));
            }
        }
    }
    if let Some(oc) = &req.output_config {
        if oc.format.is_some() {
            return Err(bad("output_config.format", "`format` is not supported"));
        }
        if let Some(e) = &oc.effort {
            on = Some(match e.as_str() {
                "low" => false,
                "medium" | "high" | "xhigh" | "max" => true,
                other => {
                    return Err(bad(
                        "output_config.effort",
                        format!("unknown effort `{other}`"),
                    ))
                }
            });
        }
    }
    Ok(on)
}

fn text_of(v: &Value, field: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut out = String::new();
            for (k, b) in blocks.iter().enumerate() {
                match (
                    b.get("type").and_then(Value::as_str),
                    b.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => {
                        return Err(bad(
                            format!("{field}[{k}]"),
                            "must be a text block `{\"type\": \"text\", \"text\": ...}`",
                        ))
                    }
                }
            }
            Ok(out)
        }
        Value::Null => Ok(String::new()),
        _ => Err(bad(field, "must be a string or an array of text blocks")),
    }
}

fn convert_message(m: &InputMessage, i: usize, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let field = format!("messages[{i}]");
    let role = match m.role.as_str() {
        "user" | "assistant" => m.role.as_str(),
        "system" => {
            return Err(bad(
                format!("{field}.role"),
                "`system` is not a message role here; use the top-level `system` field",
            ))
        }
        other => {
            return Err(bad(
                format!("{field}.role"),
                format!("unknown role `{other}` (user, assistant)"),
            ))
        }
    };
    let blocks: Vec<Value> = match &m.content {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(b) => b.clone(),
        _ => {
            return Err(bad(
                format!("{field}.content"),
                "must be a string or an array of content blocks",
            ))
        }
    };
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    let mut tool_results = Vec::new();
    for (k, b) in blocks.iter().enumerate() {
        let bf = format!("{field}.content[{k}]");
        let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
        match (role, kind) {
            (_, "text") => match b.get("text").and_then(Value::as_str) {
                Some(t) => text.push_str(t),
                None => {
                    return Err(bad(
                        format!("{bf}.text"),
                        "a text block needs a string `text`",
                    ))
                }
            },
            ("user", "image") => return Err(bad(bf, "this model does not accept images")),
            ("user", "tool_result") => {
                let id = b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => {
                        let mut s = String::new();
                        for (p, part) in parts.iter().enumerate() {
                            match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                                (Some("text"), Some(t)) => s.push_str(t),
                                _ => return Err(bad(format!("{bf}.content[{p}]"), "every part of a tool result must be `{\"type\": \"text\", ...}`")),
                            }
                        }
                        s
                    }
                    Some(_) => {
                        return Err(bad(
                            format!("{bf}.content"),
                            "must be a string or an array of text parts",
                        ))
                    }
                };
                tool_results.push(json!({"role": "tool", "content": content, "tool_call_id": id}));
            }
            ("assistant", "tool_use") => {
                let name = b
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad(format!("{bf}.name"), "a tool_use block needs `name`"))?;
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(
                    json!({"id": b.get("id").cloned().unwrap_or(json!("")), "type": "function",
                    "function": {"name": name, "arguments": input}}),
                );
            }
            ("assistant", "thinking") => {
                if let Some(t) = b.get("thinking").and_then(Value::as_str) {
                    reasoning.push_str(t);
                }
            }
            ("assistant", "redacted_thinking") => {}
            _ => {
                return Err(bad(
                    format!("{bf}.type"),
                    format!("unsupported content block `{kind}` in a {role} message"),
                ))
            }
        }
    }
    // Tool results answer the previous assistant turn, so they come before any text.
    let only_results = !tool_results.is_empty() && text.is_empty();
    out.extend(tool_results);
    if !only_results {
        let mut msg = Map::new();
        msg.insert("role".into(), json!(role));
        msg.insert("content".into(), json!(text));
        if !calls.is_empty() {
            msg.insert("tool_calls".into(), Value::Array(calls));
        }
        if !reasoning.is_empty() {
            msg.insert("reasoning_content".into(), json!(reasoning));
        }
        out.push(Value::Object(msg));
    }
    Ok(())
}
