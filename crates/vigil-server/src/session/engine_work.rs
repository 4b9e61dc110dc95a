//! The engine path for session work (ingest prefills, flash evaluations, warm prefills): a
//! request straight to the engine on the session's pin, without the client path (no
//! detokenizer, no stop-string matcher, no admission seat). What a session's actor needs of
//! the server is here and in `SessionDeps`, so the session logic runs and is tested against
//! a real engine without HTTP.

use crate::error::ApiError;
use crate::metrics::ServerMetrics;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vigil_engine::engine_thread::{EngineHandle, GenerateRequest, RequestEvent};
use vigil_engine::pins::PinUse;
use vigil_engine::sampling::SamplingParams;
use vigil_engine::sequence::{FinishReason, Priority, StopCriteria};
use vigil_model::tokenizer::Tokenizer;

/// What a session's actor depends on: the engine, the tokenizer (answer text), the model's
/// context, the server's counters and the shared queue budget.
#[derive(Clone)]
pub struct SessionDeps {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub max_model_len: usize,
    pub metrics: Arc<ServerMetrics>,
    pub budget: Arc<super::budget::QueueBudget>,
    /// Where the session's changes are logged (`journal/`).
    pub journal: super::journal::Journal,
    /// Where its KV is offloaded when idle (`--kv-disk`).
    pub kv_disk: Option<Arc<super::journal::kv_disk::KvDisk>>,
}

/// One request of session work.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    pub ignore_eos: bool,
    pub priority: Priority,
    pub pin: PinUse,
}

/// How a job ended.
#[derive(Debug)]
pub struct JobDone {
    pub ids: Vec<u32>,
    pub reason: FinishReason,
    /// The first generated token's top alternatives.
    pub first_top: Vec<(u32, f32)>,
    pub prompt_scores: Vec<(u32, Vec<(u32, f32)>)>,
    pub cached_tokens: usize,
    /// What the pin holds after the save, for a job that saves to it.
    pub pin_tokens: Option<usize>,
}

/// Greedy sampling that reports the first token's two best alternatives (for confidence).
pub fn greedy(top_logprobs: u32) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        logprobs: Some(top_logprobs),
        ..SamplingParams::default()
    }
}

/// Counts a background request in flight for as long as it lives.
struct InFlight(Arc<ServerMetrics>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.background_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl SessionDeps {
    /// Run `job` until it finishes, fails, or `cancel` resolves first (`Ok(None)`: the
    /// request is dropped, which aborts it at the next step boundary; a pin with
    /// `save_on_abort` keeps what was computed).
    pub async fn run(
        &self,
        job: Job,
        cancel: impl Future<Output = ()>,
    ) -> Result<Option<JobDone>, ApiError> {
        let prompt_len = job.prompt.len();
        if prompt_len == 0 {
            return Err(ApiError::bad_request("the prompt is empty"));
        }
        if prompt_len >= self.max_model_len {
            return Err(ApiError::context_length(prompt_len, self.max_model_len));
        }
        let stop = StopCriteria {
            max_tokens: job.max_tokens.min(self.max_model_len - prompt_len),
            stop_token_ids: self.tokenizer.eos_token_ids().to_vec(),
            ignore_eos: job.ignore_eos,
        };
        let request = GenerateRequest {
            prompt: job.prompt,
            params: job.sampling,
            stop,
            constraint: None,
            priority: job.priority,
            pin: Some(job.pin),
        };
        let mut stream =
            (self.engine.submit(request)).map_err(|_| ApiError::internal("the engine stopped"))?;
        (self.metrics.background_in_flight).fetch_add(1, Ordering::Relaxed);
        let _counted = InFlight(self.metrics.clone());
        let mut ids = Vec::new();
        let mut first_top = Vec::new();
        tokio::pin!(cancel);
        loop {
            let event = tokio::select! {
                ev = stream.next() => ev,
                () = &mut cancel => return Ok(None),
            };
            match event {
                None => return Err(ApiError::internal("the engine stopped")),
                Some(RequestEvent::Admitted { .. }) => {}
                Some(RequestEvent::Token {
                    token,
                    top_logprobs,
                    ..
                }) => {
                    if ids.is_empty() {
                        first_top = top_logprobs;
                    }
                    ids.push(token);
                }
                Some(RequestEvent::Finished {
                    reason,
                    num_cached_tokens,
                    prompt_scores,
                    pin_tokens,
                    ..
                }) => {
                    return Ok(Some(JobDone {
                        ids,
                        reason,
                        first_top,
                        prompt_scores,
                        cached_tokens: num_cached_tokens,
                        pin_tokens,
                    }))
                }
                Some(RequestEvent::Failed(e)) => return Err(ApiError::internal(e)),
            }
        }
    }
}
