//! Flash queries: questions registered on a session and answered in the background after
//! every ingested batch, so a `generate` asking one is answered at once.
//!
//! One evaluator task per session. It wakes on a new `data_version` (or a new query), and
//! evaluates every query that is not yet current at the newest version only: versions that
//! arrived while a round ran are skipped and counted, so evaluation never queues behind the
//! stream. Each evaluation is a greedy `Ingest`-class request on a fork of the session's KV (the
//! same rendering and sampling a cold `generate` with temperature 0 uses), so a round submitted
//! after batch k runs before batch k+1, and foreground requests still come first.

use super::state::Session;
use crate::error::ApiError;
use crate::generate::{self, GenParams};
use crate::state::SharedState;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::oneshot;
use vigil_engine::pins::PinUse;
use vigil_engine::sampling::SamplingParams;
use vigil_engine::sequence::Priority;

pub const MAX_FLASH_QUERIES: usize = 20;
pub const DEFAULT_FLASH_MAX_TOKENS: usize = 32;

#[derive(Debug, Clone)]
pub struct FlashAnswer {
    pub value: String,
    pub data_version: u64,
    /// First-token logit gap (top-1 minus top-2).
    pub confidence: f32,
    pub evaluated_at: u64,
}

#[derive(Debug, Clone)]
pub struct FlashQuery {
    pub id: u64,
    pub query: String,
    pub max_tokens: usize,
    pub tokens: usize,
    pub answer: Option<FlashAnswer>,
    pub evaluations: u64,
    pub skipped: u64,
    pub eval_ms: f64,
    /// Why the last evaluation could not run; the query is parked until a newer version.
    pub error: Option<FlashError>,
}

/// A parked flash query: its evaluation at `data_version` could not start (or ended without
/// an answer). It is tried again only when the data moves on, so it never spins.
#[derive(Debug, Clone)]
pub struct FlashError {
    pub message: String,
    /// `context_length_exceeded` when the question no longer fits beside the data.
    pub code: Option<&'static str>,
    pub data_version: u64,
}

impl FlashQuery {
    pub fn to_json(&self, session_version: u64) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": "session.flash_query",
            "query": self.query,
            "max_tokens": self.max_tokens,
            "tokens": self.tokens,
            "fresh": self.answer.as_ref().is_some_and(|a| a.data_version == session_version),
            "evaluations": self.evaluations,
            "skipped": self.skipped,
        });
        if let Some(a) = &self.answer {
            v["value"] = json!(a.value);
            v["data_version"] = json!(a.data_version);
            v["confidence"] = json!(a.confidence);
            v["evaluated_at"] = json!(a.evaluated_at);
            v["lag"] = json!(session_version.saturating_sub(a.data_version));
            v["eval_ms"] = json!(self.eval_ms);
        }
        if let Some(e) = &self.error {
            v["error"] =
                json!({"message": e.message, "code": e.code, "data_version": e.data_version});
        }
        v
    }

    /// Whether the query needs an evaluation at version `v`: its answer is older and it is not
    /// parked at `v` (a parked query waits for the data to move on).
    fn due_at(&self, v: u64) -> bool {
        self.answer.as_ref().is_none_or(|a| a.data_version < v)
            && self.error.as_ref().is_none_or(|e| e.data_version < v)
    }

    /// The `flash_ready` event payload.
    pub fn ready_event(&self) -> Option<Value> {
        let a = self.answer.as_ref()?;
        Some(json!({
            "id": self.id,
            "query": self.query,
            "value": a.value,
            "data_version": a.data_version,
            "confidence": a.confidence,
        }))
    }
}

/// The logit gap between the two best first tokens, from their log-probabilities (the
/// softmax normaliser cancels in the difference).
pub fn logit_gap(top: &[(u32, f32)]) -> f32 {
    match top {
        [a, b, ..] => a.1 - b.1,
        [_] => f32::MAX,
        [] => 0.0,
    }
}

/// The evaluator loop; ends when the session is deleted.
pub async fn run_evaluator(state: SharedState, session: Arc<Session>) {
    // The version each query was last evaluated at is on the query; this is the round's.
    loop {
        let wake = session.flash_wake.notified();
        if session.is_deleted() {
            return;
        }
        let due = due_queries(&session);
        if due.is_empty() {
            wake.await;
            continue;
        }
        evaluate_round(&state, &session, due).await;
    }
}

struct Due {
    id: u64,
    query: String,
    max_tokens: usize,
}

