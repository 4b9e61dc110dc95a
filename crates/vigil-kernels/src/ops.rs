//! Element-wise and per-row building blocks of the decoder: RMSNorm, RoPE, SwiGLU, softmax,
//! residual adds. Each reduces in a fixed order, so a row's result never depends on its batch.

/// `out = x / rms(x) * weight` for one row.
pub fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let sum_sq: f32 = x.iter().map(|v| v * v).sum();
    let inv_rms = 1.0 / (sum_sq / x.len() as f32 + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * inv_rms * w;
    }
}

/// RMSNorm of every `weight.len()`-wide row of `x`, in place (per-head q/k norms).
pub fn rmsnorm_rows_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    let n = weight.len();
    for row in x.chunks_exact_mut(n) {
        let sum_sq: f32 = row.iter().map(|v| v * v).sum();
        let inv_rms = 1.0 / (sum_sq / n as f32 + eps).sqrt();
        for (v, &w) in row.iter_mut().zip(weight) {
            *v = *v * inv_rms * w;
        }
    }
}

/// Rotate every head of `x` (`num_heads × head_dim`) by `pos`. `inv_freq` has `head_dim / 2`
/// entries. `interleaved` pairs `(2i, 2i+1)`; otherwise `(i, i + head_dim/2)` (NeoX / HF).
pub fn rope(x: &mut [f32], head_dim: usize, pos: u32, inv_freq: &[f32], interleaved: bool) {
    let half = head_dim / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &freq) in inv_freq.iter().enumerate().take(half) {
            let angle = pos as f32 * freq;
            let (sin, cos) = angle.sin_cos();
            let (a, b) = if interleaved {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}

/// `gate[i] = silu(gate[i]) * up[i]` (SwiGLU).
pub fn silu_mul_inplace(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// In-place softmax of one row.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `acc[i] += x[i]`.
pub fn add_inplace(acc: &mut [f32], x: &[f32]) {
    for (a, &v) in acc.iter_mut().zip(x) {
        *a += v;
    }
}
