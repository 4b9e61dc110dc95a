//! The data plane: `push` queues entries and answers at once; one ingest worker per session
//! drains the queue in batches, each a prefill onto the session's durable KV at `Ingest`
//! priority. When a batch is KV-resident, `data_version` goes up, `data_updated` is sent and
//! the flash evaluator wakes.
//!
//! With a `window`, the oldest whole entries are evicted when the data would exceed it, down to
//! `evict_to` (half the window by default), and the retained context is recomputed from the
//! opening (the engine forks the pin's common prefix, which is then the opening alone). A
//! recompute of `evict_to` tokens buys room for `window - evict_to` more, so the default costs
//! about one recomputed token per ingested token (2 prefill tokens per ingested token in all),
//! where evicting to the window itself would recompute the whole window for every entry.
//! Queries keep using the old KV until the batch lands.

use super::flash::{greedy, logit_gap};
use super::layout;
use super::queued_cost;
use super::state::{Entry, Layout, Overflow, Session};
use crate::error::ApiError;
use crate::generate::{self, GenParams};
use crate::state::SharedState;
use axum::http::StatusCode;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::oneshot;
use vigil_engine::pins::{PinSave, PinUse};
use vigil_engine::sequence::Priority;

/// Tokens an append-only session keeps free for a question and its answer.
pub const QUESTION_ROOM: usize = 256;
/// Tokens taken from the queue per ingest batch (a batch is at least one entry).
const MAX_BATCH_TOKENS: usize = 2048;

pub async fn tokenize_entries(
    state: &SharedState,
    texts: Vec<String>,
) -> Result<Vec<Entry>, ApiError> {
    let tokenizer = state.tokenizer.clone();
    crate::cpu_jobs::run(state, move || {
        texts
            .into_iter()
            .map(|text| {
                let tokens = tokenizer.encode(&format!("{text}\n"), false).map_err(|e| {
                    ApiError::invalid("data", format!("could not tokenize an entry: {e}"))
                })?;
                let queued = std::time::Instant::now();
                Ok(Entry {
                    text,
                    tokens,
                    queued,
                })
            })
            .collect()
    })
    .await
}

/// The push ack: queue counters after this push.
pub fn push(
    state: &SharedState,
    session: &Session,
    mut entries: Vec<Entry>,
) -> Result<Value, ApiError> {
    let now = std::time::Instant::now();
    for e in &mut entries {
        e.queued = now;
    }
    let n = entries.len();
    let bytes: usize = entries.iter().map(|e| e.text.len()).sum();
    let new_tokens: usize = entries.iter().map(|e| e.tokens.len()).sum();
    let s = &session.settings;
    let mut st = session.lock();
    st.touch();
    if s.window.is_none() {
        let limit = state
            .max_model_len
            .saturating_sub(QUESTION_ROOM.min(state.max_model_len / 4));
        let total = st.data_end() + st.pending_tokens() + new_tokens;
        if total > limit {
            return Err(ApiError::too_long(
                "data",
                format!(
                    "the session is full: its data would take {total} tokens, more than the {limit} an append-only session may hold (context {} minus room for a question); create the session with a `window`",
                    state.max_model_len
                ),
            ));
        }
    }
    if s.overflow == Overflow::Reject
        && (st.pending.len() + n > s.max_pending || st.pending_bytes + bytes > s.max_pending_bytes)
    {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "the session's pending queue is full ({} entries, {} bytes; limits {} and {}); nothing was queued, retry later",
                st.pending.len(),
                st.pending_bytes,
                s.max_pending,
                s.max_pending_bytes
            ),
        );
        e.retry_after = Some(1);
        return Err(e);
    }
    if session.is_deleted() {
        return Err(ApiError::not_found(format!(
            "session `{}` not found",
            session.id
        )));
    }
    let cost: usize = entries.iter().map(queued_cost).sum();
    state.sessions.reserve_queued(cost)?;
    st.pending.extend(entries);
    st.pending_bytes += bytes;
    st.total_pushed += n as u64;
    let mut dropped = 0u64;
    while st.pending.len() > s.max_pending
        || (st.pending_bytes > s.max_pending_bytes && !st.pending.is_empty())
    {
        if let Some(e) = st.pending.pop_front() {
            st.pending_bytes -= e.text.len();
            state.sessions.release_queued(queued_cost(&e));
            dropped += 1;
        }
    }
    st.total_dropped += dropped;
    let ack = json!({
        "pushed": n,
        "dropped": dropped,
        "pending": st.pending.len(),
        "pending_bytes": st.pending_bytes,
        "total_pushed": st.total_pushed,
        "total_dropped": st.total_dropped,
        "data_version": st.data_version,
    });
    if dropped > 0 {
        let ev = json!({"dropped": dropped, "total_dropped": st.total_dropped, "data_version": st.data_version});
        drop(st);
        state
            .metrics
            .session_dropped_entries
            .fetch_add(dropped, Ordering::Relaxed);
        session.events.publish("dropped", ev);
    } else {
        drop(st);
    }
    state
        .metrics
        .session_pushed_entries
        .fetch_add(n as u64, Ordering::Relaxed);
    session.ingest_wake.notify_one();
    Ok(ack)
}

