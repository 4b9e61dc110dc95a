//! GGUF as a `TensorSource`: llama.cpp's tensor names, the config from `{arch}.*` metadata,
//! and the embedded vocabulary.

use crate::config::{Activation, Arch, LocalAttention, ModelConfig, MoeConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::loader::{Part, TensorSource};
use crate::tokenizer::GgufVocab;
use vigil_kernels::QMatrix;

pub struct GgufSource<'a> {
    pub file: &'a GgufFile,
}

fn part_name(part: Part) -> &'static str {
    match part {
        Part::AttnNorm => "attn_norm",
        Part::Q => "attn_q",
        Part::K => "attn_k",
        Part::V => "attn_v",
        Part::O => "attn_output",
        Part::QNorm => "attn_q_norm",
        Part::KNorm => "attn_k_norm",
        Part::FfnNorm => "ffn_norm",
        Part::PostAttnNorm => "post_attention_norm",
        Part::PostFfnNorm => "post_ffw_norm",
        Part::Gate => "ffn_gate",
        Part::Up => "ffn_up",
        Part::Down => "ffn_down",
        Part::Router => "ffn_gate_inp",
    }
}

impl TensorSource for GgufSource<'_> {
    fn path(&self) -> &std::path::Path {
        &self.file.path
    }
    fn layer_matrix(&self, layer: usize, part: Part) -> Result<QMatrix> {
        self.file
            .tensor_matrix(&format!("blk.{layer}.{}.weight", part_name(part)))
    }
    fn layer_vector(&self, layer: usize, part: Part) -> Result<Vec<f32>> {
        self.file
            .tensor_f32(&format!("blk.{layer}.{}.weight", part_name(part)))
    }
    fn expert_matrix(&self, layer: usize, e: usize, part: Part) -> Result<QMatrix> {
        let name = format!("blk.{layer}.{}_exps.weight", part_name(part));
        let mut all = self.file.tensor_matrices(&name)?;
        if e >= all.len() {
            return Err(ModelError::format(
                &self.file.path,
                format!(
                    "tensor '{name}' has {} experts, expert {e} asked for",
                    all.len()
                ),
            ));
        }
        Ok(all.swap_remove(e))
    }
    fn embedding(&self) -> Result<QMatrix> {
        self.file.tensor_matrix("token_embd.weight")
    }
    fn output_norm(&self) -> Result<Vec<f32>> {
        self.file.tensor_f32("output_norm.weight")
    }
    fn output(&self) -> Result<Option<QMatrix>> {
        match self.file.tensor("output.weight") {
            Some(_) => Ok(Some(self.file.tensor_matrix("output.weight")?)),
            None => Ok(None),
        }
    }
    fn rope_freq_factors(&self) -> Result<Option<Vec<f32>>> {
        match self.file.tensor("rope_freqs.weight") {
            Some(_) => Ok(Some(self.file.tensor_f32("rope_freqs.weight")?)),
            None => Ok(None),
        }
    }
}

