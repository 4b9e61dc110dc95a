//! Hugging Face checkpoint directories: `config.json` → [`ModelConfig`] and
//! `generation_config.json` → [`GenerationConfig`]. The weights are read by
//! [`SafetensorsStore`] (re-exported here so one module covers an HF directory).
//!
//! Both key styles found in the wild are accepted: transformers 4.x (`rope_theta`,
//! `rope_scaling`, `num_experts`) and 5.x (`rope_parameters`, `num_local_experts`).

use crate::config::{Arch, Llama3RopeScaling, ModelConfig, MoeConfig, RopeStyle};
use crate::error::ModelError;
use serde_json::{Map, Value};
use std::path::Path;

pub use crate::safetensors_store::{HfTensor, SafetensorsStore};

/// Sampling defaults and stop tokens a checkpoint ships in `generation_config.json`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerationConfig {
    pub bos_token_id: Option<u32>,
    /// `eos_token_id`, which HF allows as one id or a list.
    pub eos_token_ids: Vec<u32>,
    /// HF samples only when this is true; with `Some(false)` the sampling fields are unused.
    pub do_sample: Option<bool>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub repetition_penalty: Option<f32>,
}

/// Read `dir/config.json` into the decoder's hyper-parameters.
pub fn load_hf_config(dir: &Path) -> Result<ModelConfig, ModelError> {
    let path = dir.join("config.json");
    let json = read_json_object(&path)?;
    parse_hf_config(&path, &json)
}

/// Read `dir/generation_config.json`; `Ok(None)` when the checkpoint has none.
pub fn load_generation_config(dir: &Path) -> Result<Option<GenerationConfig>, ModelError> {
    let path = dir.join("generation_config.json");
    if !path.exists() {
        return Ok(None);
    }
    let json = read_json_object(&path)?;
    parse_generation_config(&path, &json).map(Some)
}

fn read_json_object(path: &Path) -> Result<Map<String, Value>, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ModelError::format(path, "expected a JSON object")),
        Err(e) => Err(ModelError::format(path, format!("invalid JSON: {e}"))),
    }
}

/// Parse a `config.json` object (exposed for tests of configs that are not on disk).
pub fn parse_hf_config(path: &Path, json: &Map<String, Value>) -> Result<ModelConfig, ModelError> {
    let f = Fields { path, obj: json };
    let model_type = f.str("model_type")?;
    let arch = match model_type {
        "llama" => Arch::Llama,
        "qwen3" => Arch::Qwen3,
        "qwen3_moe" => Arch::Qwen3Moe,
        other => {
            return Err(ModelError::unsupported(
                path,
                format!("model_type \"{other}\" (supported: llama, qwen3, qwen3_moe)"),
            ))
        }
    };
    f.reject_unsupported_features()?;

    let hidden_size = f.positive("hidden_size")?;
    let num_heads = f.positive("num_attention_heads")?;
    let num_kv_heads = f.opt_usize("num_key_value_heads")?.unwrap_or(num_heads);
    if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
        return Err(ModelError::format(
            path,
            format!("num_key_value_heads {num_kv_heads} does not divide num_attention_heads {num_heads}"),
        ));
    }
    let head_dim = match f.opt_usize("head_dim")? {
        Some(d) => d,
        None if hidden_size % num_heads == 0 => hidden_size / num_heads,
        None => {
            return Err(ModelError::format(
                path,
                format!("head_dim missing and hidden_size {hidden_size} is not a multiple of num_attention_heads {num_heads}"),
            ))
        }
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(ModelError::format(
            path,
            format!("head_dim {head_dim} must be even and non-zero (RoPE rotates pairs)"),
        ));
    }
    let num_layers = f.positive("num_hidden_layers")?;
    let moe = match arch {
        Arch::Qwen3Moe => f.moe(num_layers)?,
        Arch::Llama | Arch::Qwen3 | Arch::Gemma3 => None,
    };

    Ok(ModelConfig {
        arch,
        vocab_size: f.positive("vocab_size")?,
        hidden_size,
        intermediate_size: f.positive("intermediate_size")?,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        // HF's defaults when the key is absent.
        rms_norm_eps: f.opt_f32("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta: f.rope_theta()?,
        rope_style: RopeStyle::Neox,
        rope_scaling: f.rope_scaling()?,
        max_position_embeddings: f
            .opt_usize("max_position_embeddings")?
            .unwrap_or(match arch {
                Arch::Llama => 2048,
                Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3 => 32768,
            }),
        tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        qk_norm: matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe),
        moe,
        local_attention: None,
        scale_embeddings: false,
        post_norms: false,
        activation: Default::default(),
    })
}

