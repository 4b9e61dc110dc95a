//! The Response object and its output items (reasoning, message, function calls), built from
//! what the generation produced; and the assistant turn a continuation replays.

use super::types::ResponsesRequest;
use crate::generate::Usage;
use crate::output::ToolCall;
use serde_json::{json, Value};

/// What one generation produced, split by the output parser.
#[derive(Default)]
pub struct Produced {
    pub reasoning: String,
    pub text: String,
    pub calls: Vec<ToolCall>,
    /// Cut by `max_output_tokens` or the context.
    pub cut: bool,
}

pub fn status(cut: bool) -> &'static str {
    if cut {
        "incomplete"
    } else {
        "completed"
    }
}

pub fn reasoning_item(id: &str, text: &str, done: bool) -> Value {
    let content = if done {
        json!([{"type": "reasoning_text", "text": text}])
    } else {
        json!([])
    };
    json!({"type": "reasoning", "id": id, "summary": [], "content": content,
        "status": if done { "completed" } else { "in_progress" }})
}

pub fn text_part(text: &str, logprobs: &[Value]) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs})
}

pub fn message_item(id: &str, part: Option<Value>, status: &str) -> Value {
    let content = part.map_or_else(Vec::new, |p| vec![p]);
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

/// A function call item; its id is derived from the call id so both stay paired.
pub fn call_item(c: &ToolCall, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": c.id.replacen("call_", "fc_", 1), "call_id": c.id,
        "name": c.name, "arguments": arguments, "status": status})
}

/// The assistant turn as a chat message, for the conversation a continuation replays.
pub fn assistant_message(p: &Produced) -> Value {
    let mut msg = json!({"role": "assistant", "content": p.text});
    if !p.reasoning.is_empty() {
        msg["reasoning_content"] = json!(p.reasoning);
    }
    if !p.calls.is_empty() {
        let calls: Vec<Value> = p
            .calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": c.arguments_string()}})
            })
            .collect();
        msg["tool_calls"] = json!(calls);
    }
    msg
}

pub fn usage_json(u: &Usage, reasoning_tokens: usize) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

/// The fields of a Response object that echo the request.
pub struct Echo {
    fields: Value,
}

impl Echo {
    pub fn new(req: &ResponsesRequest, stored: bool) -> Self {
        let format = req
            .text
            .as_ref()
            .and_then(|t| t.format.clone())
            .unwrap_or_else(|| json!({"type": "text"}));
        let fields = json!({
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "max_tool_calls": req.max_tool_calls,
            "metadata": req.metadata.clone().unwrap_or_else(|| json!({})),
            "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.as_ref().and_then(|r| r.effort.clone()), "summary": null},
            "store": stored,
            "temperature": req.temperature.unwrap_or(1.0),
            "text": {"format": format, "verbosity": "medium"},
            "tool_choice": req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            "tools": req.tools.clone().unwrap_or_default(),
            "top_logprobs": req.top_logprobs.unwrap_or(0),
            "top_p": req.top_p.unwrap_or(1.0),
            "truncation": req.truncation.clone().unwrap_or_else(|| "disabled".into()),
            "user": req.user,
            "service_tier": "default",
            "background": false,
        });
        Echo { fields }
    }

    /// The Response object: `status` is `in_progress`, `completed` or `incomplete`.
    pub fn response(
        &self,
        id: &str,
        created_at: u64,
        model: &str,
        output: Vec<Value>,
        done: Option<(&Produced, Value)>,
    ) -> Value {
        let mut r = json!({
            "id": id, "object": "response", "created_at": created_at, "model": model,
            "status": "in_progress", "error": null, "incomplete_details": null,
            "output": output, "usage": null,
        });
        if let (Some(obj), Some(fields)) = (r.as_object_mut(), self.fields.as_object()) {
            for (k, v) in fields {
                obj.insert(k.clone(), v.clone());
            }
        }
        if let Some((p, usage)) = done {
            r["status"] = json!(status(p.cut));
            if p.cut {
                r["incomplete_details"] = json!({"reason": "max_output_tokens"});
            }
            r["usage"] = usage;
        }
        r
    }
}
