//! HF safetensors as a `TensorSource`: `model.layers.N.*` names (experts per index).

use crate::config::Arch;
use crate::error::Result;
use crate::loader::{Part, TensorSource};
use crate::safetensors_store::SafetensorsStore;
use std::path::Path;
use vigil_kernels::QMatrix;

pub struct HfSource<'a> {
    pub store: &'a SafetensorsStore,
    pub dir: &'a Path,
    /// Gemma names its norms differently and stores their weights as `w` for `x · (1 + w)`.
    pub arch: Arch,
}

fn part_name(arch: Arch, part: Part) -> &'static str {
    let gemma = arch == Arch::Gemma3;
    match part {
        Part::AttnNorm => "input_layernorm",
        Part::Q => "self_attn.q_proj",
        Part::K => "self_attn.k_proj",
        Part::V => "self_attn.v_proj",
        Part::O => "self_attn.o_proj",
        Part::QNorm => "self_attn.q_norm",
        Part::KNorm => "self_attn.k_norm",
        // Gemma's `post_attention_layernorm` normalizes the attention output (PostAttnNorm).
        Part::FfnNorm if gemma => "pre_feedforward_layernorm",
        Part::FfnNorm => "post_attention_layernorm",
        Part::PostAttnNorm => "post_attention_layernorm",
        Part::PostFfnNorm => "post_feedforward_layernorm",
        Part::Gate => "mlp.gate_proj",
        Part::Up => "mlp.up_proj",
        Part::Down => "mlp.down_proj",
        Part::Router => "mlp.gate",
    }
}

impl HfSource<'_> {
    fn layer_name(&self, layer: usize, part: Part) -> String {
        format!("model.layers.{layer}.{}.weight", part_name(self.arch, part))
    }

    /// An RMSNorm weight as the multiplier the kernels apply: HF Gemma's `Gemma3RMSNorm`
    /// computes `x · (1 + w)` (in f32) from the stored `w` (GGUF converters add the 1).
    fn norm(&self, name: &str) -> Result<Vec<f32>> {
        let mut w = self.store.tensor(name)?.to_f32_vec();
        if self.arch == Arch::Gemma3 {
            w.iter_mut().for_each(|x| *x += 1.0);
        }
        Ok(w)
    }
}

impl TensorSource for HfSource<'_> {
    fn path(&self) -> &Path {
        self.dir
    }
    fn layer_matrix(&self, layer: usize, part: Part) -> Result<QMatrix> {
        self.store
            .tensor(&self.layer_name(layer, part))?
            .to_matrix()
    }
    /// Every per-layer vector is a norm weight.
    fn layer_vector(&self, layer: usize, part: Part) -> Result<Vec<f32>> {
        self.norm(&self.layer_name(layer, part))
    }
    fn expert_matrix(&self, layer: usize, e: usize, part: Part) -> Result<QMatrix> {
        let proj = part_name(self.arch, part).trim_start_matches("mlp.");
        self.store
            .tensor(&format!(
                "model.layers.{layer}.mlp.experts.{e}.{proj}.weight"
            ))?
            .to_matrix()
    }
    fn embedding(&self) -> Result<QMatrix> {
        self.store.tensor("model.embed_tokens.weight")?.to_matrix()
    }
    fn output_norm(&self) -> Result<Vec<f32>> {
        self.norm("model.norm.weight")
    }
    fn output(&self) -> Result<Option<QMatrix>> {
        if self.store.contains("lm_head.weight") {
            return Ok(Some(self.store.tensor("lm_head.weight")?.to_matrix()?));
        }
        Ok(None)
    }
}
