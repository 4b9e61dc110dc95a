//! HTTP to one target: JSON requests, and streamed requests whose SSE chunks are timestamped
//! as they arrive.

use crate::BenchError;
use futures_util::StreamExt;
use serde_json::Value;
use std::time::{Duration, Instant};

/// One target server, e.g. `http://127.0.0.1:8080`.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
}

/// Token counts from a reply's `usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub prompt_tokens: Option<u32>,
    pub completion_tokens: Option<u32>,
    /// `prompt_tokens_details.cached_tokens`: prompt tokens served from the prefix cache.
    pub cached_tokens: Option<u32>,
}

impl Usage {
    pub fn from_json(v: &Value) -> Usage {
        let n = |v: Option<&Value>| v.and_then(Value::as_u64).map(|n| n as u32);
        Usage {
            prompt_tokens: n(v.get("prompt_tokens")),
            completion_tokens: n(v.get("completion_tokens")),
            cached_tokens: n(v.pointer("/prompt_tokens_details/cached_tokens")),
        }
    }
}

/// What one streamed request did, with arrival times of its chunks.
#[derive(Debug, Clone)]
pub struct Streamed {
    pub start: Instant,
    /// First chunk carrying text (content, reasoning or completion text).
    pub first_text: Option<Instant>,
    /// First chunk carrying any choice: the first token's arrival even when it decodes to no
    /// text yet (a partial UTF-8 sequence, a special token).
    pub first_choice: Option<Instant>,
    pub last_text: Option<Instant>,
    pub end: Instant,
    pub text_chunks: u32,
    /// Generated text (content only for chat; reasoning is not re-sent in a conversation).
    pub text: String,
    /// Tool-call arguments the reply streamed (chat with tools), concatenated.
    pub tool_text: String,
    pub usage: Option<Usage>,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
}

impl Streamed {
    /// A request that failed before it was sent.
    pub fn failed(error: String) -> Streamed {
        let now = Instant::now();
        Streamed {
            start: now,
            first_text: None,
            first_choice: None,
            last_text: None,
            end: now,
            text_chunks: 0,
            text: String::new(),
            tool_text: String::new(),
            usage: None,
            finish_reason: None,
            error: Some(error),
        }
    }
}

