//! Tokenizer ids and decoded text against the reference implementations: HF `tokenizers` for
//! the Qwen3 and Llama 3.1 tokenizer.json files, llama.cpp for the GGUF vocabularies of
//! SmolLM2 (byte-level BPE) and Gemma 3 (SentencePiece).
//! Fixtures: tests/fixtures/tokenizer/*.json, made by scripts/make_tokenizer_fixtures.py.
//!
//! Needs `VIGIL_TEST_TOKENIZERS` (a dir with `qwen3/` and `llama3_1/`) and
//! `VIGIL_TEST_GGUF` (the SmolLM2 GGUF, whose vocabulary goes through Vigil's own GGUF reader);
//! each test is skipped with a message when its variable is unset. The Gemma 3 tests need
//! `VIGIL_TEST_GEMMA_GGUF` and fail without it (scripts/fetch_test_assets.sh sets it).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde::Deserialize;
use vigil_model::tokenizer::{GgufVocab, IncrementalDetokenizer, Tokenizer};

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    ids_add_special: Vec<u32>,
    decoded: String,
    decoded_skip_special: String,
}

fn fixture(name: &str) -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tokenizer")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn hf_tokenizer(name: &str) -> Option<Tokenizer> {
    let Some(dir) = std::env::var_os("VIGIL_TEST_TOKENIZERS") else {
        eprintln!("skipped: VIGIL_TEST_TOKENIZERS is not set");
        return None;
    };
    let dir = PathBuf::from(dir).join(name);
    Some(Tokenizer::from_hf_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())))
}

/// The SmolLM2 GGUF vocabulary, read from a JSON dump made with the reference GGUF reader.
/// (Swap this for Vigil's GGUF parser once both are merged.)
fn smollm2_vocab() -> Option<GgufVocab> {
    let Some(path) = std::env::var_os("VIGIL_TEST_GGUF") else {
        eprintln!("skipped: VIGIL_TEST_GGUF is not set");
        return None;
    };
    let file =
        vigil_model::gguf::GgufFile::open(Path::new(&path)).unwrap_or_else(|e| panic!("{e}"));
    Some(vigil_model::source_gguf::gguf_vocab(&file).unwrap_or_else(|e| panic!("{e}")))
}

fn gguf_tokenizer() -> Option<Tokenizer> {
    smollm2_vocab().map(|v| Tokenizer::from_gguf_vocab(&v).expect("SmolLM2 vocabulary"))
}

/// The Gemma 3 270M GGUF vocabulary (SentencePiece, 262,144 tokens), read once.
fn gemma_vocab() -> &'static GgufVocab {
    static VOCAB: OnceLock<GgufVocab> = OnceLock::new();
    VOCAB.get_or_init(|| {
        let path = std::env::var_os("VIGIL_TEST_GEMMA_GGUF").expect(
            "VIGIL_TEST_GEMMA_GGUF is not set: eval \"$(scripts/fetch_test_assets.sh)\" first",
        );
        let file =
            vigil_model::gguf::GgufFile::open(Path::new(&path)).unwrap_or_else(|e| panic!("{e}"));
        vigil_model::source_gguf::gguf_vocab(&file).unwrap_or_else(|e| panic!("{e}"))
    })
}

fn gemma() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| Tokenizer::from_gguf_vocab(gemma_vocab()).expect("Gemma 3 vocabulary"))
}

