//! Client-facing errors in each API's own envelope: OpenAI's `{"error": {...}}` on every route,
//! Anthropic's `{"type": "error", ...}` under `/v1/messages`.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    OpenAi,
    Anthropic,
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    /// OpenAI-style `type` (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    pub flavor: Flavor,
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            flavor: Flavor::OpenAi,
            retry_after: None,
        }
    }

    /// 400 naming the offending field.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        let param = param.into();
        let mut e = Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            message.into(),
        );
        if !param.is_empty() {
            e.param = Some(param);
        }
        e
    }

    /// The field the error is about.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or invalid API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`",
        )
    }

    pub fn overloaded(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded_error", message);
        e.retry_after = Some(1);
        e
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "api_error", message)
    }

    /// 400 `context_length_exceeded` naming `param`.
    pub fn too_long(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::invalid(param, message);
        e.code = Some("context_length_exceeded");
        e
    }

    pub fn context_length(prompt_tokens: usize, max_model_len: usize) -> Self {
        let mut e = Self::invalid(
            "messages",
            format!(
                "prompt is too long: {prompt_tokens} tokens > {} maximum (this model's maximum context length is {max_model_len} tokens)",
                max_model_len.saturating_sub(1)
            ),
        );
        e.code = Some("context_length_exceeded");
        e
    }

    pub fn with_flavor(mut self, flavor: Flavor) -> Self {
        self.flavor = flavor;
        self
    }

    /// The JSON body alone (also used for mid-stream error frames).
    pub fn body(&self) -> serde_json::Value {
        match self.flavor {
            Flavor::OpenAi => {
                let mut err = json!({"message": self.message, "type": self.kind});
                if let Some(p) = &self.param {
                    err["param"] = json!(p);
                }
                if let Some(c) = self.code {
                    err["code"] = json!(c);
                }
                json!({ "error": err })
            }
            Flavor::Anthropic => json!({
                "type": "error",
                "error": {"type": anthropic_kind(self.status, self.kind), "message": self.message_naming_param()},
                "request_id": crate::ids::new_id("req"),
            }),
        }
    }
}

impl ApiError {
    /// Anthropic's envelope has no `param`, so the message itself names the field.
    fn message_naming_param(&self) -> String {
        match &self.param {
            Some(p) if !self.message.contains(p.as_str()) => format!("{p}: {}", self.message),
            _ => self.message.clone(),
        }
    }
}

fn anthropic_kind(status: StatusCode, kind: &'static str) -> &'static str {
    match status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        503 | 529 => "overloaded_error",
        _ => kind,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert("retry-after", v);
            }
        }
        resp
    }
}