/// Parse a `generation_config.json` object.
pub fn parse_generation_config(
    path: &Path,
    json: &Map<String, Value>,
) -> Result<GenerationConfig, ModelError> {
    let f = Fields { path, obj: json };
    let eos_token_ids = match f.get("eos_token_id") {
        None => Vec::new(),
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|v| token_id(path, "eos_token_id", v))
            .collect::<Result<_, _>>()?,
        Some(v) => vec![token_id(path, "eos_token_id", v)?],
    };
    Ok(GenerationConfig {
        bos_token_id: f
            .get("bos_token_id")
            .map(|v| token_id(path, "bos_token_id", v))
            .transpose()?,
        eos_token_ids,
        do_sample: f.opt_bool("do_sample")?,
        temperature: f.opt_f32("temperature")?,
        top_p: f.opt_f32("top_p")?,
        top_k: f
            .opt_usize("top_k")?
            .map(|k| u32::try_from(k).unwrap_or(u32::MAX)),
        repetition_penalty: f.opt_f32("repetition_penalty")?,
    })
}

fn token_id(path: &Path, key: &str, v: &Value) -> Result<u32, ModelError> {
    v.as_u64()
        .and_then(|id| u32::try_from(id).ok())
        .ok_or_else(|| ModelError::format(path, format!("{key}: expected a token id, got {v}")))
}

