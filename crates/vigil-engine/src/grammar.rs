//! Structured outputs through llguidance (the grammar engine of llama.cpp, vLLM and SGLang): a
//! JSON schema, a regular expression, a choice of literals or a Lark grammar becomes a
//! `TokenConstraint` whose mask is llguidance's token mask for the output so far.
//!
//! `Grammars` is built once per model from the tokenizer's token bytes (a token trie and
//! llguidance's parser factory, ~0.1 s for a 49k vocabulary); `compile` turns one request's
//! spec into a fresh matcher, and is where a bad schema or grammar is reported. The model may
//! end its output with any of its end-of-generation ids: llguidance knows one EOS, so the mask
//! allows all of them whenever it allows that one.

use crate::constraint::TokenConstraint;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::Arc;
use toktrie::{ApproximateTokEnv, SimpleVob, TokRxInfo, TokTrie, TokenizerEnv};
use vigil_model::tokenizer::TokenBytes;

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON value valid against this schema (`{"type": "object"}` for any object).
    JsonSchema(Value),
    /// Text matching this regular expression, whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark dialect (vLLM's `guided_grammar`).
    Lark(String),
}

/// JSON layout the schema compiler enforces: Python's `json.dumps` separators and no free
/// whitespace, so a small model cannot spend its budget on blank padding.
fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// `schema` with the compact layout (unless it sets its own `x-guidance`); `true` (any value)
/// becomes an empty schema carrying it.
pub fn compact_json(schema: &Value) -> Value {
    let mut schema = schema.clone();
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(json_layout);
    } else if schema == Value::Bool(true) {
        schema = json!({"x-guidance": json_layout()});
    }
    schema
}

impl GrammarSpec {
    fn top_level(&self) -> TopLevelGrammar {
        match self {
            GrammarSpec::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(compact_json(schema))
            }
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GrammarSpec::Choice(options) => {
                let alts: Vec<String> = options
                    .iter()
                    .map(|o| serde_json::to_string(o).unwrap_or_default())
                    .collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            GrammarSpec::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
        }
    }
}

/// The model's token trie and llguidance's parser factory, shared by every request.
pub struct Grammars {
    factory: ParserFactory,
    /// Every id that ends generation; the first is the one llguidance knows as EOS.
    eos: Arc<[u32]>,
}

impl Grammars {
    /// `tokens`: every id's bytes (`Tokenizer::token_bytes`); `eos`: the ids that end
    /// generation (at least one).
    pub fn new(tokens: &[TokenBytes], eos: &[u32]) -> Result<Grammars, String> {
        let first = *eos
            .first()
            .ok_or("the model has no end-of-generation token")?;
        let words: Vec<Vec<u8>> = tokens
            .iter()
            .map(|t| {
                if t.special {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(&t.bytes);
                    w
                } else {
                    t.bytes.clone()
                }
            })
            .collect();
        let info = TokRxInfo::new(words.len() as u32, first);
        let env: Arc<dyn TokenizerEnv + Sync> =
            Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Grammars {
            factory,
            eos: eos.into(),
        })
    }

    /// A fresh constraint for one request; `Err` says what is wrong with the spec.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<GrammarConstraint, String> {
        let parser = (self.factory)
            .create_parser(spec.top_level())
            .map_err(|e| e.to_string())?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(GrammarConstraint {
            matcher,
            eos: self.eos.clone(),
            next: None,
            done: false,
        })
    }
}

/// One request's matcher: the output so far, and which tokens may follow it.
pub struct GrammarConstraint {
    matcher: Matcher,
    eos: Arc<[u32]>,
    /// The mask after the last token, computed in `advance` (to see whether the grammar is
    /// finished) and used by the next `mask`.
    next: Option<SimpleVob>,
    /// Nothing but end-of-generation may follow: the output is complete.
    done: bool,
}

impl GrammarConstraint {
    /// Why the matcher failed, if it did (a token it did not allow was forced on it).
    pub fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }
}

impl TokenConstraint for GrammarConstraint {
    fn mask(&mut self, logits: &mut [f32]) -> usize {
        let computed = match self.next.take() {
            Some(m) => Ok(m),
            None => self.matcher.compute_mask_or_eos(),
        };
        let mask = match computed {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!("structured output: no mask: {e}");
                return 0;
            }
        };
        let eos_allowed = mask.is_allowed(self.eos[0]);
        let allowed = |id: usize| {
            if self.eos.contains(&(id as u32)) {
                eos_allowed
            } else {
                id < mask.len() && mask.get(id)
            }
        };
        let n = (0..logits.len()).filter(|&id| allowed(id)).count();
        if n > 0 {
            for (id, l) in logits.iter_mut().enumerate() {
                if !allowed(id) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        n
    }

    fn advance(&mut self, token: u32) {
        let token = if self.eos.contains(&token) {
            if self.matcher.is_stopped() {
                // The grammar had ended (nothing could extend it): EOS was all it allowed.
                return;
            }
            self.eos[0]
        } else {
            token
        };
        if let Err(e) = self.matcher.consume_token(token) {
            tracing::warn!("structured output: the grammar refused token {token}: {e}");
            return;
        }
        // A grammar that only end-of-generation can follow is finished now: the sequence
        // stops on this token instead of spending a step on the end token.
        if let Ok(next) = self.matcher.compute_mask_or_eos() {
            self.done = next.num_set() == 1 && next.is_allowed(self.eos[0]);
            self.next = Some(next);
        }
    }

    fn is_complete(&self) -> bool {
        self.done || self.matcher.is_stopped()
    }
}
