//! Sampling: `SamplingParams` and the per-sequence `Sampler` that turns one logits row into a
//! token.
//!
//! The order follows vLLM: logit bias, then penalties (repetition over prompt and output,
//! frequency and presence over output), then, unless greedy, temperature, top-k, top-p, min-p
//! and a categorical draw. Greedy is argmax with ties going to the lowest token id.
//!
//! Returned log-probabilities are those of the model's distribution after bias and penalties,
//! before temperature and the filters: `log_softmax(logits)` of the row as modified in place.
//! They do not depend on the sampling settings that only shape the draw.
//!
//! For a 150k vocabulary the work is a few linear passes: top-k and the top-n logprobs use
//! `select_nth_unstable` instead of a full sort, top-p bisects with the same partitions until
//! the head holds the requested mass (no sort at all), and scratch buffers live in the `Sampler`
//! so a call allocates only its small result.

use std::cmp::Ordering;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::speculative::SpecRequest;
use vigil_kernels::ops::{exp_nonpos, sum_exp};

/// Temperatures below this are treated as greedy (as vLLM does).
pub const MIN_TEMPERATURE: f32 = 1e-5;

/// How one request samples. `Default` is greedy with nothing applied.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off; keeps tokens with probability >= `min_p` times the top token's.
    pub min_p: f32,
    /// 1 = off; HF semantics over prompt and output tokens: a seen token's positive logit is
    /// divided by it, a negative one multiplied.
    pub repetition_penalty: f32,
    /// OpenAI semantics over output tokens: subtracted once from each token that occurred.
    pub presence_penalty: f32,
    /// OpenAI semantics over output tokens: subtracted once per occurrence.
    pub frequency_penalty: f32,
    /// Added to the logits of these token ids (ids outside the vocabulary are ignored).
    pub logit_bias: Vec<(u32, f32)>,
    /// Seeds the sequence's `Sampler`; `None` draws a seed from the OS.
    pub seed: Option<u64>,
    /// How many top log-probabilities to return with each token.
    pub logprobs: Option<u32>,
    /// Stop tokens are banned until this many tokens have been generated (vLLM's `min_tokens`).
    pub min_tokens: u32,
    /// Score the prompt from this position on: for every prompt position `p` from here to the
    /// one before the last, what the sampler would pick after `p` (with its top `logprobs`),
    /// as `Sequence::prompt_scores`. A drafted continuation appended to the prompt is verified
    /// this way in one pass: greedy, the logits of a prompt row are the bits a decode step at
    /// that position would see. Rows served by the prefix cache are not computed, so not
    /// scored: a caller checks that it got every row it asked for.
    pub score_prompt_from: Option<usize>,
    /// With `score_prompt_from`: also score the prompt's own next token at each scored row
    /// (its log-probability and rank, `Sequence::prompt_logprobs`). Off for draft
    /// verification, which needs only the picks: the rank scans the whole vocabulary.
    pub score_prompt_tokens: bool,
    /// Speculative decoding for this request (`speculative`): the method, if not the
    /// server's, and a prediction of the output to draft from.
    pub speculative: SpecRequest,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
            logprobs: None,
            min_tokens: 0,
            score_prompt_from: None,
            score_prompt_tokens: false,
            speculative: SpecRequest::default(),
        }
    }
}

/// A sampling parameter out of range; names the field.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("invalid sampling parameter `{field}`: {message}")]
pub struct InvalidSamplingParam {
    pub field: &'static str,
    pub message: String,
}

impl SamplingParams {
    pub fn is_greedy(&self) -> bool {
        self.temperature < MIN_TEMPERATURE
    }

    /// Checks ranges (the server maps the error to a 4xx naming the field).
    pub fn validate(&self) -> Result<(), InvalidSamplingParam> {
        let bad = |field, message: &str| {
            Err(InvalidSamplingParam {
                field,
                message: message.to_string(),
            })
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", "must be a finite number >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", "must be in [0, 1]");
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad("repetition_penalty", "must be a finite number > 0");
        }
        if !self.presence_penalty.is_finite() {
            return bad("presence_penalty", "must be finite");
        }
        if !self.frequency_penalty.is_finite() {
            return bad("frequency_penalty", "must be finite");
        }
        if self.logit_bias.iter().any(|(_, b)| b.is_nan()) {
            return bad("logit_bias", "biases must be numbers");
        }
        Ok(())
    }
}

