//! Chat streams that keep a target's engine busy while the live stream flows
//! (`--chat-streams N`), and when each acknowledged push became KV-resident under that load.
//!
//! Each of the N streams sends one streaming chat completion after another (a different
//! prompt of about 100 tokens each time, `CHAT_TOKENS` tokens out), so the engine always has N
//! client requests decoding or prefilling. Residency is read off the session object: a push's
//! ack says it is push number `total_pushed`, and the session's `total_ingested` (or, where a
//! server lacks it, its retained plus evicted entries) says how many pushes are resident; a
//! poller reads it every `POLL` (so a figure is late by at most that).

use crate::client::Client;
use crate::stats::Summary;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Tokens each chat request generates.
pub const CHAT_TOKENS: u32 = 64;
/// How often the residency poller reads the session.
pub const POLL: Duration = Duration::from_millis(25);

/// What the chat load did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChatLoad {
    pub streams: u32,
    pub requests: u64,
    pub failed: u64,
    pub output_tokens: u64,
    pub wall_s: f64,
    pub output_tok_s: f64,
    pub ttft_ms: Option<Summary>,
    pub e2e_ms: Option<Summary>,
    pub errors: Vec<String>,
}

/// Runs `streams` closed-loop chat streams until `stop` is notified.
pub async fn run_chat_load(
    client: &Client,
    model: &str,
    streams: u32,
    seed: u64,
    stop: &Notify,
) -> ChatLoad {
    let t0 = Instant::now();
    let done = Mutex::new(Vec::new());
    let stopped = std::sync::atomic::AtomicBool::new(false);
    let one = |k: u32| {
        let done = &done;
        let stopped = &stopped;
        async move {
            let mut i = 0u64;
            while !stopped.load(std::sync::atomic::Ordering::Acquire) {
                let body = chat_request(model, seed, k, i);
                let r = client.stream("/v1/chat/completions", &body).await;
                i += 1;
                if let Ok(mut d) = done.lock() {
                    d.push(r);
                }
            }
        }
    };
    {
        let all = futures_util::future::join_all((0..streams).map(one));
        tokio::pin!(all);
        tokio::select! {
            _ = &mut all => {}
            _ = stop.notified() => {
                // Requests in flight finish (each takes a few seconds), so none is cut short
                // mid-answer and counted as a failure.
                stopped.store(true, std::sync::atomic::Ordering::Release);
                all.await;
            }
        }
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let done = done.into_inner().unwrap_or_default();
    let ok: Vec<_> = done.iter().filter(|r| r.error.is_none()).collect();
    let output_tokens: u64 = (ok.iter())
        .map(|r| u64::from(r.usage.and_then(|u| u.completion_tokens).unwrap_or(0)))
        .sum();
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
    ChatLoad {
        streams,
        requests: ok.len() as u64,
        failed: (done.len() - ok.len()) as u64,
        output_tokens,
        wall_s,
        output_tok_s: output_tokens as f64 / wall_s.max(1e-9),
        // The first chunk with text: a server may send a role-only chunk before any token.
        ttft_ms: Summary::of((ok.iter()).filter_map(|r| r.first_text.map(|f| ms(r.start, f)))),
        e2e_ms: Summary::of(ok.iter().map(|r| ms(r.start, r.end))),
        errors: (done.iter())
            .filter_map(|r| r.error.clone())
            .take(5)
            .collect(),
    }
}

/// Request `i` of stream `k`: a prompt of its own (no two share more than the template), so
/// every request prefills.
fn chat_request(model: &str, seed: u64, k: u32, i: u64) -> Value {
    let words = [
        "pump", "valve", "boiler", "turbine", "sensor", "pressure", "flow", "heat", "line",
        "shift", "report", "alarm", "check", "filter", "motor", "gauge",
    ];
    let mut x = seed ^ (u64::from(k) << 32) ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut text = format!("Request {k}-{i}. Summarize these maintenance notes:");
    for _ in 0..80 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        text.push(' ');
        text.push_str(words[(x >> 60) as usize]);
    }
    let messages = [json!({"role": "user", "content": text})];
    let mut body = crate::run::chat_body(model, &messages, CHAT_TOKENS, true);
    body["ignore_eos"] = json!(true);
    body
}

/// Acks and residency readings, matched up at the end.
#[derive(Default)]
pub struct Residency {
    /// (push number, ack time) of every push acknowledged while measured.
    acks: Mutex<Vec<(u64, Instant)>>,
    /// (total_ingested, time first seen), increasing.
    seen: Mutex<Vec<(u64, Instant)>>,
}

impl Residency {
    pub fn ack(&self, total_pushed: u64, at: Instant) {
        if let Ok(mut a) = self.acks.lock() {
            a.push((total_pushed, at));
        }
    }

    pub fn saw(&self, total_ingested: u64, at: Instant) {
        if let Ok(mut s) = self.seen.lock() {
            if s.last().is_none_or(|&(n, _)| total_ingested > n) {
                s.push((total_ingested, at));
            }
        }
    }

    /// The newest push number acknowledged so far (0: none).
    pub fn last_acked(&self) -> u64 {
        let acks = self.acks.lock().map(|a| a.last().map(|&(n, _)| n));
        acks.ok().flatten().unwrap_or(0)
    }

    /// Whether a reading covers push number `k`.
    pub fn covers(&self, k: u64) -> bool {
        let seen = self.seen.lock().map(|s| s.last().map(|&(n, _)| n));
        seen.ok().flatten().is_some_and(|n| n >= k)
    }

    /// Ms from each ack to the first reading that covers it, and how many acked pushes up to
    /// number `drained` no reading covered (still pending when the session was deleted); with
    /// each covered push's `[ack time after t0, ms to resident]`. Pushes after `drained` were
    /// acknowledged while the session was being wound down: those not covered are left out.
    pub fn summary(&self, t0: Instant, drained: u64) -> (Option<Summary>, u64, Vec<[f64; 2]>) {
        let acks = self.acks.lock().map(|a| a.clone()).unwrap_or_default();
        let seen = self.seen.lock().map(|s| s.clone()).unwrap_or_default();
        let ms_between =
            |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
        let mut timeline = Vec::new();
        let mut never = 0;
        for (k, at) in acks {
            // A batch can land before its ack reaches the client: that reads as 0 ms.
            match seen.iter().find(|&&(n, _)| n >= k) {
                Some(&(_, t)) => timeline.push([ms_between(t0, at), ms_between(at, t)]),
                None if k <= drained => never += 1,
                None => {}
            }
        }
        (Summary::of(timeline.iter().map(|p| p[1])), never, timeline)
    }
}
