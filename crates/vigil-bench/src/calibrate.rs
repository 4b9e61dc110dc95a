//! Prompts of an exact token count by the target's own tokenizer, without a local tokenizer.
//!
//! As `scripts/bench_serve.py`: a prompt is `"Words:"` followed by pseudo-words from a pool of
//! 192. The target prices each pool word once (probe requests with `max_tokens: 1`:
//! `usage.prompt_tokens` of `"Words: w"` minus that of `"Words:"`), so prompts are composed to a
//! target by addition, and one full-length probe checks the sum against the server's own count.
//! No two prompts share their first two words, so a prefix cache cannot serve one timed prompt
//! from another beyond BOS and the header (less than a KV block).

use crate::BenchError;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

pub const HEADER: &str = "Words:";
pub const POOL_SIZE: usize = 192;
/// How far the server's count of a composed prompt may stray from the prediction.
pub const LENGTH_TOLERANCE: f64 = 0.02;

/// A small deterministic generator (SplitMix64): prompts are reproducible from the seed alone.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0); the modulo bias is far below anything a benchmark sees.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// `n` distinct pronounceable pseudo-words, sorted: they tokenize into a few pieces each in any
/// BPE vocabulary and mean nothing, so no engine gets a head start from memorized text.
pub fn pseudo_words(rng: &mut SplitMix64, n: usize) -> Vec<String> {
    const ONSETS: &[&str] = &[
        "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
        "br", "ch", "dr", "gl", "kr", "pl", "sh", "st", "th", "tr",
    ];
    const VOWELS: &[&str] = &["a", "e", "i", "o", "u", "ai", "ea", "ou"];
    const CODAS: &[&str] = &["", "", "", "n", "r", "s", "l", "m", "nd", "st"];
    let mut words = HashSet::new();
    while words.len() < n {
        let syllables = *rng.pick(&[1, 2, 2, 3]);
        let word: String = (0..syllables)
            .map(|_| {
                format!(
                    "{}{}{}",
                    rng.pick(ONSETS),
                    rng.pick(VOWELS),
                    rng.pick(CODAS)
                )
            })
            .collect();
        words.insert(word);
    }
    let mut words: Vec<String> = words.into_iter().collect();
    words.sort();
    words
}

/// A prompt and the token count the composer predicts for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Composed {
    pub text: String,
    pub predicted: u32,
}

/// Composes prompts from priced pool words.
#[derive(Debug, Clone)]
pub struct Composer {
    /// Pool words with their token cost after the header (each ≥ 1).
    words: Vec<(String, u32)>,
    used_openings: HashSet<(usize, usize)>,
    rng: SplitMix64,
}

impl Composer {
    /// `priced`: pool words and their cost; a cost of 0 means the tokenizer merges words across
    /// spaces, and exact composition is impossible.
    pub fn new(priced: Vec<(String, u32)>, seed: u64) -> Result<Composer, BenchError> {
        if priced.is_empty() {
            return Err(BenchError::Calibration("no pool words".into()));
        }
        if let Some((w, _)) = priced.iter().find(|(_, c)| *c == 0) {
            return Err(BenchError::Calibration(format!(
                "the target tokenizes words across spaces (`{w}` costs 0 tokens); cannot compose"
            )));
        }
        Ok(Composer {
            words: priced,
            used_openings: HashSet::new(),
            rng: SplitMix64::new(seed ^ 0xC0FF_EE00),
        })
    }

    /// A fresh prompt of `target` tokens where `base` is the count of the header alone in the
    /// same context (bare completion, or the header as a chat message). Words are drawn at
    /// random; once few tokens remain, only words that still fit are drawn.
    pub fn compose(&mut self, target: u32, base: u32) -> Result<Composed, BenchError> {
        if target <= base {
            return Err(BenchError::Setting(format!(
                "a prompt of {target} tokens is not longer than its {base}-token header"
            )));
        }
        // A draw can end a token or two short when no word fits the remainder; such a draw is
        // kept only once exact ones keep failing (no cheap enough words in the pool).
        for attempt in 0..1000 {
            let (mut picked, mut tokens) = (Vec::new(), base);
            loop {
                let fits: Vec<usize> = (0..self.words.len())
                    .filter(|&i| tokens + self.words[i].1 <= target)
                    .collect();
                if fits.is_empty() {
                    break;
                }
                let drawn = self.rng.below(self.words.len());
                let i = if fits.contains(&drawn) {
                    drawn
                } else {
                    *self.rng.pick(&fits)
                };
                picked.push(i);
                tokens += self.words[i].1;
            }
            let opening = (
                picked.first().copied().unwrap_or(usize::MAX),
                picked.get(1).copied().unwrap_or(usize::MAX),
            );
            let exact_or_given_up = tokens == target || attempt >= 100;
            if exact_or_given_up && self.used_openings.insert(opening) {
                let mut text = HEADER.to_string();
                for i in picked {
                    text.push(' ');
                    text.push_str(&self.words[i].0);
                }
                return Ok(Composed {
                    text,
                    predicted: tokens,
                });
            }
        }
        Err(BenchError::Calibration(format!(
            "no fresh opening left for a {target}-token prompt (too many prompts this short)"
        )))
    }
}

