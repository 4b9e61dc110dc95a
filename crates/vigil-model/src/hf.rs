//! Hugging Face checkpoint directories: `config.json` → [`ModelConfig`] and
//! `generation_config.json` → [`GenerationConfig`]. The weights are read by
//! [`SafetensorsStore`] (re-exported here so one module covers an HF directory).
//!
//! Both key styles found in the wild are accepted: transformers 4.x (`rope_theta`,
//! `rope_scaling`, `num_experts`; Gemma 3's `rope_local_base_freq`, `sliding_window_pattern`)
//! and 5.x (`rope_parameters`, per layer type for Gemma 3; `num_local_experts`; `layer_types`).

use crate::config::{
    Activation, Arch, Llama3RopeScaling, LocalAttention, ModelConfig, MoeConfig, RopeStyle,
};
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
        "gemma3_text" => Arch::Gemma3,
        other => {
            return Err(ModelError::unsupported(
                path,
                format!("model_type \"{other}\" (supported: llama, qwen3, qwen3_moe, gemma3_text; for Gemma 3 only the text-only Gemma3ForCausalLM)"),
            ))
        }
    };
    let gemma = arch == Arch::Gemma3;
    f.reject_unsupported_features(arch)?;

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
        // Gemma3TextConfig's default.
        None if gemma => 256,
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
    // Gemma 3: sliding-window layers with a RoPE base of their own, no RoPE scaling.
    let (rope_theta, rope_scaling, local_attention) = if gemma {
        let (global_theta, local_theta) = f.gemma3_rope_thetas()?;
        let local = f
            .gemma3_local_layers(num_layers)?
            .map(|(window, pattern)| LocalAttention {
                window,
                pattern,
                rope_theta: local_theta,
            });
        (global_theta, None, local)
    } else {
        (f.rope_theta()?, f.rope_scaling()?, None)
    };
    let query_pre_attn_scalar = if gemma {
        // Gemma3TextConfig's default.
        let s = f.opt_f32("query_pre_attn_scalar")?.unwrap_or(256.0);
        if s <= 0.0 {
            return Err(f.err("query_pre_attn_scalar", "must be positive"));
        }
        Some(s)
    } else {
        None
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
        rope_theta,
        rope_style: RopeStyle::Neox,
        rope_scaling,
        max_position_embeddings: f
            .opt_usize("max_position_embeddings")?
            .unwrap_or(match arch {
                Arch::Llama => 2048,
                Arch::Qwen3 | Arch::Qwen3Moe => 32768,
                Arch::Gemma3 => 131_072,
            }),
        // Gemma ties by default; the others do not.
        tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(gemma),
        qk_norm: matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3),
        moe,
        local_attention,
        // Gemma: embeddings × √hidden, norms after attention and MLP, GeGLU. (Its norm weights
        // are used as `1 + w`: the HF tensor source adds the 1.)
        scale_embeddings: gemma,
        post_norms: gemma,
        activation: if gemma {
            Activation::GeluTanh
        } else {
            Activation::Silu
        },
        query_pre_attn_scalar,
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
    fn reject_unsupported_features(&self, arch: Arch) -> Result<(), ModelError> {
        for key in [
            "attention_bias",
            "mlp_bias",
            "use_sliding_window",
            "use_bidirectional_attention",
        ] {
            if self.opt_bool(key)? == Some(true) {
                return Err(ModelError::unsupported(self.path, format!("{key}: true")));
            }
        }
        // Gemma 2's tanh capping of scores / logits (Gemma 3 sets neither).
        for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
            if let Some(v) = self.get(key) {
                return Err(ModelError::unsupported(
                    self.path,
                    format!("{key} {v} (logit soft-capping is not implemented; only null)"),
                ));
            }
        }
        // HF Gemma reads its activation from `hidden_activation` (and ignores `hidden_act`).
        let (key, only) = match arch {
            Arch::Gemma3 => ("hidden_activation", "gelu_pytorch_tanh"),
            Arch::Llama | Arch::Qwen3 | Arch::Qwen3Moe => ("hidden_act", "silu"),
        };
        if let Some(act) = self.get(key) {
            if act.as_str() != Some(only) {
                return Err(ModelError::unsupported(
                    self.path,
                    format!("{key} {act} (only \"{only}\")"),
                ));
            }
        }
        Ok(())
    }

    /// Gemma 3's RoPE bases (global layers, sliding layers): `rope_parameters.full_attention`
    /// and `.sliding_attention` (5.x), or `rope_theta` and `rope_local_base_freq` (4.x), with
    /// Gemma3TextConfig's defaults 1e6 and 1e4. Only the default RoPE type is supported.
    fn gemma3_rope_thetas(&self) -> Result<(f32, f32), ModelError> {
        let mut global = self.opt_f32("rope_theta")?;
        let mut local = self.opt_f32("rope_local_base_freq")?;
        let check_type = |key: &str, params: &Fields| -> Result<(), ModelError> {
            match params.get("rope_type").or_else(|| params.get("type")) {
                None => Ok(()),
                Some(Value::String(t)) if t == "default" => Ok(()),
                Some(Value::String(t)) => Err(ModelError::unsupported(
                    self.path,
                    format!("{key} type \"{t}\" (Gemma 3: only default)"),
                )),
                Some(v) => Err(self.wrong_type(&format!("{key}.rope_type"), "a string", v)),
            }
        };
        if let Some(scaling) = self.opt_object("rope_scaling")? {
            check_type("rope_scaling", &scaling)?;
        }
        if let Some(params) = self.opt_object("rope_parameters")? {
            for (layer_type, theta) in [
                ("full_attention", &mut global),
                ("sliding_attention", &mut local),
            ] {
                let key = format!("rope_parameters.{layer_type}");
                let Some(p) = params.opt_object(layer_type)? else {
                    return Err(
                        self.err(&key, "missing (Gemma 3 has RoPE parameters per layer type)")
                    );
                };
                check_type(&key, &p)?;
                if let Some(t) = p.opt_f32("rope_theta")? {
                    *theta = Some(t);
                }
            }
        }
        Ok((global.unwrap_or(1_000_000.0), local.unwrap_or(10_000.0)))
    }

    /// Gemma 3's sliding-window layers as (window, pattern): `layer_types` (each
    /// `"sliding_attention"` or `"full_attention"`), else every `sliding_window_pattern`-th
    /// layer (default 6) global, as Gemma3TextConfig builds them; `None` when no layer slides.
    /// Vigil runs periodic patterns (layer `i` global iff `(i + 1) % pattern == 0`) only.
    fn gemma3_local_layers(&self, num_layers: usize) -> Result<Option<(usize, usize)>, ModelError> {
        let sliding: Vec<bool> = match self.get("layer_types") {
            Some(Value::Array(types)) => {
                if types.len() != num_layers {
                    return Err(self.err(
                        "layer_types",
                        &format!("{} entries for {num_layers} layers", types.len()),
                    ));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("sliding_attention") => Ok(true),
                        Some("full_attention") => Ok(false),
                        _ => Err(ModelError::unsupported(
                            self.path,
                            format!("layer_types entry {t} (supported: \"sliding_attention\", \"full_attention\")"),
                        )),
                    })
                    .collect::<Result<_, _>>()?
            }
            Some(v) => return Err(self.wrong_type("layer_types", "a list of layer types", v)),
            None => {
                let pattern = match self.opt_usize("sliding_window_pattern")? {
                    Some(0) => return Err(self.err("sliding_window_pattern", "must be positive")),
                    p => p.unwrap_or(6),
                };
                (0..num_layers).map(|i| (i + 1) % pattern != 0).collect()
            }
        };
        if !sliding.contains(&true) {
            return Ok(None);
        }
        // 0: every layer slides (`ModelConfig::layer_window`).
        let pattern = sliding.iter().position(|s| !s).map_or(0, |i| i + 1);
        let periodic = sliding
            .iter()
            .enumerate()
            .all(|(i, &s)| s == (pattern == 0 || (i + 1) % pattern != 0));
        if !periodic {
            let full: Vec<usize> = (0..num_layers).filter(|&i| !sliding[i]).collect();
            return Err(ModelError::unsupported(
                self.path,
                format!("layer_types with full_attention at layers {full:?} (supported: every n-th layer, the others sliding_attention)"),
            ));
        }
        let window = self.opt_usize("sliding_window")?.unwrap_or(4096);
        if window == 0 {
            return Err(self.err("sliding_window", "must be positive"));
        }
        Ok(Some((window, pattern)))
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