/// One sampled token.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleOutput {
    pub token: u32,
    /// Log-probability of `token` under the post-penalty distribution (see the module docs).
    pub logprob: f32,
    /// The `params.logprobs` most likely tokens, by log-probability descending (ties: lower id
    /// first).
    pub top_logprobs: Vec<(u32, f32)>,
    /// The row's log normalizer after bias and penalties: any token's log-probability is
    /// `logits[id] - log_z` with the logits `sample` left (as `logprob` is computed).
    pub log_z: f32,
}

/// Per-sequence sampling state: the RNG and reusable scratch buffers.
pub struct Sampler {
    rng: ChaCha8Rng,
    /// `seen[id] == stamp` marks ids already penalized this call (stamp changes per call).
    seen: Vec<u32>,
    stamp: u32,
    /// Output token counts for this call; entries are reset after use.
    counts: Vec<u32>,
    /// (scaled logit, id) candidates.
    cand: Vec<(f32, u32)>,
}

/// Descending by value, ties by ascending id: the one order used everywhere for determinism.
fn desc(a: &(f32, u32), b: &(f32, u32)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

impl Sampler {
    pub fn new(seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(s) => ChaCha8Rng::seed_from_u64(s),
            None => ChaCha8Rng::from_os_rng(),
        };
        Self {
            rng,
            seen: Vec::new(),
            stamp: 0,
            counts: Vec::new(),
            cand: Vec::new(),
        }
    }

    /// Samples the next token from one logits row. `logits` is modified in place (bias and
    /// penalties applied). `prompt_ids` and `output_ids` are the sequence's tokens so far.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        params: &SamplingParams,
        prompt_ids: &[u32],
        output_ids: &[u32],
    ) -> SampleOutput {
        assert!(!logits.is_empty(), "empty logits row");
        for &(id, bias) in &params.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        self.apply_penalties(logits, params, prompt_ids, output_ids);

        let (max, max_id) = argmax(logits);
        let log_z = log_sum_exp(logits, max);
        let token = if params.is_greedy() || max == f32::NEG_INFINITY {
            max_id
        } else {
            self.draw(logits, params, max)
        };
        let top_logprobs = match params.logprobs {
            Some(n) if n > 0 => self
                .top_n(logits, n as usize)
                .into_iter()
                .map(|(l, id)| (id, l - log_z))
                .collect(),
            _ => Vec::new(),
        };
        SampleOutput {
            token,
            logprob: logits[token as usize] - log_z,
            top_logprobs,
            log_z,
        }
    }

    fn apply_penalties(
        &mut self,
        logits: &mut [f32],
        params: &SamplingParams,
        prompt_ids: &[u32],
        output_ids: &[u32],
    ) {
        let vocab = logits.len();
        if params.repetition_penalty != 1.0 {
            if self.seen.len() < vocab {
                self.seen.resize(vocab, 0);
            }
            self.stamp = self.stamp.wrapping_add(1);
            if self.stamp == 0 {
                self.seen.fill(0);
                self.stamp = 1;
            }
            let p = params.repetition_penalty;
            for &id in prompt_ids.iter().chain(output_ids) {
                let i = id as usize;
                if i < vocab && self.seen[i] != self.stamp {
                    self.seen[i] = self.stamp;
                    let l = &mut logits[i];
                    *l = if *l > 0.0 { *l / p } else { *l * p };
                }
            }
        }
        if params.frequency_penalty != 0.0 || params.presence_penalty != 0.0 {
            if self.counts.len() < vocab {
                self.counts.resize(vocab, 0);
            }
            for &id in output_ids {
                if (id as usize) < vocab {
                    self.counts[id as usize] += 1;
                }
            }
            for &id in output_ids {
                let i = id as usize;
                if i < vocab && self.counts[i] > 0 {
                    let c = self.counts[i] as f32;
                    logits[i] -= params.frequency_penalty * c + params.presence_penalty;
                    self.counts[i] = 0;
                }
            }
        }
    }

    /// Temperature, top-k, top-p, min-p, then a categorical draw. `max` is the row's maximum.
    fn draw(&mut self, logits: &[f32], params: &SamplingParams, max: f32) -> u32 {
        let inv_t = 1.0 / params.temperature;
        let max = max * inv_t;
        let vocab = logits.len();
        let top_k = params.top_k as usize;
        let top_p = params.top_p < 1.0;
        let cand = &mut self.cand;
        cand.clear();
        cand.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (l * inv_t, i as u32)),
        );

        if top_k > 0 && top_k < vocab {
            cand.select_nth_unstable_by(top_k - 1, desc);
            cand.truncate(top_k);
        }
        if top_p {
            let total: f64 = cand.iter().map(|c| weight(c.0, max)).sum();
            let keep = top_p_head(cand, max, params.top_p as f64 * total);
            cand.truncate(keep);
        }
        if params.min_p > 0.0 {
            // p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p); the top token always stays.
            let threshold = max + params.min_p.ln();
            cand.retain(|c| c.0 >= threshold);
        }

        let total: f64 = cand.iter().map(|c| weight(c.0, max)).sum();
        let mut u = self.rng.random::<f64>() * total;
        for c in cand.iter() {
            u -= weight(c.0, max);
            if u < 0.0 {
                return c.1;
            }
        }
        // Rounding left a sliver past the last weight: take the last candidate with any.
        cand.iter()
            .rev()
            .find(|c| c.0 > f32::NEG_INFINITY)
            .map_or(cand[0].1, |c| c.1)
    }

    /// The `n` largest (logit, id) pairs, sorted by [`desc`].
    fn top_n(&mut self, logits: &[f32], n: usize) -> Vec<(f32, u32)> {
        let cand = &mut self.cand;
        cand.clear();
        cand.extend(logits.iter().enumerate().map(|(i, &l)| (l, i as u32)));
        let n = n.min(cand.len());
        if n < cand.len() {
            cand.select_nth_unstable_by(n - 1, desc);
            cand.truncate(n);
        }
        cand.sort_unstable_by(desc);
        cand.clone()
    }
}

