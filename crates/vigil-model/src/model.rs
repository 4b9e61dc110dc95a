//! The decoder forward pass over a flat batch, read top to bottom: embed (scaled by √hidden on
//! Gemma) → per layer (norm, QKV, q/k norm, RoPE, KV write, paged attention over the whole
//! context or a sliding window, output projection, post-norm on Gemma, residual, norm, MLP or
//! routed experts, post-norm on Gemma, residual) → final norm → logits for the rows that
//! sample.

use crate::config::{Activation, ModelConfig, RopeStyle};
use crate::kv_buf::KvBuf;
use crate::kv_cache::{KvCache, KvLayers};
use crate::step_input::StepInput;
use crate::weights::{FeedForward, Mlp, ModelWeights, Moe};
use std::sync::Arc;
use vigil_kernels::attention::{paged_attention, write_kv, AttnSeq, AttnShape, KvElem};
use vigil_kernels::matmul::{matmul, matmul_group};
use vigil_kernels::ops::{
    add_inplace, gelu_tanh_mul_inplace, rmsnorm, rmsnorm_rows_inplace, silu_mul_inplace,
    softmax_inplace, RopeTable,
};
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::quant::dequant::dequantize_row;

/// Rows a thread must get before a row-wise step (norms, RoPE, residual adds, the gated
/// activation) is split across the pool; decode steps stay on the calling thread.
const ROWS_PER_TASK: usize = 16;

/// Activation buffers, grown to the largest step seen and reused (no allocation per step).
#[derive(Default)]
struct RunState {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    router: Vec<f32>,
    /// MoE: rows routed to one expert, gathered, and each token's per-choice expert outputs.
    expert_in: Vec<f32>,
    expert_out: Vec<f32>,
    choice_out: Vec<f32>,
    sampled: Vec<f32>,
    logits: Vec<f32>,
    /// The step's rotary angles: `[0]` with the global frequencies, `[1]` with the sliding
    /// window layers' own (Gemma 3), when the model has them.
    rope: [RopeTable; 2],
}

fn sized(buf: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    &mut buf[..n]
}

/// Sees the intermediate activations of a step, named as llama.cpp names its graph nodes
/// (`attn_norm`, `Qcur`, `kqv_out`, `l_out`, ... with the layer; `result_norm`,
/// `result_output` without), each `rows × width` row-major. For comparing the forward pass
/// with another implementation layer by layer (`examples/dump_layers.rs`), and for timing the
/// parts of a step between the points (`bench_core --breakdown`).
pub type Probe = Box<dyn FnMut(&str, Option<usize>, &[f32]) + Send>;

pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    /// When set, `forward` hands it every intermediate activation (debugging and timing only:
    /// a probe that copies them slows the step).
    pub probe: Option<Probe>,
    pool: Arc<ThreadPool>,
    state: RunState,
}

impl Model {
    pub fn new(config: ModelConfig, weights: ModelWeights, pool: Arc<ThreadPool>) -> Self {
        Model {
            config,
            weights,
            probe: None,
            pool,
            state: RunState::default(),
        }
    }

    /// Run on `other`'s kernel threads instead of this model's own (a draft model beside its
    /// target: the two never run at once, and one pool spinning idle beside the other would
    /// take a core from it).
    pub fn share_pool(&mut self, other: &Model) {
        self.pool = other.pool.clone();
    }

    /// The kernel threads this model runs on.
    pub fn pool(&self) -> &Arc<ThreadPool> {
        &self.pool
    }

    /// Move KV rows (source slot, destination slot) `delta` positions, re-rotating the keys
    /// with this model's RoPE (see `KvCache::move_rows_rotating_keys`). The moved tokens'
    /// KV still reflects the context they were computed in: an approximation.
    pub fn shift_kv(&self, kv: &mut KvCache, moves: &[(usize, usize)], delta: i64) {
        let c = &self.config;
        let interleaved = c.rope_style == RopeStyle::Interleaved;
        let w = &self.weights;
        kv.move_rows_rotating_keys(moves, |layer, row| {
            let inv_freq = w.rope_inv_freq_for(c.layer_window(layer));
            vigil_kernels::ops::rope_shift(row, c.head_dim, delta, inv_freq, interleaved)
        });
    }