/// Every tokenizer whose files are available, loaded once for all tests.
fn tokenizers() -> &'static [(&'static str, Tokenizer)] {
    static ALL: OnceLock<Vec<(&'static str, Tokenizer)>> = OnceLock::new();
    ALL.get_or_init(load_tokenizers)
}

fn load_tokenizers() -> Vec<(&'static str, Tokenizer)> {
    let mut all = Vec::new();
    for name in ["qwen3", "llama3_1"] {
        if let Some(tok) = hf_tokenizer(name) {
            all.push((name, tok));
        }
    }
    if let Some(tok) = gguf_tokenizer() {
        all.push(("smollm2_gguf", tok));
    }
    all
}

#[test]
fn ids_and_decoding_match_reference() {
    for (name, tok) in tokenizers() {
        check_ids_and_decoding(name, tok);
    }
}

#[test]
fn gemma3_gguf_ids_and_decoding_match_llama_cpp() {
    check_ids_and_decoding("gemma3_gguf", gemma());
}

fn check_ids_and_decoding(name: &str, tok: &Tokenizer) {
    let fx = fixture(name);
    assert!(fx.cases.len() >= 40, "{name}: corpus too small");
    for case in &fx.cases {
        let what = format!("{name} {:?}", case.text);
        assert_eq!(
            tok.encode(&case.text, false).unwrap(),
            case.ids,
            "{what}: ids"
        );
        assert_eq!(
            tok.encode(&case.text, true).unwrap(),
            case.ids_add_special,
            "{what}: ids with special tokens"
        );
        assert_eq!(
            tok.decode(&case.ids, false).unwrap(),
            case.decoded,
            "{what}: decode"
        );
        assert_eq!(
            tok.decode(&case.ids, true).unwrap(),
            case.decoded_skip_special,
            "{what}: decode skipping special tokens"
        );
    }
}

/// Streams `ids` one at a time; returns the chunk of each push, then the flush.
fn stream(tok: &Tokenizer, tail: &[u32], ids: &[u32], skip: bool) -> Vec<String> {
    let mut detok = IncrementalDetokenizer::new(tok, tail, skip);
    let mut chunks: Vec<String> = ids.iter().map(|&id| detok.push(id).unwrap()).collect();
    chunks.push(detok.flush());
    chunks
}

#[test]
fn incremental_detokenization_equals_full_decode() {
    for (name, tok) in tokenizers() {
        check_streaming_equals_full_decode(name, tok);
    }
}

#[test]
fn gemma3_gguf_streaming() {
    let tok = gemma();
    check_streaming_equals_full_decode("gemma3_gguf", tok);
    check_streaming_after_prompt_tail("gemma3_gguf", tok);
    // Gemma has these emoji whole; it spells rarer characters in byte tokens.
    check_emoji_streams_whole("gemma3_gguf", tok, "ok \u{20000}\u{2a6a5} \u{1fae8} done");
}

fn check_streaming_equals_full_decode(name: &str, tok: &Tokenizer) {
    let mut partial_char_tokens = 0;
    for case in &fixture(name).cases {
        for skip in [false, true] {
            let ids = &case.ids_add_special;
            let chunks = stream(tok, &[], ids, skip);
            let full = tok.decode(ids, skip).unwrap();
            assert_eq!(chunks.concat(), full, "{name} {:?} skip={skip}", case.text);
            for chunk in &chunks {
                assert!(
                    !chunk.contains('\u{FFFD}') || case.text.contains('\u{FFFD}'),
                    "{name} {:?}: chunk {chunk:?} has a broken character",
                    case.text
                );
            }
            // A token holding only part of a character must emit nothing yet.
            for (&id, chunk) in ids.iter().zip(&chunks) {
                let alone = tok.decode(&[id], skip).unwrap();
                if alone.ends_with('\u{FFFD}') && !case.text.contains('\u{FFFD}') {
                    partial_char_tokens += 1;
                    assert!(
                        !chunk.ends_with('\u{FFFD}'),
                        "{name} {:?}: {chunk:?}",
                        case.text
                    );
                }
            }
        }
    }
    assert!(
        partial_char_tokens > 0,
        "{name}: the corpus should split some character over several tokens"
    );
}

#[test]
fn incremental_detokenization_after_prompt_tail() {
    for (name, tok) in tokenizers() {
        check_streaming_after_prompt_tail(name, tok);
    }
}

fn check_streaming_after_prompt_tail(name: &str, tok: &Tokenizer) {
    for case in &fixture(name).cases {
        let ids = &case.ids;
        for split in 1..ids.len() {
            let (tail, generated) = ids.split_at(split);
            let tail_text = tok.decode(tail, false).unwrap();
            if tail_text.ends_with('\u{FFFD}') {
                continue; // the prompt itself ends inside a character
            }
            let full = tok.decode(ids, false).unwrap();
            let chunks = stream(tok, tail, generated, false);
            assert_eq!(
                Some(chunks.concat().as_str()),
                full.get(tail_text.len()..),
                "{name} {:?} split at {split}",
                case.text
            );
        }
    }
}

#[test]
fn emoji_split_over_byte_tokens_streams_whole() {
    for (name, tok) in tokenizers() {
        check_emoji_streams_whole(name, tok, "ok 🇫🇷👨‍👩‍👧‍👦 done");
    }
}

fn check_emoji_streams_whole(name: &str, tok: &Tokenizer, text: &str) {
    let ids = tok.encode(text, false).unwrap();
    let chunks = stream(tok, &[], &ids, false);
    assert_eq!(chunks.concat(), text, "{name}");
    assert!(
        chunks.iter().all(|c| !c.contains('\u{FFFD}')),
        "{name}: {chunks:?}"
    );
    assert!(
        chunks.iter().filter(|c| c.is_empty()).count() > 1,
        "{name}: emoji bytes should have been held back: {chunks:?}"
    );
}

#[test]
fn special_tokens_qwen3() {
    let Some(tok) = hf_tokenizer("qwen3") else {
        return;
    };
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    let endoftext = tok.token_to_id("<|endoftext|>").unwrap();
    assert_eq!((im_end, endoftext), (151645, 151643));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert_eq!(tok.eos_token_ids()[0], im_end);
    assert!(tok.eos_token_ids().contains(&endoftext));
    assert_eq!(tok.bos_token_id(), None);
    assert!(tok.is_special(im_end));
    assert!(!tok.is_special(tok.encode("hi", false).unwrap()[0]));
    assert!(tok.chat_template().unwrap().contains("enable_thinking"));
    assert_eq!(tok.vocab_size(), 151669);
    assert_eq!(tok.id_to_token(im_end).as_deref(), Some("<|im_end|>"));
}

#[test]
fn special_tokens_llama3_1() {
    let Some(tok) = hf_tokenizer("llama3_1") else {
        return;
    };
    assert_eq!(tok.bos_token_id(), Some(128000));
    assert_eq!(tok.bos_token(), Some("<|begin_of_text|>"));
    assert_eq!(tok.eos_token(), Some("<|eot_id|>"));
    // This tokenizer.json predates 3.1's <|eom_id|>; EOS comes first, then known end tokens.
    assert_eq!(tok.eos_token_ids(), &[128009, 128001]);
    assert_eq!(tok.encode("hi", true).unwrap()[0], 128000);
}

/// `generation_config.json` adds its EOS ids (Llama 3.1 lists end_of_text, eom and eot).
#[test]
fn generation_config_eos_ids_are_added() {
    let Some(root) = std::env::var_os("VIGIL_TEST_TOKENIZERS") else {
        eprintln!("skipped: VIGIL_TEST_TOKENIZERS is not set");
        return;
    };
    let src = PathBuf::from(root).join("llama3_1");
    let dir = std::env::temp_dir().join(format!("vigil-gencfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}"#,
    )
    .unwrap();
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    assert_eq!(tok.eos_token_ids(), &[128009, 128001, 128008]);
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": "x"}"#,
    )
    .unwrap();
    assert!(Tokenizer::from_hf_dir(&dir).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn special_tokens_smollm2_gguf() {
    let Some(tok) = gguf_tokenizer() else {
        return;
    };
    assert_eq!(tok.bos_token_id(), Some(1));
    assert_eq!(tok.bos_token(), Some("<|im_start|>"));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert_eq!(tok.eos_token_ids(), &[2, 0]);
    assert!(tok.is_special(1) && tok.is_special(16) && !tok.is_special(17));
    assert_eq!(tok.vocab_size(), 49152);
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
    assert!(tok.warnings().is_empty());
}

#[test]
fn special_tokens_gemma3_gguf() {
    let tok = gemma();
    assert_eq!(tok.bos_token_id(), Some(2));
    assert_eq!(tok.bos_token(), Some("<bos>"));
    assert_eq!(tok.eos_token(), Some("<eos>"));
    // EOS, <end_of_turn>, and `</s>`: user-defined in the file, a control token that ends
    // generation for llama.cpp.
    assert_eq!(tok.eos_token_ids(), &[1, 106, 212]);
    assert!(tok.is_special(0) && tok.is_special(106) && tok.is_special(212));
    // User-defined tokens ("\n", runs of spaces, HTML tags) are text.
    assert!(!tok.is_special(107) && !tok.is_special(168));
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(tok.encode("", true).unwrap(), [2]);
    // This GGUF carries no chat template (llama.cpp falls back to its built-in Gemma format).
    assert_eq!(tok.chat_template(), None);
    assert!(tok.warnings().is_empty());
}

/// Loading a model builds its tokenizer, which for 262k tokens should stay well under a
/// second (measured: 0.25 s). Printed, not asserted: test machines are shared and slow.
#[test]
fn gemma3_gguf_vocabulary_build_time() {
    let vocab = gemma_vocab();
    let start = std::time::Instant::now();
    let tok = Tokenizer::from_gguf_vocab(vocab).unwrap();
    let built = start.elapsed();
    let start = std::time::Instant::now();
    let text = fixture("gemma3_gguf")
        .cases
        .iter()
        .map(|c| c.text.as_str())
        .collect::<String>();
    let ids = tok.encode(&text, true).unwrap();
    eprintln!(
        "Gemma 3 vocabulary built in {built:?}; {} bytes encoded to {} ids in {:?}",
        text.len(),
        ids.len(),
        start.elapsed()
    );
}

#[test]
fn unknown_pre_tokenizer_falls_back_to_gpt2_with_a_warning() {
    let Some(mut vocab) = smollm2_vocab() else {
        return;
    };
    let smollm = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    vocab.pre = Some("no-such-pre".into());
    let tok = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    assert_eq!(tok.warnings().len(), 1, "{:?}", tok.warnings());
    assert!(tok.warnings()[0].contains("no-such-pre"));
    let text = "Hello world, it's 2024!";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(ids, smollm.encode(text, false).unwrap());
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
}

#[test]
fn bad_gguf_vocabularies_are_errors() {
    let tiny = |model: &str, merges: &[&str]| GgufVocab {
        model: model.into(),
        tokens: vec!["a".into(), "b".into(), "ab".into()],
        token_types: vec![1, 1, 1],
        merges: merges.iter().map(|m| m.to_string()).collect(),
        ..GgufVocab::default()
    };
    let ok = Tokenizer::from_gguf_vocab(&tiny("gpt2", &["a b"])).unwrap();
    assert_eq!(ok.encode("ab", false).unwrap(), [2]);
    assert!(Tokenizer::from_gguf_vocab(&tiny("bert", &["a b"])).is_err());
    assert!(Tokenizer::from_gguf_vocab(&tiny("gpt2", &["ab"])).is_err());
    let mut bad_types = tiny("gpt2", &["a b"]);
    bad_types.token_types.pop();
    assert!(Tokenizer::from_gguf_vocab(&bad_types).is_err());
    let mut bad_bos = tiny("gpt2", &["a b"]);
    bad_bos.bos_token_id = Some(7);
    assert!(Tokenizer::from_gguf_vocab(&bad_bos).is_err());
}

#[test]
fn missing_hf_dir_is_an_error() {
    let err = Tokenizer::from_hf_dir(Path::new("/nonexistent/vigil-tokenizer")).err();
    assert!(err.is_some_and(|e| e.to_string().contains("tokenizer.json")));
}

/// The bytes grammar-constrained decoding matches against spell, token by token, exactly the
/// text the reference decodes the ids to.
#[test]
fn token_bytes_spell_what_the_ids_decode_to() {
    for (name, tok) in tokenizers() {
        check_token_bytes(name, tok);
    }
}

#[test]
fn gemma3_gguf_token_bytes() {
    check_token_bytes("gemma3_gguf", gemma());
}

fn check_token_bytes(name: &str, tok: &Tokenizer) {
    let bytes = tok.token_bytes();
    assert_eq!(bytes.len(), tok.vocab_size(), "{name}");
    for case in &fixture(name).cases {
        let spelled: Vec<u8> = (case.ids.iter())
            .flat_map(|&id| bytes[id as usize].bytes.iter().copied())
            .collect();
        assert_eq!(
            String::from_utf8_lossy(&spelled),
            case.decoded,
            "{name} {:?}",
            case.text
        );
    }
    let specials = bytes.iter().filter(|b| b.special).count();
    assert!(specials > 0, "{name}: no special token flagged");
}
