//! The data plane: `push` queues entries and answers at once; the session's actor drains the
//! queue in batches, each a prefill onto the session's durable KV at `Ingest` priority on the
//! engine's session path. When a batch is KV-resident (the engine's reply), the actor commits
//! it: `data_version` goes up, `data_updated` is sent and a flash round starts.
//!
//! With a `window`, the oldest whole entries are evicted when the data would exceed it, down to
//! `evict_to` (half the window by default), and the retained context is recomputed from the
//! opening (the engine forks the pin's common prefix, which is then the opening alone). A
//! recompute of `evict_to` tokens buys room for `window - evict_to` more, so the default costs
//! about one recomputed token per ingested token (2 prefill tokens per ingested token in all),
//! where evicting to the window itself would recompute the whole window for every entry.
//! Queries keep using the old KV until the batch lands.

use super::actor::{JobResult, SessionActor, Writer};
use super::engine_work::{greedy, Job, JobDone};
use super::flash::logit_gap;
use super::journal::model::Op;
use super::journal::Durable;
use super::queued_cost;
use super::state::{Entry, Layout, Overflow, WindowMode};
use crate::error::ApiError;
use crate::state::SharedState;
use axum::http::StatusCode;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
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

/// A batch taken from the queue and the context it produces.
pub struct Batch {
    entries: Vec<Entry>,
    base: Vec<u32>,
    retained: std::collections::VecDeque<Entry>,
    evicted: usize,
    evicted_tokens: usize,
    /// With `WindowMode::Shift`: keep the pin's first `.0` tokens and cut the next `.1` (the
    /// evicted entries it holds) before the prefill, instead of recomputing.
    shift: Option<(usize, usize)>,
    /// The engine did the shift.
    shifted: bool,
    /// When it was taken from the queue (for the log line of its landing).
    started: std::time::Instant,
}

impl Batch {
    /// The durable context once the batch lands.
    fn durable(&self) -> Vec<u32> {
        let mut prompt = self.base.clone();
        for e in &self.retained {
            prompt.extend_from_slice(&e.tokens);
        }
        prompt
    }
}

