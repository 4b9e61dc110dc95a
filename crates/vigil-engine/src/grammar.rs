//! Structured outputs through llguidance (the grammar engine of llama.cpp, vLLM and SGLang): a
//! JSON schema, a regular expression, a choice of literals or a Lark grammar becomes a
//! `TokenConstraint` whose mask is llguidance's token mask for the output so far.
//!
//! `Grammars` is built once per model from the tokenizer's token bytes (a token trie and
//! llguidance's parser factory, ~0.1 s for a 49k vocabulary); `compile` turns one request's
//! spec into a fresh matcher, and is where a bad schema or grammar is reported. The model may
//! end its output with any of its end-of-generation ids: llguidance knows one EOS, so the mask
//! allows all of them whenever it allows that one.
//!
//! Masks are computed beside the forward pass: after a token is sampled, the matcher consumes it
//! at once and the next mask is computed on the mask thread (`mask_thread`) while the engine
//! runs the next step's forward; sampling then picks the mask up. Only where the grammar could
//! end (the parser accepts) is the mask computed in place, because whether anything but
//! end-of-generation may follow decides whether the sequence stops on this token. The masks
//! are the same either way, so the output is too.

use crate::constraint::TokenConstraint;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
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
            matcher: Some(matcher),
            eos: self.eos.clone(),
            next: Next::Unknown,
            done: false,
        })
    }
}

type MaskResult = (Matcher, Result<SimpleVob, String>);

/// A mask computation handed to the mask thread: the matcher goes there and comes back with
/// its mask through the job's own channel.
type MaskJob = (Matcher, mpsc::SyncSender<MaskResult>);

/// The one thread that computes masks beside the forward pass, started on first use. Jobs run
/// in order; each returns its matcher and mask through its own channel.
fn mask_thread() -> Option<&'static mpsc::Sender<MaskJob>> {
    static THREAD: OnceLock<Option<mpsc::Sender<MaskJob>>> = OnceLock::new();
    THREAD
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<MaskJob>();
            std::thread::Builder::new()
                .name("vigil-grammar-masks".into())
                .spawn(move || {
                    while let Ok((mut matcher, reply)) = rx.recv() {
                        let mask = matcher.compute_mask_or_eos().map_err(|e| e.to_string());
                        let _ = reply.send((matcher, mask));
                    }
                })
                .ok()
                .map(|_| tx)
        })
        .as_ref()
}

/// The mask for the next token.
enum Next {
    /// Not computed: `mask` computes it in place.
    Unknown,
    Ready(SimpleVob),
    /// Being computed on the mask thread, which holds the matcher until it is done.
    Pending(mpsc::Receiver<MaskResult>),
}

/// One request's matcher: the output so far, and which tokens may follow it.
pub struct GrammarConstraint {
    /// `None` while the mask thread holds it (`Next::Pending`).
    matcher: Option<Matcher>,
    eos: Arc<[u32]>,
    next: Next,
    /// Nothing but end-of-generation may follow: the output is complete.
    done: bool,
}

impl GrammarConstraint {
    /// Why the matcher failed, if it did (a token it did not allow was forced on it).
    pub fn error(&mut self) -> Option<String> {
        self.settle();
        self.matcher.as_ref().and_then(Matcher::get_error)
    }

    /// Wait for a mask being computed, and take the matcher back.
    fn settle(&mut self) {
        if let Next::Pending(rx) = &self.next {
            self.next = match rx.recv() {
                Ok((matcher, mask)) => {
                    self.matcher = Some(matcher);
                    match mask {
                        Ok(m) => Next::Ready(m),
                        Err(e) => {
                            tracing::warn!("structured output: no mask: {e}");
                            Next::Unknown
                        }
                    }
                }
                // The mask thread is gone (it cannot be, short of a panic in llguidance).
                Err(_) => Next::Unknown,
            };
        }
    }

    /// Compute the next mask on the mask thread (in place if it is gone).
    fn compute_beside(&mut self, matcher: Matcher) {
        let (tx, rx) = mpsc::sync_channel(1);
        let unsent = match mask_thread() {
            Some(thread) => thread.send((matcher, tx)).err().map(|e| e.0 .0),
            None => Some(matcher),
        };
        match unsent {
            None => self.next = Next::Pending(rx),
            Some(m) => {
                // `mask` computes it when it is needed.
                self.matcher = Some(m);
                self.next = Next::Unknown;
            }
        }
    }
}

impl TokenConstraint for GrammarConstraint {
    fn mask(&mut self, logits: &mut [f32]) -> usize {
        self.settle();
        let computed = match std::mem::replace(&mut self.next, Next::Unknown) {
            Next::Ready(m) => Ok(m),
            _ => match self.matcher.as_mut() {
                Some(m) => m.compute_mask_or_eos().map_err(|e| e.to_string()),
                None => Err("the matcher was lost".to_string()),
            },
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
        self.settle();
        self.next = Next::Unknown;
        let Some(mut matcher) = self.matcher.take() else {
            return;
        };
        let token = if self.eos.contains(&token) {
            if matcher.is_stopped() {
                // The grammar had ended (nothing could extend it): EOS was all it allowed.
                self.matcher = Some(matcher);
                return;
            }
            self.eos[0]
        } else {
            token
        };
        if let Err(e) = matcher.consume_token(token) {
            tracing::warn!("structured output: the grammar refused token {token}: {e}");
            self.matcher = Some(matcher);
            return;
        }
        // Where the grammar may end here, whether only end-of-generation can follow decides
        // whether the sequence stops on this token instead of spending a step on the end
        // token: that mask is needed now. Elsewhere it can wait for the next sampling.
        if matcher.is_stopped() || matcher.is_accepting().unwrap_or(true) {
            if let Ok(next) = matcher.compute_mask_or_eos() {
                self.done = next.num_set() == 1 && next.is_allowed(self.eos[0]);
                self.next = Next::Ready(next);
            }
            self.matcher = Some(matcher);
        } else {
            self.compute_beside(matcher);
        }
    }

    fn is_complete(&self) -> bool {
        // A pending mask means the parser did not accept: the output cannot be complete.
        self.done || self.matcher.as_ref().is_some_and(Matcher::is_stopped)
    }
}
