//! The stream's entries: sensor log lines of about E tokens by the target's own tokenizer, and
//! the client's copy of a session window (what a stateless replay re-sends).
//!
//! An entry is counted as a session tokenizes it, `text + "\n"` on its own. Each count is the
//! difference of two probes, `"Log:\n" + text + "\nEnd"` against `"Log:\nEnd"`: both edges are
//! pretokenizer boundaries (a newline after punctuation, a newline before a word), so BOS,
//! chat-template wrapping and the header cancel out.

use crate::calibrate::SplitMix64;
use crate::client::{Client, Usage};
use crate::run::completion_body;
use crate::BenchError;
use serde_json::{json, Value};
use std::collections::VecDeque;

const PROBE_HEAD: &str = "Log:\n";
const PROBE_TAIL: &str = "End";

/// How a target counts tokens, cheapest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountMethod {
    /// Anthropic's `/v1/messages/count_tokens` (Vigil; counts a chat rendering).
    MessagesCountTokens,
    /// llama-cpp-python's `/extras/tokenize/count`.
    ExtrasTokenizeCount,
    /// `/tokenize` (vLLM, SGLang, Vigil).
    Tokenize,
    /// `/v1/completions` with one output token: `usage.prompt_tokens` (every target; costs a
    /// prefill).
    Completions,
}

impl CountMethod {
    /// The methods that count a bare completion prompt as `/v1/completions` does (BOS
    /// included), cheapest first: what prompt calibration uses.
    pub const FOR_PROMPTS: [CountMethod; 3] = [
        CountMethod::Tokenize,
        CountMethod::ExtrasTokenizeCount,
        CountMethod::Completions,
    ];

    const ALL: [CountMethod; 4] = [
        CountMethod::MessagesCountTokens,
        CountMethod::ExtrasTokenizeCount,
        CountMethod::Tokenize,
        CountMethod::Completions,
    ];

    pub fn path(self) -> &'static str {
        match self {
            CountMethod::MessagesCountTokens => "/v1/messages/count_tokens",
            CountMethod::ExtrasTokenizeCount => "/extras/tokenize/count",
            CountMethod::Tokenize => "/tokenize",
            CountMethod::Completions => "/v1/completions",
        }
    }

    /// Tokens of `text` as this method counts it (an HTTP error status: the target lacks it).
    pub async fn count(self, client: &Client, model: &str, text: &str) -> Result<u32, BenchError> {
        let (body, pointer) = match self {
            CountMethod::MessagesCountTokens => (
                json!({"model": model, "messages": [{"role": "user", "content": text}]}),
                "/input_tokens",
            ),
            CountMethod::ExtrasTokenizeCount => (json!({"input": text}), "/count"),
            CountMethod::Tokenize => (json!({"model": model, "prompt": text}), "/count"),
            CountMethod::Completions => (completion_body(model, text, 1, false), ""),
        };
        let reply = client.post_json(self.path(), &body).await?;
        let n = match self {
            CountMethod::Completions => {
                Usage::from_json(reply.get("usage").unwrap_or(&Value::Null)).prompt_tokens
            }
            _ => reply
                .pointer(pointer)
                .and_then(Value::as_u64)
                .map(|n| n as u32),
        };
        n.ok_or_else(|| BenchError::Reply {
            url: format!("{}{}", client.base(), self.path()),
            what: format!("no token count at `{pointer}`"),
        })
    }
}

/// Counts entry tokens on one target.
#[derive(Debug, Clone)]
pub struct TokenCounter {
    pub method: CountMethod,
    base: u32,
}

impl TokenCounter {
    /// The first method the target answers (an HTTP error status means "not this one").
    pub async fn detect(client: &Client, model: &str) -> Result<TokenCounter, BenchError> {
        let base_text = format!("{PROBE_HEAD}{PROBE_TAIL}");
        let mut last = None;
        for method in CountMethod::ALL {
            match method.count(client, model, &base_text).await {
                Ok(base) => return Ok(TokenCounter { method, base }),
                Err(e @ (BenchError::Status { .. } | BenchError::Reply { .. })) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| BenchError::Calibration("no way to count tokens".into())))
    }

    /// Tokens of `text + "\n"` tokenized alone.
    pub async fn entry_tokens(
        &self,
        client: &Client,
        model: &str,
        text: &str,
    ) -> Result<u32, BenchError> {
        let probe = format!("{PROBE_HEAD}{text}\n{PROBE_TAIL}");
        let n = self.method.count(client, model, &probe).await?;
        match n.checked_sub(self.base) {
            Some(d) if d > 0 => Ok(d),
            _ => Err(BenchError::Calibration(format!(
                "`{text}` counts {n} tokens with the probe around it, not more than the probe's {} alone",
                self.base
            ))),
        }
    }
}

