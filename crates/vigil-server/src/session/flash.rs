//! Flash queries: questions registered on a session and answered in the background after
//! every ingested batch, so a `generate` asking one is answered at once.
//!
//! The session's actor starts a round when a query is behind the newest `data_version` and
//! none runs, and evaluates every query not yet current at that version only: versions that
//! arrived while a round ran are skipped and counted, so evaluation never queues behind the
//! stream. Each evaluation is a greedy `Flash`-class request on a fork of the session's KV
//! (the same tokens and sampling a cold `generate` with temperature 0 uses), so a round
//! started after batch k runs before batch k+1, and foreground requests still come first.

use super::actor::{JobResult, SessionActor};
use super::engine_work::{greedy, Job, JobDone, SessionDeps};
use super::journal::model::{AnswerRecord, Op};
use super::journal::Durable;
use super::state::Layout;
use crate::error::ApiError;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::time::Instant;
use vigil_engine::pins::{PinKey, PinUse};
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
    /// The question wrapped for each layout, tokenized when it was registered.
    pub wrapped: Wrapped,
    /// The answer was restored from the journal: it is served, and evaluated once more after
    /// the session's KV is rebuilt.
    pub restored: bool,
}

/// A question's tokens after a context at `Layout::Data` and at `Layout::Chat`.
#[derive(Debug, Clone, Default)]
pub struct Wrapped {
    pub data: Vec<u32>,
    pub chat: Vec<u32>,
}

impl Wrapped {
    pub fn at(&self, layout: Layout) -> &[u32] {
        match layout {
            Layout::Data => &self.data,
            Layout::Chat => &self.chat,
        }
    }
}

/// A query to register: its text, answer length, own token count and wrapped tokens.
pub struct FlashSpec {
    pub query: String,
    pub max_tokens: usize,
    pub tokens: usize,
    pub wrapped: Wrapped,
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
        (self.restored || self.answer.as_ref().is_none_or(|a| a.data_version < v))
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

/// A flash query looked up for a generate.
pub enum Lookup {
    /// No query has that text: generate.
    NotRegistered,
    /// No query has that id.
    NoSuchId,
    Found {
        id: u64,
        answer: Option<FlashAnswer>,
        /// An evaluation at `data_version` is due or running.
        due: bool,
        data_version: u64,
    },
}

/// The flash queries and their answers as the actor last published them: a flash hit reads
/// this from the handle, without a message to the actor (the hot path never waits for the
/// actor's task to be scheduled).
#[derive(Debug, Default)]
pub struct FlashView {
    pub data_version: u64,
    pub queries: Vec<ViewQuery>,
}

/// One query as the view shows it.
#[derive(Debug)]
pub struct ViewQuery {
    pub id: u64,
    pub query: String,
    pub answer: Option<FlashAnswer>,
    /// An evaluation at the view's version is due (or running): a newer answer is coming.
    pub due: bool,
}

impl FlashView {
    /// A registered query's text.
    pub fn query(&self, id: u64) -> Option<String> {
        (self.queries.iter().find(|q| q.id == id)).map(|q| q.query.clone())
    }

