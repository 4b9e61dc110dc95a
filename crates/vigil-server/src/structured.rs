//! Structured outputs on the wire: OpenAI's `response_format` (`text`, `json_object`,
//! `json_schema`) and vLLM's extras (`structured_outputs`, and the older `guided_json`,
//! `guided_regex`, `guided_choice`, `guided_grammar`) become one `GrammarSpec`, compiled off
//! the async workers into the request's constraint (`vigil_engine::grammar`). A bad schema or
//! grammar is a 400 naming the field, before anything is generated.

use crate::error::ApiError;
use crate::state::SharedState;
use serde_json::{json, Value};
use std::sync::Arc;
use vigil_engine::grammar::{GrammarConstraint, GrammarSpec, Grammars};

/// The structured-output fields a chat or text completion request may carry.
#[derive(Debug, Default, Clone)]
pub struct StructuredFields {
    pub response_format: Option<Value>,
    pub structured_outputs: Option<Value>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
}

/// A JSON schema given as an object, or as a string holding one (vLLM accepts both).
fn schema_value(field: &str, v: &Value) -> Result<Value, ApiError> {
    match v {
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| ApiError::invalid(field, format!("not a JSON schema: {e}"))),
        Value::Object(_) | Value::Bool(true) => Ok(v.clone()),
        _ => Err(ApiError::invalid(
            field,
            "must be a JSON schema (an object)",
        )),
    }
}

fn response_format(v: &Value) -> Result<Option<(&'static str, GrammarSpec)>, ApiError> {
    let kind = v.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(
            "response_format.type",
            "must be `text`, `json_object` or `json_schema`",
        )
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some((
            "response_format",
            GrammarSpec::JsonSchema(json!({"type": "object"})),
        ))),
        "json_schema" => {
            let js = v.get("json_schema").ok_or_else(|| {
                ApiError::invalid(
                    "response_format.json_schema",
                    "is required with `json_schema`",
                )
            })?;
            // OpenAI nests the schema under `schema`; some clients send it as `json_schema`
            // itself. Without one, any JSON value.
            let schema = match js.get("schema") {
                Some(s) => schema_value("response_format.json_schema.schema", s)?,
                None if js.get("name").is_none() && js.is_object() => js.clone(),
                None => Value::Bool(true),
            };
            Ok(Some((
                "response_format.json_schema.schema",
                GrammarSpec::JsonSchema(schema),
            )))
        }
        other => Err(ApiError::invalid(
            "response_format.type",
            format!("`{other}` is not supported: use `text`, `json_object` or `json_schema`"),
        )),
    }
}

/// vLLM's `structured_outputs` object: one of `json`, `regex`, `choice`, `grammar`,
/// `json_object`.
fn structured_outputs(v: &Value) -> Result<Vec<(&'static str, GrammarSpec)>, ApiError> {
    let field = "structured_outputs";
    let o = v
        .as_object()
        .ok_or_else(|| ApiError::invalid(field, "must be an object"))?;
    let mut specs = Vec::new();
    for (k, val) in o {
        let spec = match k.as_str() {
            "json" => GrammarSpec::JsonSchema(schema_value("structured_outputs.json", val)?),
            "regex" => GrammarSpec::Regex(string_of("structured_outputs.regex", val)?),
            "choice" => GrammarSpec::Choice(choices("structured_outputs.choice", val)?),
            "grammar" => GrammarSpec::Lark(string_of("structured_outputs.grammar", val)?),
            "json_object" if val == &Value::Bool(true) => {
                GrammarSpec::JsonSchema(json!({"type": "object"}))
            }
            "json_object" => continue,
            "disable_fallback"
            | "disable_any_whitespace"
            | "disable_additional_properties"
            | "whitespace_pattern"
            | "backend" => continue,
            other => {
                return Err(ApiError::invalid(
                    format!("structured_outputs.{other}"),
                    "unknown field: use `json`, `regex`, `choice`, `grammar` or `json_object`",
                ))
            }
        };
        specs.push((field, spec));
    }
    Ok(specs)
}

