//! Pre-tokenizer regexes of byte-level BPE vocabularies, chosen by GGUF's `tokenizer.ggml.pre`.
//!
//! The splits follow llama.cpp (`llama-vocab.cpp`), which is the reference for GGUF files: a
//! vocabulary is cut into pieces by each regex in turn, then every piece is mapped to
//! byte-level symbols and merged by BPE independently.

/// GPT-2's original split: contractions, letters, digits, other symbols, whitespace.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's split: case-insensitive contractions, digits in groups of at most three.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split: as Llama 3 but every digit on its own.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Every digit on its own, applied before GPT-2's split (StarCoder family, SmolLM).
const SINGLE_DIGITS: &str = r"\p{N}";

/// How one `tokenizer.ggml.pre` value splits text before BPE.
pub(crate) struct PreTokenizerSpec {
    /// Regexes applied in order, each one isolating its matches inside the previous pieces.
    pub regexes: &'static [&'static str],
    /// Whole pre-tokenized words that are vocabulary entries skip merging (Llama 3).
    pub ignore_merges: bool,
}

/// The split for `pre`, or `None` when llama.cpp would not know the name either.
pub(crate) fn spec_for(pre: &str) -> Option<PreTokenizerSpec> {
    let spec = |regexes: &'static [&'static str], ignore_merges| PreTokenizerSpec {
        regexes,
        ignore_merges,
    };
    Some(match pre {
        "default" | "gpt2" | "gpt-2" | "mpt" | "olmo" | "jais" | "trillion" => spec(&[GPT2], false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => spec(&[LLAMA3], true),
        "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "hunyuan" | "megrez" => spec(&[QWEN2], false),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            spec(&[SINGLE_DIGITS, GPT2], false)
        }
        _ => return None,
    })
}

/// GPT-2's split, the fallback for a missing or unknown `pre`.
pub(crate) fn gpt2() -> PreTokenizerSpec {
    PreTokenizerSpec {
        regexes: &[GPT2],
        ignore_merges: false,
    }
}