/// Unnormalized probability of a (scaled) logit relative to the row's maximum.
fn weight(logit: f32, max: f32) -> f64 {
    exp_nonpos(logit - max) as f64
}

/// Top-p without sorting: reorders `cand` so its first `k` entries are its `k` largest (in
/// [`desc`] order, so ties go to lower ids) for the smallest `k` whose [`weight`]s reach
/// `target`, and returns `k` (at least 1). A bisection of `select_nth_unstable` partitions:
/// about `2 * len` comparisons and `len` weights, where a full sort of a 150k row costs ~17x.
fn top_p_head(cand: &mut [(f32, u32)], max: f32, target: f64) -> usize {
    // Invariant: cand[..lo] are the `lo` largest, holding `acc < target`; k is in (lo, hi].
    let (mut lo, mut hi, mut acc) = (0, cand.len(), 0.0);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        cand[lo..hi].select_nth_unstable_by(mid - lo - 1, desc);
        let upper: f64 = cand[lo..mid].iter().map(|c| weight(c.0, max)).sum();
        if acc + upper >= target {
            hi = mid;
        } else {
            acc += upper;
            lo = mid;
        }
    }
    hi.max(1)
}

/// The maximum and the lowest id holding it.
fn argmax(logits: &[f32]) -> (f32, u32) {
    // The maximum in 8 running lanes (a vectorized compare-and-select; a NaN never wins, as
    // in one pass with `>`), then its first index: the lowest id among ties.
    let first = logits[0];
    let mut lanes = [first; 8];
    let chunks = logits.chunks_exact(8);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &l) in lanes.iter_mut().zip(chunk) {
            if l > *m {
                *m = l;
            }
        }
    }
    let max = (lanes.iter().chain(tail)).fold(first, |m, &l| if l > m { l } else { m });
    if max.partial_cmp(&first) != Some(Ordering::Greater) {
        return (first, 0);
    }
    let id = logits.iter().position(|&l| l == max).unwrap_or(0);
    (logits[id], id as u32)
}

