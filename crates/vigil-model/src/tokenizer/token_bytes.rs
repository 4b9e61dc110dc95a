//! Each token's bytes as the model emits them: what grammar-constrained decoding matches
//! against (llguidance's token trie). Byte-level BPE vocabularies (GPT-2 style) write each
//! byte as a printable character; SentencePiece ones write a space as `▁` and a raw byte as
//! `<0xAB>`. Added tokens are their literal text; special ones are flagged, so a grammar never
//! produces them as text.

use super::Tokenizer;
use std::collections::HashMap;
use tokenizers::DecoderWrapper;

/// One token's bytes, and whether it is special (a control token, never text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBytes {
    pub bytes: Vec<u8>,
    pub special: bool,
}

/// How a vocabulary spells bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// GPT-2's byte-to-character table.
    ByteLevel,
    /// SentencePiece: `▁` for a space, `<0xAB>` for a byte the vocabulary lacks.
    Pieces,
}

/// GPT-2's table: printable Latin-1 bytes stand for themselves, the rest map to U+0100 on.
fn byte_level_chars() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut map = HashMap::with_capacity(256);
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        if printable(b) {
            map.insert(char::from(b), b);
        } else if let Some(c) = char::from_u32(next) {
            map.insert(c, b);
            next += 1;
        }
    }
    map
}

fn spelling_of(d: &DecoderWrapper) -> Option<Spelling> {
    match d {
        DecoderWrapper::ByteLevel(_) => Some(Spelling::ByteLevel),
        DecoderWrapper::ByteFallback(_) | DecoderWrapper::Metaspace(_) => Some(Spelling::Pieces),
        DecoderWrapper::Sequence(seq) => seq.get_decoders().iter().find_map(spelling_of),
        _ => None,
    }
}

/// `<0xAB>` → `0xAB`.
fn byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

impl Tokenizer {
    /// Every id's bytes (`vocab_size` entries). A vocabulary whose decoder is neither
    /// byte-level nor SentencePiece-style is read as plain pieces.
    pub fn token_bytes(&self) -> Vec<TokenBytes> {
        let spelling = (self.inner.get_decoder())
            .and_then(spelling_of)
            .unwrap_or(Spelling::Pieces);
        let chars = byte_level_chars();
        let added = self.inner.get_added_tokens_decoder();
        (0..self.vocab_size as u32)
            .map(|id| {
                if let Some(t) = added.get(&id) {
                    return TokenBytes {
                        bytes: t.content.as_bytes().to_vec(),
                        special: t.special,
                    };
                }
                let piece = self.inner.id_to_token(id).unwrap_or_default();
                let bytes = match spelling {
                    Spelling::ByteLevel => {
                        let mapped: Option<Vec<u8>> =
                            piece.chars().map(|c| chars.get(&c).copied()).collect();
                        mapped.unwrap_or_else(|| piece.as_bytes().to_vec())
                    }
                    Spelling::Pieces => match byte_piece(&piece) {
                        Some(b) => vec![b],
                        None => piece.replace('\u{2581}', " ").into_bytes(),
                    },
                };
                TokenBytes {
                    bytes,
                    special: self.special_ids.contains(&id),
                }
            })
            .collect()
    }
}
