//! Builds a byte-level BPE tokenizer from the vocabulary a GGUF file embeds, tokenizing as
//! llama.cpp does (the reference for GGUF): no normalizer, the pre-tokenizer regexes named by
//! `tokenizer.ggml.pre`, control and user-defined tokens matched whole in the text.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::pretokenize;
use crate::error::{ModelError, Result};

/// GGUF token type of a control token (`<|im_start|>`, BOS, EOS, ...).
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF token type of a user-defined token, always matched whole in the text.
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The `tokenizer.*` metadata of a GGUF file.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`, e.g. "gpt2" (byte-level BPE) or "llama" (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer, e.g. "llama-bpe", "qwen2", "smollm".
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub eot_token_id: Option<u32>,
    pub padding_token_id: Option<u32>,
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    pub chat_template: Option<String>,
}

/// A tokenizers pipeline for `v`, plus notes about anything it had to guess.
pub(crate) struct BuiltGguf {
    pub inner: tokenizers::Tokenizer,
    pub warnings: Vec<String>,
    /// Whether BOS is prepended when asked for special tokens, as llama.cpp decides it.
    pub add_bos: bool,
}

fn err(msg: impl Into<String>) -> ModelError {
    ModelError::Tokenizer(format!("GGUF vocabulary: {}", msg.into()))
}

pub(crate) fn build(v: &GgufVocab) -> Result<BuiltGguf> {
    if v.model != "gpt2" {
        return Err(err(format!(
            "tokenizer.ggml.model {:?} is not supported (only byte-level BPE, \"gpt2\")",
            v.model
        )));
    }
    if !v.token_types.is_empty() && v.token_types.len() != v.tokens.len() {
        return Err(err(format!(
            "{} token types for {} tokens",
            v.token_types.len(),
            v.tokens.len()
        )));
    }
    let n_tokens = u32::try_from(v.tokens.len()).map_err(|_| err("too many tokens"))?;
    for (name, id) in [
        ("bos_token_id", v.bos_token_id),
        ("eos_token_id", v.eos_token_id),
        ("eot_token_id", v.eot_token_id),
        ("padding_token_id", v.padding_token_id),
    ] {
        if let Some(id) = id.filter(|&id| id >= n_tokens) {
            return Err(err(format!("{name} {id} is outside the {n_tokens} tokens")));
        }
    }

    let mut warnings = Vec::new();
    let pre = v.pre.as_deref().unwrap_or("default");
    let spec = match pretokenize::spec_for(pre) {
        Some(spec) => spec,
        None => {
            warnings.push(format!(
                "unknown tokenizer.ggml.pre {pre:?}: splitting text with GPT-2's regex instead"
            ));
            pretokenize::gpt2()
        }
    };

    let mut vocab = Vocab::with_capacity(v.tokens.len());
    for (id, token) in (0u32..).zip(&v.tokens) {
        // Keep the first id of a duplicated string, as llama.cpp's text-to-token map does.
        vocab.entry(token.clone()).or_insert(id);
    }
    let merges = v
        .merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| {
                    err(format!(
                        "merge {m:?} is not two symbols separated by a space"
                    ))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(spec.ignore_merges)
        .build()
        .map_err(|e| err(format!("building BPE: {e}")))?;

    let mut pieces = Vec::with_capacity(spec.regexes.len() + 1);
    for regex in spec.regexes {
        let split = Split::new(
            SplitPattern::Regex((*regex).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| err(format!("pre-tokenizer regex: {e}")))?;
        pieces.push(PreTokenizerWrapper::Split(split));
    }
    pieces.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
        false, false, false,
    )));

    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(Sequence::new(pieces)));
    inner.with_decoder(Some(ByteLevelDecoder::default()));

    let mut control = Vec::new();
    let mut user_defined = Vec::new();
    for (token, &ty) in v.tokens.iter().zip(&v.token_types) {
        if token.is_empty() {
            continue;
        }
        match ty {
            TOKEN_TYPE_CONTROL => control.push(AddedToken::from(token.clone(), true)),
            TOKEN_TYPE_USER_DEFINED => {
                user_defined.push(AddedToken::from(token.clone(), false).normalized(false))
            }
            _ => {}
        }
    }
    inner.add_special_tokens(&control);
    inner.add_tokens(&user_defined);

    // llama.cpp adds BOS by default for Llama 3 vocabularies; the GGUF key overrides.
    let default_add_bos = spec.ignore_merges;
    Ok(BuiltGguf {
        inner,
        warnings,
        add_bos: v.add_bos_token.unwrap_or(default_add_bos),
    })
}
