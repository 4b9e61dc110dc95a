//! Request fields → `SamplingParams`, stop strings and limits, with the defaults of the wire
//! reference (temperature 0.6, top_p 0.9, no max_tokens cap) and a 400 naming each bad field.

use super::types::{CommonParams, StopField};
use crate::error::ApiError;
use vigil_engine::sampling::SamplingParams;
use vigil_engine::speculative::{SpecMethod, SpecRequest};

pub const DEFAULT_TEMPERATURE: f32 = 0.6;
pub const DEFAULT_TOP_P: f32 = 0.9;
pub const MAX_STOP_STRINGS: usize = 4;
pub const MAX_STOP_BYTES: usize = 64;
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// Most choices (`n`) one request may ask for.
pub const MAX_CHOICES: u32 = 16;

pub fn sampling_params(
    p: &CommonParams,
    vocab_size: usize,
    logprobs: Option<u32>,
) -> Result<SamplingParams, ApiError> {
    if let Some(n) = p.n {
        if !(1..=MAX_CHOICES).contains(&n) {
            return Err(ApiError::invalid(
                "n",
                format!("must be between 1 and {MAX_CHOICES}"),
            ));
        }
    }
    let top_k = match p.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => u32::try_from(k).unwrap_or(u32::MAX),
        Some(_) => {
            return Err(ApiError::invalid(
                "top_k",
                "must be -1, 0 (off) or positive",
            ))
        }
    };
    let mut logit_bias = Vec::new();
    if let Some(bias) = &p.logit_bias {
        for (key, &b) in bias {
            let id: u32 = key.parse().map_err(|_| {
                ApiError::invalid("logit_bias", format!("key `{key}` is not a token id"))
            })?;
            if id as usize >= vocab_size {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("token id {id} is outside the vocabulary ({vocab_size} tokens)"),
                ));
            }
            if !(-100.0..=100.0).contains(&b) {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("bias {b} for token {id} is outside [-100, 100]"),
                ));
            }
            logit_bias.push((id, b));
        }
    }
    if let Some(pp) = p.presence_penalty {
        if !(-2.0..=2.0).contains(&pp) {
            return Err(ApiError::invalid("presence_penalty", "must be in [-2, 2]"));
        }
    }
    if let Some(fp) = p.frequency_penalty {
        if !(-2.0..=2.0).contains(&fp) {
            return Err(ApiError::invalid("frequency_penalty", "must be in [-2, 2]"));
        }
    }
    if let Some(t) = p.temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::invalid("temperature", "must be in [0, 2]"));
        }
    }
    let params = SamplingParams {
        temperature: p.temperature.unwrap_or(DEFAULT_TEMPERATURE),
        top_k,
        top_p: p.top_p.unwrap_or(DEFAULT_TOP_P),
        min_p: p.min_p.unwrap_or(0.0),
        repetition_penalty: p.repetition_penalty.unwrap_or(1.0),
        presence_penalty: p.presence_penalty.unwrap_or(0.0),
        frequency_penalty: p.frequency_penalty.unwrap_or(0.0),
        logit_bias,
        seed: p.seed.map(|s| s as u64),
        logprobs,
        min_tokens: p.min_tokens.unwrap_or(0),
        score_prompt_from: None,
        score_prompt_tokens: false,
        speculative: SpecRequest {
            method: speculative_method(p.speculative.as_deref())?,
            prediction: None,
        },
    };
    params
        .validate()
        .map_err(|e| ApiError::invalid(e.field, e.to_string()))?;
    Ok(params)
}

/// A request asking for the draft model on a server without one is refused.
pub fn check_speculative(sampling: &SamplingParams, draft_model: bool) -> Result<(), ApiError> {
    if sampling.speculative.method == Some(SpecMethod::Draft) && !draft_model {
        return Err(ApiError::invalid(
            "speculative",
            "`draft` needs a server started with --speculative draft:PATH",
        ));
    }
    Ok(())
}

/// The `speculative` field: a method name, or absent for the server's.
pub fn speculative_method(name: Option<&str>) -> Result<Option<SpecMethod>, ApiError> {
    let Some(name) = name else {
        return Ok(None);
    };
    SpecMethod::parse(name).map(Some).ok_or_else(|| {
        ApiError::invalid(
            "speculative",
            format!("`{name}` is not a method: use off, ngram, suffix or draft"),
        )
    })
}

/// The text of OpenAI's `prediction` (`{"type": "content", "content": text or text parts}`),
/// which speculative decoding drafts from.
pub fn prediction_text(prediction: Option<&serde_json::Value>) -> Result<Option<String>, ApiError> {
    let Some(p) = prediction else {
        return Ok(None);
    };
    let bad = |why: &str| ApiError::invalid("prediction", why.to_string());
    if p.get("type").and_then(|t| t.as_str()) != Some("content") {
        return Err(bad("must be an object with `type: \"content\"`"));
    }
    match p.get("content") {
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(|t| t.as_str()), part.get("text")) {
                    (Some("text"), Some(serde_json::Value::String(s))) => text.push_str(s),
                    _ => {
                        return Err(bad(
                            "content parts must be `{\"type\": \"text\", \"text\": ...}`",
                        ))
                    }
                }
            }
            Ok(Some(text))
        }
        _ => Err(bad("`content` must be a string or a list of text parts")),
    }
}

pub fn stop_strings(stop: &Option<StopField>, field: &str) -> Result<Vec<String>, ApiError> {
    let list = match stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    if list.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            field,
            format!("at most {MAX_STOP_STRINGS} stop sequences are allowed"),
        ));
    }
    if let Some(s) = list.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid(
            field,
            format!(
                "stop sequence of {} bytes is longer than {MAX_STOP_BYTES}",
                s.len()
            ),
        ));
    }
    if list.iter().any(|s| s.is_empty()) {
        return Err(ApiError::invalid(field, "stop sequences must not be empty"));
    }
    Ok(list)
}

pub fn max_tokens(value: Option<u64>, field: &str) -> Result<Option<usize>, ApiError> {
    match value {
        Some(0) => Err(ApiError::invalid(field, "must be at least 1")),
        Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        None => Ok(None),
    }
}