/// The head of entry `index` (`t=12.0s sensor-3`) and enough fields for any length up to
/// `max_fields`: the same for a given seed and index on every target, so targets with one
/// tokenizer get identical entries.
pub fn sensor_fields(
    seed: u64,
    index: u64,
    period_ms: u32,
    max_fields: usize,
) -> (String, Vec<String>) {
    let mut rng = SplitMix64::new(seed ^ index.wrapping_mul(0xA076_1D64_78BD_642F));
    let mut val = |lo: u64, hi: u64| lo + rng.next_u64() % (hi - lo + 1);
    let t = index as f64 * f64::from(period_ms) / 1000.0;
    let head = format!("t={t:.1}s sensor-{}", val(1, 12));
    let fields = (0..max_fields)
        .map(|_| match val(0, 9) {
            0 => format!("temp {}.{} C", val(15, 34), val(0, 9)),
            1 => format!("pressure {} hPa", val(990, 1030)),
            2 => format!("humidity {} %", val(20, 80)),
            3 => format!("vib 0.{:02} g", val(0, 99)),
            4 => format!("flow {}.{} L/min", val(2, 40), val(0, 9)),
            5 => format!("volt {}.{} V", val(220, 240), val(0, 9)),
            6 => format!("current {}.{:02} A", val(0, 15), val(0, 99)),
            7 => format!("rpm {}", val(800, 3600)),
            8 => format!("battery {} %", val(5, 100)),
            _ => ["status ok", "status ok", "status warn", "status fault"][val(0, 3) as usize]
                .to_string(),
        })
        .collect();
    (head, fields)
}

fn line(head: &str, fields: &[String], k: usize) -> String {
    let mut s = head.to_string();
    for f in &fields[..k] {
        s.push(' ');
        s.push_str(f);
    }
    s
}

/// One stream entry and its token count on the target.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub text: String,
    pub tokens: u32,
}

/// Entries in stream order, each sized to about `target` tokens.
pub struct EntrySource {
    counter: TokenCounter,
    seed: u64,
    period_ms: u32,
    target: u32,
    next_index: u64,
    /// Characters per token seen so far: the first guess at how many fields to count.
    chars_per_token: f64,
}

impl EntrySource {
    pub fn new(counter: TokenCounter, seed: u64, period_ms: u32, target: u32) -> EntrySource {
        EntrySource {
            counter,
            seed,
            period_ms,
            target,
            next_index: 0,
            chars_per_token: 3.0,
        }
    }

    pub fn method(&self) -> CountMethod {
        self.counter.method
    }

    /// The next entry sized to the target: fields are added (or dropped) one at a time until
    /// the count crosses the target, then up to `REFINE` other fields are tried in place of the
    /// last one; the closest line wins (ties: the first found).
    pub async fn size_next(&mut self, client: &Client, model: &str) -> Result<Entry, BenchError> {
        const REFINE: usize = 6;
        let target = self.target;
        let max_fields = target as usize + 1;
        let (head, fields) = sensor_fields(self.seed, self.next_index, self.period_ms, max_fields);
        self.next_index += 1;
        let want_chars = f64::from(target) * self.chars_per_token;
        let mut k = (0..=max_fields)
            .find(|&k| line(&head, &fields, k).len() as f64 >= want_chars)
            .unwrap_or(max_fields);
        let counter = &self.counter;
        let count = |text: String| async move {
            let n = counter.entry_tokens(client, model, &text).await?;
            Ok::<_, BenchError>(Entry { text, tokens: n })
        };
        let off = |e: &Entry| e.tokens.abs_diff(target);
        let mut here = count(line(&head, &fields, k)).await?;
        // `under`: the field count of the line just below the target, once crossed.
        let (mut best, under) = loop {
            let step_up = here.tokens < target;
            let next_k = if step_up { k + 1 } else { k.wrapping_sub(1) };
            if here.tokens == target || next_k > max_fields {
                break (here, None);
            }
            let there = count(line(&head, &fields, next_k)).await?;
            if (there.tokens >= target) == step_up {
                let under = if step_up { k } else { next_k };
                let closer = if off(&there) < off(&here) {
                    there
                } else {
                    here
                };
                break (closer, Some(under));
            }
            (k, here) = (next_k, there);
        };
        if let Some(u) = under.filter(|_| best.tokens != target) {
            let stem = line(&head, &fields, u);
            for f in fields.iter().skip(u + 1).take(REFINE) {
                let e = count(format!("{stem} {f}")).await?;
                if off(&e) < off(&best) {
                    best = e;
                }
                if best.tokens == target {
                    break;
                }
            }
        }
        self.chars_per_token =
            0.7 * self.chars_per_token + 0.3 * (best.text.len() as f64 / f64::from(best.tokens));
        Ok(best)
    }
}

