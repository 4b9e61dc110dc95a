//! Element-wise and per-row building blocks of the decoder: RMSNorm, RoPE, SwiGLU, softmax,
//! residual adds. Each reduces in a fixed order, so a row's result never depends on its batch.

/// `out = x / rms(x) * weight` for one row.
pub fn rmsnorm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let inv_rms = 1.0 / (sum_squares(x) / x.len() as f32 + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * inv_rms * w;
    }
}

/// RMSNorm of every `weight.len()`-wide row of `x`, in place (per-head q/k norms).
pub fn rmsnorm_rows_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    let n = weight.len();
    for row in x.chunks_exact_mut(n) {
        let inv_rms = 1.0 / (sum_squares(row) / n as f32 + eps).sqrt();
        for (v, &w) in row.iter_mut().zip(weight) {
            *v = *v * inv_rms * w;
        }
    }
}

/// `Σ v²` in a fixed order: 8 running lanes (independent chains, which the compiler turns
/// into vector adds), summed pairwise, then the tail. A one-chain sum waits on each add: a
/// decode step of SmolLM2 norms 60 rows of 576, and that chain was 1.7 % of its time.
fn sum_squares(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (acc, &v) in lanes.iter_mut().zip(c) {
            *acc += v * v;
        }
    }
    let [a, b, c, d, e, f, g, h] = lanes;
    let mut sum = ((a + e) + (b + f)) + ((c + g) + (d + h));
    for &v in tail {
        sum += v * v;
    }
    sum
}

thread_local! {
    static ROPE_SIN_COS: std::cell::RefCell<RopeTable> =
        const { std::cell::RefCell::new(RopeTable::new()) };
}

/// Rotate every head of `x` (`num_heads × head_dim`) by `pos`. `inv_freq` has `head_dim / 2`
/// entries. `interleaved` pairs `(2i, 2i+1)`; otherwise `(i, i + head_dim/2)` (NeoX / HF).
/// The angles' sines and cosines are computed once for all heads.
pub fn rope(x: &mut [f32], head_dim: usize, pos: u32, inv_freq: &[f32], interleaved: bool) {
    rotate(x, head_dim, pos as f32, inv_freq, interleaved);
}

/// Rotate keys already rotated to their positions by `delta` more positions (negative moves
/// them back): rotations compose, so a key at `p` becomes the key at `p + delta`, up to
/// rounding. The position shift of a session window uses it (llama.cpp's context shift).
pub fn rope_shift(x: &mut [f32], head_dim: usize, delta: i64, inv_freq: &[f32], interleaved: bool) {
    rotate(x, head_dim, delta as f32, inv_freq, interleaved);
}

fn rotate(x: &mut [f32], head_dim: usize, pos: f32, inv_freq: &[f32], interleaved: bool) {
    ROPE_SIN_COS.with(|cell| {
        let mut table = cell.borrow_mut();
        table.fill_angles([pos].into_iter(), inv_freq, head_dim);
        table.rotate(0, x, head_dim, interleaved);
    });
}

/// The sines and cosines of a step's rotary angles, one row of `head_dim / 2` per token
/// position: computed once a step and shared by every layer and by q and k, where `rope`
/// computes them again for each row it rotates. The same angles, so the same bits.
#[derive(Debug, Default)]
pub struct RopeTable {
    /// Frequencies a row rotates (`min(head_dim / 2, inv_freq.len())`).
    pairs: usize,
    sin: Vec<f32>,
    cos: Vec<f32>,
}

impl RopeTable {
    pub const fn new() -> Self {
        RopeTable {
            pairs: 0,
            sin: Vec::new(),
            cos: Vec::new(),
        }
    }

    /// The angles of token positions `positions` (row `r` of the table: `positions[r]`).
    pub fn fill(&mut self, positions: &[u32], inv_freq: &[f32], head_dim: usize) {
        self.fill_angles(positions.iter().map(|&p| p as f32), inv_freq, head_dim);
    }

