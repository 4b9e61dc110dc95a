//! The bigram merge of llama.cpp's SentencePiece tokenizer (`llm_tokenizer_spm_session` in
//! llama-vocab.cpp), on one fragment whose spaces are already `▁`.
//!
//! The text starts as one symbol per character. A priority queue holds every adjacent pair
//! whose concatenation is a vocabulary entry, by that entry's score, highest first and leftmost
//! on a tie. Popping a pair merges it, unless either side has changed since it was queued, and
//! queues the new symbol's pairs with its neighbours. The order is exactly llama.cpp's: at any
//! time each left symbol has at most one valid pair queued, so equal (score, left) keys never
//! have to be told apart.
//!
//! Written out rather than run through HF `tokenizers` as a BPE with merges derived from the
//! scores: merge ranks cannot express leftmost-on-equal-score, and HF turns a character the
//! vocabulary lacks into bytes before merging, where llama.cpp may still merge it.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A candidate merge of the adjacent symbols `left` and `right`.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Bytes of the merged text: a side that has changed since no longer adds up to it.
    len: usize,
}

impl Ord for Bigram {
    /// Highest score first, then leftmost: the order of llama.cpp's priority queue.
    fn cmp(&self, other: &Self) -> Ordering {
        (self.score.partial_cmp(&other.score))
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// A symbol: `text[start..start + len]`, linked to its neighbours. A symbol merged into its
/// left neighbour has `len` 0 and is out of the chain.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// The symbols `text` merges into, in order. `score` gives the score of a vocabulary entry,
/// `None` for a text that is no entry. Every returned symbol of more than one character is an
/// entry; a single character may not be.
pub(crate) fn merge(text: &str, score: impl Fn(&str) -> Option<f32>) -> Vec<&str> {
    let mut symbols: Vec<Symbol> = (text.char_indices().enumerate())
        .map(|(i, (start, c))| Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: Some(i + 1),
        })
        .collect();
    if let Some(last) = symbols.last_mut() {
        last.next = None;
    }
    let mut queue = BinaryHeap::new();
    let push = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left, right| {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r): (Symbol, Symbol) = (symbols[left], symbols[right]);
        let merged = &text[l.start..r.start + r.len];
        if let Some(score) = score(merged) {
            queue.push(Bigram {
                score,
                left,
                right,
                len: merged.len(),
            });
        }
    };
    for right in 1..symbols.len() {
        push(&mut queue, &symbols, Some(right - 1), Some(right));
    }
    while let Some(bigram) = queue.pop() {
        let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != bigram.len {
            continue; // a side has merged since this pair was queued
        }
        symbols[bigram.left].len += r.len;
        symbols[bigram.left].next = r.next;
        symbols[bigram.right].len = 0;
        if let Some(next) = r.next {
            symbols[next].prev = Some(bigram.left);
        }
        push(&mut queue, &symbols, l.prev, Some(bigram.left));
        push(&mut queue, &symbols, Some(bigram.left), r.next);
    }
    let mut pieces = Vec::new();
    let mut at = (!symbols.is_empty()).then_some(0);
    while let Some(i) = at {
        let s = symbols[i];
        pieces.push(&text[s.start..s.start + s.len]);
        at = s.next;
    }
    pieces
}
