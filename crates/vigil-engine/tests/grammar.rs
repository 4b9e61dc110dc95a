//! Structured outputs (`grammar.rs`) on real vocabularies: whatever the model's logits, a
//! sequence sampled under the grammar's masks is valid. Random logits stand in for a model
//! (the worst case: every token equally likely), so these outputs exercise token boundaries
//! that a real model would rarely reach. Vocabularies: SmolLM2's GGUF (`VIGIL_TEST_GGUF`;
//! required under CI) and the committed tiny Qwen3 tokenizer.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::path::Path;
use vigil_engine::constraint::TokenConstraint;
use vigil_engine::grammar::{GrammarSpec, Grammars};
use vigil_model::tokenizer::Tokenizer;

fn smollm2() -> Option<Tokenizer> {
    let Some(path) = std::env::var_os("VIGIL_TEST_GGUF") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "VIGIL_TEST_GGUF must be set under CI (scripts/fetch_test_assets.sh)"
        );
        eprintln!("skipped SmolLM2: VIGIL_TEST_GGUF is not set");
        return None;
    };
    let file = vigil_model::gguf::GgufFile::open(Path::new(&path)).expect("the GGUF opens");
    let vocab = vigil_model::source_gguf::gguf_vocab(&file).expect("its vocabulary");
    Some(Tokenizer::from_gguf_vocab(&vocab).expect("SmolLM2 tokenizer"))
}

fn tiny_qwen3() -> Tokenizer {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/qwen3");
    Tokenizer::from_hf_dir(&dir).expect("tiny Qwen3 tokenizer")
}

fn vocabularies() -> Vec<(&'static str, Tokenizer)> {
    let mut all = vec![("tiny-qwen3", tiny_qwen3())];
    all.extend(smollm2().map(|t| ("smollm2", t)));
    all
}

/// Samples under `spec`'s masks from random logits until the grammar completes (or `limit`
/// tokens); returns the text, or None when it hit the limit.
fn sample(tok: &Tokenizer, grammars: &Grammars, spec: &GrammarSpec, seed: u64) -> Option<String> {
    let mut c = grammars.compile(spec).expect("the spec compiles");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let eos = tok.eos_token_ids();
    let mut out = Vec::new();
    for _ in 0..400 {
        let mut logits: Vec<f32> = (0..tok.vocab_size()).map(|_| rng.random()).collect();
        let n = c.mask(&mut logits);
        assert!(
            n > 0,
            "a live grammar always allows something: {:?} after {:?}",
            c.error(),
            tok.decode(&out, false)
        );
        let allowed: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| logits[i as usize].is_finite())
            .collect();
        for &id in &allowed {
            assert!(
                !tok.is_special(id) || eos.contains(&id),
                "special token {id} offered as text"
            );
        }
        let pick = allowed[rng.random_range(0..allowed.len())];
        c.advance(pick);
        assert!(c.error().is_none(), "an allowed token was refused");
        if eos.contains(&pick) {
            assert!(c.is_complete(), "EOS ends the grammar");
            return Some(tok.decode(&out, false).expect("decodes"));
        }
        out.push(pick);
        if c.is_complete() {
            // Nothing but EOS could follow: the output ends on this token.
            return Some(tok.decode(&out, false).expect("decodes"));
        }
    }
    None
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user"]},
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}
        },
        "required": ["name", "age", "role", "tags"],
        "additionalProperties": false
    })
}

fn check_person(v: &Value) {
    let o = v.as_object().expect("an object");
    assert_eq!(o.len(), 4, "{v}");
    assert!(
        o["name"].as_str().is_some_and(|s| s.chars().count() <= 6),
        "{v}"
    );
    assert!(
        o["age"].as_i64().is_some_and(|a| (0..=120).contains(&a)),
        "{v}"
    );
    assert!(matches!(o["role"].as_str(), Some("admin" | "user")), "{v}");
    let tags = o["tags"].as_array().expect("tags");
    assert!(tags.len() <= 3 && tags.iter().all(Value::is_boolean), "{v}");
}

#[test]
fn random_logits_under_a_json_schema_give_valid_instances() {
    for (name, tok) in vocabularies() {
        let grammars = Grammars::new(&tok.token_bytes(), tok.eos_token_ids()).expect("grammars");
        let spec = GrammarSpec::JsonSchema(schema());
        let mut finished = 0;
        for seed in 0..12 {
            let Some(text) = sample(&tok, &grammars, &spec, seed) else {
                continue;
            };
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{name} seed {seed}: {text:?} is not JSON: {e}"));
            check_person(&v);
            finished += 1;
        }
        assert!(finished >= 6, "{name}: only {finished} of 12 finished");
    }
}

#[test]
fn json_object_regex_and_choice_hold_under_random_logits() {
    for (name, tok) in vocabularies() {
        let grammars = Grammars::new(&tok.token_bytes(), tok.eos_token_ids()).expect("grammars");
        let object = GrammarSpec::JsonSchema(json!({
            "type": "object",
            "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9},
            "maxProperties": 2
        }));
        let regex = GrammarSpec::Regex(r"[0-9]{3}-[a-z]{2,4}".into());
        let choice = GrammarSpec::Choice(vec!["yes".into(), "no".into(), "maybe so".into()]);
        for seed in 0..8 {
            if let Some(t) = sample(&tok, &grammars, &object, seed) {
                let v: Value =
                    serde_json::from_str(&t).unwrap_or_else(|e| panic!("{name}: {t:?}: {e}"));
                assert!(v.as_object().is_some_and(|o| o.len() <= 2), "{name}: {t}");
            }
            let t = sample(&tok, &grammars, &regex, seed).expect("a regex this short ends");
            let (digits, letters) = t.split_once('-').unwrap_or_else(|| panic!("{name}: {t:?}"));
            assert!(
                digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()),
                "{t:?}"
            );
            assert!((2..=4).contains(&letters.len()), "{t:?}");
            assert!(letters.bytes().all(|b| b.is_ascii_lowercase()), "{t:?}");
            let t = sample(&tok, &grammars, &choice, seed).expect("a choice ends");
            assert!(
                ["yes", "no", "maybe so"].contains(&t.as_str()),
                "{name}: {t:?}"
            );
        }
    }
}

#[test]
fn bad_specs_are_refused_with_a_reason() {
    let tok = tiny_qwen3();
    let grammars = Grammars::new(&tok.token_bytes(), tok.eos_token_ids()).expect("grammars");
    for spec in [
        GrammarSpec::JsonSchema(json!({"type": "no-such-type"})),
        GrammarSpec::Regex("(unclosed".into()),
        GrammarSpec::Lark("start: missing_rule".into()),
    ] {
        let e = grammars
            .compile(&spec)
            .err()
            .unwrap_or_else(|| panic!("{spec:?} compiled"));
        assert!(!e.is_empty());
    }
}

#[test]
fn a_token_outside_the_mask_is_reported_not_accepted() {
    let tok = tiny_qwen3();
    let grammars = Grammars::new(&tok.token_bytes(), tok.eos_token_ids()).expect("grammars");
    let mut c = grammars
        .compile(&GrammarSpec::Regex("[0-9]+".into()))
        .expect("compiles");
    let mut logits = vec![0.0; tok.vocab_size()];
    c.mask(&mut logits);
    let refused = (0..logits.len() as u32)
        .find(|&i| logits[i as usize].is_infinite() && !tok.is_special(i))
        .expect("some token is masked");
    c.advance(refused);
    assert!(c.error().is_some());
}
