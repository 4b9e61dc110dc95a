//! HF safetensors as a `TensorSource`: `model.layers.N.*` names (experts per index).

use crate::error::Result;
use crate::loader::{Part, TensorSource};
use crate::safetensors_store::SafetensorsStore;
use std::path::Path;
use vigil_kernels::QMatrix;

pub struct HfSource<'a> {
    pub store: &'a SafetensorsStore,
    pub dir: &'a Path,
}

fn part_name(part: Part) -> &'static str {
    match part {
        Part::AttnNorm => "input_layernorm",
        Part::Q => "self_attn.q_proj",
        Part::K => "self_attn.k_proj",
        Part::V => "self_attn.v_proj",
        Part::O => "self_attn.o_proj",
        Part::QNorm => "self_attn.q_norm",
        Part::KNorm => "self_attn.k_norm",
        Part::FfnNorm => "post_attention_layernorm",
        // Gemma's (HF Gemma is not loaded yet: its FFN norm is `pre_feedforward_layernorm`).
        Part::PostAttnNorm => "post_attention_layernorm",
        Part::PostFfnNorm => "post_feedforward_layernorm",
        Part::Gate => "mlp.gate_proj",
        Part::Up => "mlp.up_proj",
        Part::Down => "mlp.down_proj",
        Part::Router => "mlp.gate",
    }
}

fn layer_name(layer: usize, part: Part) -> String {
    format!("model.layers.{layer}.{}.weight", part_name(part))
}

impl TensorSource for HfSource<'_> {
    fn path(&self) -> &Path {
        self.dir
    }
    fn layer_matrix(&self, layer: usize, part: Part) -> Result<QMatrix> {
        self.store.tensor(&layer_name(layer, part))?.to_matrix()
    }
    fn layer_vector(&self, layer: usize, part: Part) -> Result<Vec<f32>> {
        Ok(self.store.tensor(&layer_name(layer, part))?.to_f32_vec())
    }
    fn expert_matrix(&self, layer: usize, e: usize, part: Part) -> Result<QMatrix> {
        let proj = part_name(part).trim_start_matches("mlp.");
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
        Ok(self.store.tensor("model.norm.weight")?.to_f32_vec())
    }
    fn output(&self) -> Result<Option<QMatrix>> {
        if self.store.contains("lm_head.weight") {
            return Ok(Some(self.store.tensor("lm_head.weight")?.to_matrix()?));
        }
        Ok(None)
    }
}
