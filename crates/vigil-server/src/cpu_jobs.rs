//! CPU work on client data (tokenizing, template rendering) runs here, off the async workers
//! and a few jobs at a time, so large or many prompts neither stall `/health` and the
//! streams nor pile up memory: at most one job per core runs, the rest wait their turn. A
//! text is refused before it is tokenized when its length alone shows it cannot fit. A job
//! whose client leaves before it starts never runs (dropping the request drops the wait, and
//! a job handed to a thread first checks that someone still awaits it); one already running
//! is bounded by the length check.

use crate::error::ApiError;
use crate::state::SharedState;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The permits that bound the jobs, and what a length check needs to know.
pub struct CpuJobs {
    permits: Arc<Semaphore>,
    /// The longest token of the vocabulary, in bytes: a text of more than
    /// `max_model_len × max_token_bytes` bytes cannot fit the context.
    pub max_token_bytes: usize,
}

impl CpuJobs {
    pub fn new(tokenizer: &vigil_model::tokenizer::Tokenizer) -> CpuJobs {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let max_token_bytes = (0..tokenizer.vocab_size() as u32)
            .filter_map(|id| tokenizer.id_to_token(id))
            .map(|t| t.len())
            .max()
            .unwrap_or(1)
            .max(1);
        CpuJobs {
            permits: Arc::new(Semaphore::new(cores)),
            max_token_bytes,
        }
    }
}

/// Counts a job as abandoned unless it started: dropped with the request that waits for it.
struct Waiting<'a> {
    state: &'a SharedState,
    started: Arc<AtomicBool>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.started.load(Ordering::Acquire) {
            (self.state.metrics.cpu_jobs_abandoned).fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Run `f` on the blocking pool once a permit is free; not at all if the caller is dropped
/// (its client left) before a thread takes it up.
pub async fn run<T: Send + 'static>(
    state: &SharedState,
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let waiting = Waiting {
        state,
        started: Arc::new(AtomicBool::new(false)),
    };
    let permit = (state.cpu_jobs.permits.clone().acquire_owned())
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let awaited = Arc::new(());
    let still_awaited = Arc::downgrade(&awaited);
    let (started, metrics) = (waiting.started.clone(), state.clone());
    let job = tokio::task::spawn_blocking(move || {
        if still_awaited.strong_count() == 0 {
            return None;
        }
        started.store(true, Ordering::Release);
        (metrics.metrics.cpu_jobs_run).fetch_add(1, Ordering::Relaxed);
        let r = f();
        drop(permit);
        Some(r)
    });
    let r = job
        .await
        .map_err(|e| ApiError::internal(format!("a tokenizer job failed: {e}")))?;
    drop(awaited);
    drop(waiting);
    r.unwrap_or_else(|| Err(ApiError::internal("the job's client left")))
}

/// Refuse `text` (400 `context_length_exceeded` naming `param`) when its bytes alone show that
/// its tokens cannot fit `max_model_len`.
pub fn check_length(state: &SharedState, text_bytes: usize, param: &str) -> Result<(), ApiError> {
    let most = state
        .max_model_len
        .saturating_mul(state.cpu_jobs.max_token_bytes);
    if text_bytes <= most {
        return Ok(());
    }
    Err(ApiError::too_long(
        param,
        format!(
            "the text is {text_bytes} bytes: more than the {} tokens of this model's context can hold (its longest token is {} bytes)",
            state.max_model_len, state.cpu_jobs.max_token_bytes
        ),
    ))
}

/// `text`'s token ids, after the length check, on the bounded pool.
pub async fn encode(
    state: &SharedState,
    text: String,
    add_special_tokens: bool,
    param: &'static str,
) -> Result<Vec<u32>, ApiError> {
    check_length(state, text.len(), param)?;
    let tokenizer = state.tokenizer.clone();
    run(state, move || {
        tokenizer
            .encode(&text, add_special_tokens)
            .map_err(|e| ApiError::invalid(param, format!("could not tokenize: {e}")))
    })
    .await
}
