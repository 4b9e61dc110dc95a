//! Tokenizers: HF `tokenizer.json` directories and GGUF-embedded vocabularies (byte-level BPE
//! and SentencePiece) behind one type, with the special-token facts the engine needs (BOS, the
//! ids that end generation, the chat template). Streaming detokenization lives in `detokenize`.

mod detokenize;
mod gguf_vocab;
mod hf_config;
mod pretokenize;
mod special_split;
mod spm;
mod spm_merge;
#[cfg(test)]
mod spm_tests;
mod token_bytes;
mod token_types;

use std::collections::HashSet;
use std::path::Path;

pub use detokenize::IncrementalDetokenizer;
pub use gguf_vocab::{GgufVocab, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED};
pub use token_bytes::TokenBytes;

use crate::error::{ModelError, Result};

/// Texts of special tokens that end a turn in the chat formats we know, whatever the config
/// calls EOS (llama.cpp treats them the same way).
const END_OF_GENERATION_TOKENS: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
    "<|return|>",
    "<EOT>",
    "<end_of_utterance>",
];

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// SentencePiece GGUF vocabularies encode and decode here, not through `inner`.
    spm: Option<spm::Spm>,
    bos_token_id: Option<u32>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    eos_token_ids: Vec<u32>,
    /// Prepend BOS ourselves: GGUF vocabularies have no post-processor doing it.
    add_bos: bool,
    add_eos: bool,
    eos_token_id: Option<u32>,
    chat_template: Option<String>,
    special_ids: HashSet<u32>,
    warnings: Vec<String>,
    /// Counted once: `tokenizers` builds the whole vocabulary map to count it (~49k strings),
    /// which cost every request tens of milliseconds when asked per request.
    vocab_size: usize,
}

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(e.to_string())
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`, with `tokenizer_config.json` (chat template, BOS/EOS) and
    /// `generation_config.json` (extra EOS ids) when present.
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer> {
        let json_path = dir.join("tokenizer.json");
        let inner = tokenizers::Tokenizer::from_file(&json_path)
            .map_err(|e| ModelError::format(&json_path, format!("not a valid tokenizer: {e}")))?;
        let config = hf_config::HfTokenizerConfig::load(dir)?;
        let id_of = |t: &Option<String>| t.as_deref().and_then(|t| inner.token_to_id(t));
        let bos_token_id = id_of(&config.bos_token);
        let eos_token_id = id_of(&config.eos_token);
        let mut tokenizer = Tokenizer {
            bos_token_id,
            bos_token: config.bos_token,
            eos_token: config.eos_token,
            eos_token_ids: Vec::new(),
            // The tokenizer.json post-processor already adds what the model wants.
            add_bos: false,
            add_eos: false,
            eos_token_id,
            chat_template: config.chat_template,
            special_ids: HashSet::new(),
            warnings: Vec::new(),
            vocab_size: inner.get_vocab_size(true),
            inner,
            spm: None,
        };
        tokenizer.finish_special_tokens(eos_token_id.into_iter().chain(config.generation_eos_ids));
        Ok(tokenizer)
    }

    /// Builds the tokenizer of a GGUF vocabulary, tokenizing as llama.cpp does.
    pub fn from_gguf_vocab(v: &GgufVocab) -> Result<Tokenizer> {
        let built = gguf_vocab::build(v)?;
        let text_of = |id: Option<u32>| id.and_then(|id| v.tokens.get(id as usize).cloned());
        let mut tokenizer = Tokenizer {
            // Ids are 0..n, added tokens included (counting through `tokenizers` would copy
            // the whole map: a tenth of a second for Gemma's 262k tokens).
            vocab_size: v.tokens.len(),
            inner: built.inner,
            spm: built.spm,
            bos_token_id: v.bos_token_id,
            bos_token: text_of(v.bos_token_id),
            eos_token: text_of(v.eos_token_id),
            eos_token_ids: Vec::new(),
            add_bos: built.add_bos && v.bos_token_id.is_some(),
            add_eos: v.add_eos_token.unwrap_or(false) && v.eos_token_id.is_some(),
            eos_token_id: v.eos_token_id,
            chat_template: v.chat_template.clone(),
            special_ids: HashSet::new(),
            warnings: built.warnings,
        };
        tokenizer.finish_special_tokens(v.eos_token_id.into_iter().chain(v.eot_token_id));
        Ok(tokenizer)
    }

    /// Records which ids are special and which end generation: the configured ones plus every
    /// special token whose text is a known end-of-turn marker.
    fn finish_special_tokens(&mut self, configured_eos: impl IntoIterator<Item = u32>) {
        let added = self.inner.get_added_tokens_decoder();
        self.special_ids = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, _)| id)
            .collect();
        let mut eos: Vec<u32> = configured_eos.into_iter().collect();
        let mut known: Vec<u32> = added
            .iter()
            .filter(|(_, t)| t.special && END_OF_GENERATION_TOKENS.contains(&t.content.as_str()))
            .map(|(&id, _)| id)
            .collect();
        known.sort_unstable();
        eos.extend(known);
        let mut seen = HashSet::new();
        eos.retain(|id| seen.insert(*id));
        self.eos_token_ids = eos;
    }

    /// Token ids of `text`. Special-token strings in `text` always become their special ids;
    /// `add_special_tokens` adds what the model wants around a sequence (e.g. BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        if add_special_tokens && self.add_bos {
            out.extend(self.bos_token_id);
        }
        match &self.spm {
            Some(spm) => spm.encode(text, &mut out)?,
            None => {
                let encoding = (self.inner)
                    .encode_fast(text, add_special_tokens)
                    .map_err(tok_err)?;
                out.extend_from_slice(encoding.get_ids());
            }
        }
        if add_special_tokens && self.add_eos {
            out.extend(self.eos_token_id);
        }
        Ok(out)
    }

    /// Text of `ids`. Invalid UTF-8 (a character cut between tokens) becomes U+FFFD; ids
    /// outside the vocabulary are skipped, as HF tokenizers does.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        match &self.spm {
            Some(spm) => Ok(spm.decode(ids, skip_special_tokens)),
            None => self.inner.decode(ids, skip_special_tokens).map_err(tok_err),
        }
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        self.inner.token_to_id(s)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    /// Every id that ends generation: EOS, EOT and the end-of-turn tokens of the chat format.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Whether `id` is a special (control) token, dropped by `skip_special_tokens`.
    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// What the loader had to guess (e.g. an unknown pre-tokenizer); empty when nothing.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}
