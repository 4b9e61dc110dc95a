//! Element-wise math in SIMD lanes shared by several kernels: `exp` (attention's softmax,
//! SwiGLU) and the SwiGLU built on it.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    /// `avx2::exp8` in 16 lanes: the same operations lane for lane (floor as a round toward
    /// -inf, the same constants and FMAs), so each lane gives `exp8`'s bits.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub fn exp16(x: __m512) -> __m512 {
        let x = _mm512_max_ps(
            _mm512_min_ps(x, _mm512_set1_ps(88.376_26)),
            _mm512_set1_ps(-88.376_26),
        );
        let fx = _mm512_fmadd_ps(
            x,
            _mm512_set1_ps(std::f32::consts::LOG2_E),
            _mm512_set1_ps(0.5),
        );
        let fx = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(fx);
        let r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693_359_4), x);
        let r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.121_944_4e-4), r);
        let mut y = _mm512_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(c));
        }
        let y = _mm512_fmadd_ps(
            y,
            _mm512_mul_ps(r, r),
            _mm512_add_ps(r, _mm512_set1_ps(1.0)),
        );
        let n = _mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127));
        _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32::<23>(n)))
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// `e^x` in 8 lanes (Cephes `expf`: 2^n by exponent bits times a degree-6 polynomial on
    /// the remainder), within 2 ulp of the exact value over the softmax range (x <= 0).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn exp8(x: __m256) -> __m256 {
        let x = _mm256_max_ps(
            _mm256_min_ps(x, _mm256_set1_ps(88.376_26)),
            _mm256_set1_ps(-88.376_26),
        );
        let fx = _mm256_fmadd_ps(
            x,
            _mm256_set1_ps(std::f32::consts::LOG2_E),
            _mm256_set1_ps(0.5),
        );
        let fx = _mm256_floor_ps(fx);
        let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693_359_4), x);
        let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.121_944_4e-4), r);
        let mut y = _mm256_set1_ps(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
        }
        let y = _mm256_fmadd_ps(
            y,
            _mm256_mul_ps(r, r),
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        );
        let n = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
        _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(n)))
    }

    /// `Σ e^(x_i - max)` with `exp8` in 8 lanes, the lanes summed in f64 at the end; the
    /// tail goes through a copy padded with `-inf` (whose `exp8` is 0).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn sum_exp(x: &[f32], max: f32) -> f64 {
        let m = _mm256_set1_ps(max);
        let full = x.len() / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        for i in (0..full).step_by(8) {
            let v = _mm256_loadu_ps(x.as_ptr().add(i));
            acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(v, m)));
        }
        if full < x.len() {
            let mut t = [f32::NEG_INFINITY; 8];
            t[..x.len() - full].copy_from_slice(&x[full..]);
            let v = _mm256_loadu_ps(t.as_ptr());
            acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(v, m)));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        lanes.iter().map(|&l| l as f64).sum()
    }

    /// `gate[i] = silu(gate[i]) * up[i]` with `exp8`; the tail goes through a zero-padded
    /// 8-lane copy so every element takes the same operations. Lengths must match.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn silu_mul(gate: &mut [f32], up: &[f32]) {
        let n = gate.len().min(up.len());
        let one = _mm256_set1_ps(1.0);
        let silu_mul8 = |g: __m256, u: __m256| {
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u)
        };
        let full = n / 8 * 8;
        let (gp, up_) = (gate.as_mut_ptr(), up.as_ptr());
        for i in (0..full).step_by(8) {
            let r = silu_mul8(_mm256_loadu_ps(gp.add(i)), _mm256_loadu_ps(up_.add(i)));
            _mm256_storeu_ps(gp.add(i), r);
        }
        if full < n {
            let (mut g, mut u) = ([0f32; 8], [0f32; 8]);
            g[..n - full].copy_from_slice(&gate[full..n]);
            u[..n - full].copy_from_slice(&up[full..n]);
            let r = silu_mul8(_mm256_loadu_ps(g.as_ptr()), _mm256_loadu_ps(u.as_ptr()));
            _mm256_storeu_ps(g.as_mut_ptr(), r);
            gate[full..n].copy_from_slice(&g[..n - full]);
        }
    }
}