    /// The query named by id (or else by its text), and its cached answer.
    pub fn lookup(&self, id: Option<u64>, query: &str) -> Lookup {
        let found = match id {
            Some(fid) => match self.queries.iter().find(|q| q.id == fid) {
                Some(q) => q,
                None => return Lookup::NoSuchId,
            },
            None => match self.queries.iter().find(|q| q.query == query) {
                Some(q) => q,
                None => return Lookup::NotRegistered,
            },
        };
        Lookup::Found {
            id: found.id,
            answer: found.answer.clone(),
            due: found.due,
            data_version: self.data_version,
        }
    }
}

/// A query due for evaluation, as the round's task sees it.
struct Due {
    id: u64,
    prompt: Vec<u32>,
    max_tokens: usize,
    /// The previous answer, if any: verified as a draft before anything is decoded.
    draft: Option<(Vec<u32>, FinishReason)>,
}

/// What a round reports back to the actor.
pub struct RoundResult {
    version: u64,
    started: Instant,
    results: Vec<(u64, Result<Evaluated, ApiError>)>,
}

/// One evaluation's answer.
struct Evaluated {
    ids: Vec<u32>,
    finish: FinishReason,
    first_top: Vec<(u32, f32)>,
    value: String,
}

impl SessionActor {
    pub(super) fn add_flash(&mut self, spec: FlashSpec) -> Result<(Value, Durable), ApiError> {
        let st = &mut self.st;
        st.touch();
        if st.flash.iter().any(|q| q.query == spec.query) {
            return Err(super::conflict(
                "this flash query is already registered on the session",
            ));
        }
        if st.flash.len() >= MAX_FLASH_QUERIES {
            return Err(super::conflict(format!(
                "a session holds at most {MAX_FLASH_QUERIES} flash queries; delete one first"
            )));
        }
        let q = FlashQuery {
            id: st.next_flash_id,
            query: spec.query,
            max_tokens: spec.max_tokens,
            tokens: spec.tokens,
            answer: None,
            evaluations: 0,
            skipped: 0,
            eval_ms: 0.0,
            error: None,
            wrapped: spec.wrapped,
            restored: false,
        };
        st.next_flash_id += 1;
        let v = q.to_json(st.data_version);
        let op = Op::AddFlash {
            id: q.id,
            query: q.query.clone(),
            max_tokens: q.max_tokens,
        };
        st.flash.push(q);
        self.flash_epoch += 1;
        Ok((v, self.deps.journal.log_durable(&self.head.id, op)))
    }

    pub(super) fn list_flash(&mut self) -> Value {
        self.st.touch();
        let v = self.st.data_version;
        let data: Vec<Value> = self.st.flash.iter().map(|q| q.to_json(v)).collect();
        json!({"object": "list", "data": data, "data_version": v})
    }

    pub(super) fn delete_flash(&mut self, id: u64) -> Result<(Value, Durable), ApiError> {
        let st = &mut self.st;
        st.touch();
        let before = st.flash.len();
        st.flash.retain(|q| q.id != id);
        if st.flash.len() == before {
            return Err(ApiError::not_found(format!(
                "flash query `{id}` not found on session `{}`",
                self.head.id
            )));
        }
        self.flash_epoch += 1;
        let v = json!({"id": id, "object": "session.flash_query.deleted", "deleted": true, "remaining": st.flash.len()});
        Ok((
            v,
            self.deps
                .journal
                .log_durable(&self.head.id, Op::DeleteFlash { id }),
        ))
    }

    /// Publish the flash view if the queries, their answers or the data version changed.
    pub(super) fn publish_flash(&mut self) {
        let now = (self.st.data_version, self.flash_epoch);
        if self.published_flash == Some(now) {
            return;
        }
        self.published_flash = Some(now);
        let v = self.st.data_version;
        let queries = (self.st.flash.iter())
            .map(|q| ViewQuery {
                id: q.id,
                query: q.query.clone(),
                answer: q.answer.clone(),
                due: v > 0 && q.due_at(v),
            })
            .collect();
        self.flash_view.send_replace(std::sync::Arc::new(FlashView {
            data_version: self.st.data_version,
            queries,
        }));
    }

