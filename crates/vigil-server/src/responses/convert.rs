//! Responses input → chat: input items to chat messages (the template's turns), and the
//! request to the chat request the generation path takes, so both APIs share one validation.
//! Errors the chat path raises are renamed to the Responses fields they came from.

use super::types::ResponsesRequest;
use crate::error::ApiError;
use crate::openai::types::ChatCompletionRequest;
use serde_json::{json, Map, Value};

/// The request's input as stored (`input_items`) and as chat messages.
pub struct Input {
    pub items: Vec<Value>,
    pub messages: Vec<Value>,
}

fn bad(field: impl Into<String>, msg: impl Into<String>) -> ApiError {
    ApiError::invalid(field, msg)
}

/// Refuse keys an item of this type does not have, naming the first.
fn known_keys(item: &Map<String, Value>, keys: &[&str], field: &str) -> Result<(), ApiError> {
    match item.keys().find(|k| !keys.contains(&k.as_str())) {
        Some(k) => Err(bad(
            format!("{field}.{k}"),
            format!("unknown field `{k}` for this item type"),
        )),
        None => Ok(()),
    }
}

pub fn input(input: Option<&Value>) -> Result<Input, ApiError> {
    let mut conv = Converter::default();
    match input {
        None | Some(Value::Null) => return Err(bad("input", "`input` is required")),
        Some(Value::String(text)) => conv.message("user", text.clone(), None, "input")?,
        Some(Value::Array(items)) => {
            if items.is_empty() {
                return Err(bad("input", "must contain at least one item"));
            }
            for (i, item) in items.iter().enumerate() {
                conv.item(item, &format!("input[{i}]"))?;
            }
        }
        Some(_) => return Err(bad("input", "must be text or a list of items")),
    }
    if conv.reasoning.is_some() {
        return Err(bad(
            "input",
            "a reasoning item must be followed by the assistant output it belongs to",
        ));
    }
    Ok(Input {
        items: conv.items,
        messages: conv.messages,
    })
}

#[derive(Default)]
struct Converter {
    items: Vec<Value>,
    messages: Vec<Value>,
    /// A reasoning item's text, for the assistant message that follows it.
    reasoning: Option<String>,
}

impl Converter {
    fn item(&mut self, item: &Value, field: &str) -> Result<(), ApiError> {
        let Some(obj) = item.as_object() else {
            return Err(bad(field, "each input item must be an object"));
        };
        let kind = match obj.get("type") {
            None if obj.contains_key("role") => "message",
            None => return Err(bad(format!("{field}.type"), "is required")),
            Some(Value::String(k)) => k.as_str(),
            Some(_) => return Err(bad(format!("{field}.type"), "must be a string")),
        };
        match kind {
            "message" => {
                known_keys(obj, &["type", "role", "content", "id", "status", "phase"], field)?;
                let role = match obj.get("role").and_then(Value::as_str) {
                    Some(r @ ("user" | "system" | "developer" | "assistant")) => r,
                    Some(r) => {
                        return Err(bad(
                            format!("{field}.role"),
                            format!("unknown role `{r}` (user, system, developer, assistant)"),
                        ))
                    }
                    None => return Err(bad(format!("{field}.role"), "is required")),
                };
                let text = content_text(obj.get("content"), &format!("{field}.content"))?;
                self.message(role, text, Some(item), field)
            }
            "function_call" => {
                known_keys(
                    obj,
                    &["type", "call_id", "name", "arguments", "id", "status"],
                    field,
                )?;
                let call_id = string(obj, "call_id", field)?;
                let name = string(obj, "name", field)?;
                let arguments = string(obj, "arguments", field)?;
                let call = json!({"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments}});
                // Calls that follow an assistant message (or other calls) belong to its turn.
                match self.messages.last_mut() {
                    Some(last)
                        if last["role"] == "assistant" && self.reasoning.is_none() =>
                    {
                        match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => {
                        let mut msg = json!({"role": "assistant", "content": "", "tool_calls": [call]});
                        if let Some(r) = self.reasoning.take() {
                            msg["reasoning_content"] = json!(r);
                        }
                        self.messages.push(msg);
                    }
                }
                self.items.push(item.clone());
                Ok(())
            }
            "function_call_output" => {
                known_keys(obj, &["type", "call_id", "output", "id", "status"], field)?;
                let call_id = string(obj, "call_id", field)?;
                let output = match obj.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => content_text(Some(v), &format!("{field}.output"))?,
                    _ => return Err(bad(format!("{field}.output"), "is required (text)")),
                };
                self.messages
                    .push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
                self.items.push(item.clone());
                Ok(())
            }
            "reasoning" => {
                known_keys(
                    obj,
                    &["type", "id", "summary", "content", "encrypted_content", "status"],
                    field,
                )?;
                let mut text = String::new();
                if let Some(parts) = obj.get("content").and_then(Value::as_array) {
                    for p in parts {
                        text.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""));
                    }
                }
                self.reasoning = Some(text);
                self.items.push(item.clone());
                Ok(())
            }
            "item_reference" => Err(bad(
                format!("{field}.type"),
                "item references are not supported: continue a stored response with `previous_response_id`",
            )),
            other => Err(bad(
                format!("{field}.type"),
                format!(
                    "unsupported item type `{other}` (message, function_call, function_call_output, reasoning)"
                ),
            )),
        }
    }

