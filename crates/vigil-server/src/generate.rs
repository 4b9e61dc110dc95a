//! One request's generation, route-independent: admission checks (context length, overload),
//! submission to the engine, incremental detokenization, stop strings, and the usage figures.
//! A task per request owns the engine stream; the route reads `GenEvent`s from a channel.
//! When the route drops its receiver (the client went away), the task sees the channel close,
//! drops its `RequestStream`, and the engine aborts the sequence and frees its KV.

use crate::error::ApiError;
use crate::metrics::Outcome;
use crate::state::SharedState;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tokio::sync::mpsc;
use vigil_engine::engine_thread::{GenerateRequest, RequestEvent};
use vigil_engine::pins::PinUse;
use vigil_engine::sampling::SamplingParams;
use vigil_engine::sequence::{FinishReason, Priority, StopCriteria};
use vigil_model::tokenizer::IncrementalDetokenizer;

/// What a finished request produced, for a caller that keeps state (a session).
#[derive(Debug, Clone)]
pub struct Finished {
    pub reason: FinishReason,
    /// Ended by a stop string (the engine aborted the sequence there).
    pub by_stop_string: bool,
    pub output_ids: Vec<u32>,
    /// The first generated token's top alternatives (when `top_logprobs` asked for them).
    pub first_top: Vec<(u32, f32)>,
    /// With `score_prompt_from`: the greedy pick (and top alternatives) after each scored
    /// prompt row.
    pub prompt_scores: Vec<(u32, Vec<(u32, f32)>)>,
}

/// Called once when a request ends: `Some` when it finished, `None` when it was cancelled or
/// failed. Whatever it captures (a session's busy guard) is released when it has run.
pub type FinishHook = Box<dyn FnOnce(Option<Finished>) + Send>;

/// Everything a route decided about one generation.
pub struct GenParams {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// `None`: until the context is full.
    pub max_tokens: Option<usize>,
    pub stop_strings: Vec<String>,
    pub ignore_eos: bool,
    /// Decode each token's text and its alternatives (for `logprobs`).
    pub want_token_text: bool,
    /// The output continues a forced tool call (how it is parsed); its constraint is `grammar`.
    pub forced_call: Option<crate::output::ForcedCall>,
    /// Constrain the output to a grammar: structured outputs, or a forced call's arguments
    /// under its tool's schema (`structured::compile_forced`).
    pub grammar: Option<vigil_engine::grammar::GrammarConstraint>,
    /// Score the prompt (`echo`, `prompt_logprobs`): `sampling.score_prompt_from` is 0 and
    /// `Done` carries the prompt's tokens with their log-probabilities.
    pub score_prompt: bool,
    pub priority: Priority,
    /// Told when the first token is out, so the prompt's KV is computed and its full blocks
    /// are in the prefix cache: the other choices of an `n > 1` request start then, and share
    /// them.
    pub first_token: Option<tokio::sync::oneshot::Sender<()>>,
    /// Run on (and maybe save to) a session's KV.
    pub pin: Option<PinUse>,
    pub on_finish: Option<FinishHook>,
}

