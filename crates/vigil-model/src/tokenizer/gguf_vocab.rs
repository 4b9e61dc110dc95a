//! Builds the tokenizer of the vocabulary a GGUF file embeds, tokenizing as llama.cpp does
//! (the reference for GGUF). Byte-level BPE ("gpt2") runs through HF `tokenizers`: no
//! normalizer, the pre-tokenizer regexes named by `tokenizer.ggml.pre`, control and
//! user-defined tokens matched whole in the text. SentencePiece ("llama") encodes and decodes
//! with `spm`; its `tokenizers` pipeline only maps ids and texts and flags special tokens.

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::spm::Spm;
use super::{pretokenize, token_types};
use crate::error::{ModelError, Result};

/// GGUF token type of an ordinary token.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
/// GGUF token type of the unknown token (matched whole, rendered like a control token).
pub const TOKEN_TYPE_UNKNOWN: i32 = 2;
/// GGUF token type of a control token (`<|im_start|>`, BOS, EOS, ...).
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF token type of a user-defined token, always matched whole in the text.
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;
/// GGUF token type of a SentencePiece byte token, `<0xAB>`.
pub const TOKEN_TYPE_BYTE: i32 = 6;

/// The `tokenizer.*` metadata of a GGUF file.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`, e.g. "gpt2" (byte-level BPE) or "llama" (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer, e.g. "llama-bpe", "qwen2", "smollm".
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.scores`: SentencePiece merges the pair whose token scores highest.
    #[serde(default)]
    pub scores: Vec<f32>,
    pub merges: Vec<String>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub eot_token_id: Option<u32>,
    pub unknown_token_id: Option<u32>,
    pub padding_token_id: Option<u32>,
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece): a space before the text and after
    /// each special token. llama.cpp's default for "llama" is true.
    pub add_space_prefix: Option<bool>,
    pub chat_template: Option<String>,
}

/// A tokenizers pipeline for `v`, plus notes about anything it had to guess.
pub(crate) struct BuiltGguf {
    pub inner: tokenizers::Tokenizer,
    pub warnings: Vec<String>,
    /// Whether BOS is prepended when asked for special tokens, as llama.cpp decides it.
    pub add_bos: bool,
    /// The SentencePiece encoder and decoder, for "llama" vocabularies.
    pub spm: Option<Spm>,
}

fn err(msg: impl Into<String>) -> ModelError {
    ModelError::Tokenizer(format!("GGUF vocabulary: {}", msg.into()))
}

pub(crate) fn build(v: &GgufVocab) -> Result<BuiltGguf> {
    check(v)?;
    let types = token_types::resolve(v);
    let mut built = match v.model.as_str() {
        "gpt2" => build_bpe(v)?,
        "llama" => build_spm(v, &types)?,
        other => {
            return Err(err(format!(
                "tokenizer.ggml.model {other:?} is not supported (only byte-level BPE, \"gpt2\", \
                 and SentencePiece, \"llama\")"
            )))
        }
    };

    let mut control = Vec::new();
    let mut user_defined = Vec::new();
    for (token, &ty) in v.tokens.iter().zip(&types) {
        if token.is_empty() {
            continue;
        }
        match ty {
            TOKEN_TYPE_CONTROL | TOKEN_TYPE_UNKNOWN => {
                control.push(AddedToken::from(token.clone(), true))
            }
            TOKEN_TYPE_USER_DEFINED => {
                user_defined.push(AddedToken::from(token.clone(), false).normalized(false))
            }
            _ => {}
        }
    }
    built.inner.add_special_tokens(&control);
    built.inner.add_tokens(&user_defined);
    Ok(built)
}

/// Array lengths and special ids agree with the token list.
fn check(v: &GgufVocab) -> Result<()> {
    for (name, len) in [
        ("token types", v.token_types.len()),
        ("scores", v.scores.len()),
    ] {
        if len != 0 && len != v.tokens.len() {
            return Err(err(format!("{len} {name} for {} tokens", v.tokens.len())));
        }
    }
    let n_tokens = u32::try_from(v.tokens.len()).map_err(|_| err("too many tokens"))?;
    for (name, id) in [
        ("bos_token_id", v.bos_token_id),
        ("eos_token_id", v.eos_token_id),
        ("eot_token_id", v.eot_token_id),
        ("unknown_token_id", v.unknown_token_id),
        ("padding_token_id", v.padding_token_id),
    ] {
        if let Some(id) = id.filter(|&id| id >= n_tokens) {
            return Err(err(format!("{name} {id} is outside the {n_tokens} tokens")));
        }
    }
    Ok(())
}

/// The text → id map of every token. llama.cpp refuses a vocabulary with a duplicated text;
/// here its first id wins.
fn vocab_map(v: &GgufVocab) -> Vocab {
    let mut vocab = Vocab::with_capacity(v.tokens.len());
    for (id, token) in (0u32..).zip(&v.tokens) {
        vocab.entry(token.clone()).or_insert(id);
    }
    vocab
}

/// SentencePiece: `Spm` encodes and decodes. The `tokenizers` side is a merge-less model
/// for id ↔ text, with the decoder that tells `token_bytes` how pieces spell bytes.
fn build_spm(v: &GgufVocab, types: &[i32]) -> Result<BuiltGguf> {
    let add_space_prefix = v.add_space_prefix.unwrap_or(true);
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_map(v), Vec::new())
        .byte_fallback(true)
        .build()
        .map_err(|e| err(format!("building the vocabulary: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let space = Replace::new("\u{2581}", " ").map_err(|e| err(e.to_string()))?;
    inner.with_decoder(Some(DecoderSequence::new(vec![
        space.into(),
        ByteFallback::default().into(),
        Fuse::default().into(),
    ])));
    let spm = Spm::new(
        &v.tokens,
        &v.scores,
        types.to_vec(),
        v.unknown_token_id,
        add_space_prefix,
    );
    Ok(BuiltGguf {
        inner,
        warnings: Vec::new(),
        // llama.cpp's default for SentencePiece; the GGUF key overrides.
        add_bos: v.add_bos_token.unwrap_or(true),
        spm: Some(spm),
    })
}

fn build_bpe(v: &GgufVocab) -> Result<BuiltGguf> {
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
        .vocab_and_merges(vocab_map(v), merges)
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

    // llama.cpp adds BOS by default for Llama 3 vocabularies; the GGUF key overrides.
    let default_add_bos = spec.ignore_merges;
    Ok(BuiltGguf {
        inner,
        warnings,
        add_bos: v.add_bos_token.unwrap_or(default_add_bos),
        spm: None,
    })
}
