//! Builds `ModelWeights` from a checkpoint: one code path for every format, with the format's
//! tensor names and storage behind `TensorSource`. Optional load-time quantization to Q8_0.

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::weights::{FeedForward, LayerWeights, Mlp, ModelWeights, Moe};
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::QMatrix;

/// The parts of a decoder layer, named independently of any file format.
#[derive(Debug, Clone, Copy)]
pub enum Part {
    AttnNorm,
    Q,
    K,
    V,
    O,
    QNorm,
    KNorm,
    FfnNorm,
    /// Gemma's norms of the attention and MLP outputs.
    PostAttnNorm,
    PostFfnNorm,
    Gate,
    Up,
    Down,
    Router,
}

/// Where the tensors of one checkpoint come from.
pub trait TensorSource {
    /// Path shown in errors.
    fn path(&self) -> &std::path::Path;
    fn layer_matrix(&self, layer: usize, part: Part) -> Result<QMatrix>;
    fn layer_vector(&self, layer: usize, part: Part) -> Result<Vec<f32>>;
    /// Expert `e`'s gate, up or down projection of a sparse layer.
    fn expert_matrix(&self, layer: usize, e: usize, part: Part) -> Result<QMatrix>;
    fn embedding(&self) -> Result<QMatrix>;
    fn output_norm(&self) -> Result<Vec<f32>>;
    /// The untied output projection, if the checkpoint has one.
    fn output(&self) -> Result<Option<QMatrix>>;
    /// Per-pair RoPE frequency divisors baked into the file (GGUF `rope_freqs.weight`).
    fn rope_freq_factors(&self) -> Result<Option<Vec<f32>>> {
        Ok(None)
    }
}

/// Load-time conversion of the linear layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadQuantization {
    #[default]
    AsStored,
    /// Quantize float linear weights to Q8_0 (norms and already-quantized tensors unchanged).
    Q8_0,
}

