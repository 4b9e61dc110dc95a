//! The decoder's hyper-parameters. Llama, Qwen3, Qwen3-MoE and Gemma 3 are one decoder; what
//! differs between them is data here (per-head q/k norms, routed experts, RoPE style and
//! scaling, sliding-window layers, norms around the blocks, the MLP's activation, the attention
//! scale).

/// The architecture family, as named by HF `model_type` / GGUF `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen3,
    Qwen3Moe,
    Gemma3,
}

/// The gated MLP's activation: `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// SwiGLU (Llama, Qwen).
    #[default]
    Silu,
    /// GeGLU with tanh-approximated GELU (Gemma).
    GeluTanh,
}

/// Sliding-window (local) attention layers interleaved with global ones (Gemma 3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LocalAttention {
    /// Keys a local layer's query sees, itself included.
    pub window: usize,
    /// Every `pattern`-th layer (1-based) is global; the others are local.
    pub pattern: usize,
    /// RoPE base of the local layers (global ones use `rope_theta`).
    pub rope_theta: f32,
}

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: GGUF Llama, whose converter permuted the Q/K rows.
    Interleaved,
    /// Halves `(i, i + d/2)`: HF checkpoints (`rotate_half`) and GGUF Qwen.
    Neox,
}

/// Llama 3.x frequency scaling (`rope_scaling.rope_type == "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position_embeddings: usize,
}

/// Routed experts of a Qwen3-MoE layer.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    /// Renormalize the top-k routing weights to sum to 1.
    pub norm_topk_prob: bool,
    /// Layer `i` is sparse when `(i + 1) % decoder_sparse_step == 0` and `i` is not in `mlp_only_layers`.
    pub decoder_sparse_step: usize,
    pub mlp_only_layers: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Dense MLP width (unused by sparse layers).
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    pub rope_scaling: Option<Llama3RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    pub moe: Option<MoeConfig>,
    /// Sliding-window layers (Gemma 3); `None`: every layer attends to the whole context.
    pub local_attention: Option<LocalAttention>,
    /// Embeddings multiplied by √hidden (Gemma).
    pub scale_embeddings: bool,
    /// RMSNorm of the attention and MLP outputs before each residual add (Gemma's
    /// `post_attention_norm` / `post_feedforward_layernorm`).
    pub post_norms: bool,
    pub activation: Activation,
    /// Attention scores are scaled by `1/√query_pre_attn_scalar` (HF Gemma's key); `None`:
    /// by `1/√head_dim`.
    pub query_pre_attn_scalar: Option<f32>,
}

impl ModelConfig {
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// KV heads and their size, as `KvCache::new` takes them.
    pub fn kv_shape(&self) -> (usize, usize) {
        (self.num_kv_heads, self.head_dim)
    }

    /// The factor of the attention scores `q · k`.
    pub fn attn_scale(&self) -> f32 {
        match self.query_pre_attn_scalar {
            Some(s) => 1.0 / s.sqrt(),
            None => vigil_kernels::attention::AttnShape::default_scale(self.head_dim),
        }
    }

    /// Layer `i`'s attention window: `Some` on a local (sliding-window) layer.
    pub fn layer_window(&self, i: usize) -> Option<usize> {
        let l = self.local_attention?;
        (l.pattern == 0 || !(i + 1).is_multiple_of(l.pattern)).then_some(l.window)
    }

    /// The local (sliding-window) layers, in order.
    pub fn window_layers(&self) -> Vec<usize> {
        (0..self.num_layers)
            .filter(|&l| self.layer_window(l).is_some())
            .collect()
    }

    /// Whether layer `i` routes through experts.
    pub fn is_sparse_layer(&self, i: usize) -> bool {
        match &self.moe {
            Some(m) => {
                m.decoder_sparse_step > 0
                    && (i + 1).is_multiple_of(m.decoder_sparse_step)
                    && !m.mlp_only_layers.contains(&i)
            }
            None => false,
        }
    }

    /// Inverse frequency of each rotated pair, with Llama 3 scaling applied when configured.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        self.rope_inv_freq_for(self.rope_theta)
    }

    /// The local layers' inverse frequencies, when they have a base of their own.
    pub fn rope_inv_freq_local(&self) -> Option<Vec<f32>> {
        self.local_attention
            .map(|l| self.rope_inv_freq_for(l.rope_theta))
    }

    fn rope_inv_freq_for(&self, theta: f32) -> Vec<f32> {
        let half = self.head_dim / 2;
        (0..half)
            .map(|i| {
                let inv = 1.0 / (theta as f64).powf(2.0 * i as f64 / self.head_dim as f64);
                match &self.rope_scaling {
                    None => inv as f32,
                    Some(s) => llama3_scale_inv_freq(inv, s) as f32,
                }
            })
            .collect()
    }
}

/// HF `_compute_llama3_parameters`: long wavelengths are slowed by `factor`, short ones kept,
/// and the band between is interpolated smoothly.
fn llama3_scale_inv_freq(inv_freq: f64, s: &Llama3RopeScaling) -> f64 {
    let old_ctx = s.original_max_position_embeddings as f64;
    let low_freq_wavelen = old_ctx / s.low_freq_factor as f64;
    let high_freq_wavelen = old_ctx / s.high_freq_factor as f64;
    let wavelen = 2.0 * std::f64::consts::PI / inv_freq;
    if wavelen < high_freq_wavelen {
        inv_freq
    } else if wavelen > low_freq_wavelen {
        inv_freq / s.factor as f64
    } else {
        let smooth = (old_ctx / wavelen - s.low_freq_factor as f64)
            / (s.high_freq_factor as f64 - s.low_freq_factor as f64);
        (1.0 - smooth) * inv_freq / s.factor as f64 + smooth * inv_freq
    }
}
