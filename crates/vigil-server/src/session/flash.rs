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
use vigil_engine::sequence::{FinishReason, Priority};
use vigil_model::tokenizer::IncrementalDetokenizer;

pub const MAX_FLASH_QUERIES: usize = 20;
pub const DEFAULT_FLASH_MAX_TOKENS: usize = 32;

#[derive(Debug, Clone)]
pub struct FlashAnswer {
    pub value: String,
    /// The answer's tokens and why it ended: the next evaluation's draft.
    pub ids: Vec<u32>,
    pub finish: FinishReason,
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
    pub fn due_at(&self, v: u64) -> bool {
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
    /// The previous answer, if any: verified as a draft before anything is decoded.
    draft: Option<(Vec<u32>, FinishReason)>,
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
            draft: (q.answer.as_ref()).map(|a| (a.ids.clone(), a.finish)),
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
    let mut jobs = Vec::new();
    for d in due {
        let text = format!("{}{}{}", wrap.before, d.query, wrap.after);
        let q_tokens = match crate::cpu_jobs::encode(state, text, false, "query").await {
            Ok(t) => t,
            Err(e) => {
                park(state, session, d.id, version, &e);
                continue;
            }
        };
        let mut base = mirror.clone();
        base.extend(q_tokens);
        let id = d.id;
        jobs.push(async move { (id, evaluate(state, session, base, d).await) });
    }
    for (id, result) in futures_util::future::join_all(jobs).await {
        let answer = match result {
            Ok(a) => a,
            Err(e) => {
                if !session.is_deleted() {
                    park(state, session, id, version, &e);
                }
                continue;
            }
        };
        state
            .metrics
            .flash_evaluations
            .fetch_add(1, Ordering::Relaxed);
        let answer = FlashAnswer {
            value: answer_text(state, &answer.base_tail, &answer.ids),
            ids: answer.ids,
            finish: answer.finish,
            data_version: version,
            confidence: logit_gap(&answer.first_top),
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

/// One evaluation's result before it is turned into text.
struct Evaluated {
    ids: Vec<u32>,
    finish: FinishReason,
    first_top: Vec<(u32, f32)>,
    /// The last prompt tokens, the detokenizer's left context.
    base_tail: Vec<u32>,
}

/// Answer `d` on `base` (the data and the wrapped question), exactly as a greedy decode from
/// `base` would. With a previous answer, that answer is appended as a draft and every row of
/// it scored in one pass: the longest prefix the model still picks is kept, and decoding goes
/// on from there only if it diverged (or had not ended). Answers change rarely while data
/// streams in, so most evaluations cost one prefill of the question and the draft instead of
/// `max_tokens` decode steps.
async fn evaluate(
    state: &SharedState,
    session: &Arc<Session>,
    base: Vec<u32>,
    d: Due,
) -> Result<Evaluated, ApiError> {
    let base_tail = base[base.len().saturating_sub(4)..].to_vec();
    let mut accepted = Vec::new();
    let mut first_top = None;
    if let Some((draft, finish)) = d.draft.filter(|(ids, _)| !ids.is_empty()) {
        let draft: Vec<u32> = draft.into_iter().take(d.max_tokens).collect();
        let mut prompt = base.clone();
        prompt.extend_from_slice(&draft);
        let mut sampling = greedy(2);
        sampling.score_prompt_from = Some(base.len() - 1);
        // A draft that does not fit (or a failed pass) only costs the shortcut.
        let scores = match run_on_fork(state, session, prompt, sampling, 1).await {
            Ok(verified) => verified.prompt_scores,
            Err(_) => Vec::new(),
        };
        // Every draft row scored (none served from the prefix cache): keep what still holds.
        if scores.len() == draft.len() {
            let kept = (scores.iter().zip(&draft))
                .take_while(|((pick, _), &t)| *pick == t)
                .count();
            first_top = scores.first().map(|(_, top)| top.clone());
            state.metrics.flash_drafts.fetch_add(1, Ordering::Relaxed);
            state
                .metrics
                .flash_draft_tokens
                .fetch_add(kept as u64, Ordering::Relaxed);
            let ended = finish == FinishReason::Stop || draft.len() == d.max_tokens;
            if kept == draft.len() && ended {
                state.metrics.flash_verified.fetch_add(1, Ordering::Relaxed);
                return Ok(Evaluated {
                    ids: draft,
                    finish,
                    first_top: first_top.unwrap_or_default(),
                    base_tail,
                });
            }
            accepted = draft[..kept].to_vec();
        }
    }
    let mut prompt = base;
    prompt.extend_from_slice(&accepted);
    let left = d.max_tokens - accepted.len();
    let decoded = run_on_fork(state, session, prompt, greedy(2), left).await?;
    let first_top = first_top.unwrap_or(decoded.first_top);
    accepted.extend(decoded.output_ids);
    Ok(Evaluated {
        ids: accepted,
        finish: decoded.reason,
        first_top,
        base_tail,
    })
}

/// A greedy `Ingest`-class request on a fork of the session's KV; what it finished with.
async fn run_on_fork(
    state: &SharedState,
    session: &Session,
    prompt: Vec<u32>,
    sampling: SamplingParams,
    max_tokens: usize,
) -> Result<generate::Finished, ApiError> {
    let (tx, rx) = oneshot::channel();
    let mut params = GenParams::new(prompt, sampling, Some(max_tokens));
    // Above the data plane: an evaluation runs before the next batch's prefill (the batches
    // wait while it runs), and coalescing keeps rounds from queueing.
    params.priority = Priority::Flash;
    params.pin = Some(PinUse {
        key: session.pin,
        save: None,
        save_on_abort: false,
    });
    params.on_finish = Some(Box::new(move |f| {
        let _ = tx.send(f);
    }));
    let mut events = generate::start(state, params)?;
    while events.recv().await.is_some() {}
    match rx.await {
        Ok(Some(finished)) => Ok(finished),
        _ => Err(ApiError::internal("the evaluation ended without an answer")),
    }
}

/// The text a streamed generation of `ids` after `base_tail` shows (the same incremental
/// detokenization, so a flash answer reads exactly as a cold generate's).
fn answer_text(state: &SharedState, base_tail: &[u32], ids: &[u32]) -> String {
    let mut detok = IncrementalDetokenizer::new(&state.tokenizer, base_tail, true);
    let mut text: String = ids.iter().filter_map(|&id| detok.push(id).ok()).collect();
    text.push_str(&detok.flush());
    text
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