impl Client {
    pub fn new(base: &str, timeout: Duration) -> Result<Client, BenchError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|source| BenchError::Http {
                url: base.to_string(),
                source,
            })?;
        Ok(Client {
            http,
            base: base.trim_end_matches('/').to_string(),
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// GET `path`; the JSON body and the `server` header (names the engine on some servers).
    pub async fn get_json(&self, path: &str) -> Result<(Value, Option<String>), BenchError> {
        let url = format!("{}{path}", self.base);
        let resp = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|source| BenchError::Http {
                url: url.clone(),
                source,
            })?;
        let server = resp
            .headers()
            .get(reqwest::header::SERVER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        Ok((read_json(&url, resp).await?, server))
    }

    /// GET `path` as text (e.g. a Prometheus `/metrics` page).
    pub async fn get_text(&self, path: &str) -> Result<String, BenchError> {
        let url = format!("{}{path}", self.base);
        let http = |source| BenchError::Http {
            url: url.clone(),
            source,
        };
        let resp = self.http.get(&url).send().await.map_err(http)?;
        let status = resp.status();
        let text = resp.text().await.map_err(http)?;
        if !status.is_success() {
            return Err(BenchError::Status {
                url: url.clone(),
                status: status.as_u16(),
                body: clip(&text),
            });
        }
        Ok(text)
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Value, BenchError> {
        let url = format!("{}{path}", self.base);
        let resp = send(self.http.post(&url).json(body))
            .await
            .map_err(|source| BenchError::Http {
                url: url.clone(),
                source,
            })?;
        read_json(&url, resp).await
    }

    pub async fn delete_json(&self, path: &str) -> Result<Value, BenchError> {
        let url = format!("{}{path}", self.base);
        let resp = (self.http.delete(&url).send().await).map_err(|source| BenchError::Http {
            url: url.clone(),
            source,
        })?;
        read_json(&url, resp).await
    }

    /// Sends a streamed request; never fails as a call: what went wrong is in `error`, so a
    /// failed request is a counted sample, not an aborted run.
    pub async fn stream(&self, path: &str, body: &Value) -> Streamed {
        self.stream_with(path, body, &[]).await
    }

    /// [`Client::stream`] with extra request headers (e.g. `x-layerscale-session-id`).
    pub async fn stream_with(
        &self,
        path: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> Streamed {
        let mut out = Streamed::failed(String::new());
        out.error = None;
        if let Err(e) = self.stream_into(path, body, headers, &mut out).await {
            out.error = Some(e);
        }
        out.end = Instant::now();
        out
    }

    /// [`Client::stream`] cut off at `deadline`: what arrived before it, and whether it was cut
    /// (a cut request carries no error of its own).
    pub async fn stream_until(
        &self,
        path: &str,
        body: &Value,
        deadline: Instant,
    ) -> (Streamed, bool) {
        let mut out = Streamed::failed(String::new());
        out.error = None;
        let streaming = self.stream_into(path, body, &[], &mut out);
        let cut = match tokio::time::timeout_at(deadline.into(), streaming).await {
            Ok(Ok(())) => false,
            Ok(Err(e)) => {
                out.error = Some(e);
                false
            }
            Err(_) => true,
        };
        out.end = Instant::now();
        (out, cut)
    }

    async fn stream_into(
        &self,
        path: &str,
        body: &Value,
        headers: &[(&str, &str)],
        out: &mut Streamed,
    ) -> Result<(), String> {
        let url = format!("{}{path}", self.base);
        let mut req = self.http.post(&url).json(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = send(req).await.map_err(|e| with_causes(&e))?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(format!("HTTP {}: {}", status.as_u16(), clip(&text)));
        }
        let mut bytes = resp.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(piece) = bytes.next().await {
            let piece = piece.map_err(|e| format!("reading the stream: {e}"))?;
            let now = Instant::now();
            buf.extend_from_slice(&piece);
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                if on_line(&line, now, out)? {
                    return Ok(());
                }
            }
        }
        if !buf.is_empty() {
            on_line(&buf, Instant::now(), out)?;
        }
        Ok(())
    }
}

/// Sends `req`, and once more on a fresh connection when the server had closed the pooled
/// keep-alive connection it went out on (cpp-httplib servers such as llama-server close idle
/// connections after a few seconds): the server never read it, so resending is safe, and it is
/// what an HTTP client library does. Any other failure is the request's.
async fn send(req: reqwest::RequestBuilder) -> Result<reqwest::Response, reqwest::Error> {
    let again = req.try_clone();
    match req.send().await {
        Err(e) if closed_idle_connection(&e) => match again {
            Some(again) => again.send().await,
            None => Err(e),
        },
        other => other,
    }
}

/// hyper's error for a connection closed before any response (its `IncompleteMessage`).
fn closed_idle_connection(e: &reqwest::Error) -> bool {
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        if c.to_string()
            .contains("connection closed before message completed")
        {
            return true;
        }
        cause = c.source();
    }
    false
}

/// The error and its causes, so a failed sample says why (reqwest's own message names only the
/// URL).
fn with_causes(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Handles one SSE line; `true` at `data: [DONE]`.
fn on_line(line: &[u8], now: Instant, out: &mut Streamed) -> Result<bool, String> {
    let line = String::from_utf8_lossy(line);
    let Some(payload) = line.trim_end().strip_prefix("data:") else {
        return Ok(false); // blank separators, comments, `event:` names
    };
    let payload = payload.trim();
    if payload == "[DONE]" {
        return Ok(true);
    }
    let chunk: Value = serde_json::from_str(payload)
        .map_err(|e| format!("bad SSE chunk ({e}): {}", clip(payload)))?;
    if let Some(err) = chunk.get("error") {
        return Err(format!("error in stream: {}", clip(&err.to_string())));
    }
    if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
        out.usage = Some(Usage::from_json(u));
    }
    for choice in chunk
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.first_choice.get_or_insert(now);
        let content = nonempty(choice.get("text")).or(nonempty(choice.pointer("/delta/content")));
        let reasoning = nonempty(choice.pointer("/delta/reasoning"))
            .or(nonempty(choice.pointer("/delta/reasoning_content")));
        // A tool call streams as argument fragments instead of content.
        let call = (choice
            .pointer("/delta/tool_calls")
            .and_then(Value::as_array))
        .into_iter()
        .flatten()
        .filter_map(|c| nonempty(c.pointer("/function/arguments")))
        .collect::<String>();
        if !call.is_empty() {
            out.tool_text.push_str(&call);
        }
        if content.is_some() || reasoning.is_some() || !call.is_empty() {
            out.first_text.get_or_insert(now);
            out.last_text = Some(now);
            out.text_chunks += 1;
        }
        if let Some(c) = content {
            out.text.push_str(c);
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            out.finish_reason = Some(f.to_string());
        }
    }
    // LayerScale's dialect A (session `generate`): `{"text": …}` frames, then a `done` frame
    // with the finish reason and usage at the top level.
    if chunk.get("choices").is_none() {
        if let Some(t) = nonempty(chunk.get("text")) {
            out.first_choice.get_or_insert(now);
            out.first_text.get_or_insert(now);
            out.last_text = Some(now);
            out.text_chunks += 1;
            out.text.push_str(t);
        }
        if let Some(f) = chunk.get("finish_reason").and_then(Value::as_str) {
            out.finish_reason = Some(f.to_string());
        }
    }
    Ok(false)
}