    /// Start a round for every query behind the newest version (none before any data).
    pub(super) fn start_round(&mut self) {
        let v = self.st.data_version;
        if v == 0 || self.rebuilding || !self.st.flash.iter().any(|q| q.due_at(v)) {
            return;
        }
        let mirror = self.st.mirror();
        let layout = self.st.layout;
        let due: Vec<Due> = (self.st.flash.iter())
            .filter(|q| q.due_at(v))
            .map(|q| {
                let mut prompt = mirror.clone();
                prompt.extend_from_slice(q.wrapped.at(layout));
                Due {
                    id: q.id,
                    prompt,
                    max_tokens: q.max_tokens,
                    draft: (q.answer.as_ref()).map(|a| (a.ids.clone(), a.finish)),
                }
            })
            .collect();
        if due.is_empty() {
            return;
        }
        self.flash_running = true;
        let (deps, jobs, pin) = (self.deps.clone(), self.jobs_tx.clone(), self.head.pin);
        let gone = self.gone.subscribe();
        tokio::spawn(async move {
            let started = Instant::now();
            let evaluations = due.into_iter().map(|d| {
                let (deps, mut gone) = (&deps, gone.clone());
                async move {
                    let id = d.id;
                    let cancelled = async move {
                        let _ = gone.wait_for(|g| *g).await;
                    };
                    tokio::select! {
                        r = evaluate(deps, pin, d) => (id, r),
                        () = cancelled => (id, Err(ApiError::not_found("the session was deleted"))),
                    }
                }
            });
            let results = futures_util::future::join_all(evaluations).await;
            let _ = jobs.send(JobResult::FlashRound(RoundResult {
                version: v,
                started,
                results,
            }));
        });
    }

    /// Apply a round's answers (a newer answer is never replaced by an older one), then tell
    /// waiters the round ended.
    pub(super) fn round_done(&mut self, round: RoundResult) {
        self.flash_running = false;
        if *self.gone.borrow() {
            return;
        }
        let metrics = self.deps.metrics.clone();
        let version = round.version;
        for (id, result) in round.results {
            let answer = match result {
                Ok(a) => a,
                Err(e) => {
                    self.park(id, version, &e);
                    continue;
                }
            };
            metrics.flash_evaluations.fetch_add(1, Ordering::Relaxed);
            let answer = FlashAnswer {
                value: answer.value,
                ids: answer.ids,
                finish: answer.finish,
                data_version: version,
                confidence: logit_gap(&answer.first_top),
                evaluated_at: crate::ids::unix_now(),
            };
            let Some(q) = self.st.flash.iter_mut().find(|q| q.id == id) else {
                continue;
            };
            let previous = q.answer.as_ref().map(|a| (a.data_version, a.value.clone()));
            if previous.as_ref().is_some_and(|(v, _)| *v >= version) && !q.restored {
                continue;
            }
            q.restored = false;
            let skipped = (previous.as_ref()).map_or(0, |(v, _)| version.saturating_sub(v + 1));
            q.skipped += skipped;
            metrics.flash_skipped.fetch_add(skipped, Ordering::Relaxed);
            q.evaluations += 1;
            q.error = None;
            q.eval_ms = round.started.elapsed().as_secs_f64() * 1000.0;
            let changed = previous.is_none_or(|(_, v)| v != answer.value);
            let record = AnswerRecord {
                value: answer.value.clone(),
                ids: answer.ids.clone(),
                stopped: answer.finish == FinishReason::Stop,
                data_version: answer.data_version,
                confidence: answer.confidence,
                evaluated_at: answer.evaluated_at,
            };
            (self.deps.journal).log(&self.head.id, Op::FlashAnswer { id, answer: record });
            q.answer = Some(answer);
            if let Some(data) = changed.then(|| q.ready_event()).flatten() {
                self.events.publish("flash_ready", data);
            }
        }
        // Published view first, then progress (the run loop): a generate woken by the round
        // reads the answers it brought.
        self.flash_epoch += 1;
        self.rounds_done += 1;
    }

