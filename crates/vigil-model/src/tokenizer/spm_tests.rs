//! The SentencePiece rules on tiny vocabularies, where each one decides the result: score
//! order, leftmost on a tie, merging through a character the vocabulary lacks, byte fallback,
//! the space prefix, special tokens. The real vocabulary is checked against llama.cpp in
//! tests/tokenizer.rs (Gemma 3).

use super::gguf_vocab::{TOKEN_TYPE_BYTE, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL};
use super::{GgufVocab, Tokenizer};

/// `<unk>`, `<s>`, `</s>`, the 256 byte tokens, then `pieces` (text, score), normal tokens.
fn spm(pieces: &[(&str, f32)], add_space_prefix: bool) -> Tokenizer {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    let mut types = vec![TOKEN_TYPE_CONTROL; 3];
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.extend([TOKEN_TYPE_BYTE; 256]);
    let mut scores = vec![0.0; tokens.len()];
    for (text, score) in pieces {
        tokens.push(text.to_string());
        types.push(TOKEN_TYPE_NORMAL);
        scores.push(*score);
    }
    let vocab = GgufVocab {
        model: "llama".into(),
        tokens,
        token_types: types,
        scores,
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        unknown_token_id: Some(0),
        add_bos_token: Some(true),
        add_space_prefix: Some(add_space_prefix),
        ..GgufVocab::default()
    };
    match Tokenizer::from_gguf_vocab(&vocab) {
        Ok(tok) => tok,
        Err(e) => panic!("tiny vocabulary: {e}"),
    }
}

/// Texts of the ids of `text` (without BOS).
fn pieces(tok: &Tokenizer, text: &str) -> Vec<String> {
    let ids = tok.encode(text, false).unwrap_or_default();
    ids.iter().filter_map(|&id| tok.id_to_token(id)).collect()
}

#[test]
fn the_highest_scoring_pair_merges_first() {
    let tok = spm(
        &[
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -5.0),
            ("bc", -2.0),
        ],
        false,
    );
    assert_eq!(pieces(&tok, "abc"), ["a", "bc"]);
}

#[test]
fn equal_scores_merge_leftmost_first() {
    let tok = spm(
        &[("a", -1.0), ("b", -1.0), ("ab", -3.0), ("ba", -3.0)],
        false,
    );
    assert_eq!(pieces(&tok, "aba"), ["ab", "a"]);
    assert_eq!(pieces(&tok, "bab"), ["ba", "b"]);
}

#[test]
fn a_missing_character_still_merges_or_falls_back_to_bytes() {
    // "é" is no token, "éa" is: llama.cpp merges the pair, so must we.
    let tok = spm(&[("a", -1.0), ("éa", -2.0)], false);
    assert_eq!(pieces(&tok, "éa"), ["éa"]);
    assert_eq!(pieces(&tok, "aé"), ["a", "<0xC3>", "<0xA9>"]);
    let ids = tok.encode("aé", false).unwrap_or_default();
    assert_eq!(tok.decode(&ids, false).ok().as_deref(), Some("aé"));
}

#[test]
fn spaces_are_escaped_and_prefixed_when_asked() {
    let vocab = [
        ("▁", -1.0),
        ("a", -1.0),
        ("▁a", -2.0),
        ("b", -1.0),
        ("▁b", -2.0),
    ];
    let plain = spm(&vocab, false);
    assert_eq!(pieces(&plain, "a b"), ["a", "▁b"]);
    let prefixed = spm(&vocab, true);
    assert_eq!(pieces(&prefixed, "a b"), ["▁a", "▁b"]);
    // After a special token the next text gets the prefix again.
    assert_eq!(pieces(&prefixed, "a</s>b"), ["▁a", "</s>", "▁b"]);
    let ids = prefixed.encode("a b", true).unwrap_or_default();
    assert_eq!(ids.first(), Some(&1));
    // Decoding drops the prefix of the first token only, as llama_detokenize does.
    assert_eq!(
        prefixed.decode(&ids[1..], false).ok().as_deref(),
        Some("a b")
    );
    assert_eq!(
        prefixed.decode(&ids, false).ok().as_deref(),
        Some("<s> a b")
    );
    assert_eq!(prefixed.decode(&ids, true).ok().as_deref(), Some(" a b"));
}

#[test]
fn unknown_models_and_bad_arrays_are_errors() {
    let mut vocab = GgufVocab {
        model: "llama".into(),
        tokens: vec!["a".into(), "b".into()],
        scores: vec![0.0],
        ..GgufVocab::default()
    };
    assert!(Tokenizer::from_gguf_vocab(&vocab).is_err());
    vocab.scores.clear();
    assert!(Tokenizer::from_gguf_vocab(&vocab).is_ok());
    vocab.model = "bert".into();
    assert!(Tokenizer::from_gguf_vocab(&vocab).is_err());
}
