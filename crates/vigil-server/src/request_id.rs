//! A request id on every response: the client's `x-request-id` when it sent a usable one
//! (visible ASCII, at most 200 bytes), else a new `req_…`. It comes back as `x-request-id` (what
//! the OpenAI SDKs read into `_request_id`) and as `request-id` (Anthropic's name), and the
//! request's tracing span carries it, so the log lines of the request name it.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// Longest client-given id kept; a longer one is replaced.
const MAX_ID_BYTES: usize = 200;

fn client_id(req: &Request) -> Option<String> {
    let v = req.headers().get("x-request-id")?.to_str().ok()?;
    let usable =
        !v.is_empty() && v.len() <= MAX_ID_BYTES && v.bytes().all(|b| b.is_ascii_graphic());
    usable.then(|| v.to_string())
}

pub async fn request_id(req: Request, next: Next) -> Response {
    let id = client_id(&req).unwrap_or_else(|| crate::ids::new_id("req_"));
    let span = tracing::info_span!("request", id = %id, path = %req.uri().path());
    let mut res = next.run(req).instrument(span).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert("x-request-id", v.clone());
        res.headers_mut().insert("request-id", v);
    }
    res
}
