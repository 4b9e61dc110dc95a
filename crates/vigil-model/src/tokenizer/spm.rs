//! SentencePiece vocabularies of GGUF files (`tokenizer.ggml.model = "llama"`: Llama 2,
//! Gemma, Mistral's first models), encoded and decoded exactly as llama.cpp does
//! (`llm_tokenizer_spm` and `token_to_piece` in llama-vocab.cpp), the reference for GGUF.
//!
//! Encoding: special tokens are cut out first (`special_split`); each text fragment gets a
//! leading space when `add_space_prefix` says so and it starts the input or follows a special
//! token, has its spaces written `▁`, and is split into characters. Then, as long as some
//! adjacent pair concatenates to a vocabulary entry, the pair whose entry has the highest score
//! is merged, the leftmost on a tie (`spm_merge`). A remaining symbol that is no entry (a
//! character the vocabulary lacks) becomes its UTF-8 bytes as `<0xAB>` tokens.

use std::collections::HashMap;

use super::gguf_vocab::{
    TOKEN_TYPE_BYTE, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNKNOWN,
    TOKEN_TYPE_USER_DEFINED,
};
use super::special_split::{Fragment, SpecialSplitter};
use super::spm_merge;
use crate::error::{ModelError, Result};

/// SentencePiece's visible space, U+2581.
const SPACE: char = '\u{2581}';

pub(crate) struct Spm {
    /// Text → id over the whole vocabulary, special tokens included (llama.cpp merges into
    /// any entry).
    ids: HashMap<String, u32>,
    texts: Vec<String>,
    scores: Vec<f32>,
    /// Types as llama.cpp resolves them (`token_types::resolve`).
    types: Vec<i32>,
    /// Token of each byte: `<0xAB>`, else the byte itself as text, else UNK.
    byte_ids: Vec<Option<u32>>,
    specials: SpecialSplitter,
    add_space_prefix: bool,
}

impl Spm {
    /// `types` has one entry per token; `scores` is empty (all 0) or has one per token.
    pub(crate) fn new(
        tokens: &[String],
        scores: &[f32],
        types: Vec<i32>,
        unknown_token_id: Option<u32>,
        add_space_prefix: bool,
    ) -> Spm {
        let mut ids = HashMap::with_capacity(tokens.len());
        for (id, token) in (0u32..).zip(tokens) {
            ids.entry(token.clone()).or_insert(id);
        }
        let byte_ids = (0..=255u8)
            .map(|b| {
                let single = (b < 0x80).then(|| char::from(b).to_string());
                (ids.get(&format!("<0x{b:02X}>")).copied())
                    .or_else(|| single.and_then(|s| ids.get(&s).copied()))
                    .or(unknown_token_id)
            })
            .collect();
        let special = |ty: i32| {
            matches!(
                ty,
                TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED | TOKEN_TYPE_UNKNOWN
            )
        };
        let specials = SpecialSplitter::new(
            ((0u32..).zip(tokens).zip(&types))
                .filter(|(_, &ty)| special(ty))
                .map(|((id, text), _)| (id, text.as_str())),
        );
        let scores = if scores.is_empty() {
            vec![0.0; tokens.len()]
        } else {
            scores.to_vec()
        };
        Spm {
            ids,
            texts: tokens.to_vec(),
            scores,
            types,
            byte_ids,
            specials,
            add_space_prefix,
        }
    }

    /// Appends the ids of `text` to `out` (no BOS or EOS: the caller adds those).
    pub(crate) fn encode(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        // Input start counts as "after a special token" for the space prefix.
        let mut after_special = true;
        for fragment in self.specials.split(text) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(piece) => {
                    let prefix = if self.add_space_prefix && after_special {
                        " "
                    } else {
                        ""
                    };
                    let escaped = format!("{prefix}{piece}").replace(' ', "\u{2581}");
                    self.encode_fragment(&escaped, out)?;
                    after_special = false;
                }
            }
        }
        Ok(())
    }

    /// Merges one escaped fragment and appends its ids. A merged symbol is always an entry,
    /// so only a lone character can be missing: it becomes its bytes (llama.cpp's `resegment`
    /// never reaches its reverse-merge branch for one).
    fn encode_fragment(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let score = |piece: &str| self.ids.get(piece).map(|&id| self.scores[id as usize]);
        for piece in spm_merge::merge(text, score) {
            if let Some(&id) = self.ids.get(piece) {
                out.push(id);
                continue;
            }
            for &b in piece.as_bytes() {
                let id = self.byte_ids[b as usize].ok_or_else(|| {
                    ModelError::Tokenizer(format!(
                        "byte 0x{b:02X} has no token and the vocabulary no <unk>"
                    ))
                })?;
                out.push(id);
            }
        }
        Ok(())
    }

    /// Text of `ids` as llama.cpp's `llama_detokenize` gives it: `▁` becomes a space, byte
    /// tokens their byte; control and unknown tokens render as their text unless skipped,
    /// user-defined ones always; other types (unused, undefined) are nothing. With
    /// `add_space_prefix` the first token loses one leading space. Ids outside the vocabulary
    /// are skipped; bytes that are no valid UTF-8 become U+FFFD.
    pub(crate) fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        let mut bytes = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let (Some(text), Some(&ty)) =
                (self.texts.get(id as usize), self.types.get(id as usize))
            else {
                continue;
            };
            let start = bytes.len();
            match ty {
                TOKEN_TYPE_CONTROL | TOKEN_TYPE_UNKNOWN if skip_special_tokens => {}
                TOKEN_TYPE_CONTROL | TOKEN_TYPE_UNKNOWN | TOKEN_TYPE_USER_DEFINED => {
                    bytes.extend_from_slice(text.as_bytes())
                }
                TOKEN_TYPE_NORMAL => {
                    for c in text.chars() {
                        let c = if c == SPACE { ' ' } else { c };
                        bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                    }
                }
                TOKEN_TYPE_BYTE => bytes.extend(byte_of(text)),
                _ => {}
            }
            if i == 0 && self.add_space_prefix && bytes.get(start) == Some(&b' ') {
                bytes.remove(start);
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// `<0xAB>` → 0xAB.
fn byte_of(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}