/// The decoder config from `{arch}.*` keys.
pub fn gguf_config(f: &GgufFile) -> Result<ModelConfig> {
    let arch_name = f
        .architecture()
        .ok_or_else(|| ModelError::format(&f.path, "missing general.architecture"))?;
    let arch = match arch_name {
        "llama" => Arch::Llama,
        "qwen3" => Arch::Qwen3,
        "qwen3moe" => Arch::Qwen3Moe,
        "gemma3" => Arch::Gemma3,
        other => {
            return Err(ModelError::unsupported(
                &f.path,
                format!("architecture '{other}' (supported: llama, qwen3, qwen3moe, gemma3)"),
            ))
        }
    };
    let key = |k: &str| format!("{arch_name}.{k}");
    let req = |k: &str| {
        f.get_u32(&key(k)).map(|v| v as usize).ok_or_else(|| {
            ModelError::format(
                &f.path,
                format!("missing or non-integer metadata '{}'", key(k)),
            )
        })
    };
    let hidden_size = req("embedding_length")?;
    let num_heads = req("attention.head_count")?;
    if num_heads == 0 {
        return Err(ModelError::format(&f.path, "attention.head_count is 0"));
    }
    let num_kv_heads = f
        .get_u32(&key("attention.head_count_kv"))
        .map_or(num_heads, |v| v as usize);
    let head_dim = f
        .get_u32(&key("attention.key_length"))
        .map_or(hidden_size / num_heads, |v| v as usize);
    if num_kv_heads == 0 || num_heads % num_kv_heads != 0 || !head_dim.is_multiple_of(2) {
        return Err(ModelError::format(&f.path, format!("bad head geometry: {num_heads} heads, {num_kv_heads} kv heads, head_dim {head_dim}")));
    }
    let vocab_size = match f.get_u32(&key("vocab_size")) {
        Some(v) => v as usize,
        None => f
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| ModelError::format(&f.path, "no token_embd.weight"))?
            as usize,
    };
    let moe = if arch == Arch::Qwen3Moe {
        Some(MoeConfig {
            num_experts: req("expert_count")?,
            num_experts_per_tok: req("expert_used_count")?,
            moe_intermediate_size: req("expert_feed_forward_length")?,
            norm_topk_prob: f.get_bool(&key("expert_weights_norm")).unwrap_or(true),
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
        })
    } else {
        None
    };
    let gemma = arch == Arch::Gemma3;
    // llama.cpp's Gemma 3: every 6th layer global, the rest local with RoPE base 10,000
    // (neither is in the file); the window is `attention.sliding_window`.
    let local_attention = match f.get_u32(&key("attention.sliding_window")) {
        Some(w) if gemma => Some(LocalAttention {
            window: w as usize,
            pattern: 6,
            rope_theta: 10_000.0,
        }),
        _ => None,
    };
    Ok(ModelConfig {
        arch,
        vocab_size,
        hidden_size,
        intermediate_size: f
            .get_u32(&key("feed_forward_length"))
            .map_or(0, |v| v as usize),
        num_layers: req("block_count")?,
        num_heads,
        num_kv_heads,
        head_dim,
        rms_norm_eps: f
            .get_f32(&key("attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-6),
        rope_theta: f.get_f32(&key("rope.freq_base")).unwrap_or(10000.0),
        // llama.cpp's converter permutes Llama's Q/K rows for adjacent-pair RoPE; Qwen keeps NeoX.
        rope_style: if arch == Arch::Llama {
            RopeStyle::Interleaved
        } else {
            RopeStyle::Neox
        },
        rope_scaling: None, // Llama 3 scaling arrives baked into `rope_freqs.weight`.
        max_position_embeddings: req("context_length")?,
        tie_word_embeddings: f.tensor("output.weight").is_none(),
        qk_norm: f.tensor("blk.0.attn_q_norm.weight").is_some(),
        moe,
        local_attention,
        // Gemma's converter already adds 1 to its norm weights (HF stores `w - 1`).
        scale_embeddings: gemma,
        post_norms: f.tensor("blk.0.post_attention_norm.weight").is_some(),
        activation: if gemma {
            Activation::GeluTanh
        } else {
            Activation::Silu
        },
        // 1/√head_dim. (llama.cpp uses 1/√(hidden/heads) for the 62-layer Gemma 3 27B, whose HF
        // query_pre_attn_scalar is that; the file does not say, and Vigil does not guess it.)
        query_pre_attn_scalar: None,
    })
}

/// The `tokenizer.ggml.*` vocabulary.
pub fn gguf_vocab(f: &GgufFile) -> Result<GgufVocab> {
    let tokens = f
        .get_str_array("tokenizer.ggml.tokens")
        .ok_or_else(|| ModelError::format(&f.path, "missing tokenizer.ggml.tokens"))?;
    Ok(GgufVocab {
        model: f
            .get_str("tokenizer.ggml.model")
            .unwrap_or("gpt2")
            .to_string(),
        pre: f.get_str("tokenizer.ggml.pre").map(str::to_string),
        tokens: tokens.into_iter().map(str::to_string).collect(),
        token_types: f
            .get_i32_array("tokenizer.ggml.token_type")
            .unwrap_or_default(),
        // llama.cpp also accepts integer scores.
        scores: (f.get_f32_array("tokenizer.ggml.scores"))
            .or_else(|| {
                let ints = f.get_i32_array("tokenizer.ggml.scores")?;
                Some(ints.into_iter().map(|s| s as f32).collect())
            })
            .unwrap_or_default(),
        merges: f
            .get_str_array("tokenizer.ggml.merges")
            .unwrap_or_default()
            .into_iter()
            .map(str::to_string)
            .collect(),
        bos_token_id: f.get_u32("tokenizer.ggml.bos_token_id"),
        eos_token_id: f.get_u32("tokenizer.ggml.eos_token_id"),
        eot_token_id: f.get_u32("tokenizer.ggml.eot_token_id"),
        unknown_token_id: f.get_u32("tokenizer.ggml.unknown_token_id"),
        padding_token_id: f.get_u32("tokenizer.ggml.padding_token_id"),
        add_bos_token: f.get_bool("tokenizer.ggml.add_bos_token"),
        add_eos_token: f.get_bool("tokenizer.ggml.add_eos_token"),
        add_space_prefix: f.get_bool("tokenizer.ggml.add_space_prefix"),
        chat_template: f.get_str("tokenizer.chat_template").map(str::to_string),
    })
}