    /// Run one step; returns `sample_rows.len() × vocab` logits.
    pub fn forward(&mut self, input: &StepInput, kv: &mut KvCache) -> &[f32] {
        let c = &self.config;
        let w = &self.weights;
        let pool = &*self.pool;
        let s = &mut self.state;
        let mut see = |name: &str, layer: Option<usize>, data: &[f32]| {
            if let Some(probe) = self.probe.as_mut() {
                probe(name, layer, data);
            }
        };
        let (t, h) = (input.num_tokens(), c.hidden_size);
        let (q_dim, kv_dim) = (c.q_dim(), c.kv_dim());

        let x = sized(&mut s.x, t * h);
        for (row, &tok) in x.chunks_exact_mut(h).zip(&input.token_ids) {
            dequantize_row(&w.token_embd, tok as usize, row);
        }
        if c.scale_embeddings {
            let scale = (h as f32).sqrt();
            x.iter_mut().for_each(|v| *v *= scale);
        }
        see("embd", None, x);

        let mut query_start = 0;
        let seqs: Vec<AttnSeq> = input
            .seqs
            .iter()
            .map(|sq| {
                let a = AttnSeq {
                    query_start,
                    query_len: sq.query_len,
                    context_len: sq.context_len,
                    block_table: &sq.block_table,
                };
                query_start += sq.query_len;
                a
            })
            .collect();
        let global = AttnShape {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size: kv.block_size,
            window: None,
            scale: c.attn_scale(),
        };
        let interleaved = c.rope_style == RopeStyle::Interleaved;
        s.rope[0].fill(&input.positions, &w.rope_inv_freq, c.head_dim);
        if let Some(local) = &w.rope_inv_freq_local {
            s.rope[1].fill(&input.positions, local, c.head_dim);
        }

        for (li, layer) in w.layers.iter().enumerate() {
            let window = c.layer_window(li);
            let shape = AttnShape { window, ..global };
            let angles = &s.rope[usize::from(w.uses_local_rope(window))];
            // Attention block.
            let xn = sized(&mut s.xn, t * h);
            norm_rows(pool, xn, &s.x[..t * h], &layer.attn_norm, c.rms_norm_eps);
            see("attn_norm", Some(li), xn);
            let q = sized(&mut s.q, t * q_dim);
            let k = sized(&mut s.k, t * kv_dim);
            let v = sized(&mut s.v, t * kv_dim);
            let qkv = [&layer.wq, &layer.wk, &layer.wv];
            // Threads waiting between jobs pull the next matmul's weights toward the cache.
            pool.warm_next(&[layer.wo.data.bytes()]);
            matmul_group(pool, &qkv, xn, t, &mut [&mut q[..], &mut k[..], &mut v[..]]);
            let (qn, kn) = match (&layer.q_norm, &layer.k_norm) {
                (Some(qn), Some(kn)) => (Some(&qn[..]), Some(&kn[..])),
                _ => (None, None),
            };
            for (buf, width, norm) in [(&mut q[..], q_dim, qn), (&mut k[..], kv_dim, kn)] {
                pool.for_row_chunks(buf, width, ROWS_PER_TASK, |r0, rows| {
                    for (i, row) in rows.chunks_exact_mut(width).enumerate() {
                        if let Some(norm) = norm {
                            rmsnorm_rows_inplace(row, norm, c.rms_norm_eps);
                        }
                        angles.rotate(r0 + i, row, c.head_dim, interleaved);
                    }
                });
            }
            see("Qcur", Some(li), q);
            see("Kcur", Some(li), k);
            see("Vcur", Some(li), v);
            let attn = sized(&mut s.attn, t * q_dim);
            match &mut kv.layers {
                KvLayers::F16(layers) => {
                    attend(pool, shape, &mut layers[li], q, k, v, input, &seqs, attn)
                }
                KvLayers::F32(layers) => {
                    attend(pool, shape, &mut layers[li], q, k, v, input, &seqs, attn)
                }
            }
            see("kqv_out", Some(li), attn);
            let proj = sized(&mut s.proj, t * h);
            match &layer.ffn {
                FeedForward::Dense(mlp) => {
                    pool.warm_next(&[mlp.gate.data.bytes(), mlp.up.data.bytes()])
                }
                FeedForward::Sparse(_) => pool.warm_next(&[]),
            }
            matmul(pool, &layer.wo, attn, t, proj);
            residual(
                pool,
                &mut s.x[..t * h],
                proj,
                h,
                layer.post_attn_norm.as_deref(),
                c.rms_norm_eps,
            );
            see("attn_out", Some(li), proj);
            see("ffn_inp", Some(li), &s.x[..t * h]);

            // Feed-forward block.
            let xn = sized(&mut s.xn, t * h);
            norm_rows(pool, xn, &s.x[..t * h], &layer.ffn_norm, c.rms_norm_eps);
            see("ffn_norm", Some(li), xn);
            let proj = sized(&mut s.proj, t * h);
            match &layer.ffn {
                FeedForward::Dense(mlp) => {
                    let act = c.activation;
                    let next = w.layers.get(li + 1).map_or_else(
                        || [w.output.data.bytes(), &[], &[]],
                        |l| [l.wq.data.bytes(), l.wk.data.bytes(), l.wv.data.bytes()],
                    );
                    mlp_forward(pool, mlp, act, xn, t, &mut s.gate, &mut s.up, proj, &next);
                    let inter = mlp.gate.rows;
                    see("ffn_up", Some(li), &s.up[..t * inter]);
                    see("ffn_swiglu", Some(li), &s.gate[..t * inter]);
                }
                FeedForward::Sparse(moe) => {
                    let top_k = c.moe.as_ref().map_or(1, |m| m.num_experts_per_tok);
                    let norm_topk = c.moe.as_ref().is_some_and(|m| m.norm_topk_prob);
                    let scratch = MoeScratch {
                        router: &mut s.router,
                        expert_in: &mut s.expert_in,
                        expert_out: &mut s.expert_out,
                        choice_out: &mut s.choice_out,
                        gate: &mut s.gate,
                        up: &mut s.up,
                    };
                    moe_forward(pool, moe, top_k, norm_topk, xn, t, h, scratch, proj);
                }
            }
            if let Some(norm) = &layer.post_ffn_norm {
                let eps = c.rms_norm_eps;
                pool.for_row_chunks(proj, h, ROWS_PER_TASK, |_, rows| {
                    rmsnorm_rows_inplace(rows, norm, eps)
                });
            }
            see("ffn_out", Some(li), proj);
            residual(pool, &mut s.x[..t * h], proj, h, None, c.rms_norm_eps);
            see("l_out", Some(li), &s.x[..t * h]);
        }

        // Only the sampled rows go through the final norm and the vocabulary projection.
        let n = input.sample_rows.len();
        let sampled = sized(&mut s.sampled, n * h);
        for (o, &r) in sampled.chunks_exact_mut(h).zip(&input.sample_rows) {
            rmsnorm(o, &s.x[r * h..(r + 1) * h], &w.output_norm, c.rms_norm_eps);
        }
        see("result_norm", None, sampled);
        let logits = sized(&mut s.logits, n * c.vocab_size);
        // The next step starts with the first layer's projections.
        if let Some(l) = w.layers.first() {
            pool.warm_next(&[l.wq.data.bytes(), l.wk.data.bytes(), l.wv.data.bytes()]);
        }
        matmul(pool, &w.output, sampled, n, logits);
        see("result_output", None, logits);
        &s.logits[..n * c.vocab_size]
    }
}

