//! Server-sent events: dialect A (untyped `data:` frames, the route sends `[DONE]` itself) and
//! dialect B (typed `event:` + `data:` frames). Frames are written as they come, with no
//! heartbeats; a dropped body drops the channel, which cancels the generation upstream.
//!
//! Every stream also ends at the shutdown deadline ([`Closing`]): it then writes one last
//! frame saying why, in its dialect, instead of being cut off mid-answer.

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::{Stream, StreamExt};
use std::convert::Infallible;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;

/// Why a stream ended early at shutdown, for the final frames.
pub const SHUTDOWN_MESSAGE: &str =
    "the server is shutting down and its --shutdown-timeout has passed; this stream ends here";

/// The server-wide signal that open streams must end now (the shutdown deadline passed).
#[derive(Debug)]
pub struct Closing(watch::Sender<bool>);

impl Default for Closing {
    fn default() -> Self {
        Closing(watch::Sender::new(false))
    }
}

impl Closing {
    /// End every open stream (each writes its final frame).
    pub fn close_all(&self) {
        self.0.send_replace(true);
    }

    /// Resolves once [`Closing::close_all`] was called.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.0.subscribe();
        async move {
            if rx.wait_for(|c| *c).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// `frames` until they end or `closing` fires; then `last` as the stream's final frame.
fn until_closing<S>(frames: S, closing: &Closing, last: String) -> impl Stream<Item = String>
where
    S: Stream<Item = String> + Send + 'static,
{
    let closed = Box::pin(closing.closed());
    let start = Some((Box::pin(frames), closed, last));
    futures_util::stream::unfold(start, |st| async move {
        let (mut frames, mut closed, last) = st?;
        tokio::select! {
            biased;
            f = frames.next() => f.map(|f| (f, Some((frames, closed, last)))),
            _ = &mut closed => Some((last, None)),
        }
    })
}

fn sse_response<F>(
    rx: UnboundedReceiver<String>,
    frame: F,
    closing: &Closing,
    last: String,
) -> Response
where
    F: Fn(String) -> String + Send + 'static,
{
    let stream = futures_util::stream::unfold((rx, frame), |(mut rx, frame)| async move {
        let item = rx.recv().await?;
        Some((frame(item), (rx, frame)))
    });
    frames_response(until_closing(stream, closing, last))
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

/// Dialect A: each item is one `data:` payload (JSON text or `[DONE]`). At the shutdown
/// deadline: an OpenAI error frame (`code: server_shutdown`), then `[DONE]`.
pub fn data_stream(rx: UnboundedReceiver<String>, closing: &Closing) -> Response {
    let err = serde_json::json!({"error": {
        "message": SHUTDOWN_MESSAGE, "type": "server_error", "code": "server_shutdown",
    }});
    let last = format!("data: {err}\n\ndata: [DONE]\n\n");
    sse_response(rx, |data| format!("data: {data}\n\n"), closing, last)
}

/// A dialect B item (`name\npayload`) as its frame.
fn typed_frame(item: String) -> String {
    match item.split_once('\n') {
        Some((name, data)) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {item}\n\n"),
    }
}

/// Dialect B: each item is `name\npayload`; written as `event: name` + `data: payload`. At the
/// shutdown deadline: an Anthropic `error` event (`overloaded_error`: retry elsewhere).
pub fn event_stream(rx: UnboundedReceiver<String>, closing: &Closing) -> Response {
    let err = serde_json::json!({"type": "error", "error": {
        "type": "overloaded_error", "message": SHUTDOWN_MESSAGE,
    }});
    let last = format!("event: error\ndata: {err}\n\n");
    sse_response(rx, typed_frame, closing, last)
}

/// Dialect B for OpenAI's Responses API: at the shutdown deadline, its `error` event.
pub fn responses_event_stream(rx: UnboundedReceiver<String>, closing: &Closing) -> Response {
    let err = serde_json::json!({"type": "error", "code": "server_shutdown",
        "message": SHUTDOWN_MESSAGE, "param": null});
    let last = format!("event: error\ndata: {err}\n\n");
    sse_response(rx, typed_frame, closing, last)
}