/// What calibration found, kept in the result file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CalibrationRecord {
    pub pool_words: usize,
    /// Tokens of the header alone as a bare completion prompt.
    pub completion_base_tokens: u32,
    /// Tokens of the header as the one user message of a chat (template included).
    pub chat_base_tokens: Option<u32>,
    pub word_cost_min: u32,
    pub word_cost_max: u32,
    /// How prompts were counted: `/tokenize`, `/extras/tokenize/count` (llama-cpp-python), or
    /// `/v1/completions` usage (one generated token per count) where the target has neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count_method: Option<String>,
    /// The full-length probe: endpoint, target, the composer's prediction and the server's count.
    pub check: CalibrationCheck,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CalibrationCheck {
    pub endpoint: String,
    pub target: u32,
    pub predicted: u32,
    pub counted: u32,
}

impl CalibrationCheck {
    pub fn verify(&self) -> Result<(), BenchError> {
        let off = (f64::from(self.counted) - f64::from(self.target)).abs();
        // At least one token of slack: 2% of a short prompt is less than one.
        if off > (LENGTH_TOLERANCE * f64::from(self.target)).max(1.0) {
            return Err(BenchError::Calibration(format!(
                "a composed {}-token prompt is {} tokens by the server on {} (predicted {})",
                self.target, self.counted, self.endpoint, self.predicted
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn priced(costs: &[u32]) -> Vec<(String, u32)> {
        costs
            .iter()
            .enumerate()
            .map(|(i, &c)| (format!("w{i}"), c))
            .collect()
    }

    #[test]
    fn composes_to_the_exact_target_when_a_one_token_word_exists() {
        let mut c = Composer::new(priced(&[1, 2, 3, 5]), 7).unwrap();
        for target in [5, 17, 128, 1000] {
            let p = c.compose(target, 3).unwrap();
            assert_eq!(p.predicted, target);
            // The prediction is the header's base plus the listed words' costs.
            let words: Vec<&str> = p.text.split(' ').collect();
            assert_eq!(words[0], HEADER);
            let sum: u32 = words[1..]
                .iter()
                .map(|w| [1, 2, 3, 5][w[1..].parse::<usize>().unwrap()])
                .sum();
            assert_eq!(3 + sum, target);
        }
    }

    #[test]
    fn never_overshoots_and_stops_when_nothing_fits() {
        // Costs 2 and 3 only, base 1: a greedy draw can end a token short.
        // A fresh composer per target: two words have few distinct openings.
        for target in 3..60 {
            let mut c = Composer::new(priced(&[2, 3]), u64::from(target)).unwrap();
            let p = c.compose(target, 1).unwrap();
            // 1 + 2k + 3m reaches every target ≥ 3 exactly, and retries find it.
            assert_eq!(p.predicted, target, "{p:?}");
        }
    }

    #[test]
    fn openings_are_unique_and_seeded() {
        let pool = priced(&[1; 50]);
        let mut a = Composer::new(pool.clone(), 3).unwrap();
        let mut b = Composer::new(pool, 3).unwrap();
        let pa: Vec<String> = (0..40).map(|_| a.compose(64, 2).unwrap().text).collect();
        let pb: Vec<String> = (0..40).map(|_| b.compose(64, 2).unwrap().text).collect();
        assert_eq!(pa, pb, "same seed, same prompts");
        let openings: HashSet<Vec<&str>> =
            pa.iter().map(|t| t.split(' ').take(3).collect()).collect();
        assert_eq!(openings.len(), 40);
    }

    #[test]
    fn refuses_what_cannot_be_composed() {
        assert!(Composer::new(priced(&[1, 0]), 0).is_err());
        let mut c = Composer::new(priced(&[1]), 0).unwrap();
        assert!(c.compose(3, 3).is_err());
        // One word: a 2-word opening can be used once only.
        assert!(c.compose(10, 3).is_ok());
        assert!(c.compose(10, 3).is_err());
    }

    #[test]
    fn pool_words_are_distinct_and_deterministic() {
        let a = pseudo_words(&mut SplitMix64::new(1), POOL_SIZE);
        assert_eq!(a.len(), POOL_SIZE);
        assert_eq!(a, pseudo_words(&mut SplitMix64::new(1), POOL_SIZE));
        assert!(a.iter().all(|w| w.chars().all(|c| c.is_ascii_lowercase())));
    }

    #[test]
    fn check_tolerance_is_two_percent() {
        let check = |counted| CalibrationCheck {
            endpoint: "/v1/completions".into(),
            target: 1000,
            predicted: 1000,
            counted,
        };
        assert!(check(1020).verify().is_ok());
        assert!(check(980).verify().is_ok());
        assert!(check(1021).verify().is_err());
        let short = |counted| CalibrationCheck {
            counted,
            target: 32,
            ..check(0)
        };
        assert!(short(31).verify().is_ok());
        assert!(short(30).verify().is_err());
    }
}