/// `out` = RMSNorm of each `weight.len()`-wide row of `x`, rows split across the pool.
fn norm_rows(pool: &ThreadPool, out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let h = weight.len();
    pool.for_row_chunks(out, h, ROWS_PER_TASK, |r0, rows| {
        for (o, i) in rows.chunks_exact_mut(h).zip(x[r0 * h..].chunks_exact(h)) {
            rmsnorm(o, i, weight, eps);
        }
    });
}

/// The residual stream `x += proj` (`width` values a row), with `proj` first RMS-normed row by
/// row when the block has a post-norm (Gemma), rows split across the pool.
fn residual(
    pool: &ThreadPool,
    x: &mut [f32],
    proj: &mut [f32],
    width: usize,
    post_norm: Option<&[f32]>,
    eps: f32,
) {
    if let Some(norm) = post_norm {
        pool.for_row_chunks(proj, width, ROWS_PER_TASK, |_, rows| {
            rmsnorm_rows_inplace(rows, norm, eps)
        });
    }
    let proj = &proj[..];
    pool.for_row_chunks(x, width, ROWS_PER_TASK, |r0, rows| {
        add_inplace(rows, &proj[r0 * width..r0 * width + rows.len()])
    });
}

#[allow(clippy::too_many_arguments)]
fn attend<E: KvElem + bytemuck::Pod>(
    pool: &ThreadPool,
    shape: AttnShape,
    layer_kv: &mut [KvBuf<E>; 2],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    input: &StepInput,
    seqs: &[AttnSeq],
    out: &mut [f32],
) {
    let [k_cache, v_cache] = layer_kv;
    write_kv(k_cache, v_cache, k, v, &input.slot_mapping, shape);
    paged_attention(pool, shape, q, k_cache, v_cache, seqs, out);
}

