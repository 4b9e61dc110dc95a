//! The decoder's weights, whatever file they came from. Linear layers are `QMatrix` in any
//! format the kernels multiply (F32/F16/BF16/Q8_0/Q4_x/Qk_K); norms are plain f32.

use std::collections::HashMap;
use std::sync::Arc;
use vigil_kernels::storage::resident_copy;
use vigil_kernels::{QMatrix, WeightData};

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
    /// Every matrix (a tied output and its embedding are two entries viewing the same bytes).
    fn matrices_mut(&mut self) -> Vec<&mut QMatrix> {
        let mut all = vec![&mut self.token_embd, &mut self.output];
        for l in &mut self.layers {
            all.extend([&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo]);
            match &mut l.ffn {
                FeedForward::Dense(m) => all.extend([&mut m.gate, &mut m.up, &mut m.down]),
                FeedForward::Sparse(moe) => {
                    all.push(&mut moe.router);
                    for m in &mut moe.experts {
                        all.extend([&mut m.gate, &mut m.up, &mut m.down]);
                    }
                }
            }
        }
        all
    }

    /// Moves every matrix still viewing the checkpoint's file mapping into one resident buffer
    /// (`storage::resident_copy`), 64-byte aligned each; bytes viewed twice (a tied output)
    /// are copied once. Matrices converted at load own their bytes already and stay as they
    /// are, so nothing the model no longer reads is copied.
    pub fn make_resident(&mut self) -> std::io::Result<()> {
        let mut mats = self.matrices_mut();
        // Source (address, length) → offset in the copy.
        let mut placed: HashMap<(usize, usize), usize> = HashMap::new();
        let mut parts = Vec::new();
        let mut len = 0;
        for m in &mats {
            if let WeightData::Mapped { .. } = m.data {
                let bytes = m.data.bytes();
                placed
                    .entry((bytes.as_ptr() as usize, bytes.len()))
                    .or_insert_with(|| {
                        let at = len;
                        parts.push((at, bytes));
                        len = (at + bytes.len()).next_multiple_of(64);
                        at
                    });
            }
        }
        if parts.is_empty() {
            return Ok(());
        }
        let map = Arc::new(resident_copy(len, &parts)?);
        drop(parts);
        for m in &mut mats {
            if let WeightData::Mapped { .. } = m.data {
                let bytes = m.data.bytes();
                let offset = placed[&(bytes.as_ptr() as usize, bytes.len())];
                m.data = WeightData::Mapped {
                    map: map.clone(),
                    offset,
                    len: bytes.len(),
                };
            }
        }
        Ok(())
    }

    /// The RoPE frequencies of a layer with this attention window.
    pub fn rope_inv_freq_for(&self, window: Option<usize>) -> &[f32] {
        match (&self.rope_inv_freq_local, window) {
            (Some(local), Some(_)) => local,
            _ => &self.rope_inv_freq,
        }
    }
}
