//! Speculative decoding: a proposer guesses the next few tokens of a decoding sequence, the
//! step computes them as extra rows of that sequence (in the flat batch with everything else),
//! and the sampler's pick at each row says how many of the guesses stand.
//!
//! Verification is exact. Every proposer here is deterministic: its draft is a point mass
//! `q`, for which the standard rejection rule (accept draft token `d` with probability
//! `min(1, p(d) / q(d)) = p(d)`, else draw from `(p - q)+` renormalized, which is `p` without
//! `d`) is the same as drawing from `p` and accepting `d` if the draw is `d`. So each row is
//! sampled exactly as a decode step at that position would sample it (same logits bits, by the
//! determinism contract; same penalties, constraint and RNG draw, because rows are sampled in
//! order and the first mismatch ends the verification). Greedy output, and seeded sampled
//! output, are identical with and without speculation; unseeded output keeps its distribution.
//!
//! Files: `ngram.rs` (prompt lookup), `suffix.rs` (longest-suffix match over the context and a
//! request's prediction), `draft.rs` (a smaller model of the same vocabulary), `policy.rs` (how
//! many tokens to propose, from the acceptance seen).

mod draft;
mod ngram;
mod policy;
mod suffix;

pub use draft::{DraftModel, DraftRequest};
pub use policy::SpecState;

use std::sync::Arc;

/// Where draft tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecMethod {
    /// No speculation.
    #[default]
    Off,
    /// vLLM's prompt lookup: the most recent earlier occurrence of the last 4, 3 or 2 tokens
    /// (longest first), and what followed it.
    Ngram,
    /// The longest earlier match of the context's suffix (up to 32 tokens), anywhere in the
    /// context or the request's prediction, and what followed it; longer matches may propose
    /// more.
    Suffix,
    /// The server's draft model (`--speculative draft:PATH`), greedily.
    Draft,
}

impl SpecMethod {
    pub fn parse(s: &str) -> Option<SpecMethod> {
        match s {
            "off" | "none" => Some(SpecMethod::Off),
            "ngram" => Some(SpecMethod::Ngram),
            "suffix" => Some(SpecMethod::Suffix),
            "draft" => Some(SpecMethod::Draft),
            _ => None,
        }
    }
}

/// What a request asks of speculation. `Default`: the server's method, no prediction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecRequest {
    /// `None`: the server-wide method.
    pub method: Option<SpecMethod>,
    /// Tokens the output is expected to resemble (OpenAI's predicted outputs): searched for
    /// drafts beside the context.
    pub prediction: Option<Arc<[u32]>>,
}

/// The server-wide settings.
#[derive(Debug, Clone)]
pub struct SpecConfig {
    pub method: SpecMethod,
    /// Most draft tokens per sequence per step.
    pub max_draft: usize,
    /// The cost of one more row of a sequence in a step, as a fraction of a one-row decode
    /// step: what a draft token must be likely enough to pay for. Measured on SmolLM2 Q4_1 at
    /// 2 threads (Xeon, AVX-512): 1 row 4.9 ms, 2 rows 7.2, 9 rows 19.4, 17 rows 28.5, so a
    /// row adds 0.3–0.45 of a step. 0.35 was the best of 0.3, 0.35 and 0.45 on the speculative
    /// benchmark (free text kept its speed at 0.35, not at 0.3).
    pub row_cost: f32,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            method: SpecMethod::Off,
            max_draft: 16,
            row_cost: 0.35,
        }
    }
}

/// Counters since start, for `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpecStats {
    /// Verifications run (a sequence's step with at least one draft token).
    pub drafts: u64,
    pub proposed_tokens: u64,
    pub accepted_tokens: u64,
}

