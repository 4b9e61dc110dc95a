//! The parts of an HF model directory around `tokenizer.json` that the tokenizer needs:
//! `tokenizer_config.json` (special tokens, chat template), `chat_template.jinja`, and
//! `generation_config.json` (the ids that end generation).

use std::path::Path;

use serde_json::Value;

use crate::error::{ModelError, Result};

#[derive(Default)]
pub(crate) struct HfTokenizerConfig {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub chat_template: Option<String>,
    pub generation_eos_ids: Vec<u32>,
}

/// The parsed JSON at `path`, or `None` when the file does not exist.
fn read_json(path: &Path) -> Result<Option<Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ModelError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ModelError::format(path, format!("invalid JSON: {e}")))
}

/// A special token is written either as its text or as a serialized `AddedToken` object.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// `chat_template` is a string, or a list of named templates of which "default" is the one.
fn chat_template(path: &Path, v: Option<&Value>) -> Result<Option<String>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(named)) => Ok(named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string))),
        Some(_) => Err(ModelError::format(
            path,
            "chat_template is neither a string nor a list of named templates",
        )),
    }
}

impl HfTokenizerConfig {
    pub fn load(dir: &Path) -> Result<Self> {
        let mut config = HfTokenizerConfig::default();
        let config_path = dir.join("tokenizer_config.json");
        if let Some(json) = read_json(&config_path)? {
            config.bos_token = token_text(json.get("bos_token"));
            config.eos_token = token_text(json.get("eos_token"));
            config.chat_template = chat_template(&config_path, json.get("chat_template"))?;
        }
        // Newer transformers save the template beside the config, and prefer that file.
        let jinja_path = dir.join("chat_template.jinja");
        match std::fs::read_to_string(&jinja_path) {
            Ok(text) => config.chat_template = Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ModelError::Io {
                    path: jinja_path,
                    source,
                })
            }
        }
        let generation_path = dir.join("generation_config.json");
        if let Some(json) = read_json(&generation_path)? {
            let ids = match json.get("eos_token_id") {
                Some(Value::Array(ids)) => ids.iter().collect(),
                Some(id) => vec![id],
                None => Vec::new(),
            };
            for id in ids {
                let id = id
                    .as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| {
                        ModelError::format(
                            &generation_path,
                            format!("eos_token_id {id} is not a token id"),
                        )
                    })?;
                config.generation_eos_ids.push(id);
            }
        }
        Ok(config)
    }
}
