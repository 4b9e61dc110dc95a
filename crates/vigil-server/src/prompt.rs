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
    /// Continue the final assistant message (a prefill) instead of opening a new turn:
    /// vLLM's `continue_final_message`, Anthropic's trailing assistant message.
    pub continue_final: bool,
}

/// The text of `messages`' last entry when it is an assistant message with text: what a
/// continuation extends.
pub fn final_assistant_text(messages: &Value) -> Option<String> {
    let last = messages.as_array()?.last()?;
    let text = (last.get("role")? == "assistant")
        .then(|| last.get("content")?.as_str())
        .flatten()?;
    (!text.is_empty()).then(|| text.to_string())
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
    let continued = match spec.continue_final {
        true => Some(final_assistant_text(&messages).ok_or_else(|| {
            ApiError::invalid(
                "messages",
                "continuing the final message needs the last message to be an assistant message with text",
            )
        })?),
        false => None,
    };
    let add_generation_prompt = add_generation_prompt && continued.is_none();
    let continues = continued.is_some();
    if state.generic_tools && crate::generic_tools::needed(&messages, tools.as_ref()) {
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
        if let Some(c) = &continued {
            // The turn's closing (end-of-turn token, newline) comes after its text: cut it
            // there, so the model goes on writing the same message.
            let end = text.rfind(c.as_str()).map(|i| i + c.len()).ok_or_else(|| {
                ApiError::invalid(
                    "messages",
                    "the chat template does not render the final assistant message verbatim, so it cannot be continued",
                )
            })?;
            text.truncate(end);
        }
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
        starts_in_thinking: starts_in_thinking && spec.forced.is_none() && !continues,
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
