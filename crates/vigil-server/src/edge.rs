//! Guards every request passes before a route sees it, and the envelope of every error the
//! router makes by itself:
//! - browsers: a request carrying an `Origin` that `--allowed-origins` does not list is refused
//!   (403), so a web page cannot push into or create sessions on a local server; listed
//!   origins get CORS headers and their preflights answered;
//! - a POST must say its body is JSON (415 otherwise; no `Content-Type` at all is taken as
//!   JSON, for tools that send none — a browser's cross-site form or `text/plain` post always
//!   sends one);
//! - errors the router or an extractor produce as plain text or an empty body (405, a bad path
//!   parameter, a body over the limit) are rewritten into the route's JSON envelope, and a 413
//!   closes the connection (the unread rest of the body would be taken for the next request).

use crate::error::{ApiError, Flavor};
use crate::state::SharedState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// Which origins may call the API from a browser.
#[derive(Debug, Clone, Default)]
pub enum AllowedOrigins {
    /// None (the default): cross-origin browser requests are refused.
    #[default]
    None,
    Any,
    List(Vec<String>),
}

impl AllowedOrigins {
    /// `--allowed-origins`: `*`, or a comma-separated list of `scheme://host[:port]`.
    pub fn parse(s: &str) -> Self {
        let list: Vec<String> = (s.split(','))
            .map(|o| o.trim().trim_end_matches('/').to_string())
            .filter(|o| !o.is_empty())
            .collect();
        if list.iter().any(|o| o == "*") {
            AllowedOrigins::Any
        } else if list.is_empty() {
            AllowedOrigins::None
        } else {
            AllowedOrigins::List(list)
        }
    }

    fn allows(&self, origin: &str) -> bool {
        match self {
            AllowedOrigins::None => false,
            AllowedOrigins::Any => true,
            AllowedOrigins::List(l) => l.iter().any(|o| o.eq_ignore_ascii_case(origin)),
        }
    }
}

pub fn flavor_of(path: &str) -> Flavor {
    if path.starts_with("/v1/messages") {
        Flavor::Anthropic
    } else {
        Flavor::OpenAi
    }
}

/// An origin naming this server itself (a page it served, were it to serve one) is not
/// cross-origin.
fn same_origin(origin: &str, headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let bare = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    matches!((bare, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

fn is_json(content_type: &str) -> bool {
    let mime = content_type.split(';').next().unwrap_or("").trim();
    mime.eq_ignore_ascii_case("application/json")
        || (mime.len() > 5 && mime[mime.len() - 5..].eq_ignore_ascii_case("+json"))
}

pub async fn guard(State(state): State<SharedState>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let flavor = flavor_of(&path);
    let origin = (req.headers().get(header::ORIGIN))
        .and_then(|o| o.to_str().ok())
        .map(str::to_string)
        .filter(|o| !same_origin(o, req.headers()));
    if let Some(origin) = &origin {
        if !state.config.allowed_origins.allows(origin) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "permission_error",
                format!("cross-origin request from `{origin}` refused; start the server with --allowed-origins to allow it"),
            )
            .with_flavor(flavor)
            .into_response();
        }
        if req.method() == Method::OPTIONS
            && req
                .headers()
                .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        {
            return preflight(origin, req.headers());
        }
    }
    if req.method() == Method::POST {
        let ct = (req.headers().get(header::CONTENT_TYPE)).map(|v| v.to_str().unwrap_or("?"));
        if let Some(ct) = ct.filter(|ct| !is_json(ct)) {
            return ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                format!(
                    "request bodies are JSON: send `Content-Type: application/json` (got `{ct}`)"
                ),
            )
            .with_flavor(flavor)
            .into_response();
        }
    }
    let mut res = enveloped(next.run(req).await, flavor).await;
    if let Some(origin) = origin {
        cors_headers(res.headers_mut(), &origin);
    }
    res
}

fn cors_headers(h: &mut HeaderMap, origin: &str) {
    if let Ok(v) = HeaderValue::from_str(origin) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    h.append(header::VARY, HeaderValue::from_static("origin"));
    h.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static("retry-after, server"),
    );
}

fn preflight(origin: &str, req: &HeaderMap) -> Response {
    let mut res = StatusCode::NO_CONTENT.into_response();
    let h = res.headers_mut();
    cors_headers(h, origin);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
    );
    let asked = req.get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        asked.unwrap_or(HeaderValue::from_static(
            "authorization, content-type, x-api-key, last-event-id",
        )),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    res
}

/// An error response that is not JSON (axum's own 405, path and body rejections) rewritten
/// into `flavor`'s envelope with its status and text; a 413 also closes the connection.
async fn enveloped(mut res: Response, flavor: Flavor) -> Response {
    let status = res.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return res;
    }
    let json = (res.headers().get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json);
    let mut res = if json {
        res
    } else {
        let allow = res.headers().get(header::ALLOW).cloned();
        let text = axum::body::to_bytes(std::mem::replace(res.body_mut(), Body::empty()), 4096)
            .await
            .map(|b| String::from_utf8_lossy(&b).trim().to_string())
            .unwrap_or_default();
        let message = match (status, text.is_empty()) {
            (StatusCode::METHOD_NOT_ALLOWED, _) => format!(
                "method not allowed on this route{}",
                allow
                    .as_ref()
                    .and_then(|a| a.to_str().ok())
                    .map(|a| format!("; allowed: {a}"))
                    .unwrap_or_default()
            ),
            (StatusCode::PAYLOAD_TOO_LARGE, _) => {
                "request body is larger than the server's limit (--max-body-bytes)".to_string()
            }
            (_, true) => status
                .canonical_reason()
                .unwrap_or("request refused")
                .to_string(),
            (_, false) => text,
        };
        let kind = match status.as_u16() {
            404 => "not_found_error",
            500..=599 => "api_error",
            _ => "invalid_request_error",
        };
        let mut out = ApiError::new(status, kind, message)
            .with_flavor(flavor)
            .into_response();
        if let Some(a) = allow {
            out.headers_mut().insert(header::ALLOW, a);
        }
        out
    };
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        let l = AllowedOrigins::parse("http://a.test, https://b.test:8443/");
        assert!(l.allows("http://a.test") && l.allows("https://b.test:8443"));
        assert!(!l.allows("http://c.test"));
        assert!(AllowedOrigins::parse("*").allows("http://x"));
        assert!(!AllowedOrigins::parse("").allows("http://x"));
    }

    #[test]
    fn json_types() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(is_json("application/vnd.api+json"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/x-www-form-urlencoded"));
        assert!(!is_json("multipart/form-data; boundary=x"));
    }
}