impl GenParams {
    /// A plain foreground request: no stop strings, no constraint, no session.
    pub fn new(prompt: Vec<u32>, sampling: SamplingParams, max_tokens: Option<usize>) -> Self {
        GenParams {
            prompt,
            sampling,
            max_tokens,
            stop_strings: Vec::new(),
            ignore_eos: false,
            want_token_text: false,
            forced_call: None,
            grammar: None,
            score_prompt: false,
            priority: Priority::Foreground,
            first_token: None,
            pin: None,
            on_finish: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct TokenInfo {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
    pub top: Vec<(u32, String, f32)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// End of sequence token.
    Eos,
    /// One of the request's stop strings (not included in the text).
    StopString(String),
    /// `max_tokens`, or the context filled up.
    Length { context_full: bool },
}

#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// Speculative decoding: draft tokens verified, and accepted (reported as OpenAI's
    /// predicted-output counts).
    pub draft_tokens: usize,
    pub accepted_draft_tokens: usize,
}

impl Usage {
    /// Fold one choice's usage into a response's (several choices, several prompts): a prompt
    /// counts once, with the choice that brings it first.
    pub fn add_choice(&mut self, u: &Usage, first_of_prompt: bool) {
        if first_of_prompt {
            self.prompt_tokens += u.prompt_tokens;
            self.cached_tokens += u.cached_tokens;
        }
        self.completion_tokens += u.completion_tokens;
        self.draft_tokens += u.draft_tokens;
        self.accepted_draft_tokens += u.accepted_draft_tokens;
    }
}

#[derive(Debug)]
pub enum GenEvent {
    /// New text (possibly empty while held back for a stop string) and the tokens behind it.
    Delta {
        text: String,
        tokens: Vec<TokenInfo>,
    },
    Done {
        finish: Finish,
        usage: Usage,
        /// With `GenParams::score_prompt`: every prompt token after the first, with its
        /// log-probability given the tokens before it, its top alternatives and its rank.
        prompt: Vec<(TokenInfo, u32)>,
    },
    Failed(ApiError),
}

/// Checks admission and starts the request; errors here are returned before anything streams.
pub fn start(
    state: &SharedState,
    mut params: GenParams,
) -> Result<mpsc::UnboundedReceiver<GenEvent>, ApiError> {
    let scored_prompt = params.score_prompt.then(|| params.prompt.clone());
    if params.score_prompt {
        params.sampling.score_prompt_from = Some(0);
        params.sampling.score_prompt_tokens = true;
    }
    let prompt_len = params.prompt.len();
    if prompt_len == 0 {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if prompt_len >= state.max_model_len {
        return Err(ApiError::context_length(prompt_len, state.max_model_len));
    }
    let room = state.max_model_len - prompt_len;
    let max_tokens = params.max_tokens.map_or(room, |m| m.min(room));
    let context_capped = params.max_tokens.is_none_or(|m| m > room);
    let capacity = state.config.max_seqs + state.config.max_queue;
    let foreground = params.priority == Priority::Foreground;
    // One atomic step: a seat is taken only if one is free, so concurrent requests cannot
    // overshoot the bound between a check and a submit.
    let seat = if foreground {
        Admission::take(state, capacity)
    } else {
        None
    };
    if foreground && seat.is_none() {
        state
            .metrics
            .requests_rejected_overload
            .fetch_add(1, Ordering::Relaxed);
        return Err(ApiError::overloaded(format!(
            "the server is at capacity ({} running, {} queued); retry later",
            state.config.max_seqs, state.config.max_queue
        )));
    }
    let stop = StopCriteria {
        max_tokens,
        stop_token_ids: state.tokenizer.eos_token_ids().to_vec(),
        ignore_eos: params.ignore_eos,
    };
    let constraint = params
        .grammar
        .map(|g| Box::new(g) as Box<dyn vigil_engine::constraint::TokenConstraint>);
    let tail_start = prompt_len.saturating_sub(4);
    let prompt_tail = params.prompt[tail_start..].to_vec();
    let stream = state
        .engine
        .submit(GenerateRequest {
            prompt: params.prompt,
            params: params.sampling,
            stop,
            constraint,
            priority: params.priority,
            pin: params.pin,
        })
        .map_err(|e| ApiError::internal(e.to_string()))?;
    if foreground {
        state
            .metrics
            .requests_started
            .fetch_add(1, Ordering::Relaxed);
    } else {
        state
            .metrics
            .background_in_flight
            .fetch_add(1, Ordering::Relaxed);
    }
    let on_finish = params.on_finish;
    let (tx, rx) = mpsc::unbounded_channel();
    let state = state.clone();
    let arrived = Instant::now();
    tokio::spawn(async move {
        let _seat = seat;
        let ctx = DriveCtx {
            prompt_len,
            prompt_tail,
            stop_strings: params.stop_strings,
            want_token_text: params.want_token_text,
            context_capped,
            arrived,
            foreground,
            scored_prompt,
            first_token: params.first_token,
        };
        let (outcome, finished, done) = drive(&state, stream, &tx, ctx).await;
        // The turn ends (a session's next turn may begin) before the client can see its end.
        if let Some(hook) = on_finish {
            hook(finished);
        }
        if let Some(done) = done {
            let _ = tx.send(done);
        }
        if foreground {
            state.metrics.record(outcome);
            state.metrics.e2e.observe(arrived.elapsed().as_secs_f64());
        } else {
            state
                .metrics
                .background_in_flight
                .fetch_sub(1, Ordering::Relaxed);
        }
    });
    Ok(rx)
}

/// A foreground request's place in the `--max-seqs` + `--max-queue` bound, given back when
/// the request's task ends (or when it fails to start).
struct Admission(SharedState);

impl Admission {
    fn take(state: &SharedState, capacity: usize) -> Option<Admission> {
        let counter = &state.metrics.foreground_in_flight;
        let taken = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < capacity).then_some(n + 1)
        });
        taken.ok().map(|_| Admission(state.clone()))
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.0
            .metrics
            .foreground_in_flight
            .fetch_sub(1, Ordering::AcqRel);
    }
}