fn due_queries(session: &Session) -> Vec<Due> {
    let st = session.lock();
    let v = st.data_version;
    // Before any data (version 0) there is nothing to answer about.
    if v == 0 {
        return Vec::new();
    }
    (st.flash.iter())
        .filter(|q| q.due_at(v))
        .map(|q| Due {
            id: q.id,
            query: q.query.clone(),
            max_tokens: q.max_tokens,
        })
        .collect()
}

async fn evaluate_round(state: &SharedState, session: &Arc<Session>, due: Vec<Due>) {
    let (mirror, version, layout) = {
        let st = session.lock();
        (st.mirror(), st.data_version, st.layout)
    };
    let wrap = session.settings.wraps.at(layout);
    let started = Instant::now();
    let mut waits = Vec::new();
    for d in due {
        let text = format!("{}{}{}", wrap.before, d.query, wrap.after);
        let q_tokens = match crate::cpu_jobs::encode(state, text, false, "query").await {
            Ok(t) => t,
            Err(e) => {
                park(state, session, d.id, version, &e);
                continue;
            }
        };
        let mut prompt = mirror.clone();
        prompt.extend(q_tokens);
        let (tx, rx) = oneshot::channel();
        let mut params = GenParams::new(prompt, greedy(2), Some(d.max_tokens));
        // The data plane's class: a round is older than the next batch, so it runs first and a
        // continuous stream cannot starve it (coalescing keeps it from queueing).
        params.priority = Priority::Ingest;
        params.pin = Some(PinUse {
            key: session.pin,
            save: None,
            save_on_abort: false,
        });
        params.on_finish = Some(Box::new(move |f| {
            let _ = tx.send(f);
        }));
        match generate::start(state, params) {
            Ok(events) => waits.push((d.id, events, rx)),
            Err(e) => park(state, session, d.id, version, &e),
        }
    }
    for (id, mut events, rx) in waits {
        let mut text = String::new();
        while let Some(ev) = events.recv().await {
            if let generate::GenEvent::Delta { text: t, .. } = ev {
                text.push_str(&t);
            }
        }
        let Ok(Some(finished)) = rx.await else {
            if !session.is_deleted() {
                let e = ApiError::internal("the evaluation ended without an answer");
                park(state, session, id, version, &e);
            }
            continue;
        };
        state
            .metrics
            .flash_evaluations
            .fetch_add(1, Ordering::Relaxed);
        let answer = FlashAnswer {
            value: text,
            data_version: version,
            confidence: logit_gap(&finished.first_top),
            evaluated_at: crate::ids::unix_now(),
        };
        let event = {
            let mut st = session.lock();
            let Some(q) = st.flash.iter_mut().find(|q| q.id == id) else {
                continue;
            };
            let previous = q.answer.as_ref().map(|a| (a.data_version, a.value.clone()));
            if previous.as_ref().is_some_and(|(v, _)| *v >= version) {
                continue;
            }
            let skipped = previous
                .as_ref()
                .map_or(0, |(v, _)| version.saturating_sub(v + 1));
            q.skipped += skipped;
            state
                .metrics
                .flash_skipped
                .fetch_add(skipped, Ordering::Relaxed);
            q.evaluations += 1;
            q.error = None;
            q.eval_ms = started.elapsed().as_secs_f64() * 1000.0;
            let changed = previous.is_none_or(|(_, v)| v != answer.value);
            q.answer = Some(answer);
            changed.then(|| q.ready_event()).flatten()
        };
        if let Some(data) = event {
            session.events.publish("flash_ready", data);
        }
    }
    session.flash_done.send_modify(|n| *n += 1);
}

/// Park query `id` at `version` with the reason its evaluation did not run, and tell the
/// session's streams (`error` event). The evaluator skips it until the data moves on.
fn park(state: &SharedState, session: &Session, id: u64, version: u64, err: &ApiError) {
    tracing::warn!(session = %session.id, flash_id = id, "flash evaluation parked: {}", err.message);
    let event = {
        let mut st = session.lock();
        let Some(q) = st.flash.iter_mut().find(|q| q.id == id) else {
            return;
        };
        q.error = Some(FlashError {
            message: err.message.clone(),
            code: err.code,
            data_version: version,
        });
        json!({
            "type": "flash_error",
            "message": err.message,
            "code": err.status.as_u16(),
            "error_code": err.code,
            "flash_id": id,
            "query": q.query,
            "data_version": version,
        })
    };
    state.metrics.flash_errors.fetch_add(1, Ordering::Relaxed);
    session.events.publish("error", event);
}

/// Greedy sampling that reports the first token's two best alternatives (for confidence).
pub fn greedy(top_logprobs: u32) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        logprobs: Some(top_logprobs),
        ..SamplingParams::default()
    }
}
