//! `POST /tokenize` and `POST /detokenize` in vLLM's shape: a prompt (or a chat conversation,
//! rendered through the model's template as a chat request would be) to token ids, and ids back
//! to text. Benchmarks calibrate prompt lengths with them; clients budget context with them.

use super::messages::{template_messages, template_tools};
use super::types::{ChatMessage, ToolDef};
use crate::error::{ApiError, Flavor};
use crate::extract::parse_body;
use crate::prompt::{render_chat_opening, template_kwargs, ChatPromptSpec};
use crate::state::SharedState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    #[serde(default)]
    #[allow(dead_code)] // accepted for vLLM clients; one model is served
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    tools: Option<Vec<ToolDef>>,
    /// Prompt only: add the tokenizer's special tokens (BOS), as `/v1/completions` does.
    add_special_tokens: Option<bool>,
    /// Messages only: end with the assistant turn's opening, as `/v1/chat/completions` does.
    add_generation_prompt: Option<bool>,
    chat_template_kwargs: Option<Map<String, Value>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    #[serde(default)]
    #[allow(dead_code)]
    model: Option<String>,
    tokens: Vec<u32>,
}

pub async fn tokenize(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match count(&state, body).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => crate::routes::error_response(&state, e),
    }
}

async fn count(
    state: &SharedState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Value, ApiError> {
    let req: TokenizeRequest = parse_body(body, Flavor::OpenAi)?;
    let ids = match (req.prompt, req.messages) {
        (Some(text), None) => {
            if req.add_generation_prompt.is_some() || req.tools.is_some() {
                return Err(ApiError::bad_request(
                    "`add_generation_prompt` and `tools` apply to `messages`, not `prompt`",
                ));
            }
            let special = req.add_special_tokens.unwrap_or(true);
            crate::cpu_jobs::encode(state, text, special, "prompt").await?
        }
        (None, Some(messages)) => {
            if req.add_special_tokens.is_some() {
                return Err(ApiError::invalid(
                    "add_special_tokens",
                    "applies to `prompt`; a chat template writes its own special tokens",
                ));
            }
            let messages = template_messages(&messages)?;
            let tools = match req.tools.as_deref() {
                Some(t) if !t.is_empty() => Some(template_tools(t)?),
                _ => None,
            };
            let kwargs = template_kwargs(
                req.chat_template_kwargs.as_ref(),
                None,
                "chat_template_kwargs",
            )?;
            let spec = ChatPromptSpec {
                messages: &messages,
                tools: tools.as_ref(),
                kwargs,
                forced: None,
                continue_final: false,
            };
            let with_opening = req.add_generation_prompt.unwrap_or(true);
            render_chat_opening(state, spec, with_opening).await?.ids
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "give `prompt` or `messages`, not both",
            ))
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "prompt",
                "missing: give `prompt` (text) or `messages` (a chat conversation)",
            ))
        }
    };
    Ok(json!({"count": ids.len(), "max_model_len": state.max_model_len, "tokens": ids}))
}

pub async fn detokenize(
    State(state): State<SharedState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let req: DetokenizeRequest = parse_body(body, Flavor::OpenAi)?;
        let vocab = state.tokenizer.vocab_size();
        if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::invalid(
                "tokens",
                format!("token id {bad} is outside the vocabulary (0..{vocab})"),
            ));
        }
        let tok = state.tokenizer.clone();
        let text = crate::cpu_jobs::run(&state, move || {
            tok.decode(&req.tokens, false)
                .map_err(|e| ApiError::invalid("tokens", format!("could not decode: {e}")))
        })
        .await?;
        Ok(json!({"prompt": text}))
    }
    .await;
    match result {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => crate::routes::error_response(&state, e),
    }
}