struct DriveCtx {
    prompt_len: usize,
    prompt_tail: Vec<u32>,
    stop_strings: Vec<String>,
    want_token_text: bool,
    context_capped: bool,
    arrived: Instant,
    /// Record latency metrics (background work would skew the client-facing figures).
    foreground: bool,
    /// The prompt, when its scores are wanted.
    scored_prompt: Option<Vec<u32>>,
    first_token: Option<tokio::sync::oneshot::Sender<()>>,
}

async fn drive(
    state: &SharedState,
    mut stream: vigil_engine::engine_thread::RequestStream,
    tx: &mpsc::UnboundedSender<GenEvent>,
    mut ctx: DriveCtx,
) -> (Outcome, Option<Finished>, Option<GenEvent>) {
    let tokenizer = state.tokenizer.clone();
    let mut detok = IncrementalDetokenizer::new(&tokenizer, &ctx.prompt_tail, true);
    let mut stops = StopMatcher::new(ctx.stop_strings.clone());
    let (want_token_text, context_capped, arrived) =
        (ctx.want_token_text, ctx.context_capped, ctx.arrived);
    let mut cached_tokens = 0;
    let mut num_tokens = 0usize;
    let mut last_token_at: Option<Instant> = None;
    let mut pending_tokens: Vec<TokenInfo> = Vec::new();
    let mut output_ids: Vec<u32> = Vec::new();
    let mut first_top: Vec<(u32, f32)> = Vec::new();
    loop {
        let event = tokio::select! {
            ev = stream.next() => ev,
            _ = tx.closed() => return (Outcome::Cancelled, None, None),
        };
        let Some(event) = event else {
            let _ = tx.send(GenEvent::Failed(ApiError::internal("the engine stopped")));
            return (Outcome::ServerError, None, None);
        };
        match event {
            RequestEvent::Admitted { num_cached_tokens } => cached_tokens = num_cached_tokens,
            RequestEvent::Token {
                token,
                logprob,
                top_logprobs,
            } => {
                let now = Instant::now();
                match (ctx.foreground, last_token_at) {
                    (false, _) => {}
                    (true, None) => state.metrics.ttft.observe((now - arrived).as_secs_f64()),
                    (true, Some(t)) => state.metrics.inter_token.observe((now - t).as_secs_f64()),
                }
                last_token_at = Some(now);
                num_tokens += 1;
                if let Some(first) = ctx.first_token.take() {
                    let _ = first.send(());
                }
                if output_ids.is_empty() {
                    first_top.clone_from(&top_logprobs);
                }
                output_ids.push(token);
                let piece = match detok.push(token) {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = tx.send(GenEvent::Failed(ApiError::internal(e.to_string())));
                        return (Outcome::ServerError, None, None);
                    }
                };
                if want_token_text {
                    pending_tokens.push(token_info(&tokenizer, token, logprob, &top_logprobs));
                }
                let (text, hit) = stops.push(&piece);
                if let Some(matched) = hit {
                    let _ = tx.send(GenEvent::Delta {
                        text,
                        tokens: std::mem::take(&mut pending_tokens),
                    });
                    let done = GenEvent::Done {
                        finish: Finish::StopString(matched),
                        usage: Usage {
                            prompt_tokens: ctx.prompt_len,
                            cached_tokens,
                            completion_tokens: num_tokens,
                            ..Usage::default()
                        },
                        prompt: Vec::new(),
                    };
                    let finished = Finished {
                        reason: FinishReason::Stop,
                        by_stop_string: true,
                        output_ids,
                        first_top,
                        prompt_scores: Vec::new(),
                    };
                    return (Outcome::Ok, Some(finished), Some(done));
                }
                if (!text.is_empty() || !pending_tokens.is_empty())
                    && tx
                        .send(GenEvent::Delta {
                            text,
                            tokens: std::mem::take(&mut pending_tokens),
                        })
                        .is_err()
                {
                    return (Outcome::Cancelled, None, None);
                }
            }
            RequestEvent::Finished {
                reason,
                num_prompt_tokens,
                num_cached_tokens,
                num_output_tokens,
                prompt_scores,
                prompt_logprobs,
                num_draft_tokens,
                num_accepted_draft_tokens,
                ..
            } => {
                let tail = detok.flush();
                let text = stops.finish(&tail);
                if !text.is_empty() {
                    let _ = tx.send(GenEvent::Delta {
                        text,
                        tokens: Vec::new(),
                    });
                }
                let finish = match reason {
                    FinishReason::Stop => Finish::Eos,
                    FinishReason::Length | FinishReason::Abort => Finish::Length {
                        context_full: context_capped,
                    },
                };
                let prompt = match &ctx.scored_prompt {
                    Some(ids) => (ids.iter().skip(1))
                        .zip(&prompt_scores)
                        .zip(&prompt_logprobs)
                        .map(|((&id, (_, top)), &(lp, rank))| {
                            (token_info(&tokenizer, id, lp, top), rank)
                        })
                        .collect(),
                    None => Vec::new(),
                };
                let done = GenEvent::Done {
                    finish,
                    usage: Usage {
                        prompt_tokens: num_prompt_tokens,
                        cached_tokens: num_cached_tokens,
                        completion_tokens: num_output_tokens,
                        draft_tokens: num_draft_tokens,
                        accepted_draft_tokens: num_accepted_draft_tokens,
                    },
                    prompt,
                };
                let finished = Finished {
                    reason,
                    by_stop_string: false,
                    output_ids,
                    first_top,
                    prompt_scores,
                };
                return (Outcome::Ok, Some(finished), Some(done));
            }
            RequestEvent::Failed(msg) => {
                let _ = tx.send(GenEvent::Failed(ApiError::internal(msg)));
                return (Outcome::ServerError, None, None);
            }
        }
    }
}