/// `ln(sum(exp(logits)))` given the row's maximum (`ops::sum_exp`: SIMD where the CPU has it).
fn log_sum_exp(logits: &[f32], max: f32) -> f32 {
    if max == f32::NEG_INFINITY {
        return max;
    }
    max + sum_exp(logits, max).ln() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane-wise argmax against one pass with `>`: ties (lowest id), NaNs (never win
    /// unless first), infinities, and rows shorter than a lane group.
    #[test]
    fn argmax_matches_a_single_pass() {
        fn one_pass(logits: &[f32]) -> (f32, u32) {
            let mut best = (logits[0], 0u32);
            for (i, &l) in logits.iter().enumerate().skip(1) {
                if l > best.0 {
                    best = (l, i as u32);
                }
            }
            best
        }
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for len in [1usize, 3, 8, 9, 17, 100, 49_152] {
            for case in 0..6 {
                // Few distinct values, so ties are common.
                let mut row: Vec<f32> = (0..len)
                    .map(|_| (rng.random::<u32>() % 7) as f32 - 3.0)
                    .collect();
                let at = rng.random::<u32>() as usize % len;
                match case {
                    1 => row[at] = f32::NAN,
                    2 => row[0] = f32::NAN,
                    3 => row[at] = f32::INFINITY,
                    4 => row.iter_mut().for_each(|l| *l = f32::NEG_INFINITY),
                    5 => {
                        row.iter_mut().for_each(|l| *l = l.min(0.0));
                        row[at] = -0.0;
                    }
                    _ => {}
                }
                let (want, got) = (one_pass(&row), argmax(&row));
                assert_eq!(want.1, got.1, "len {len}, case {case}");
                assert_eq!(want.0.to_bits(), got.0.to_bits(), "len {len}, case {case}");
            }
        }
    }

    /// `log_sum_exp` against f64 on ragged rows.
    #[test]
    fn log_sum_exp_matches_f64() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for len in [1usize, 7, 8, 9, 1000, 49_152] {
            let row: Vec<f32> = (0..len)
                .map(|_| rng.random::<f32>() * 60.0 - 30.0)
                .collect();
            let (max, _) = argmax(&row);
            let got = log_sum_exp(&row, max);
            let exact = max as f64
                + row
                    .iter()
                    .map(|&l| ((l - max) as f64).exp())
                    .sum::<f64>()
                    .ln();
            assert!(
                (got as f64 - exact).abs() < 1e-5,
                "len {len}: {got} vs {exact}"
            );
        }
    }

    /// Top-p over a large random row: the bisection must keep exactly the tokens a full
    /// sort keeps.
    #[test]
    fn adaptive_top_p_head_matches_full_sort() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for &(vocab, p) in &[(150_000usize, 0.9f32), (1000, 0.999), (300, 0.5), (5, 0.3)] {
            let row: Vec<(f32, u32)> = (0..vocab)
                .map(|i| (rng.random::<f32>() * 12.0, i as u32))
                .collect();
            let max = row.iter().map(|c| c.0).fold(f32::NEG_INFINITY, f32::max);
            let mut full = row.clone();
            full.sort_unstable_by(desc);
            let total: f64 = full.iter().map(|c| weight(c.0, max)).sum();
            let mut head = row.clone();
            let k = top_p_head(&mut head, max, p as f64 * total);
            head.truncate(k);
            head.sort_unstable_by(desc);
            let mut cum = 0.0;
            let keep = full
                .iter()
                .position(|c| {
                    cum += weight(c.0, max);
                    cum >= p as f64 * total
                })
                .unwrap()
                + 1;
            assert_eq!(head, full[..keep], "vocab {vocab}");
        }
    }
}