    fn fill_angles(
        &mut self,
        positions: impl Iterator<Item = f32>,
        inv_freq: &[f32],
        head_dim: usize,
    ) {
        self.pairs = (head_dim / 2).min(inv_freq.len());
        self.sin.clear();
        self.cos.clear();
        for pos in positions {
            for &freq in &inv_freq[..self.pairs] {
                let (sin, cos) = (pos * freq).sin_cos();
                self.sin.push(sin);
                self.cos.push(cos);
            }
        }
    }

    /// Rotate every head of `x` (`num_heads × head_dim`) by the angles of table row `row`,
    /// pairing elements as `rope` does.
    pub fn rotate(&self, row: usize, x: &mut [f32], head_dim: usize, interleaved: bool) {
        let n = self.pairs;
        let (sin, cos) = (&self.sin[row * n..][..n], &self.cos[row * n..][..n]);
        let half = head_dim / 2;
        for head in x.chunks_exact_mut(head_dim) {
            if interleaved {
                for (i, (&sin, &cos)) in sin.iter().zip(cos).enumerate() {
                    let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = x0 * cos - x1 * sin;
                    head[2 * i + 1] = x0 * sin + x1 * cos;
                }
            } else {
                // Two disjoint halves, so the loop runs as vectors.
                let (lo, hi) = head.split_at_mut(half);
                for (((a, b), &sin), &cos) in lo.iter_mut().zip(hi.iter_mut()).zip(sin).zip(cos) {
                    let (x0, x1) = (*a, *b);
                    *a = x0 * cos - x1 * sin;
                    *b = x0 * sin + x1 * cos;
                }
            }
        }
    }
}

/// `gate[i] = silu(gate[i]) * up[i]` (SwiGLU): the vector path (Cephes `exp`, the one
/// attention's softmax uses; 16 lanes on AVX-512, 8 on AVX2, the same operations per lane)
/// where the CPU has it, else [`silu_mul_scalar`]. Each element's result depends only on its
/// own inputs and never on its index or the lane width: a tail runs the same vector code on
/// a padded copy.
pub fn silu_mul_inplace(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let cpu = crate::cpu::features();
        if cpu.has(crate::cpu::Isa::Avx512) {
            // SAFETY: the features were just checked.
            return unsafe { crate::vector_math::avx512::silu_mul16(gate, up) };
        }
        if cpu.avx2_fma_f16c {
            // SAFETY: the features were just checked.
            return unsafe { crate::vector_math::avx2::silu_mul(gate, up) };
        }
    }
    silu_mul_scalar(gate, up)
}

/// The portable SwiGLU, with libm's `exp`: the reference the AVX2 path is tested against.
pub fn silu_mul_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// GeGLU with the tanh approximation of GELU (Gemma): `gate = gelu_tanh(gate) * up`.
pub fn gelu_tanh_mul_inplace(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
        *g = 0.5 * x * (1.0 + inner.tanh()) * u;
    }
}