fn string_of(field: &str, v: &Value) -> Result<String, ApiError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| ApiError::invalid(field, "must be a string"))
}

fn choices(field: &str, v: &Value) -> Result<Vec<String>, ApiError> {
    let list: Option<Vec<String>> = v
        .as_array()
        .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect());
    match list {
        Some(l) if !l.is_empty() => Ok(l),
        _ => Err(ApiError::invalid(
            field,
            "must be a non-empty list of strings",
        )),
    }
}

impl StructuredFields {
    /// The request's grammar, if it asks for one, and the field that asked; a 400 when it
    /// asks in more than one way or a field is malformed.
    pub fn spec(&self) -> Result<Option<(&'static str, GrammarSpec)>, ApiError> {
        let mut specs: Vec<(&'static str, GrammarSpec)> = Vec::new();
        if let Some(v) = &self.response_format {
            specs.extend(response_format(v)?);
        }
        if let Some(v) = &self.structured_outputs {
            specs.extend(structured_outputs(v)?);
        }
        if let Some(v) = &self.guided_json {
            specs.push((
                "guided_json",
                GrammarSpec::JsonSchema(schema_value("guided_json", v)?),
            ));
        }
        if let Some(rx) = &self.guided_regex {
            specs.push(("guided_regex", GrammarSpec::Regex(rx.clone())));
        }
        if let Some(c) = &self.guided_choice {
            if c.is_empty() {
                return Err(ApiError::invalid("guided_choice", "must not be empty"));
            }
            specs.push(("guided_choice", GrammarSpec::Choice(c.clone())));
        }
        if let Some(g) = &self.guided_grammar {
            specs.push(("guided_grammar", GrammarSpec::Lark(g.clone())));
        }
        if specs.len() > 1 {
            let names: Vec<&str> = specs.iter().map(|(f, _)| *f).collect();
            return Err(ApiError::invalid(
                names[1],
                format!(
                    "give one structured-output constraint, not several ({})",
                    names.join(", ")
                ),
            ));
        }
        Ok(specs.pop())
    }
}

/// The model's grammar tables, built on first use (a token trie over the whole vocabulary).
fn grammars(state: &SharedState) -> Result<Arc<Grammars>, ApiError> {
    let built = state.grammars.get_or_init(|| {
        let t = std::time::Instant::now();
        let g = Grammars::new(
            &state.tokenizer.token_bytes(),
            state.tokenizer.eos_token_ids(),
        );
        tracing::info!(
            "structured outputs: grammar tables built in {:?}",
            t.elapsed()
        );
        g.map(Arc::new)
    });
    built
        .clone()
        .map_err(|e| ApiError::internal(format!("structured outputs are unavailable: {e}")))
}

/// The constraint of a forced tool call: its arguments under the tool's schema (a 400 on
/// `field` when a tool's schema cannot be compiled).
pub async fn compile_forced(
    state: &SharedState,
    field: &'static str,
    call: &crate::output::ForcedCall,
) -> Result<GrammarConstraint, ApiError> {
    let format = state.tool_format.ok_or_else(|| {
        ApiError::invalid(
            field,
            "this model has no tool-call format, so a call cannot be forced",
        )
    })?;
    compile(state, field, call.grammar(format)).await
}

/// Compile `spec` for one request, off the async workers; a 400 on `field` when it is bad.
pub async fn compile(
    state: &SharedState,
    field: &'static str,
    spec: GrammarSpec,
) -> Result<GrammarConstraint, ApiError> {
    let st = state.clone();
    crate::cpu_jobs::run(state, move || {
        let grammars = grammars(&st)?;
        grammars
            .compile(&spec)
            .map_err(|e| ApiError::invalid(field, format!("cannot be used as a constraint: {e}")))
    })
    .await
}
