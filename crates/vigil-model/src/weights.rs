//! The decoder's weights, whatever file they came from. Linear layers are `QMatrix` in any
//! format the kernels multiply (F32/F16/BF16/Q8_0/Q4_x/Qk_K); norms are plain f32.

use vigil_kernels::QMatrix;

/// A gated MLP: `down(act(gate(x)) * up(x))` (SwiGLU or GeGLU, `ModelConfig::activation`).
#[derive(Debug, Clone)]
pub struct Mlp {
    pub gate: QMatrix,
    pub up: QMatrix,
    pub down: QMatrix,
}

/// Routed experts: a router picks `num_experts_per_tok` of `experts` per token.
#[derive(Debug, Clone)]
pub struct Moe {
    pub router: QMatrix,
    pub experts: Vec<Mlp>,
}

#[derive(Debug, Clone)]
pub enum FeedForward {
    Dense(Mlp),
    Sparse(Moe),
}

#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wq: QMatrix,
    pub wk: QMatrix,
    pub wv: QMatrix,
    pub wo: QMatrix,
    /// Per-head RMSNorm weights of q and k (Qwen3), `head_dim` each.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: FeedForward,
    /// Gemma's norms of the attention and MLP outputs, before each residual add.
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_ffn_norm: Option<Vec<f32>>,
}

#[derive(Debug, Clone)]
pub struct ModelWeights {
    /// `vocab × hidden`; rows are dequantized on lookup.
    pub token_embd: QMatrix,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>,
    /// `vocab × hidden`; the embedding itself when tied.
    pub output: QMatrix,
    /// RoPE inverse frequencies per rotated pair, scaling already applied.
    pub rope_inv_freq: Vec<f32>,
    /// Those of the sliding-window layers, when their base differs (Gemma 3).
    pub rope_inv_freq_local: Option<Vec<f32>>,
}

impl ModelWeights {
    /// The RoPE frequencies of a layer with this attention window.
    pub fn rope_inv_freq_for(&self, window: Option<usize>) -> &[f32] {
        match (&self.rope_inv_freq_local, window) {
            (Some(local), Some(_)) => local,
            _ => &self.rope_inv_freq,
        }
    }
}