    fn message(
        &mut self,
        role: &str,
        text: String,
        item: Option<&Value>,
        field: &str,
    ) -> Result<(), ApiError> {
        let role = if role == "developer" { "system" } else { role };
        let mut msg = json!({"role": role, "content": text});
        if let Some(r) = self.reasoning.take() {
            if role != "assistant" {
                return Err(bad(
                    field,
                    "a reasoning item must be followed by the assistant output it belongs to",
                ));
            }
            msg["reasoning_content"] = json!(r);
        }
        self.messages.push(msg);
        self.items.push(match item {
            Some(v) => v.clone(),
            None => json!({"type": "message", "role": role,
                "content": [{"type": "input_text", "text": text}]}),
        });
        Ok(())
    }
}

fn string(obj: &Map<String, Value>, key: &str, field: &str) -> Result<String, ApiError> {
    match obj.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(bad(format!("{field}.{key}"), "is required (a string)")),
    }
}

/// A message's content: text, or text parts (`input_text`, `output_text`, `refusal`).
fn content_text(content: Option<&Value>, field: &str) -> Result<String, ApiError> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                let key = match kind {
                    "input_text" | "output_text" | "text" => "text",
                    "refusal" => "refusal",
                    "input_image" | "input_file" | "input_audio" => {
                        return Err(bad(
                            format!("{field}[{j}].type"),
                            format!("`{kind}` is not supported: this model reads text only"),
                        ))
                    }
                    other => {
                        return Err(bad(
                            format!("{field}[{j}].type"),
                            format!("unknown content type `{other}` (input_text, output_text)"),
                        ))
                    }
                };
                match p.get(key) {
                    Some(Value::String(s)) => text.push_str(s),
                    _ => return Err(bad(format!("{field}[{j}].{key}"), "is required (text)")),
                }
            }
            Ok(text)
        }
        None | Some(Value::Null) => Err(bad(field, "is required")),
        Some(_) => Err(bad(field, "must be text or a list of content parts")),
    }
}

/// Responses function tools (`{type, name, parameters, …}`) as chat tools.
fn chat_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let field = format!("tools[{i}]");
        let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "function" {
            return Err(bad(
                format!("{field}.type"),
                format!("only `function` tools are supported; `{kind}` is a hosted tool Vigil does not run"),
            ));
        }
        let Some(obj) = t.as_object() else {
            return Err(bad(field, "must be an object"));
        };
        known_keys(
            obj,
            &["type", "name", "description", "parameters", "strict"],
            &field,
        )?;
        let mut function = obj.clone();
        function.remove("type");
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out)
}

fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(s) if ["auto", "none", "required"].contains(&s.as_str()) => {
            Ok(choice.clone())
        }
        Value::String(s) => Err(bad(
            "tool_choice",
            format!("unknown mode `{s}` (auto, none, required)"),
        )),
        Value::Object(o) if o.get("type") == Some(&json!("function")) => match o.get("name") {
            Some(Value::String(name)) => {
                Ok(json!({"type": "function", "function": {"name": name}}))
            }
            _ => Err(bad("tool_choice.name", "is required")),
        },
        _ => Err(bad(
            "tool_choice",
            "must be auto, none, required or {\"type\": \"function\", \"name\": …}",
        )),
    }
}

/// `text.format` as the chat `response_format`.
fn response_format(format: &Value) -> Result<Value, ApiError> {
    let kind = format.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "text" | "json_object" => Ok(json!({"type": kind})),
        "json_schema" => {
            let mut schema = Map::new();
            for key in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(key) {
                    schema.insert(key.into(), v.clone());
                }
            }
            Ok(json!({"type": "json_schema", "json_schema": schema}))
        }
        other => Err(bad(
            "text.format.type",
            format!("unknown format `{other}` (text, json_object, json_schema)"),
        )),
    }
}

/// The chat request this Responses request runs as.
pub fn chat_request(
    req: &ResponsesRequest,
    messages: Vec<Value>,
) -> Result<ChatCompletionRequest, ApiError> {
    let mut chat = json!({"messages": messages});
    let mut set = |key: &str, v: Option<Value>| {
        if let Some(v) = v {
            chat[key] = v;
        }
    };
    set("max_tokens", req.max_output_tokens.map(|v| json!(v)));
    set("temperature", req.temperature.map(|v| json!(v)));
    set("top_p", req.top_p.map(|v| json!(v)));
    set("top_k", req.top_k.map(|v| json!(v)));
    set("min_p", req.min_p.map(|v| json!(v)));
    set("seed", req.seed.map(|v| json!(v)));
    set("presence_penalty", req.presence_penalty.map(|v| json!(v)));
    set("frequency_penalty", req.frequency_penalty.map(|v| json!(v)));
    set(
        "repetition_penalty",
        req.repetition_penalty.map(|v| json!(v)),
    );
    set("stop", req.stop.clone());
    set("ignore_eos", req.ignore_eos.map(|v| json!(v)));
    set("speculative", req.speculative.clone().map(Value::String));
    set("stream", req.stream.map(|v| json!(v)));
    set(
        "parallel_tool_calls",
        req.parallel_tool_calls.map(|v| json!(v)),
    );
    let effort = req.reasoning.as_ref().and_then(|r| r.effort.clone());
    set("reasoning_effort", effort.map(Value::String));
    let with_logprobs = req
        .include
        .as_ref()
        .is_some_and(|i| i.iter().any(|s| s == "message.output_text.logprobs"));
    if req.top_logprobs.is_some() || with_logprobs {
        chat["logprobs"] = json!(true);
        chat["top_logprobs"] = json!(req.top_logprobs.unwrap_or(0));
    }
    if let Some(tools) = &req.tools {
        if !tools.is_empty() {
            chat["tools"] = json!(chat_tools(tools)?);
        }
    }
    if let Some(choice) = &req.tool_choice {
        chat["tool_choice"] = chat_tool_choice(choice)?;
    }
    if let Some(format) = req.text.as_ref().and_then(|t| t.format.as_ref()) {
        chat["response_format"] = response_format(format)?;
    }
    serde_json::from_value(chat).map_err(|e| {
        bad(
            "input",
            format!("invalid request: {}", crate::extract::describe(&e)),
        )
    })
}

/// An error of the chat path, naming the Responses field the chat field came from.
pub fn rename_param(mut e: ApiError) -> ApiError {
    let Some(param) = &e.param else {
        return e;
    };
    let renamed = match param.as_str() {
        "max_tokens" => "max_output_tokens",
        "response_format" => "text.format",
        "reasoning_effort" | "chat_template_kwargs" => "reasoning.effort",
        p if p.starts_with("messages") => "input",
        _ => return e,
    };
    e.param = Some(renamed.to_string());
    e
}
