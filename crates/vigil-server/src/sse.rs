//! Server-sent events: dialect A (untyped `data:` frames, the route sends `[DONE]` itself) and
//! dialect B (typed `event:` + `data:` frames). Frames are written as they come, with no
//! heartbeats; a dropped body drops the channel, which cancels the generation upstream.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::{Stream, StreamExt};
use std::convert::Infallible;
use tokio::sync::mpsc::UnboundedReceiver;

fn sse_response<F>(rx: UnboundedReceiver<String>, frame: F) -> Response
where
    F: Fn(String) -> String + Send + 'static,
{
    let stream = futures_util::stream::unfold((rx, frame), |(mut rx, frame)| async move {
        let item = rx.recv().await?;
        Some((frame(item), (rx, frame)))
    });
    frames_response(stream)
}

/// A response whose body is the given SSE frames, each written whole. The body pulls the next
/// frame only when the connection can take it, so a slow reader pushes back on the stream.
pub fn frames_response<S>(frames: S) -> Response
where
    S: Stream<Item = String> + Send + 'static,
{
    let stream = frames.map(|f| Ok::<_, Infallible>(axum::body::Bytes::from(f)));
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// Dialect A: each item is one `data:` payload (JSON text or `[DONE]`).
pub fn data_stream(rx: UnboundedReceiver<String>) -> Response {
    sse_response(rx, |data| format!("data: {data}\n\n"))
}

/// Dialect B: each item is `name\npayload`; written as `event: name` + `data: payload`.
pub fn event_stream(rx: UnboundedReceiver<String>) -> Response {
    sse_response(rx, |item| match item.split_once('\n') {
        Some((name, data)) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {item}\n\n"),
    })
}