/// `e^x` for `x <= 0` to about 2 ulp, and exactly 0 below `-87` (so `-inf` bans stay banned).
/// Cephes' `expf` without branches or libm calls, so loops over a vocabulary row vectorize:
/// several times cheaper than `f32::exp` over 150k logits.
#[inline]
pub fn exp_nonpos(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = x.clamp(-87.0, 0.0);
    let shifted = xc * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    // Wrapping ops: no overflow-check branches to stop vectorization (n is in [-126, 0]).
    let n_int = (shifted.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = xc - n * 0.693_359_4 + n * 2.121_944_4e-4; // ln 2 split in two for precision
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    let scale = f32::from_bits((n_int.wrapping_add(127) as u32) << 23);
    if x < -87.0 {
        0.0
    } else {
        y * scale
    }
}

/// `Σ e^(x_i - max)` over a row whose elements are all at most `max` (a softmax's
/// normalizer), in f64: the AVX2 `exp` in 8 lanes where the CPU has it, else `exp_nonpos` in 8
/// lanes. The two differ in the last bits (the AVX2 one fuses its multiply-adds); a sampler's
/// log-probabilities are the only users, and no token choice depends on them.
pub fn sum_exp(x: &[f32], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::features().avx2_fma_f16c {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { crate::vector_math::avx2::sum_exp(x, max) };
    }
    sum_exp_portable(x, max)
}

/// `sum_exp` without SIMD intrinsics: `exp_nonpos` in 8 lanes.
fn sum_exp_portable(x: &[f32], max: f32) -> f64 {
    let mut lanes = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail: f32 = chunks
        .remainder()
        .iter()
        .map(|&v| exp_nonpos(v - max))
        .sum();
    for chunk in chunks {
        for (acc, &v) in lanes.iter_mut().zip(chunk) {
            *acc += exp_nonpos(v - max);
        }
    }
    lanes.iter().map(|&l| l as f64).sum::<f64>() + tail as f64
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed pseudo-random sequence in [-1, 1).
    fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    #[test]
    fn exp_nonpos_matches_exp() {
        let mut worst = 0f64;
        for i in 0..=1_000_000 {
            let x = -87.0 * i as f32 / 1_000_000.0;
            let want = (x as f64).exp();
            worst = worst.max((exp_nonpos(x) as f64 - want).abs() / want);
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(-100.0), 0.0);
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
    }

    /// `sum_exp` against f64 on ragged rows (the AVX2 tail too), with `-inf` bans counting 0.
    #[test]
    fn sum_exp_matches_f64() {
        for (n, seed) in [(1, 1), (7, 2), (8, 3), (9, 4), (1000, 5), (49_152, 6)] {
            let mut x: Vec<f32> = noise(n, seed).iter().map(|v| v * 30.0).collect();
            if n > 2 {
                x[1] = f32::NEG_INFINITY;
            }
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let want: f64 = x.iter().map(|&v| (v as f64 - max as f64).exp()).sum();
            for got in [sum_exp(&x, max), sum_exp_portable(&x, max)] {
                assert!((got - want).abs() <= 1e-5 * want, "n {n}: {got} vs {want}");
            }
        }
    }

    /// RMSNorm against the same formula in f64, on ragged widths (the 8-lane sum's tail too),
    /// in place and out of place alike.
    #[test]
    fn rmsnorm_matches_f64() {
        for (n, seed) in [(1, 1), (7, 2), (8, 3), (63, 4), (576, 5), (1000, 6)] {
            let x = noise(n, seed);
            let w: Vec<f32> = noise(n, seed + 100).iter().map(|v| 1.0 + v).collect();
            let eps = 1e-5;
            let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            let mut out = vec![0f32; n];
            rmsnorm(&mut out, &x, &w, eps);
            let mut inplace = x.clone();
            rmsnorm_rows_inplace(&mut inplace, &w, eps);
            for i in 0..n {
                let want = x[i] as f64 * inv * w[i] as f64;
                assert!(
                    (out[i] as f64 - want).abs() <= 1e-5 * want.abs().max(1e-3),
                    "n {n}, {i}"
                );
                assert_eq!(out[i].to_bits(), inplace[i].to_bits(), "n {n}, {i}");
            }
        }
    }

    #[test]
    fn silu_mul_matches_the_scalar_reference_on_ragged_lengths() {
        for n in (0..40).chain([1536, 3072 + 5]) {
            // Gates over the whole range exp must handle, including past its clamps.
            let gate: Vec<f32> = noise(n, n as u64).iter().map(|v| v * 100.0).collect();
            let up = noise(n, 7 + n as u64);
            let (mut fast, mut reference) = (gate.clone(), gate.clone());
            silu_mul_inplace(&mut fast, &up);
            silu_mul_scalar(&mut reference, &up);
            for (i, (&f, &r)) in fast.iter().zip(&reference).enumerate() {
                let tol = 4e-6 * r.abs() + 1e-30;
                assert!(
                    (f - r).abs() <= tol,
                    "n {n} i {i}: {f} vs {r} (gate {})",
                    gate[i]
                );
            }
            // An element's result does not depend on where the row ends.
            if n > 8 {
                let mut prefix = gate[..n - 3].to_vec();
                silu_mul_inplace(&mut prefix, &up[..n - 3]);
                assert_eq!(prefix, fast[..n - 3], "n {n}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn silu_mul16_equals_the_8_lane_path() {
        use crate::cpu::{features, Isa};
        if !features().has(Isa::Avx512) {
            eprintln!("skipped: CPU lacks avx512");
            return;
        }
        for n in (0..70).chain([1536, 3072 + 5]) {
            let gate: Vec<f32> = noise(n, 3 * n as u64).iter().map(|v| v * 100.0).collect();
            let up = noise(n, 11 + n as u64);
            let (mut a, mut b) = (gate.clone(), gate);
            // SAFETY: AVX-512 F (and so AVX2, FMA, F16C) checked above.
            unsafe {
                crate::vector_math::avx2::silu_mul(&mut a, &up);
                crate::vector_math::avx512::silu_mul16(&mut b, &up);
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "n = {n}");
        }
    }

    #[test]
    fn rope_rotates_every_head_as_the_per_head_formula() {
        let (head_dim, heads, pos) = (64, 9, 1234u32);
        let inv_freq: Vec<f32> = (0..head_dim / 2)
            .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / head_dim as f32))
            .collect();
        for interleaved in [false, true] {
            let x = noise(head_dim * heads, 3);
            let mut got = x.clone();
            rope(&mut got, head_dim, pos, &inv_freq, interleaved);
            let half = head_dim / 2;
            for (h, head) in x.chunks_exact(head_dim).enumerate() {
                for (i, &freq) in inv_freq.iter().enumerate() {
                    let (sin, cos) = (pos as f32 * freq).sin_cos();
                    let (a, b) = if interleaved {
                        (2 * i, 2 * i + 1)
                    } else {
                        (i, i + half)
                    };
                    let o = h * head_dim;
                    assert_eq!(got[o + a], head[a] * cos - head[b] * sin);
                    assert_eq!(got[o + b], head[a] * sin + head[b] * cos);
                }
            }
        }
    }

    #[test]
    fn a_table_row_rotates_as_rope_at_its_position() {
        let (head_dim, heads) = (64, 3);
        let positions = [0u32, 7, 1234, 40_000];
        for pairs in [head_dim / 2, 8] {
            let inv_freq: Vec<f32> = (0..pairs)
                .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / head_dim as f32))
                .collect();
            let mut table = RopeTable::new();
            table.fill(&positions, &inv_freq, head_dim);
            for interleaved in [false, true] {
                for (r, &pos) in positions.iter().enumerate() {
                    let x = noise(head_dim * heads, r as u64 + 11);
                    let (mut want, mut got) = (x.clone(), x.clone());
                    rope(&mut want, head_dim, pos, &inv_freq, interleaved);
                    table.rotate(r, &mut got, head_dim, interleaved);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "pos {pos} pairs {pairs}");
                    if pairs < head_dim / 2 {
                        // Elements past the rotated pairs keep their values.
                        assert_eq!(got[head_dim / 2 - 1], x[head_dim / 2 - 1]);
                    }
                }
            }
        }
    }

    #[test]
    fn a_shifted_key_matches_the_key_rotated_at_its_new_position() {
        let head_dim = 16;
        let inv_freq: Vec<f32> = (0..head_dim / 2)
            .map(|i| 10000f32.powf(-2.0 * i as f32 / head_dim as f32))
            .collect();
        for interleaved in [false, true] {
            let raw: Vec<f32> = (0..2 * head_dim).map(|i| (i as f32 * 0.37).sin()).collect();
            let (mut at_new, mut shifted) = (raw.clone(), raw.clone());
            rope(&mut at_new, head_dim, 1000, &inv_freq, interleaved);
            rope(&mut shifted, head_dim, 1700, &inv_freq, interleaved);
            rope_shift(&mut shifted, head_dim, -700, &inv_freq, interleaved);
            for (a, b) in at_new.iter().zip(&shifted) {
                assert!((a - b).abs() < 2e-3, "{a} vs {b}");
            }
        }
    }
}