    /// Park query `id` at `version` with the reason its evaluation did not run, and tell the
    /// session's streams (`error` event). It is skipped until the data moves on.
    fn park(&mut self, id: u64, version: u64, err: &ApiError) {
        tracing::warn!(session = %self.head.id, flash_id = id, "flash evaluation parked: {}", err.message);
        let Some(q) = self.st.flash.iter_mut().find(|q| q.id == id) else {
            return;
        };
        q.error = Some(FlashError {
            message: err.message.clone(),
            code: err.code,
            data_version: version,
        });
        let event = json!({
            "type": "flash_error",
            "message": err.message,
            "code": err.status.as_u16(),
            "error_code": err.code,
            "flash_id": id,
            "query": q.query,
            "data_version": version,
        });
        self.deps
            .metrics
            .flash_errors
            .fetch_add(1, Ordering::Relaxed);
        self.events.publish("error", event);
    }
}

/// Answer `d` exactly as a greedy decode from its prompt would. With a previous answer, that
/// answer is appended as a draft and every row of it scored in one pass: the longest prefix
/// the model still picks is kept, and decoding goes on from there only if it diverged (or had
/// not ended). Answers change rarely while data streams in, so most evaluations cost one
/// prefill of the question and the draft instead of `max_tokens` decode steps.
async fn evaluate(deps: &SessionDeps, pin: PinKey, d: Due) -> Result<Evaluated, ApiError> {
    let base = d.prompt;
    let base_tail = base[base.len().saturating_sub(4)..].to_vec();
    let metrics = &deps.metrics;
    let mut accepted = Vec::new();
    let mut first_top = None;
    if let Some((draft, finish)) = d.draft.filter(|(ids, _)| !ids.is_empty()) {
        let draft: Vec<u32> = draft.into_iter().take(d.max_tokens).collect();
        let mut prompt = base.clone();
        prompt.extend_from_slice(&draft);
        let mut sampling = greedy(2);
        sampling.score_prompt_from = Some(base.len() - 1);
        // A draft that does not fit (or a failed pass) only costs the shortcut.
        let scores = match on_fork(deps, pin, prompt, sampling, 1).await {
            Ok(verified) => verified.prompt_scores,
            Err(_) => Vec::new(),
        };
        // Every draft row scored (none served from the prefix cache): keep what still holds.
        if scores.len() == draft.len() {
            let kept = (scores.iter().zip(&draft))
                .take_while(|((pick, _), &t)| *pick == t)
                .count();
            first_top = scores.first().map(|(_, top)| top.clone());
            metrics.flash_drafts.fetch_add(1, Ordering::Relaxed);
            (metrics.flash_draft_tokens).fetch_add(kept as u64, Ordering::Relaxed);
            let ended = finish == FinishReason::Stop || draft.len() == d.max_tokens;
            if kept == draft.len() && ended {
                metrics.flash_verified.fetch_add(1, Ordering::Relaxed);
                let value = answer_text(deps, &base_tail, &draft);
                return Ok(Evaluated {
                    ids: draft,
                    finish,
                    first_top: first_top.unwrap_or_default(),
                    value,
                });
            }
            accepted = draft[..kept].to_vec();
        }
    }
    let mut prompt = base;
    prompt.extend_from_slice(&accepted);
    let left = d.max_tokens - accepted.len();
    let decoded = on_fork(deps, pin, prompt, greedy(2), left).await?;
    let first_top = first_top.unwrap_or(decoded.first_top);
    accepted.extend(decoded.ids);
    let value = answer_text(deps, &base_tail, &accepted);
    Ok(Evaluated {
        ids: accepted,
        finish: decoded.reason,
        first_top,
        value,
    })
}

/// A greedy `Flash`-class request on a fork of the session's KV (it saves nothing). Above
/// the data plane: an evaluation runs before the next batch's prefill.
async fn on_fork(
    deps: &SessionDeps,
    pin: PinKey,
    prompt: Vec<u32>,
    sampling: SamplingParams,
    max_tokens: usize,
) -> Result<JobDone, ApiError> {
    let job = Job {
        prompt,
        sampling,
        max_tokens,
        ignore_eos: false,
        priority: Priority::Flash,
        pin: PinUse {
            key: pin,
            save: None,
            save_on_abort: false,
        },
    };
    (deps.run(job, std::future::pending()).await?)
        .ok_or_else(|| ApiError::internal("the evaluation ended without an answer"))
}

/// The text a streamed generation of `ids` after `base_tail` shows (the same incremental
/// detokenization, so a flash answer reads exactly as a cold generate's).
fn answer_text(deps: &SessionDeps, base_tail: &[u32], ids: &[u32]) -> String {
    let mut detok = IncrementalDetokenizer::new(&deps.tokenizer, base_tail, true);
    let mut text: String = ids.iter().filter_map(|&id| detok.push(id).ok()).collect();
    text.push_str(&detok.flush());
    text
}