/// Typed access to the keys of one JSON object; errors name the file and the key.
struct Fields<'a> {
    path: &'a Path,
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    /// The value of `key`; JSON `null` counts as absent (HF writes `"head_dim": null`).
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn err(&self, key: &str, what: &str) -> ModelError {
        ModelError::format(self.path, format!("{key}: {what}"))
    }

    fn wrong_type(&self, key: &str, expected: &str, v: &Value) -> ModelError {
        self.err(key, &format!("expected {expected}, got {v}"))
    }

    fn str(&self, key: &str) -> Result<&'a str, ModelError> {
        match self.get(key) {
            Some(Value::String(s)) => Ok(s),
            Some(v) => Err(self.wrong_type(key, "a string", v)),
            None => Err(self.err(key, "missing")),
        }
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>, ModelError> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.wrong_type(key, "a non-negative integer", v))
            })
            .transpose()
    }

    fn positive(&self, key: &str) -> Result<usize, ModelError> {
        match self.opt_usize(key)? {
            Some(0) => Err(self.err(key, "must be positive")),
            Some(n) => Ok(n),
            None => Err(self.err(key, "missing")),
        }
    }

    fn opt_f32(&self, key: &str) -> Result<Option<f32>, ModelError> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .map(|x| x as f32)
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| self.wrong_type(key, "a finite number", v))
            })
            .transpose()
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.wrong_type(key, "true or false", v))
            })
            .transpose()
    }

    fn opt_object(&self, key: &str) -> Result<Option<Fields<'a>>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(obj)) => Ok(Some(Fields {
                path: self.path,
                obj,
            })),
            Some(v) => Err(self.wrong_type(key, "an object", v)),
        }
    }

    /// Options that change the math of the decoder Vigil runs; refuse rather than run wrongly.
    fn reject_unsupported_features(&self) -> Result<(), ModelError> {
        for key in ["attention_bias", "mlp_bias", "use_sliding_window"] {
            if self.opt_bool(key)? == Some(true) {
                return Err(ModelError::unsupported(self.path, format!("{key}: true")));
            }
        }
        if let Some(act) = self.get("hidden_act") {
            if act.as_str() != Some("silu") {
                return Err(ModelError::unsupported(
                    self.path,
                    format!("hidden_act {act} (only \"silu\")"),
                ));
            }
        }
        Ok(())
    }

    /// `rope_theta` at top level (4.x) or inside `rope_parameters` (5.x); HF default 10000.
    fn rope_theta(&self) -> Result<f32, ModelError> {
        if let Some(theta) = self.opt_f32("rope_theta")? {
            return Ok(theta);
        }
        if let Some(params) = self.opt_object("rope_parameters")? {
            if let Some(theta) = params.opt_f32("rope_theta")? {
                return Ok(theta);
            }
        }
        Ok(10000.0)
    }

    /// `rope_scaling` (4.x) or `rope_parameters` (5.x); the type is `rope_type` or legacy `type`.
    fn rope_scaling(&self) -> Result<Option<Llama3RopeScaling>, ModelError> {
        let (key, scaling) = match self.opt_object("rope_scaling")? {
            Some(s) => ("rope_scaling", s),
            None => match self.opt_object("rope_parameters")? {
                Some(s) => ("rope_parameters", s),
                None => return Ok(None),
            },
        };
        let kind = match (scaling.get("rope_type"), scaling.get("type")) {
            (Some(v), _) | (None, Some(v)) => v
                .as_str()
                .ok_or_else(|| self.wrong_type(&format!("{key}.rope_type"), "a string", v))?,
            (None, None) => return Err(self.err(&format!("{key}.rope_type"), "missing")),
        };
        match kind {
            "default" => Ok(None),
            "llama3" => {
                let num = |k: &str| {
                    scaling
                        .opt_f32(k)?
                        .ok_or_else(|| self.err(&format!("{key}.{k}"), "missing"))
                };
                let original = scaling
                    .opt_usize("original_max_position_embeddings")?
                    .ok_or_else(|| {
                        self.err(
                            &format!("{key}.original_max_position_embeddings"),
                            "missing",
                        )
                    })?;
                let s = Llama3RopeScaling {
                    factor: num("factor")?,
                    low_freq_factor: num("low_freq_factor")?,
                    high_freq_factor: num("high_freq_factor")?,
                    original_max_position_embeddings: original,
                };
                if s.factor <= 0.0 || s.high_freq_factor <= s.low_freq_factor || original == 0 {
                    return Err(self.err(key, "llama3 scaling needs factor > 0, high_freq_factor > low_freq_factor and original_max_position_embeddings > 0"));
                }
                Ok(Some(s))
            }
            other => Err(ModelError::unsupported(
                self.path,
                format!("{key} type \"{other}\" (supported: default, llama3)"),
            )),
        }
    }

    fn moe(&self, num_layers: usize) -> Result<Option<MoeConfig>, ModelError> {
        let num_experts = match self.opt_usize("num_experts")? {
            Some(n) => n,
            None => self
                .opt_usize("num_local_experts")?
                .ok_or_else(|| self.err("num_experts", "missing"))?,
        };
        // HF builds only dense layers when there are no experts.
        if num_experts == 0 {
            return Ok(None);
        }
        let num_experts_per_tok = self.positive("num_experts_per_tok")?;
        if num_experts_per_tok > num_experts {
            return Err(self.err(
                "num_experts_per_tok",
                &format!("{num_experts_per_tok} exceeds num_experts {num_experts}"),
            ));
        }
        let mlp_only_layers = match self.get("mlp_only_layers") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|i| usize::try_from(i).ok())
                        .filter(|&i| i < num_layers)
                        .ok_or_else(|| {
                            self.wrong_type(
                                "mlp_only_layers",
                                "layer indices below num_hidden_layers",
                                v,
                            )
                        })
                })
                .collect::<Result<_, _>>()?,
            Some(v) => {
                return Err(self.wrong_type("mlp_only_layers", "a list of layer indices", v))
            }
        };
        Ok(Some(MoeConfig {
            num_experts,
            num_experts_per_tok,
            moe_intermediate_size: self.positive("moe_intermediate_size")?,
            norm_topk_prob: self.opt_bool("norm_topk_prob")?.unwrap_or(false),
            decoder_sparse_step: match self.opt_usize("decoder_sparse_step")? {
                Some(0) => return Err(self.err("decoder_sparse_step", "must be positive")),
                step => step.unwrap_or(1),
            },
            mlp_only_layers,
        }))
    }
}
