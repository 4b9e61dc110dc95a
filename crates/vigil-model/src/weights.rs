//! The decoder's weights, whatever file they came from. Linear layers are `QMatrix` in any
//! format the kernels multiply (F32/F16/BF16/Q8_0/Q4_x/Qk_K); norms are plain f32.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use vigil_kernels::cpu;
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::quant::interleave::{can_interleave, interleave_into, interleaved_len};
use vigil_kernels::quant::packed_bf16::{self, PackPlan};
use vigil_kernels::storage::{resident_map, AlignedBytes};
use vigil_kernels::{Layout, QMatrix, WeightData};

/// The form a matrix takes in the resident copy.
enum Form {
    /// Its bytes as they are.
    Stored,
    Interleaved,
    Packed(PackPlan),
}

impl Form {
    fn len(&self, m: &QMatrix) -> usize {
        match self {
            Form::Stored => m.data.bytes().len(),
            Form::Interleaved => interleaved_len(m).expect("an interleaved form was planned"),
            Form::Packed(plan) => plan.len(m),
        }
    }

    fn layout(&self, m: &QMatrix) -> Layout {
        match self {
            Form::Stored => m.layout,
            Form::Interleaved => Layout::Interleaved8,
            Form::Packed(_) => Layout::PackedBf16,
        }
    }

