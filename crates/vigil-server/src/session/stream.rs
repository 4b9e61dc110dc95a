//! A session's live feeds: `GET …/events` (SSE dialect B) and `GET …/ws` (WebSocket, the
//! `{type, data}` envelope). Both start with `connected`, replay the cached flash answers, then
//! follow the session's event bus; each event carries its bus id (`id:` on SSE, `event_id` on
//! WS) and `Last-Event-ID` resumes from the replay buffer. Both read the bus only as fast as
//! the client reads the connection, so a subscriber that falls more than the bus's capacity
//! behind gets `lagged` and is cut off; nothing is buffered per subscriber beyond the socket.

use super::events::SessionEvent;
use super::handle::{Held, Hold};
use super::ingest;
use super::routes::{push_entries, PushData};
use super::valid_id;
use super::Session;
use crate::error::ApiError;
use crate::routes::error_response;
use crate::state::SharedState;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures_util::Stream;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast::{self, error::RecvError};

const HEARTBEAT: Duration = Duration::from_secs(15);
const WS_READ_TIMEOUT: Duration = Duration::from_secs(30);

fn sse_frame(id: Option<u64>, kind: &str, data: &Value) -> String {
    match id {
        Some(id) => format!("id: {id}\nevent: {kind}\ndata: {data}\n\n"),
        None => format!("event: {kind}\ndata: {data}\n\n"),
    }
}

pub async fn events(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let session = match state.sessions.get(&id) {
        Ok(s) => s,
        Err(e) => return error_response(&state, e),
    };
    let last_id = (headers.get("last-event-id"))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match sse_feed(session, last_id).await {
        Ok(feed) => crate::sse::frames_response(feed),
        Err(e) => error_response(&state, e),
    }
}

/// The frames of one SSE subscription: `connected`, then the buffered events after `last_id`
/// when the buffer reaches back to it (else the cached flash answers), then the live bus.
async fn sse_feed(
    session: Arc<Session>,
    last_id: Option<u64>,
) -> Result<impl Stream<Item = String>, ApiError> {
    let sub = Hold::new(session.clone(), Held::Subscriber);
    let (rx, buffered) = session.events.subscribe(last_id);
    let (connected, flash_replay) = session.stream_opening().await?;
    let resumed = last_id.is_some_and(|last| {
        buffered
            .first()
            .map_or(session.events.next_id() == last + 1, |e| e.id == last + 1)
    });
    let mut opening = VecDeque::new();
    opening.push_back(sse_frame(None, "connected", &connected));
    if resumed {
        opening.extend(
            buffered
                .iter()
                .map(|ev| sse_frame(Some(ev.id), ev.kind, &ev.data)),
        );
    } else {
        opening.extend(
            flash_replay
                .iter()
                .map(|d| sse_frame(None, "flash_ready", d)),
        );
    }
    let feed = SseFeed {
        sub,
        rx,
        opening,
        done: false,
    };
    Ok(futures_util::stream::unfold(feed, SseFeed::next_frame))
}

/// The state of one SSE stream. Its frames are pulled by the response body, so the bus
/// receiver is read only as fast as the client reads: a reader more than the bus's capacity
/// behind finds `Lagged` on its receiver and gets `lagged`, then the end of the stream.
struct SseFeed {
    sub: Hold,
    rx: broadcast::Receiver<Arc<SessionEvent>>,
    opening: VecDeque<String>,
    done: bool,
}

impl SseFeed {
    async fn next_frame(mut self) -> Option<(String, Self)> {
        if let Some(frame) = self.opening.pop_front() {
            return Some((frame, self));
        }
        if self.done {
            return None;
        }
        let session = self.sub.session.clone();
        let next = tokio::select! {
            biased;
            r = tokio::time::timeout(HEARTBEAT, self.rx.recv()) => r,
            _ = session.wait_deleted() => match self.rx.try_recv() {
                Ok(ev) => Ok(Ok(ev)),
                Err(_) => return None,
            },
        };
        let frame = match next {
            Err(_) => ": heartbeat\n\n".to_string(),
            Ok(Ok(ev)) => {
                self.done = matches!(ev.kind, "deleted" | "shutdown");
                sse_frame(Some(ev.id), ev.kind, &ev.data)
            }
            Ok(Err(RecvError::Lagged(n))) => {
                self.done = true;
                sse_frame(None, "lagged", &json!({"missed": n}))
            }
            Ok(Err(RecvError::Closed)) => return None,
        };
        Some((frame, self))
    }
}

