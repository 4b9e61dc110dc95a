//! Token types of a GGUF vocabulary as llama.cpp resolves them when it loads one
//! (`llama_vocab::impl::load` in llama-vocab.cpp), which is what decides which texts are
//! matched whole as special tokens and which ids decode to nothing when special tokens are
//! skipped. `tokenizer.ggml.token_type` is the start; llama.cpp then overrides a few types by
//! token text, because converters got them wrong (Gemma 3 ships `</s>` as a user-defined token,
//! and llama.cpp makes it a control token that ends generation).

use super::gguf_vocab::{TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED};
use super::GgufVocab;

/// Texts llama.cpp makes control tokens whatever their type: its end-of-generation list
/// (a superset of its end-of-turn and end-of-message lists) and its fill-in-the-middle lists.
const CONTROL_BY_TEXT: &[&str] = &[
    // end of generation
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
    // fill in the middle
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

/// gpt-oss's channel markers, which llama.cpp always renders as text.
const USER_DEFINED_BY_TEXT: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/// One type per token, as llama.cpp ends up with them. A missing `token_type` array means
/// every token is normal.
pub(crate) fn resolve(v: &GgufVocab) -> Vec<i32> {
    let mut types = if v.token_types.is_empty() {
        vec![TOKEN_TYPE_NORMAL; v.tokens.len()]
    } else {
        v.token_types.clone()
    };
    let id_of = |text: &str| v.tokens.iter().position(|t| t == text);
    let has = |text: &str| v.tokens.iter().any(|t| t == text);
    for (token, ty) in v.tokens.iter().zip(types.iter_mut()) {
        if CONTROL_BY_TEXT.contains(&token.as_str()) {
            *ty = TOKEN_TYPE_CONTROL;
        } else if USER_DEFINED_BY_TEXT.contains(&token.as_str()) {
            *ty = TOKEN_TYPE_USER_DEFINED;
        }
    }
    // o200k_harmony and solar-open: `<|end|>` ends a message, not the generation, and stays text.
    let has_call = has("<|call|>") || has("<|calls|>");
    if has_call && (has("<|return|>") || has("<|flush|>")) {
        if let Some(id) = id_of("<|end|>") {
            types[id] = TOKEN_TYPE_USER_DEFINED;
        }
    }
    // Gemma 4 and PLaMo have an ordinary `</s>`.
    let eos_is = |text: &str| {
        (v.eos_token_id.into_iter().chain(v.eot_token_id))
            .any(|id| v.tokens.get(id as usize).is_some_and(|t| t == text))
    };
    if has("<|tool_response>") || eos_is("<|plamo:eos|>") {
        if let Some(id) = id_of("</s>") {
            types[id] = TOKEN_TYPE_NORMAL;
        }
    }
    types
}