/// The client's copy of a session window, evicted exactly as the server does, entry by entry:
/// when an entry takes the data past `cap` tokens, whole oldest entries go until at most
/// `evict_to` remain.
#[derive(Debug, Clone)]
pub struct Window {
    cap: u32,
    evict_to: u32,
    entries: VecDeque<Entry>,
    tokens: u32,
}

impl Window {
    pub fn new(cap: u32, evict_to: u32) -> Window {
        Window {
            cap,
            evict_to: evict_to.min(cap),
            entries: VecDeque::new(),
            tokens: 0,
        }
    }

    /// Appends an entry; returns how many were evicted.
    pub fn push(&mut self, e: Entry) -> usize {
        self.tokens += e.tokens;
        self.entries.push_back(e);
        let mut evicted = 0;
        if self.tokens <= self.cap {
            return 0;
        }
        while self.tokens > self.evict_to {
            let Some(old) = self.entries.pop_front() else {
                break;
            };
            self.tokens -= old.tokens;
            evicted += 1;
        }
        evicted
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn tokens(&self) -> u32 {
        self.tokens
    }

    pub fn texts(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.text.clone()).collect()
    }

    /// The user message of a stateless replay, as a session renders a question after its
    /// data: `e1\ne2\n…\n<question>`.
    pub fn user_content(&self, question: &str) -> String {
        let mut s = String::new();
        for e in &self.entries {
            s.push_str(&e.text);
            s.push('\n');
        }
        s.push_str(question);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(text: &str, tokens: u32) -> Entry {
        Entry {
            text: text.into(),
            tokens,
        }
    }

    #[test]
    fn the_window_keeps_the_newest_entries_that_fit() {
        let mut w = Window::new(10, 10);
        assert_eq!(w.push(entry("a", 4)), 0);
        assert_eq!(w.push(entry("b", 4)), 0);
        assert_eq!(w.tokens(), 8);
        // 12 > 10: the oldest goes, whole.
        assert_eq!(w.push(entry("c", 4)), 1);
        assert_eq!(w.texts(), ["b", "c"]);
        assert_eq!(w.push(entry("d", 9)), 2);
        assert_eq!(w.texts(), ["d"]);
        assert_eq!(w.user_content("Q?"), "d\nQ?");
        w.push(entry("e", 1));
        assert_eq!(w.user_content("Q?"), "d\ne\nQ?");
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn an_amortized_window_evicts_below_the_cap_only_when_it_passes_it() {
        let mut w = Window::new(10, 5);
        for t in ["a", "b"] {
            assert_eq!(w.push(entry(t, 4)), 0);
        }
        // 12 > 10: evict down to at most 5 tokens (a and b go), then room again for 6.
        assert_eq!(w.push(entry("c", 4)), 2);
        assert_eq!(w.texts(), ["c"]);
        assert_eq!(w.push(entry("d", 4)), 0);
        assert_eq!(w.push(entry("e", 2)), 0);
        assert_eq!(w.tokens(), 10);
        assert_eq!(w.push(entry("f", 1)), 2);
        assert_eq!(w.texts(), ["e", "f"]);
    }

    #[test]
    fn sensor_lines_are_seeded_and_grow_by_fields() {
        let (h1, f1) = sensor_fields(7, 3, 1000, 12);
        let (h2, f2) = sensor_fields(7, 3, 1000, 12);
        assert_eq!((h1.clone(), f1.clone()), (h2, f2));
        assert!(h1.starts_with("t=3.0s sensor-"), "{h1}");
        let (_, other) = sensor_fields(7, 4, 1000, 12);
        assert_ne!(f1, other);
        let short = line(&h1, &f1, 2);
        let long = line(&h1, &f1, 5);
        assert!(long.starts_with(&short) && long.len() > short.len());
        assert!(f1.iter().all(|f| !f.starts_with(' ') && !f.ends_with(' ')));
    }
}