/// The gated MLP: `out = down(act(gate · x) * (up · x))`. `then` names the weights of the
/// matmul after `down`, for the pool's waiting threads to warm (`ThreadPool::warm_next`).
#[allow(clippy::too_many_arguments)]
fn mlp_forward(
    pool: &ThreadPool,
    mlp: &Mlp,
    act: Activation,
    x: &[f32],
    t: usize,
    gate: &mut Vec<f32>,
    up: &mut Vec<f32>,
    out: &mut [f32],
    then: &[&[u8]],
) {
    let inter = mlp.gate.rows;
    pool.warm_next(&[mlp.down.data.bytes()]);
    let g = sized(gate, t * inter);
    let u = sized(up, t * inter);
    matmul_group(
        pool,
        &[&mlp.gate, &mlp.up],
        x,
        t,
        &mut [&mut g[..], &mut u[..]],
    );
    let u = &u[..];
    pool.for_row_chunks(g, inter, ROWS_PER_TASK, |r0, rows| {
        let up = &u[r0 * inter..r0 * inter + rows.len()];
        match act {
            Activation::Silu => silu_mul_inplace(rows, up),
            Activation::GeluTanh => gelu_tanh_mul_inplace(rows, up),
        }
    });
    pool.warm_next(then);
    matmul(pool, &mlp.down, g, t, out);
}

/// Scratch buffers of the routed-experts block.
struct MoeScratch<'a> {
    router: &'a mut Vec<f32>,
    expert_in: &'a mut Vec<f32>,
    expert_out: &'a mut Vec<f32>,
    choice_out: &'a mut Vec<f32>,
    gate: &'a mut Vec<f32>,
    up: &'a mut Vec<f32>,
}

/// Route each token to its top-k experts (softmax over all experts, then top-k, optionally
/// renormalized), run each expert once over the rows routed to it, and sum each token's
/// choices in rank order, so a token's output never depends on its batch.
#[allow(clippy::too_many_arguments)]
fn moe_forward(
    pool: &ThreadPool,
    moe: &Moe,
    top_k: usize,
    norm_topk: bool,
    x: &[f32],
    t: usize,
    h: usize,
    s: MoeScratch,
    out: &mut [f32],
) {
    let num_experts = moe.experts.len();
    let router = sized(s.router, t * num_experts);
    matmul(pool, &moe.router, x, t, router);
    // choices[token * top_k + rank] = (expert, weight)
    let mut choices = Vec::with_capacity(t * top_k);
    for probs in router.chunks_exact_mut(num_experts) {
        softmax_inplace(probs);
        let mut order: Vec<usize> = (0..num_experts).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let picked = &order[..top_k];
        let sum: f32 = picked.iter().map(|&e| probs[e]).sum();
        for &e in picked {
            choices.push((e, if norm_topk { probs[e] / sum } else { probs[e] }));
        }
    }
    let choice_out = sized(s.choice_out, t * top_k * h);
    for e in 0..num_experts {
        let routed: Vec<usize> = (0..t * top_k).filter(|&i| choices[i].0 == e).collect();
        if routed.is_empty() {
            continue;
        }
        let n = routed.len();
        let expert_in = sized(s.expert_in, n * h);
        for (dst, &i) in expert_in.chunks_exact_mut(h).zip(&routed) {
            dst.copy_from_slice(&x[(i / top_k) * h..(i / top_k + 1) * h]);
        }
        let expert_out = sized(s.expert_out, n * h);
        mlp_forward(
            pool,
            &moe.experts[e],
            Activation::Silu,
            expert_in,
            n,
            s.gate,
            s.up,
            expert_out,
            &[],
        );
        for (src, &i) in expert_out.chunks_exact(h).zip(&routed) {
            choice_out[i * h..(i + 1) * h].copy_from_slice(src);
        }
    }
    for (tok, o) in out.chunks_exact_mut(h).enumerate() {
        o.fill(0.0);
        for rank in 0..top_k {
            let i = tok * top_k + rank;
            let wgt = choices[i].1;
            for (a, &b) in o.iter_mut().zip(&choice_out[i * h..(i + 1) * h]) {
                *a += wgt * b;
            }
        }
    }
}