/// A batch taken from the queue and the context it produces.
struct Batch {
    entries: Vec<Entry>,
    base: Vec<u32>,
    retained: std::collections::VecDeque<Entry>,
    evicted: usize,
    evicted_tokens: usize,
}

fn take_batch(state: &SharedState, session: &Session) -> Result<Option<Batch>, ApiError> {
    let mut st = session.lock();
    if st.pending.is_empty() && !st.opening_due {
        return Ok(None);
    }
    let mut entries = Vec::new();
    let mut tokens = 0;
    while let Some(e) = st.pending.front() {
        if !entries.is_empty() && tokens + e.tokens.len() > MAX_BATCH_TOKENS {
            break;
        }
        tokens += e.tokens.len();
        if let Some(e) = st.pending.pop_front() {
            st.pending_bytes -= e.text.len();
            state.sessions.release_queued(queued_cost(&e));
            entries.push(e);
        }
    }
    let mut base = st.base.clone();
    match st.layout {
        Layout::Data => {}
        Layout::Chat => {
            let text = layout::data_prefix(state, Layout::Chat)?;
            let t = state
                .tokenizer
                .encode(&text, false)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            base.extend(t);
        }
    }
    // The window rule is applied entry by entry, so what a session retains depends only on
    // the entries pushed, never on how they were batched (a client can mirror it exactly).
    let mut retained = st.entries.clone();
    let (mut evicted, mut evicted_tokens) = (0, 0);
    let mut data: usize = retained.iter().map(|e| e.tokens.len()).sum();
    for e in &entries {
        retained.push_back(e.clone());
        data += e.tokens.len();
        let Some(window) = session.settings.window else {
            continue;
        };
        if data <= window {
            continue;
        }
        let target = session.settings.evict_to.unwrap_or(window);
        while data > target {
            let Some(old) = retained.pop_front() else {
                break;
            };
            data -= old.tokens.len();
            evicted += 1;
            evicted_tokens += old.tokens.len();
        }
    }
    Ok(Some(Batch {
        entries,
        base,
        retained,
        evicted,
        evicted_tokens,
    }))
}

/// The ingest worker; ends when the session is deleted.
pub async fn run_ingest(state: SharedState, session: Arc<Session>) {
    loop {
        let wake = session.ingest_wake.notified();
        if session.is_deleted() {
            return;
        }
        let idle = {
            let st = session.lock();
            st.pending.is_empty() && !st.opening_due
        };
        if idle {
            wake.await;
            continue;
        }
        let writer = session.writer.lock().await;
        if session.is_deleted() {
            return;
        }
        match take_batch(&state, &session) {
            Ok(Some(batch)) => ingest_batch(&state, &session, batch).await,
            Ok(None) => {}
            Err(e) => tracing::warn!(session = %session.id, "ingest failed: {}", e.message),
        }
        drop(writer);
        // The flash queries answer this version before the next batch is prefilled (entries
        // arriving meanwhile coalesce into that batch), so answers lag by at most a version;
        // bounded, so data still becomes resident if an evaluation is slow (an engine full of
        // client requests decodes an answer at their pace).
        await_flash_round(&session).await;
    }
}