/// Propose up to `max` tokens to follow `context` (whose last `num_output` tokens are output)
/// by `method`, searching the context and `prediction`. Empty when nothing matches.
///
/// While the output so far is exactly the prediction's start, the prediction's next tokens
/// are the draft, whatever the context holds: that alignment is the strongest evidence there
/// is. Once the output leaves the prediction, the proposers search it like the context, so a
/// prediction with one change is picked up again after the change.
pub fn propose(
    method: SpecMethod,
    context: &[u32],
    num_output: usize,
    prediction: Option<&[u32]>,
    max: usize,
    out: &mut Vec<u32>,
) {
    out.clear();
    if max == 0 || method == SpecMethod::Off {
        return;
    }
    if let Some(p) = prediction {
        let output = &context[context.len().saturating_sub(num_output)..];
        if !output.is_empty() && p.len() > output.len() && p.starts_with(output) {
            out.extend(p[output.len()..].iter().take(max));
            return;
        }
    }
    match method {
        // The draft model proposes through `DraftModel::propose`, all sequences at once.
        SpecMethod::Off | SpecMethod::Draft => {}
        SpecMethod::Ngram => ngram::propose(context, prediction, max, out),
        SpecMethod::Suffix => suffix::propose(context, prediction, max, out),
    }
}

/// Append up to `max` tokens of `src` from `at` on. A copy out of the context runs on into
/// what it has appended (an overlapping copy, as in LZ77), so a loop of period `p` found `p`
/// tokens back proposes the whole draft, not just `p` tokens.
fn copy_continuation(src: &[u32], at: usize, is_context: bool, max: usize, out: &mut Vec<u32>) {
    let start = out.len();
    for j in at..at + max {
        let token = match src.get(j) {
            Some(&t) => t,
            None if is_context => out[start + j - src.len()],
            None => break,
        };
        out.push(token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_proposers_continue_a_repeated_span() {
        let ctx = [5, 6, 7, 8, 9, 10, 1, 2, 5, 6, 7];
        let mut out = Vec::new();
        propose(SpecMethod::Ngram, &ctx, 0, None, 3, &mut out);
        assert_eq!(out, [8, 9, 10]);
        propose(SpecMethod::Suffix, &ctx, 0, None, 3, &mut out);
        assert_eq!(out, [8, 9, 10]);
        propose(SpecMethod::Off, &ctx, 0, None, 3, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn a_loop_proposes_past_the_end_of_the_context() {
        let ctx = [9, 1, 2, 3, 1, 2, 3];
        let mut out = Vec::new();
        propose(SpecMethod::Suffix, &ctx, 0, None, 5, &mut out);
        assert_eq!(out, [1, 2, 3, 1, 2]);
        propose(SpecMethod::Ngram, &ctx, 0, None, 5, &mut out);
        assert_eq!(out, [1, 2, 3, 1, 2]);
        propose(SpecMethod::Suffix, &[4, 4, 4], 0, None, 3, &mut out);
        assert_eq!(out, [4, 4, 4]);
    }

    #[test]
    fn a_prediction_is_searched_too() {
        let ctx = [1, 2, 3, 40, 41];
        let pred = [40, 41, 42, 43, 44];
        let mut out = Vec::new();
        propose(SpecMethod::Suffix, &ctx, 0, Some(&pred), 8, &mut out);
        assert_eq!(out, [42, 43, 44]);
        propose(SpecMethod::Ngram, &ctx, 0, Some(&pred), 2, &mut out);
        assert_eq!(out, [42, 43]);
    }

    #[test]
    fn an_output_that_follows_the_prediction_drafts_its_next_tokens() {
        // The context would propose 5 after [4]; the output so far is the prediction's start.
        let ctx = [4, 5, 1, 4];
        let pred = [1, 4, 6, 7];
        let mut out = Vec::new();
        propose(SpecMethod::Suffix, &ctx, 2, Some(&pred), 8, &mut out);
        assert_eq!(out, [6, 7]);
        // Left the prediction: back to searching.
        propose(
            SpecMethod::Ngram,
            &[1, 4, 9, 1, 4],
            3,
            Some(&pred),
            8,
            &mut out,
        );
        assert_eq!(out, [9, 1, 4, 9, 1, 4, 9, 1]);
    }

    #[test]
    fn nothing_is_proposed_without_a_match() {
        let mut out = vec![9];
        propose(SpecMethod::Suffix, &[1, 2, 3, 4], 0, None, 4, &mut out);
        assert!(out.is_empty());
        propose(SpecMethod::Ngram, &[1, 2, 3, 4], 0, None, 4, &mut out);
        assert!(out.is_empty());
    }
}
