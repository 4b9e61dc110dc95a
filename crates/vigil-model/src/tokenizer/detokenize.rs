//! Streaming detokenization: turns generated ids into text one id at a time, emitting only
//! whole UTF-8 characters.
//!
//! A token may carry part of a character (byte-level BPE splits emoji over several tokens),
//! and some decoders change a token's text depending on what precedes it (e.g. SentencePiece
//! strips the leading space of the first token). So each step decodes a short window that
//! starts a few tokens back (`prefix_offset`) and emits what it adds beyond the text already
//! emitted up to `read_offset`, holding it back while it ends in an incomplete character
//! (U+FFFD). This is the prefix-offset/read-offset method of vLLM and TGI.

use super::Tokenizer;
use crate::error::Result;

const REPLACEMENT: char = '\u{FFFD}';

pub struct IncrementalDetokenizer<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    /// Start of the decoding window: tokens before it are done for good.
    prefix_offset: usize,
    /// Tokens before this have had their text emitted.
    read_offset: usize,
    skip_special_tokens: bool,
}

impl<'a> IncrementalDetokenizer<'a> {
    /// `prompt_ids_tail` (the last few prompt ids, may be empty) gives the first generated
    /// tokens their left context; its own text is never emitted.
    pub fn new(
        tokenizer: &'a Tokenizer,
        prompt_ids_tail: &[u32],
        skip_special_tokens: bool,
    ) -> Self {
        IncrementalDetokenizer {
            tokenizer,
            ids: prompt_ids_tail.to_vec(),
            prefix_offset: 0,
            read_offset: prompt_ids_tail.len(),
            skip_special_tokens,
        }
    }

    /// Adds one generated id; returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        self.emit(false)
    }

    /// Emits whatever is still held back (an incomplete character becomes U+FFFD).
    pub fn flush(&mut self) -> String {
        self.emit(true).unwrap_or_default()
    }

    fn emit(&mut self, force: bool) -> Result<String> {
        let window = self.ids.get(self.prefix_offset..).unwrap_or_default();
        let done = self
            .ids
            .get(self.prefix_offset..self.read_offset)
            .unwrap_or_default();
        let prefix_text = self.tokenizer.decode(done, self.skip_special_tokens)?;
        let new_text = self.tokenizer.decode(window, self.skip_special_tokens)?;
        let complete = force || !new_text.ends_with(REPLACEMENT);
        if new_text.len() <= prefix_text.len() || !complete {
            if force {
                self.prefix_offset = self.ids.len();
                self.read_offset = self.ids.len();
            }
            return Ok(String::new());
        }
        // The window's text normally extends the emitted text; if a decoder rewrote it, emit
        // from the first byte where the two differ (rounded to a character boundary).
        let start = if new_text.starts_with(&prefix_text) {
            prefix_text.len()
        } else {
            common_prefix_len(&prefix_text, &new_text)
        };
        let chunk = new_text.get(start..).unwrap_or_default().to_string();
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(chunk)
    }
}

/// Length in bytes of the longest common prefix of `a` and `b` made of whole characters.
fn common_prefix_len(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, ca), cb)| ca != cb)
        .map(|((i, _), _)| i)
        .unwrap_or_else(|| a.len().min(b.len()))
}