    /// Writes `m` in this form into `out` (`len(m)` bytes).
    fn write(&self, m: &QMatrix, out: &mut [u8]) {
        match self {
            Form::Stored => out.copy_from_slice(m.data.bytes()),
            Form::Interleaved => interleave_into(m, out),
            Form::Packed(plan) => plan.pack_into(m, out),
        }
    }
}

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

    /// The matrices one decode token's matmuls read whole: every layer's and the output
    /// projection (a tied embedding once, as the output; an untied one only has a row looked
    /// up). A MoE layer lists all its experts, though a token reads only those it is routed to.
    pub fn decode_matrices(&self) -> Vec<&QMatrix> {
        let mut all = vec![&self.output];
        for l in &self.layers {
            all.extend([&l.wq, &l.wk, &l.wv, &l.wo]);
            match &l.ffn {
                FeedForward::Dense(m) => all.extend([&m.gate, &m.up, &m.down]),
                FeedForward::Sparse(moe) => {
                    all.push(&moe.router);
                    for m in &moe.experts {
                        all.extend([&m.gate, &m.up, &m.down]);
                    }
                }
            }
        }
        all
    }

    /// Moves every matrix into one resident buffer in huge pages (`storage::resident_map`),
    /// 64-byte aligned each; bytes viewed twice (a tied output) are placed once. Matrices
    /// converted at load (`--quantize`, Q5_0 widened) move too, from their owned buffers in
    /// 4 KiB pages, each freed once it is placed: decode streams them every token like the rest
    /// (Qwen3-0.6B's Q8_0 read 29-30 GB/s from owned buffers where its BF16 read 33-35 from
    /// the copy). Only the matrices the model reads are there: a checkpoint's bytes a
    /// conversion replaced are not copied.
    ///
    /// With SIMD kernels, the Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K and float matrices the matmuls read are
    /// stored interleaved 8 rows at a time instead (`quant::interleave`): the same bytes in the
    /// order the kernels multiply them. An untied embedding, which only has rows looked up, stays
    /// row-major; a tied one is the output projection too and is interleaved (a lookup takes
    /// its row back out of the groups, `dequantize_row`). BF16 matrices are packed into 12 bits
    /// a value as well (`quant::packed_bf16`), unless `VIGIL_PACK_BF16=0`.
    ///
    /// Each form is written straight into the buffer on `pool`'s threads, a matrix a task: made
    /// on one thread, packing alone was over a quarter of loading a BF16 checkpoint. Nothing is
    /// staged on the heap: forms staged in `Vec`s on the pool's threads left some of that memory
    /// in glibc's per-thread arenas after they were freed, a different amount each start
    /// (docs/benchmarks.md, "A checkpoint's kernel forms written in place on every load thread").
    pub fn make_resident(&mut self, pool: &ThreadPool) -> std::io::Result<()> {
        let interleave = cpu::features().best() != cpu::Isa::Scalar;
        let key = |m: &QMatrix| {
            let b = m.data.bytes();
            (b.as_ptr() as usize, b.len())
        };
        let embd = key(&self.token_embd);
        let tied = key(&self.output) == embd;
        let mut mats = self.matrices_mut();
        let interleaves = |m: &QMatrix| interleave && can_interleave(m) && (key(m) != embd || tied);
        // Each distinct matrix once (a tied output projection is the embedding's bytes).
        let mut seen = HashSet::new();
        let distinct: Vec<QMatrix> = (mats.iter().map(|m| &**m))
            .filter(|&m| seen.insert(key(m)))
            .cloned()
            .collect();
        if distinct.is_empty() {
            return Ok(());
        }
        // Packed where BF16 packs (its plan, a pass over the matrix, says), else interleaved.
        let form_of = |m: &QMatrix| {
            if !interleaves(m) {
                return Form::Stored;
            }
            let plan = packed_bf16::enabled().then(|| PackPlan::new(m)).flatten();
            plan.map_or(Form::Interleaved, Form::Packed)
        };
        let forms: Vec<OnceLock<Form>> = distinct.iter().map(|_| OnceLock::new()).collect();
        pool.run(distinct.len(), |i| {
            // Each task sets only its own slot.
            let _ = forms[i].set(form_of(&distinct[i]));
        });
        let forms: Vec<Form> = forms
            .into_iter()
            .map(|f| f.into_inner().expect("every task ran"))
            .collect();
        // Source (address, length) → offset, length and layout in the copy.
        let mut placed: HashMap<(usize, usize), (usize, usize, Layout)> = HashMap::new();
        let mut len = 0;
        for (m, form) in distinct.iter().zip(&forms) {
            let n = form.len(m);
            placed.insert(key(m), (len, n, form.layout(m)));
            len = (len + n).next_multiple_of(64);
        }
        let mut anon = resident_map(len)?;
        // From here the sources live only in `distinct`: each is dropped once its bytes are
        // written, so a buffer converted at load (`--quantize q8_0`) is freed as its copy
        // fills, instead of every converted matrix and the whole copy being held at once.
        let keys: Vec<(usize, usize)> = mats.iter().map(|m| key(m)).collect();
        let empty = WeightData::Owned(Arc::new(AlignedBytes::zeroed(0)));
        for m in &mut mats {
            m.data = empty.clone();
        }
        // The buffer cut at the placements, in order: a disjoint slice a task, with its source.
        let mut tasks = Vec::with_capacity(distinct.len());
        let (mut rest, mut at) = (&mut anon[..], 0);
        for m in distinct {
            let (offset, n, _) = placed[&key(&m)];
            let (out, tail) = rest[offset - at..].split_at_mut(n);
            tasks.push(Mutex::new(Some((m, out))));
            (rest, at) = (tail, offset + n);
        }
        pool.run(tasks.len(), |i| {
            let task = tasks[i].lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some((m, out)) = task {
                forms[i].write(&m, out);
            }
        });
        drop(tasks);
        let map = Arc::new(anon.make_read_only()?);
        for (m, k) in mats.iter_mut().zip(keys) {
            // Keyed by the bytes it viewed (both views of a tied pair find the same place).
            let (offset, len, layout) = placed[&k];
            m.data = WeightData::Mapped {
                map: map.clone(),
                offset,
                len,
            };
            m.layout = layout;
        }
        Ok(())
    }

    /// The RoPE frequencies of a layer with this attention window.
    pub fn rope_inv_freq_for(&self, window: Option<usize>) -> &[f32] {
        match &self.rope_inv_freq_local {
            Some(local) if self.uses_local_rope(window) => local,
            _ => &self.rope_inv_freq,
        }
    }

    /// Whether a layer with this attention window rotates by the local frequencies (a
    /// sliding-window layer of a model that has them, Gemma 3).
    pub fn uses_local_rope(&self, window: Option<usize>) -> bool {
        self.rope_inv_freq_local.is_some() && window.is_some()
    }
}