pub fn build_weights(
    config: &ModelConfig,
    src: &dyn TensorSource,
    quant: LoadQuantization,
    pool: &ThreadPool,
) -> Result<ModelWeights> {
    let q = |m: QMatrix| convert(m, quant, pool);
    let mut layers = Vec::with_capacity(config.num_layers);
    for i in 0..config.num_layers {
        let ffn = if config.is_sparse_layer(i) {
            let num_experts = config.moe.as_ref().map_or(0, |m| m.num_experts);
            let experts = (0..num_experts)
                .map(|e| {
                    Ok(Mlp {
                        gate: q(src.expert_matrix(i, e, Part::Gate)?)?,
                        up: q(src.expert_matrix(i, e, Part::Up)?)?,
                        down: q(src.expert_matrix(i, e, Part::Down)?)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            // The router stays in its stored precision: its top-k choice is sensitive to rounding.
            FeedForward::Sparse(Moe {
                router: src.layer_matrix(i, Part::Router)?,
                experts,
            })
        } else {
            FeedForward::Dense(Mlp {
                gate: q(src.layer_matrix(i, Part::Gate)?)?,
                up: q(src.layer_matrix(i, Part::Up)?)?,
                down: q(src.layer_matrix(i, Part::Down)?)?,
            })
        };
        let (q_norm, k_norm) = if config.qk_norm {
            (
                Some(src.layer_vector(i, Part::QNorm)?),
                Some(src.layer_vector(i, Part::KNorm)?),
            )
        } else {
            (None, None)
        };
        let (post_attn_norm, post_ffn_norm) = if config.post_norms {
            (
                Some(src.layer_vector(i, Part::PostAttnNorm)?),
                Some(src.layer_vector(i, Part::PostFfnNorm)?),
            )
        } else {
            (None, None)
        };
        layers.push(LayerWeights {
            attn_norm: src.layer_vector(i, Part::AttnNorm)?,
            post_attn_norm,
            post_ffn_norm,
            wq: q(src.layer_matrix(i, Part::Q)?)?,
            wk: q(src.layer_matrix(i, Part::K)?)?,
            wv: q(src.layer_matrix(i, Part::V)?)?,
            wo: q(src.layer_matrix(i, Part::O)?)?,
            q_norm,
            k_norm,
            ffn_norm: src.layer_vector(i, Part::FfnNorm)?,
            ffn,
        });
    }
    let token_embd = src.embedding()?;
    let output = match src.output()? {
        Some(m) => q(m)?,
        None => q(token_embd.clone())?,
    };
    let mut rope_inv_freq = config.rope_inv_freq();
    if let Some(factors) = src.rope_freq_factors()? {
        if factors.len() != rope_inv_freq.len() {
            return Err(ModelError::format(
                src.path(),
                format!(
                    "rope_freqs has {} entries, expected {}",
                    factors.len(),
                    rope_inv_freq.len()
                ),
            ));
        }
        for (f, d) in rope_inv_freq.iter_mut().zip(factors) {
            *f /= d;
        }
    }
    check_shapes(config, &token_embd, &output, src.path())?;
    Ok(ModelWeights {
        token_embd,
        layers,
        output_norm: src.output_norm()?,
        output,
        rope_inv_freq,
        rope_inv_freq_local: config.rope_inv_freq_local(),
    })
}

fn check_shapes(
    c: &ModelConfig,
    embd: &QMatrix,
    out: &QMatrix,
    path: &std::path::Path,
) -> Result<()> {
    if embd.cols != c.hidden_size || out.cols != c.hidden_size || out.rows != c.vocab_size {
        return Err(ModelError::format(
            path,
            format!(
                "embedding {}x{} / output {}x{} do not match hidden {} vocab {}",
                embd.rows, embd.cols, out.rows, out.cols, c.hidden_size, c.vocab_size
            ),
        ));
    }
    Ok(())
}

fn convert(m: QMatrix, quant: LoadQuantization, pool: &ThreadPool) -> Result<QMatrix> {
    // Formats without kernels of their own are widened losslessly once, here.
    let m = vigil_kernels::quant::widen::widened(&m).unwrap_or(m);
    match quant {
        LoadQuantization::AsStored => Ok(m),
        LoadQuantization::Q8_0 if m.dtype.is_quantized() || !m.cols.is_multiple_of(32) => Ok(m),
        LoadQuantization::Q8_0 => Ok(quantize_matrix_q8_0(&m, pool)),
    }
}

/// Dequantize each row to f32 and requantize it to Q8_0 blocks, the rows split over `pool`'s
/// threads (Qwen3-0.6B shape, start to first prefill: 2.40 s on one, 1.83 on two,
/// docs/benchmarks.md). The buffer is allocated here, on the loading thread, so the pool's
/// threads only write into it.
fn quantize_matrix_q8_0(m: &QMatrix, pool: &ThreadPool) -> QMatrix {
    use vigil_kernels::quant::{quantize::quantize_row_q8_0, BlockQ8_0};
    use vigil_kernels::storage::AlignedBytes;
    let blocks_per_row = m.cols / 32;
    let mut bytes = AlignedBytes::zeroed(m.rows * blocks_per_row * size_of::<BlockQ8_0>());
    // 64-byte aligned, whole blocks: a slice of blocks in place.
    let blocks: &mut [BlockQ8_0] = bytemuck::cast_slice_mut(bytes.as_bytes_mut());
    pool.for_row_chunks(blocks, blocks_per_row, 8, |r0, rows| {
        let mut row = vec![0f32; m.cols];
        for (i, out) in rows.chunks_exact_mut(blocks_per_row).enumerate() {
            vigil_kernels::quant::dequant::dequantize_row(m, r0 + i, &mut row);
            quantize_row_q8_0(&row, out);
        }
    });
    QMatrix {
        layout: vigil_kernels::Layout::Rows,
        dtype: vigil_kernels::DType::Q8_0,
        rows: m.rows,
        cols: m.cols,
        data: vigil_kernels::WeightData::Owned(std::sync::Arc::new(bytes)),
    }
}
