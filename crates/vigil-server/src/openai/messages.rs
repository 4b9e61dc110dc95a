//! OpenAI chat messages and tools → the chat template's input (HF `apply_chat_template`
//! shapes), with a 400 naming the field for anything the template cannot take.

use super::types::{ChatMessage, MessageContent, ToolChoice, ToolDef};
use crate::error::ApiError;
use serde_json::{json, Value};

pub fn template_messages(messages: &[ChatMessage]) -> Result<Value, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "must contain at least one message",
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let field = |f: &str| format!("messages[{i}].{f}");
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" | "ipython" => "tool",
            other => {
                return Err(ApiError::invalid(
                    field("role"),
                    format!("unknown role `{other}` (system, user, assistant, tool, ipython)"),
                ))
            }
        };
        let content = content_text(m.content.as_ref(), role, &field("content"))?;
        let mut msg = json!({"role": role, "content": content});
        if let Some(calls) = &m.tool_calls {
            if role != "assistant" {
                return Err(ApiError::invalid(
                    field("tool_calls"),
                    "only assistant messages carry tool calls",
                ));
            }
            let mut tc = Vec::new();
            for (j, c) in calls.iter().enumerate() {
                if c.kind.as_deref().is_some_and(|k| k != "function") {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].tool_calls[{j}].type"),
                        "must be \"function\"",
                    ));
                }
                let args = match &c.function.arguments {
                    None | Some(Value::Null) => json!({}),
                    Some(Value::String(s)) => {
                        serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
                    }
                    Some(v) => v.clone(),
                };
                tc.push(json!({
                    "id": c.id.clone().unwrap_or_default(),
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": args},
                }));
            }
            msg["tool_calls"] = Value::Array(tc);
        }
        if role == "tool" {
            msg["tool_call_id"] = json!(m.tool_call_id.clone().unwrap_or_default());
        }
        if let Some(name) = &m.name {
            msg["name"] = json!(name);
        }
        if let Some(r) = m.reasoning.as_ref().or(m.reasoning_content.as_ref()) {
            if role == "assistant" {
                msg["reasoning_content"] = json!(r);
            }
        }
        out.push(msg);
    }
    Ok(Value::Array(out))
}

fn content_text(
    content: Option<&MessageContent>,
    role: &str,
    field: &str,
) -> Result<String, ApiError> {
    match content {
        None => Ok(String::new()),
        Some(MessageContent::Text(s)) => Ok(s.clone()),
        Some(MessageContent::Parts(parts)) => {
            let mut text = String::new();
            for (k, p) in parts.iter().enumerate() {
                match p.kind.as_deref().unwrap_or("text") {
                    "text" => match &p.text {
                        Some(t) => text.push_str(t),
                        None => {
                            return Err(ApiError::invalid(
                                format!("{field}[{k}].text"),
                                "a text part needs `text`",
                            ))
                        }
                    },
                    "image_url" if role == "user" => {
                        return Err(ApiError::invalid(
                            format!("{field}[{k}]"),
                            "this model does not accept images",
                        ))
                    }
                    other => {
                        return Err(ApiError::invalid(
                            format!("{field}[{k}].type"),
                            format!("unsupported content part type `{other}` for role {role}"),
                        ))
                    }
                }
            }
            Ok(text)
        }
    }
}

/// Tools in the template's shape, after checking each definition.
pub fn template_tools(tools: &[ToolDef]) -> Result<Value, ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        if t.kind.as_deref().is_some_and(|k| k != "function") {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                "must be \"function\"",
            ));
        }
        if t.function.name.is_empty() {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                "must not be empty",
            ));
        }
        if let Some(p) = &t.function.parameters {
            if !p.is_object() {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.parameters"),
                    "must be a JSON Schema object",
                ));
            }
        }
        let mut f = json!({"name": t.function.name});
        if let Some(d) = &t.function.description {
            f["description"] = json!(d);
        }
        f["parameters"] = t
            .function
            .parameters
            .clone()
            .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// What `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolMode {
    None,
    Auto,
    Required,
    Named(String),
}

pub fn tool_mode(
    choice: Option<&ToolChoice>,
    tools: Option<&[ToolDef]>,
    field: &str,
) -> Result<ToolMode, ApiError> {
    let has_tools = tools.is_some_and(|t| !t.is_empty());
    let mode = match choice {
        None => {
            if has_tools {
                ToolMode::Auto
            } else {
                ToolMode::None
            }
        }
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => ToolMode::None,
            "auto" => ToolMode::Auto,
            "required" => ToolMode::Required,
            other => {
                return Err(ApiError::invalid(
                    field,
                    format!(
                        "unknown tool_choice `{other}` (auto, none, required, or a named function)"
                    ),
                ))
            }
        },
        Some(ToolChoice::Named(n)) => {
            if n.kind != "function" {
                return Err(ApiError::invalid(
                    format!("{field}.type"),
                    "must be \"function\"",
                ));
            }
            ToolMode::Named(n.function.name.clone())
        }
    };
    match &mode {
        ToolMode::Required | ToolMode::Named(_) if !has_tools => Err(ApiError::invalid(
            field,
            "tool_choice forces a call but no `tools` were given",
        )),
        ToolMode::Named(name)
            if !tools
                .unwrap_or_default()
                .iter()
                .any(|t| &t.function.name == name) =>
        {
            Err(ApiError::invalid(
                field,
                format!("tool `{name}` is not in `tools`"),
            ))
        }
        _ => Ok(mode),
    }
}
