//! A request's state on the engine thread: its tokens, how many have KV, its blocks and its
//! sampling state. `num_computed_tokens` chases `num_tokens()`; there is no prefill or decode
//! phase, only tokens still to compute.

use crate::block_table::BlockTable;
use crate::constraint::TokenConstraint;
use crate::pins::PinUse;
use crate::sampling::{SampleOutput, Sampler, SamplingParams};
use crate::speculative::SpecState;

pub type SeqId = u64;

/// Scheduling class, highest first: a lower class only gets the token budget and KV blocks
/// the higher ones leave over, and is preempted first. Ordered so that `Foreground` is the
/// greatest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Warm turns: useful, but nobody is waiting on them.
    Background,
    /// The data plane: session data being ingested.
    Ingest,
    /// Flash evaluations: short (one pass over a verified draft, or a few decode steps) and
    /// each one due after an ingested batch. While one runs, the classes below wait, so an
    /// evaluation goes before the next batch's prefill instead of decoding beside it.
    Flash,
    /// A client request.
    #[default]
    Foreground,
}

impl Priority {
    /// Every class, highest first: the order the scheduler serves them in.
    pub const DESCENDING: [Priority; 4] = [
        Priority::Foreground,
        Priority::Flash,
        Priority::Ingest,
        Priority::Background,
    ];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence or stop token was sampled.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The client went away or asked to stop.
    Abort,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStatus {
    Waiting,
    Running,
    Finished(FinishReason),
}

/// What a request asks of generation besides sampling.
#[derive(Debug, Clone)]
pub struct StopCriteria {
    pub max_tokens: usize,
    /// Sampling any of these ends the sequence (the model's EOS ids plus the request's own).
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
}

pub struct Sequence {
    pub id: SeqId,
    pub token_ids: Vec<u32>,
    pub num_prompt_tokens: usize,
    pub num_computed_tokens: usize,
    /// Prompt tokens whose KV came from the prefix cache at first admission.
    pub num_cached_tokens: usize,
    /// Times the scheduler evicted this sequence's blocks to recompute them later.
    pub num_preemptions: u32,
    pub table: Option<BlockTable>,
    pub params: SamplingParams,
    pub stop: StopCriteria,
    pub sampler: Sampler,
    pub status: SeqStatus,
    pub priority: Priority,
    /// Set by the scheduler when this sequence waited past the age bound: from then on it is
    /// scheduled as `Foreground`, so a lower class cannot starve.
    pub promoted: bool,
    /// Restricts which tokens may be sampled (a forced tool call); see `constraint.rs`.
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// The constraint allowed no token at some step: the sequence ends there.
    pub constraint_dead_end: bool,
    /// The session pin this sequence was forked from and may save to (see `pins.rs`).
    pub pin: Option<PinUse>,
    /// With `params.score_prompt_from`: the sampler's pick after each scored prompt row, in
    /// position order from that position.
    pub prompt_scores: Vec<SampleOutput>,
    /// With `params.score_prompt_tokens`, beside each of `prompt_scores`: the log-probability
    /// of the prompt's own next token there, and its rank (1 = the most likely) — the
    /// prompt's scores (`echo`, `prompt_logprobs`, perplexity).
    pub prompt_logprobs: Vec<(f32, u32)>,
    /// Draft tokens proposed to follow `token_ids` this step (speculative decoding): computed
    /// as extra rows after the last token, then cut back to what the sampler confirmed. Empty
    /// outside a step.
    pub draft: Vec<u32>,
    /// Draft tokens this step's verification has confirmed so far, and whether it has ended.
    pub draft_accepted: usize,
    pub draft_rejected: bool,
    /// This sequence's acceptance record and draft-length policy.
    pub spec: SpecState,
}

impl Sequence {
    pub fn new(id: SeqId, prompt: Vec<u32>, params: SamplingParams, stop: StopCriteria) -> Self {
        let sampler = Sampler::new(params.seed);
        Sequence {
            id,
            num_prompt_tokens: prompt.len(),
            token_ids: prompt,
            num_computed_tokens: 0,
            num_cached_tokens: 0,
            num_preemptions: 0,
            table: None,
            params,
            stop,
            sampler,
            status: SeqStatus::Waiting,
            priority: Priority::Foreground,
            promoted: false,
            constraint: None,
            constraint_dead_end: false,
            pin: None,
            prompt_scores: Vec::new(),
            prompt_logprobs: Vec::new(),
            draft: Vec::new(),
            draft_accepted: 0,
            draft_rejected: false,
            spec: SpecState::default(),
        }
    }

    /// The class the scheduler treats this sequence as: its own, or `Foreground` once promoted.
    pub fn effective_priority(&self) -> Priority {
        if self.promoted {
            Priority::Foreground
        } else {
            self.priority
        }
    }

    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Tokens the next step may compute for this sequence: those without KV, and this
    /// step's draft.
    pub fn num_uncomputed_tokens(&self) -> usize {
        self.token_ids.len() + self.draft.len() - self.num_computed_tokens
    }

    pub fn num_output_tokens(&self) -> usize {
        self.token_ids.len() - self.num_prompt_tokens
    }

    pub fn output_ids(&self) -> &[u32] {
        &self.token_ids[self.num_prompt_tokens..]
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.status, SeqStatus::Finished(_))
    }

    /// Sample the next token from this sequence's logits row and append it.
    pub fn sample_and_append(&mut self, logits: &mut [f32]) -> SampleOutput {
        if self.num_output_tokens() < self.params.min_tokens as usize {
            for &id in &self.stop.stop_token_ids {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        if let Some(c) = &mut self.constraint {
            if c.mask(logits) == 0 {
                self.constraint_dead_end = true;
            }
        }
        let (prompt, output) = self.token_ids.split_at(self.num_prompt_tokens);
        let out = self.sampler.sample(logits, &self.params, prompt, output);
        self.token_ids.push(out.token);
        if let Some(c) = &mut self.constraint {
            c.advance(out.token);
        }
        out
    }

    /// Score one prompt row's logits (what the sampler would pick there) without appending.
    pub fn score_prompt_row(&mut self, logits: &mut [f32]) {
        let row = self.params.score_prompt_from.unwrap_or(0) + self.prompt_scores.len();
        let prompt = &self.token_ids[..self.num_prompt_tokens];
        let out = self.sampler.sample(logits, &self.params, prompt, &[]);
        let next = prompt
            .get(row + 1)
            .filter(|_| self.params.score_prompt_tokens);
        if let Some(&next) = next {
            // The same operation as a generated token's `logprob`: equal bits for the same row.
            let l = logits
                .get(next as usize)
                .copied()
                .unwrap_or(f32::NEG_INFINITY);
            let rank = 1 + logits.iter().filter(|&&x| x > l).count() as u32;
            self.prompt_logprobs.push((l - out.log_z, rank));
        }
        self.prompt_scores.push(out);
    }

    /// Whether the last appended token ends the sequence, and why.
    pub fn check_stop(&self) -> Option<FinishReason> {
        let last = *self.token_ids.last()?;
        let constraint_done = self.constraint.as_ref().is_some_and(|c| c.is_complete());
        if constraint_done || self.constraint_dead_end {
            return Some(FinishReason::Stop);
        }
        if !self.stop.ignore_eos && self.stop.stop_token_ids.contains(&last) {
            return Some(FinishReason::Stop);
        }
        (self.num_output_tokens() >= self.stop.max_tokens).then_some(FinishReason::Length)
    }
}