fn nonempty(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str).filter(|s| !s.is_empty())
}

async fn read_json(url: &str, resp: reqwest::Response) -> Result<Value, BenchError> {
    let status = resp.status();
    let text = resp.text().await.map_err(|source| BenchError::Http {
        url: url.to_string(),
        source,
    })?;
    if !status.is_success() {
        return Err(BenchError::Status {
            url: url.to_string(),
            status: status.as_u16(),
            body: clip(&text),
        });
    }
    serde_json::from_str(&text).map_err(|e| BenchError::Reply {
        url: url.to_string(),
        what: format!("not JSON ({e}): {}", clip(&text)),
    })
}

fn clip(s: &str) -> String {
    s.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty() -> Streamed {
        Streamed {
            error: None,
            ..Streamed::failed(String::new())
        }
    }

    #[test]
    fn parses_chat_and_completion_chunks() {
        let mut s = empty();
        let t = Instant::now();
        let lines = [
            r#"data: {"choices":[{"delta":{"role":"assistant","content":""}}],"usage":null}"#,
            "",
            r#"data: {"choices":[{"delta":{"content":"Hi"}}]}"#,
            r#"data: {"choices":[{"text":" there","finish_reason":"length"}]}"#,
            r#"data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}"#,
        ];
        for l in lines {
            assert!(!on_line(l.as_bytes(), t, &mut s).unwrap());
        }
        assert!(on_line(b"data: [DONE]\n", t, &mut s).unwrap());
        assert_eq!(s.text, "Hi there");
        assert_eq!(s.text_chunks, 2);
        assert_eq!(s.finish_reason.as_deref(), Some("length"));
        let u = s.usage.unwrap();
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.cached_tokens),
            (Some(12), Some(2), Some(8))
        );
    }

    #[test]
    fn tool_call_fragments_count_as_generated_text() {
        let mut s = empty();
        let t = Instant::now();
        let lines = [
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"search","arguments":""}}]}}]}"#,
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"q\": "}}]}}]}"#,
            r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"x\"}"}}]},"finish_reason":"tool_calls"}]}"#,
        ];
        for l in lines {
            assert!(!on_line(l.as_bytes(), t, &mut s).unwrap());
        }
        assert_eq!(s.tool_text, r#"{"q": "x"}"#);
        assert_eq!(s.text, "");
        assert_eq!(s.text_chunks, 2);
        assert_eq!(s.first_text, Some(t));
    }

    #[test]
    fn parses_session_generate_frames() {
        let mut s = empty();
        let t = Instant::now();
        let lines = [
            r#"data: {"text":"Yes"}"#,
            r#"data: {"text":", sensor-3"}"#,
            r#"data: {"done":true,"finish_reason":"length","data_version":7,"usage":{"prompt_tokens":30,"completion_tokens":2}}"#,
        ];
        for l in lines {
            assert!(!on_line(l.as_bytes(), t, &mut s).unwrap());
        }
        assert!(on_line(b"data: [DONE]", t, &mut s).unwrap());
        assert_eq!(s.text, "Yes, sensor-3");
        assert_eq!(s.text_chunks, 2);
        assert!(s.first_text.is_some());
        assert_eq!(s.finish_reason.as_deref(), Some("length"));
        assert_eq!(s.usage.and_then(|u| u.completion_tokens), Some(2));
    }

    /// A one-shot SSE server: answers the first request with `events`, then holds the
    /// connection open for `hold` (a stream still running) before closing it.
    fn sse_server(events: &'static [&'static str], hold: Duration) -> String {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            let _ = sock.read(&mut [0u8; 8192]);
            let mut reply = String::from(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
            );
            for e in events {
                reply.push_str(&format!("data: {e}\n\n"));
            }
            let _ = sock.write_all(reply.as_bytes());
            let _ = sock.flush();
            std::thread::sleep(hold);
        });
        format!("http://{addr}")
    }

    /// A keep-alive server that answers the first request on a connection and closes the
    /// connection without answering when a second request arrives on it (the race a client hits
    /// when it reuses a pooled connection the server just closed), counting what it answered.
    fn closing_keep_alive_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let answered = std::sync::Arc::new(AtomicUsize::new(0));
        let count = answered.clone();
        std::thread::spawn(move || {
            for sock in listener.incoming() {
                let Ok(mut sock) = sock else { return };
                let count = count.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 8192];
                    if sock.read(&mut buf).unwrap_or(0) == 0 {
                        return;
                    }
                    let body = r#"{"ok":true}"#;
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    // Counted before it is sent: the client may check the count as soon as
                    // the reply arrives.
                    count.fetch_add(1, Ordering::SeqCst);
                    let _ = sock.write_all(reply.as_bytes());
                    // The next request on this connection: read it, answer nothing, close.
                    let _ = sock.read(&mut buf);
                });
            }
        });
        (format!("http://{addr}"), answered)
    }

    #[tokio::test]
    async fn a_request_on_a_connection_the_server_closed_is_sent_again() {
        let (url, answered) = closing_keep_alive_server();
        let client = Client::new(&url, Duration::from_secs(10)).unwrap();
        let body = serde_json::json!({"x": 1});
        for i in 0..3 {
            // The second and third go out on the pooled connection, which the server closes.
            let v = client.post_json("/v1/x", &body).await;
            assert_eq!(v.ok(), Some(serde_json::json!({"ok": true})), "request {i}");
        }
        assert_eq!(answered.load(std::sync::atomic::Ordering::SeqCst), 3);
        let s = client.stream("/v1/x", &body).await;
        assert_eq!(s.error, None);
    }

    #[tokio::test]
    async fn a_stream_cut_at_its_deadline_keeps_what_arrived() {
        let tokens = &[
            r#"{"choices":[{"text":"a"}]}"#,
            r#"{"choices":[{"text":"b"}]}"#,
        ];
        let url = sse_server(tokens, Duration::from_secs(5));
        let client = Client::new(&url, Duration::from_secs(30)).unwrap();
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_millis(400);
        let (s, cut) = client.stream_until("/x", &Value::Null, deadline).await;
        assert!(cut);
        assert_eq!((s.text.as_str(), s.text_chunks), ("ab", 2));
        assert_eq!(s.error, None);
        assert!(s.end >= deadline && s.end < t0 + Duration::from_secs(2));
        // A stream that ends in time is not cut.
        let done = &[
            r#"{"choices":[{"text":"c","finish_reason":"length"}]}"#,
            "[DONE]",
        ];
        let url = sse_server(done, Duration::from_secs(5));
        let client = Client::new(&url, Duration::from_secs(30)).unwrap();
        let far = Instant::now() + Duration::from_secs(3);
        let (s, cut) = client.stream_until("/x", &Value::Null, far).await;
        assert!(!cut);
        assert_eq!(s.finish_reason.as_deref(), Some("length"));
        assert!(s.end < far);
    }

    #[test]
    fn an_error_frame_fails_the_request() {
        let mut s = empty();
        let frame = br#"data: {"error":{"message":"boom","type":"server_error"}}"#;
        assert!(on_line(frame, Instant::now(), &mut s)
            .unwrap_err()
            .contains("boom"));
    }
}
