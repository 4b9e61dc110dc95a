//! Chat messages (already in the template's shape) → prompt token ids: thinking switches,
//! template kwargs, tools, and the opening of a forced tool call.

use crate::error::ApiError;
use crate::state::SharedState;
use serde_json::{Map, Value};

pub struct ChatPrompt {
    pub ids: Vec<u32>,
    /// The model's output starts inside a `<think>` block the template opened.
    pub starts_in_thinking: bool,
    /// The output continues a forced call's opening, put at the end of the prompt.
    pub forced: Option<crate::output::ForcedCall>,
}

pub struct ChatPromptSpec<'a> {
    pub messages: &'a Value,
    pub tools: Option<&'a Value>,
    pub kwargs: Map<String, Value>,
    pub forced: Option<crate::output::ForcedCall>,
}

pub async fn render_chat(
    state: &SharedState,
    spec: ChatPromptSpec<'_>,
) -> Result<ChatPrompt, ApiError> {
    render_chat_opening(state, spec, true).await
}

/// [`render_chat`], with or without the assistant turn's opening at the end.
pub async fn render_chat_opening(
    state: &SharedState,
    spec: ChatPromptSpec<'_>,
    add_generation_prompt: bool,
) -> Result<ChatPrompt, ApiError> {
    let template = state.template.clone().ok_or_else(|| {
        ApiError::bad_request("this model has no chat template; use /v1/completions")
    })?;
    let forced_prefix = match (&spec.forced, state.tool_format) {
        (Some(fc), Some(format)) => Some(vigil_model::tool_parser::forced_call_prefix(
            format,
            fc.name.as_deref(),
        )),
        _ => None,
    };
    let (mut messages, mut tools, kwargs) =
        (spec.messages.clone(), spec.tools.cloned(), spec.kwargs);
    if state.generic_tools {
        messages = crate::generic_tools::rewrite(&messages, tools.as_ref());
        tools = None;
    }
    let job_state = state.clone();
    let (ids, starts_in_thinking) = crate::cpu_jobs::run(state, move || {
        let mut text = template
            .render(&messages, tools.as_ref(), add_generation_prompt, &kwargs)
            .map_err(|e| {
                ApiError::invalid(
                    "messages",
                    format!("the chat template refused the conversation: {e}"),
                )
            })?;
        let starts_in_thinking = text.trim_end().ends_with("<think>");
        text.push_str(forced_prefix.as_deref().unwrap_or(""));
        // Rendering is cheap next to tokenizing: a text too long by its bytes alone stops here.
        crate::cpu_jobs::check_length(&job_state, text.len(), "messages")?;
        let ids = (job_state.tokenizer)
            .encode(&text, false)
            .map_err(|e| ApiError::invalid("messages", format!("could not tokenize: {e}")))?;
        Ok((ids, starts_in_thinking))
    })
    .await?;
    Ok(ChatPrompt {
        ids,
        starts_in_thinking: starts_in_thinking && spec.forced.is_none(),
        forced: spec.forced,
    })
}

/// Validates `chat_template_kwargs` (only the keys the wire reference admits) and folds
/// `reasoning_effort` into `enable_thinking`.
pub fn template_kwargs(
    kwargs: Option<&Map<String, Value>>,
    reasoning_effort: Option<&str>,
    field_prefix: &str,
) -> Result<Map<String, Value>, ApiError> {
    let mut out = Map::new();
    if let Some(kw) = kwargs {
        for (k, v) in kw {
            let field = format!("{field_prefix}.{k}");
            match k.as_str() {
                "date_string" if v.is_string() => {}
                "enable_thinking" if v.is_boolean() => {}
                "add_generation_prompt" | "tools_in_user_message" if v == &Value::Bool(true) => {}
                "date_string" => return Err(ApiError::invalid(field, "must be a string")),
                "enable_thinking" => return Err(ApiError::invalid(field, "must be a boolean")),
                "add_generation_prompt" | "tools_in_user_message" => {
                    return Err(ApiError::invalid(field, "only `true` is accepted"))
                }
                _ => {
                    return Err(ApiError::invalid(
                        field,
                        format!("unsupported chat template kwarg `{k}` (accepted: date_string, enable_thinking, add_generation_prompt, tools_in_user_message)"),
                    ))
                }
            }
            out.insert(k.clone(), v.clone());
        }
    }
    if let Some(effort) = reasoning_effort {
        let on = match effort {
            "none" | "minimal" | "low" => false,
            "medium" | "high" | "xhigh" | "max" => true,
            other => {
                return Err(ApiError::invalid(
                    "reasoning_effort",
                    format!(
                        "unknown value `{other}` (none, minimal, low, medium, high, xhigh, max)"
                    ),
                ))
            }
        };
        out.insert("enable_thinking".into(), Value::Bool(on));
    }
    Ok(out)
}