impl SessionActor {
    /// The push ack: queue counters after this push, and the push's durability.
    pub(super) fn push(&mut self, mut entries: Vec<Entry>) -> Result<(Value, Durable), ApiError> {
        let now = std::time::Instant::now();
        for e in &mut entries {
            e.queued = now;
        }
        let n = entries.len();
        let bytes: usize = entries.iter().map(|e| e.text.len()).sum();
        let new_tokens: usize = entries.iter().map(|e| e.tokens.len()).sum();
        let (s, st, max_len) = (&self.settings.params, &mut self.st, self.deps.max_model_len);
        st.touch();
        if s.window.is_none() {
            let limit = max_len.saturating_sub(QUESTION_ROOM.min(max_len / 4));
            let total = st.data_end() + st.pending_tokens() + new_tokens;
            if total > limit {
                return Err(ApiError::too_long(
                    "data",
                    format!(
                        "the session is full: its data would take {total} tokens, more than the {limit} an append-only session may hold (context {max_len} minus room for a question); create the session with a `window`"
                    ),
                ));
            }
        }
        if s.overflow == Overflow::Reject
            && (st.pending.len() + n > s.max_pending
                || st.pending_bytes + bytes > s.max_pending_bytes)
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
        let cost: usize = entries.iter().map(queued_cost).sum();
        let budget = &self.deps.budget;
        if let Err(held) = budget.reserve(cost) {
            let mut e = ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "the server holds {held} bytes of queued session data and this push adds {cost}; the limit is {} (--max-pending-bytes-total); nothing was queued, retry once ingest catches up",
                    budget.max
                ),
            );
            e.retry_after = Some(1);
            return Err(e);
        }
        let texts: Vec<String> = entries.iter().map(|e| e.text.clone()).collect();
        st.pending.extend(entries);
        st.pending_bytes += bytes;
        st.total_pushed += n as u64;
        let mut dropped = 0u64;
        while st.pending.len() > s.max_pending
            || (st.pending_bytes > s.max_pending_bytes && !st.pending.is_empty())
        {
            if let Some(e) = st.pending.pop_front() {
                st.pending_bytes -= e.text.len();
                budget.release(queued_cost(&e));
                dropped += 1;
            }
        }
        st.total_dropped += dropped;
        // Logged as applied (queued, then the oldest dropped): the replay drops the same ones.
        let durable = self.deps.journal.log_durable(
            &self.head.id,
            Op::Push {
                entries: texts,
                dropped,
            },
        );
        let ack = json!({
            "pushed": n,
            "dropped": dropped,
            "pending": st.pending.len(),
            "pending_bytes": st.pending_bytes,
            "total_pushed": st.total_pushed,
            "total_dropped": st.total_dropped,
            "data_version": st.data_version,
        });
        let metrics = &self.deps.metrics;
        if dropped > 0 {
            let ev = json!({"dropped": dropped, "total_dropped": st.total_dropped, "data_version": st.data_version});
            (metrics.session_dropped_entries).fetch_add(dropped, Ordering::Relaxed);
            self.events.publish("dropped", ev);
        }
        (metrics.session_pushed_entries).fetch_add(n as u64, Ordering::Relaxed);
        Ok((ack, durable))
    }

    pub(super) fn ingest_due(&self) -> bool {
        !self.st.pending.is_empty() || self.st.opening_due
    }

    /// Take a batch from the queue and prefill it onto the pin (the engine's reply comes back
    /// as `JobResult::Batch`).
    pub(super) fn start_batch(&mut self) {
        let batch = self.take_batch();
        let mut prompt = batch.durable();
        if self.settings.params.pre_decode {
            // Compute the ready position too: the generation prompt after the data.
            prompt.extend_from_slice(&self.settings.ready_suffix);
        }
        let mut batch = batch;
        let (engine, pin, shift) = (self.deps.engine.clone(), self.head.pin, batch.shift);
        let job = Job {
            prompt,
            sampling: greedy(2),
            max_tokens: 1,
            ignore_eos: true,
            priority: Priority::Ingest,
            pin: PinUse {
                key: self.head.pin,
                save: Some(PinSave::Prompt),
                save_on_abort: false,
            },
        };
        self.writer = Writer::Ingest;
        let (deps, jobs, mut gone) = (
            self.deps.clone(),
            self.jobs_tx.clone(),
            self.gone.subscribe(),
        );
        tokio::spawn(async move {
            // Deletion drops the request, which aborts the prefill.
            let cancel = async move {
                let _ = gone.wait_for(|g| *g).await;
            };
            if let Some((keep, drop)) = shift {
                // Applied before the prefill is submitted: its fork then finds the retained
                // entries in the pin, and only the new ones are computed.
                batch.shifted = engine.shift_pin(pin, keep, drop).await;
            }
            let result = deps.run(job, cancel).await;
            let _ = jobs.send(JobResult::Batch(batch, result));
        });
    }

    fn take_batch(&mut self) -> Batch {
        let st = &mut self.st;
        let mut entries = Vec::new();
        let mut tokens = 0;
        while let Some(e) = st.pending.front() {
            if !entries.is_empty() && tokens + e.tokens.len() > MAX_BATCH_TOKENS {
                break;
            }
            tokens += e.tokens.len();
            if let Some(e) = st.pending.pop_front() {
                st.pending_bytes -= e.text.len();
                self.deps.budget.release(queued_cost(&e));
                entries.push(e);
            }
        }
        if !entries.is_empty() {
            let n = entries.len();
            self.deps.journal.log(&self.head.id, Op::Taken { n });
        }
        let mut base = st.base.clone();
        if st.layout == Layout::Chat {
            base.extend_from_slice(&self.settings.chat_data_prefix);
        }
        // The window rule is applied entry by entry, so what a session retains depends only
        // on the entries pushed, never on how they were batched (a client can mirror it).
        let mut retained = st.entries.clone();
        let (mut evicted, mut evicted_tokens) = (0, 0);
        // Tokens evicted from the entries the pin already holds (they come first).
        let (held, mut evicted_held) = (st.entries.len(), 0);
        let mut data: usize = retained.iter().map(|e| e.tokens.len()).sum();
        for e in &entries {
            retained.push_back(e.clone());
            data += e.tokens.len();
            let Some(window) = self.settings.params.window else {
                continue;
            };
            if data <= window {
                continue;
            }
            let target = self.settings.params.evict_to.unwrap_or(window);
            while data > target {
                let Some(old) = retained.pop_front() else {
                    break;
                };
                data -= old.tokens.len();
                if evicted < held {
                    evicted_held += old.tokens.len();
                }
                evicted += 1;
                evicted_tokens += old.tokens.len();
            }
        }
        let shift = (self.settings.params.window_mode == WindowMode::Shift
            && st.layout == Layout::Data
            && evicted_held > 0)
            .then_some((base.len(), evicted_held));
        Batch {
            entries,
            base,
            retained,
            evicted,
            evicted_tokens,
            shift,
            shifted: false,
            started: std::time::Instant::now(),
        }
    }

    /// The engine's reply to a batch: commit it as the durable context, or report its entries
    /// as dropped if the prefill failed. A cancelled one (the session is going) is dropped.
    pub(super) fn batch_landed(&mut self, batch: Batch, result: Result<Option<JobDone>, ApiError>) {
        self.writer = Writer::Idle;
        self.rebuilding = false;
        if self.gone.borrow().to_owned() {
            return;
        }
        let done = match result {
            Ok(Some(done)) => done,
            Ok(None) => return,
            Err(e) => return self.lose_batch(batch.entries.len(), &e),
        };
        let durable_len =
            batch.base.len() + batch.retained.iter().map(|e| e.tokens.len()).sum::<usize>();
        if done.pin_tokens.is_some_and(|t| t < durable_len) {
            tracing::debug!(session = %self.head.id, "the pin holds {:?} of {durable_len} tokens (evicted under memory pressure)", done.pin_tokens);
        }
        let ready = (done.first_top.first()).map(|&(t, _)| (t, logit_gap(&done.first_top)));
        let n = batch.entries.len() as u64;
        if let Some(first) = batch.entries.first() {
            // Where push-to-resident time goes: queued before the batch, then in the engine.
            tracing::debug!(
                session = %self.head.id,
                entries = n,
                evicted = batch.evicted,
                queued_ms = (batch.started - first.queued).as_millis() as u64,
                engine_ms = batch.started.elapsed().as_millis() as u64,
                "ingest batch landed"
            );
        }
        let st = &mut self.st;
        let opened_turn = st.layout == Layout::Chat;
        let landed = Op::Landed {
            evicted: batch.evicted as u64,
            evicted_tokens: batch.evicted_tokens as u64,
            shifted: batch.shifted,
            base: opened_turn.then(|| batch.base.clone()),
        };
        st.base = batch.base;
        st.opening_due = false;
        st.data_tokens = batch.retained.iter().map(|e| e.tokens.len()).sum();
        st.entries = batch.retained;
        st.layout = Layout::Data;
        if self.settings.params.pre_decode {
            st.ready = ready;
        }
        // The opening alone is not data: no new version, nothing for flash queries.
        if n == 0 {
            self.kv_changed();
            return;
        }
        self.deps.journal.log(&self.head.id, landed);
        self.kv_changed();
        let st = &mut self.st;
        st.data_version += 1;
        st.total_ingested += n;
        st.evicted += batch.evicted as u64;
        st.evicted_tokens += batch.evicted_tokens as u64;
        if batch.shifted {
            st.window_shifts += 1;
        } else if batch.evicted > 0 {
            st.window_recomputes += 1;
        }
        debug_assert_eq!(st.data_end(), durable_len);
        let data = json!({"data_version": st.data_version, "tokens": st.data_end(), "pending": st.pending.len(), "total_ingested": st.total_ingested});
        let v = st.data_version;
        if st.flash.iter().any(|q| q.due_at(v)) {
            self.hold = Some(tokio::time::Instant::now() + super::actor::FLASH_ROUND_WAIT);
        }
        let metrics = &self.deps.metrics;
        (metrics.session_ingested_entries).fetch_add(n, Ordering::Relaxed);
        let tokens: usize = batch.entries.iter().map(|e| e.tokens.len()).sum();
        (metrics.session_ingested_tokens).fetch_add(tokens as u64, Ordering::Relaxed);
        self.events.publish("data_updated", data);
    }

    /// A batch that could not be ingested is counted as dropped and reported, never lost.
    fn lose_batch(&mut self, n: usize, err: &ApiError) {
        tracing::warn!(session = %self.head.id, "ingest batch of {n} entries dropped: {}", err.message);
        self.deps.journal.log(&self.head.id, Op::Lost);
        self.st.total_dropped += n as u64;
        let ev = json!({"dropped": n, "total_dropped": self.st.total_dropped, "data_version": self.st.data_version, "message": err.message});
        (self.deps.metrics.session_dropped_entries).fetch_add(n as u64, Ordering::Relaxed);
        self.events.publish("dropped", ev);
    }
}