/// Longest the next batch waits for the flash queries to answer the newest version.
const FLASH_ROUND_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// Longest an entry, counted from its push, waits in the queue on flash queries.
const FLASH_QUEUE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Until every flash query is answered (or parked) at the session's version, at most
/// `FLASH_ROUND_WAIT`, and no longer than the oldest queued entry's `FLASH_QUEUE_WAIT`.
async fn await_flash_round(session: &Session) {
    let mut rounds = session.flash_done.subscribe();
    let mut deadline = tokio::time::Instant::now() + FLASH_ROUND_WAIT;
    loop {
        let oldest = session.lock().pending.front().map(|e| e.queued);
        if let Some(q) = oldest {
            deadline = deadline.min((q + FLASH_QUEUE_WAIT).into());
        }
        let behind = {
            let st = session.lock();
            let v = st.data_version;
            v > 0 && st.flash.iter().any(|q| q.due_at(v))
        };
        if !behind || session.is_deleted() {
            return;
        }
        match tokio::time::timeout_at(deadline, rounds.changed()).await {
            Ok(Ok(())) => {}
            _ => return, // The deadline passed (or the session is going away).
        }
    }
}

async fn ingest_batch(state: &SharedState, session: &Arc<Session>, batch: Batch) {
    let mut prompt = batch.base.clone();
    for e in &batch.retained {
        prompt.extend_from_slice(&e.tokens);
    }
    let durable_len = prompt.len();
    if session.settings.pre_decode {
        // Compute the ready position too: the generation prompt after the data.
        let after = &session.settings.wraps.data.after;
        prompt.extend(state.tokenizer.encode(after, false).unwrap_or_default());
    }
    let (tx, rx) = oneshot::channel();
    let mut params = GenParams::new(prompt, greedy(2), Some(1));
    params.priority = Priority::Ingest;
    params.ignore_eos = true;
    params.pin = Some(PinUse {
        key: session.pin,
        save: Some(PinSave::Prompt),
        save_on_abort: false,
    });
    params.on_finish = Some(Box::new(move |f| {
        let _ = tx.send(f);
    }));
    let mut events = match generate::start(state, params) {
        Ok(ev) => ev,
        Err(e) => return lose_batch(state, session, batch.entries.len(), &e),
    };
    // Deletion drops `events`, which aborts the prefill.
    loop {
        tokio::select! {
            ev = events.recv() => if ev.is_none() { break },
            _ = session.wait_deleted() => return,
        }
    }
    let Ok(Some(finished)) = rx.await else {
        // The prefill ended without a result (the engine failed it): report the entries as
        // dropped rather than lose them silently. A deleted session has nobody to tell.
        if !session.is_deleted() {
            let e = ApiError::internal("the ingest prefill ended without a result");
            lose_batch(state, session, batch.entries.len(), &e);
        }
        return;
    };
    let ready = finished
        .first_top
        .first()
        .map(|&(t, _)| (t, logit_gap(&finished.first_top)));
    let n = batch.entries.len() as u64;
    let data = {
        let mut st = session.lock();
        st.base = batch.base;
        st.opening_due = false;
        st.data_tokens = batch.retained.iter().map(|e| e.tokens.len()).sum();
        st.entries = batch.retained;
        st.layout = Layout::Data;
        if session.settings.pre_decode {
            st.ready = ready;
        }
        // The opening alone is not data: no new version, nothing for flash queries.
        if n == 0 {
            return;
        }
        st.data_version += 1;
        st.total_ingested += n;
        st.evicted += batch.evicted as u64;
        st.evicted_tokens += batch.evicted_tokens as u64;
        if batch.evicted > 0 {
            st.window_recomputes += 1;
        }
        debug_assert_eq!(st.data_end(), durable_len);
        json!({"data_version": st.data_version, "tokens": st.data_end(), "pending": st.pending.len(), "total_ingested": st.total_ingested})
    };
    state
        .metrics
        .session_ingested_entries
        .fetch_add(n, Ordering::Relaxed);
    let tokens: usize = batch.entries.iter().map(|e| e.tokens.len()).sum();
    state
        .metrics
        .session_ingested_tokens
        .fetch_add(tokens as u64, Ordering::Relaxed);
    session.events.publish("data_updated", data);
    session.flash_wake.notify_one();
}

/// A batch that could not be ingested is counted as dropped and reported, never lost silently.
fn lose_batch(state: &SharedState, session: &Session, n: usize, err: &ApiError) {
    tracing::warn!(session = %session.id, "ingest batch of {n} entries dropped: {}", err.message);
    let ev = {
        let mut st = session.lock();
        st.total_dropped += n as u64;
        json!({"dropped": n, "total_dropped": st.total_dropped, "data_version": st.data_version, "message": err.message})
    };
    state
        .metrics
        .session_dropped_entries
        .fetch_add(n as u64, Ordering::Relaxed);
    session.events.publish("dropped", ev);
}