pub async fn ws(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    if !valid_id(&id) {
        return error_response(
            &state,
            ApiError::invalid("id", format!("malformed session id in the path: `{id}`")),
        );
    }
    let session = match state.sessions.get(&id) {
        Ok(s) => s,
        Err(e) => return error_response(&state, e),
    };
    let upgrade = match upgrade {
        Ok(u) => u,
        Err(e) => {
            return error_response(
                &state,
                ApiError::bad_request(format!("not a WebSocket upgrade: {e}")),
            )
        }
    };
    // A pushed message obeys the same limit as a push body.
    let limit = state.config.max_body_bytes;
    upgrade
        .max_message_size(limit)
        .max_frame_size(limit)
        .on_upgrade(move |socket| serve_socket(state, session, socket))
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ClientMessage {
    Push { data: PushData },
    Ping,
    Close,
}

fn envelope(kind: &str, data: Value, event_id: Option<u64>) -> Message {
    let mut v = json!({"type": kind, "data": data});
    if let Some(id) = event_id {
        v["event_id"] = json!(id);
    }
    Message::Text(v.to_string().into())
}

fn ws_error(e: &ApiError) -> Message {
    envelope(
        "error",
        json!({"message": e.message, "code": e.status.as_u16()}),
        None,
    )
}

async fn serve_socket(state: SharedState, session: Arc<Session>, mut socket: WebSocket) {
    let _sub = Hold::new(session.clone(), Held::Subscriber);
    let (mut rx, _) = session.events.subscribe(None);
    let Ok((connected, flash_replay)) = session.stream_opening().await else {
        let _ = socket.send(Message::Close(None)).await;
        return;
    };
    let mut out = vec![envelope("connected", connected, None)];
    out.extend(
        flash_replay
            .into_iter()
            .map(|d| envelope("flash_ready", d, None)),
    );
    for m in out {
        if socket.send(m).await.is_err() {
            return;
        }
    }
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + HEARTBEAT, HEARTBEAT);
    let mut read_deadline = tokio::time::Instant::now() + WS_READ_TIMEOUT;
    loop {
        // Events first: a client that pipelines pushes over this socket reads the events they
        // cause before the server reads its next push, so its own pushes cannot put it more
        // than the bus's capacity behind (an unbiased pick let a fast producer lag itself).
        let reply: Option<Message> = tokio::select! {
            biased;
            ev = rx.recv() => match ev {
                Ok(ev) => Some(event_message(&ev)),
                Err(RecvError::Lagged(n)) => {
                    let _ = socket.send(envelope("lagged", json!({"missed": n}), None)).await;
                    let _ = socket.send(Message::Close(None)).await;
                    return;
                }
                Err(RecvError::Closed) => return,
            },
            msg = socket.recv() => {
                read_deadline = tokio::time::Instant::now() + WS_READ_TIMEOUT;
                match msg {
                    None => return,
                    Some(Err(e)) => {
                        // A message over the limit (or a broken frame): say so, if the socket
                        // still takes a close frame.
                        let (code, reason) = match e.to_string().to_ascii_lowercase() {
                            m if m.contains("too long") || m.contains("too big") || m.contains("capacity") => (1009, "message larger than --max-body-bytes"),
                            _ => (1002, "protocol error"),
                        };
                        let frame = axum::extract::ws::CloseFrame { code, reason: reason.into() };
                        let _ = socket.send(Message::Close(Some(frame))).await;
                        return;
                    }
                    Some(Ok(Message::Text(t))) => match handle_text(&state, &session, t.as_str()).await {
                        Reply::Send(m) => Some(m),
                        Reply::Close => {
                            let _ = socket.send(Message::Close(None)).await;
                            return;
                        }
                    },
                    Some(Ok(Message::Binary(_))) => Some(ws_error(&ApiError::bad_request("binary frames are not accepted; send JSON text"))),
                    Some(Ok(Message::Close(_))) => return,
                    Some(Ok(_)) => None,
                }
            }
            _ = ping.tick() => Some(Message::Ping(axum::body::Bytes::from_static(b"hb"))),
            _ = tokio::time::sleep_until(read_deadline) => {
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
            _ = session.wait_deleted() => {
                while let Ok(ev) = rx.try_recv() {
                    let _ = socket.send(event_message(&ev)).await;
                }
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
        };
        if let Some(m) = reply {
            if socket.send(m).await.is_err() {
                return;
            }
        }
    }
}

fn event_message(ev: &SessionEvent) -> Message {
    envelope(ev.kind, ev.data.clone(), Some(ev.id))
}

enum Reply {
    Send(Message),
    Close,
}

/// One client message. A push is acknowledged here, before the loop reads the bus again, so
/// the ack precedes every event the push causes.
async fn handle_text(state: &SharedState, session: &Arc<Session>, text: &str) -> Reply {
    let msg: ClientMessage = match serde_json::from_str(text) {
        Ok(m) => m,
        Err(e) => {
            let e = crate::extract::describe(&e);
            let err = ApiError::bad_request(format!(
                "unrecognised message ({e}); expected {{\"type\": \"push\", \"data\": ...}}, {{\"type\": \"ping\"}} or {{\"type\": \"close\"}}"
            ));
            return Reply::Send(ws_error(&err));
        }
    };
    match msg {
        ClientMessage::Ping => Reply::Send(envelope("pong", json!({}), None)),
        ClientMessage::Close => Reply::Close,
        ClientMessage::Push { data } => {
            session.touch();
            let r = async {
                let entries = ingest::tokenize_entries(state, push_entries(data)?).await?;
                session.push(entries).await
            }
            .await;
            Reply::Send(match r {
                Ok(ack) => envelope("push_ack", ack, None),
                Err(e) => ws_error(&e),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::events::CHANNEL_EVENTS;
    use futures_util::StreamExt;

    fn session() -> Arc<Session> {
        use crate::session::testing;
        testing::spawn(
            testing::tiny_deps(64),
            testing::plain_settings(vec![1, 2, 3]),
        )
    }

    async fn subscribers(s: &Session) -> u64 {
        s.describe(false).await.unwrap()["subscribers"]
            .as_u64()
            .unwrap()
    }

    fn kind(frame: &str) -> &str {
        frame
            .lines()
            .find_map(|l| l.strip_prefix("event: "))
            .unwrap_or(frame.trim())
    }

    #[tokio::test]
    async fn a_reader_too_far_behind_gets_lagged_then_the_end() {
        let s = session();
        let mut feed = Box::pin(sse_feed(s.clone(), None).await.unwrap());
        assert_eq!(kind(&feed.next().await.unwrap()), "connected");
        for i in 0..CHANNEL_EVENTS + 88 {
            s.events
                .publish("data_updated", json!({ "data_version": i }));
        }
        let lagged = feed.next().await.unwrap();
        assert_eq!(kind(&lagged), "lagged");
        assert!(lagged.contains(r#"{"missed":88}"#), "{lagged}");
        assert_eq!(subscribers(&s).await, 1);
        assert!(feed.next().await.is_none());
        drop(feed);
        assert_eq!(
            subscribers(&s).await,
            0,
            "an ended stream no longer holds the session"
        );
    }

    #[tokio::test]
    async fn a_reader_within_the_bus_capacity_gets_every_event_in_order() {
        let s = session();
        let mut feed = Box::pin(sse_feed(s.clone(), None).await.unwrap());
        for i in 0..CHANNEL_EVENTS {
            s.events
                .publish("data_updated", json!({ "data_version": i }));
        }
        assert_eq!(kind(&feed.next().await.unwrap()), "connected");
        for i in 0..CHANNEL_EVENTS {
            let f = feed.next().await.unwrap();
            assert!(f.starts_with(&format!("id: {}\n", i + 1)), "{f}");
            assert!(
                f.ends_with(&format!("data: {{\"data_version\":{i}}}\n\n")),
                "{f}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_stream_sends_a_heartbeat_every_15_seconds() {
        let s = session();
        let mut feed = Box::pin(sse_feed(s.clone(), None).await.unwrap());
        assert_eq!(kind(&feed.next().await.unwrap()), "connected");
        let started = tokio::time::Instant::now();
        assert_eq!(feed.next().await.unwrap(), ": heartbeat\n\n");
        assert_eq!(started.elapsed(), HEARTBEAT);
        s.events.publish("data_updated", json!({}));
        assert_eq!(kind(&feed.next().await.unwrap()), "data_updated");
        assert_eq!(feed.next().await.unwrap(), ": heartbeat\n\n");
        assert_eq!(started.elapsed(), 2 * HEARTBEAT);
    }

    #[tokio::test]
    async fn a_deleted_session_sends_deleted_last() {
        let s = session();
        let mut feed = Box::pin(sse_feed(s.clone(), None).await.unwrap());
        assert_eq!(kind(&feed.next().await.unwrap()), "connected");
        s.delete().await.unwrap();
        assert_eq!(kind(&feed.next().await.unwrap()), "deleted");
        assert!(feed.next().await.is_none());
    }

    #[tokio::test]
    async fn last_event_id_resumes_from_the_buffer() {
        let s = session();
        for i in 0..5 {
            s.events
                .publish("data_updated", json!({ "data_version": i }));
        }
        let mut feed = Box::pin(sse_feed(s.clone(), Some(3)).await.unwrap());
        assert_eq!(kind(&feed.next().await.unwrap()), "connected");
        assert!(feed.next().await.unwrap().starts_with("id: 4\n"));
        assert!(feed.next().await.unwrap().starts_with("id: 5\n"));
    }
}