fn token_info(
    tokenizer: &vigil_model::tokenizer::Tokenizer,
    token: u32,
    logprob: f32,
    top: &[(u32, f32)],
) -> TokenInfo {
    let text_of = |id: u32| tokenizer.decode(&[id], false).unwrap_or_default();
    TokenInfo {
        id: token,
        text: text_of(token),
        logprob,
        top: top.iter().map(|&(id, lp)| (id, text_of(id), lp)).collect(),
    }
}

/// Finds the first stop string in the generated text, holding back any tail that could still
/// become one so that a stop string never leaks to the client.
struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Returns the text safe to emit, and the stop string if one completed.
    fn push(&mut self, piece: &str) -> (String, Option<String>) {
        if self.stops.is_empty() {
            return (piece.to_string(), None);
        }
        self.held.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|i| (i, s)))
            .min_by_key(|&(i, _)| i);
        if let Some((i, s)) = first {
            let matched = s.clone();
            let text = self.held[..i].to_string();
            self.held.clear();
            return (text, Some(matched));
        }
        let keep = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_string();
        self.held.drain(..cut);
        (text, None)
    }

    fn finish(&mut self, tail: &str) -> String {
        let (mut text, _) = self.push(tail);
        text.push_str(&std::mem::take(&mut self.held));
        text
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`, on char bounds.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = text.len().min(stop.len().saturating_sub(1));
    (1..=max)
        .rev()
        .find(|&n| {
            let start = text.len() - n;
            text.is_char_boundary(start) && stop.as_bytes().starts_with(&text.as_bytes()[start..])
        })
        .unwrap_or(0)
}

/// Several generations' events as one stream, each tagged with its generation's place in
/// `rxs`, in the order they come (a streamed response with several choices). A generation's
/// forwarding ends with it or when the merged receiver is dropped; dropping its receiver then
/// cancels it.
pub fn merge(
    rxs: Vec<mpsc::UnboundedReceiver<GenEvent>>,
) -> mpsc::UnboundedReceiver<(usize, GenEvent)> {
    let (merged_tx, merged) = mpsc::unbounded_channel();
    for (index, mut rx) in rxs.into_iter().enumerate() {
        let merged_tx = merged_tx.clone();
        tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                if merged_tx.send((index, ev)).is_err() {
                    break;
                }
            }
        });
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_split_over_pieces_never_leaks() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        let mut out = String::new();
        for p in ["hello S", "TO", "x more ST", "OP tail"] {
            let (t, hit) = m.push(p);
            out.push_str(&t);
            if let Some(s) = hit {
                assert_eq!(s, "STOP");
                assert_eq!(out, "hello STOx more ");
                return;
            }
        }
        panic!("stop string not found");
    }

    #[test]
    fn held_text_is_released_at_the_end() {
        let mut m = StopMatcher::new(vec!["END".into()]);
        let (t, _) = m.push("abcE");
        assert_eq!(t, "abc");
        assert_eq!(m.finish("N"), "EN");
    }
}
