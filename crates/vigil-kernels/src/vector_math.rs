//! Element-wise math in SIMD lanes shared by several kernels: `exp` (attention's softmax,
//! SwiGLU) and the SwiGLU built on it.

/// Cephes `expf` written once over a vector type, so `exp8` and `exp16` are the same
/// operations lane for lane and give the same bits.
#[cfg(target_arch = "x86_64")]
mod cephes {
    use std::arch::x86_64::*;

    /// The lane operations `exp` takes. Implementations are `#[inline(always)]`, so they are
    /// compiled with the features of the entry point that inlines them.
    pub trait Lanes: Copy {
        unsafe fn splat(v: f32) -> Self;
        unsafe fn min(self, b: Self) -> Self;
        unsafe fn max(self, b: Self) -> Self;
        /// `self * b + c`.
        unsafe fn fmadd(self, b: Self, c: Self) -> Self;
        /// `-(self * b) + c`.
        unsafe fn fnmadd(self, b: Self, c: Self) -> Self;
        unsafe fn floor(self) -> Self;
        unsafe fn mul(self, b: Self) -> Self;
        unsafe fn add(self, b: Self) -> Self;
        unsafe fn sub(self, b: Self) -> Self;
        unsafe fn div(self, b: Self) -> Self;
        /// `2^self` for integral lanes in range: the exponent field built from `self + 127`.
        unsafe fn pow2(self) -> Self;
    }

    impl Lanes for __m256 {
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            _mm256_set1_ps(v)
        }
        #[inline(always)]
        unsafe fn min(self, b: Self) -> Self {
            _mm256_min_ps(self, b)
        }
        #[inline(always)]
        unsafe fn max(self, b: Self) -> Self {
            _mm256_max_ps(self, b)
        }
        #[inline(always)]
        unsafe fn fmadd(self, b: Self, c: Self) -> Self {
            _mm256_fmadd_ps(self, b, c)
        }
        #[inline(always)]
        unsafe fn fnmadd(self, b: Self, c: Self) -> Self {
            _mm256_fnmadd_ps(self, b, c)
        }
        #[inline(always)]
        unsafe fn floor(self) -> Self {
            _mm256_floor_ps(self)
        }
        #[inline(always)]
        unsafe fn mul(self, b: Self) -> Self {
            _mm256_mul_ps(self, b)
        }
        #[inline(always)]
        unsafe fn add(self, b: Self) -> Self {
            _mm256_add_ps(self, b)
        }
        #[inline(always)]
        unsafe fn sub(self, b: Self) -> Self {
            _mm256_sub_ps(self, b)
        }
        #[inline(always)]
        unsafe fn div(self, b: Self) -> Self {
            _mm256_div_ps(self, b)
        }
        #[inline(always)]
        unsafe fn pow2(self) -> Self {
            let n = _mm256_add_epi32(_mm256_cvttps_epi32(self), _mm256_set1_epi32(127));
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(n))
        }
    }

    impl Lanes for __m512 {
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            _mm512_set1_ps(v)
        }
        #[inline(always)]
        unsafe fn min(self, b: Self) -> Self {
            _mm512_min_ps(self, b)
        }
        #[inline(always)]
        unsafe fn max(self, b: Self) -> Self {
            _mm512_max_ps(self, b)
        }
        #[inline(always)]
        unsafe fn fmadd(self, b: Self, c: Self) -> Self {
            _mm512_fmadd_ps(self, b, c)
        }
        #[inline(always)]
        unsafe fn fnmadd(self, b: Self, c: Self) -> Self {
            _mm512_fnmadd_ps(self, b, c)
        }
        /// A round toward -inf: `_mm256_floor_ps`'s result.
        #[inline(always)]
        unsafe fn floor(self) -> Self {
            _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(self)
        }
        #[inline(always)]
        unsafe fn mul(self, b: Self) -> Self {
            _mm512_mul_ps(self, b)
        }
        #[inline(always)]
        unsafe fn add(self, b: Self) -> Self {
            _mm512_add_ps(self, b)
        }
        #[inline(always)]
        unsafe fn sub(self, b: Self) -> Self {
            _mm512_sub_ps(self, b)
        }
        #[inline(always)]
        unsafe fn div(self, b: Self) -> Self {
            _mm512_div_ps(self, b)
        }
        #[inline(always)]
        unsafe fn pow2(self) -> Self {
            let n = _mm512_add_epi32(_mm512_cvttps_epi32(self), _mm512_set1_epi32(127));
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(n))
        }
    }

    /// `e^x` per lane: 2^n by exponent bits times a degree-6 polynomial on the remainder,
    /// within 2 ulp of the exact value over the softmax range (x <= 0).
    ///
    /// # Safety
    /// Inlined into an entry point with `L`'s features.
    #[inline(always)]
    pub unsafe fn exp<L: Lanes>(x: L) -> L {
        let x = x.min(L::splat(88.376_26)).max(L::splat(-88.376_26));
        let fx = x
            .fmadd(L::splat(std::f32::consts::LOG2_E), L::splat(0.5))
            .floor();
        let r = fx.fnmadd(L::splat(0.693_359_4), x);
        let r = fx.fnmadd(L::splat(-2.121_944_4e-4), r);
        let mut y = L::splat(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.5,
        ] {
            y = y.fmadd(r, L::splat(c));
        }
        let y = y.fmadd(r.mul(r), r.add(L::splat(1.0)));
        y.mul(fx.pow2())
    }

    /// SwiGLU per lane: `g / (1 + e^-g) * u`.
    ///
    /// # Safety
    /// As `exp`.
    #[inline(always)]
    pub unsafe fn silu_mul<L: Lanes>(g: L, u: L) -> L {
        let e = exp(L::splat(0.0).sub(g));
        g.div(L::splat(1.0).add(e)).mul(u)
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    /// `avx2::exp8` in 16 lanes: the same operations lane for lane (`cephes::exp`), so each
    /// lane gives `exp8`'s bits.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub fn exp16(x: __m512) -> __m512 {
        // SAFETY: AVX-512 F enabled here.
        unsafe { super::cephes::exp(x) }
    }

    /// `avx2::silu_mul` 16 lanes at a time: each element the same operations (`cephes`), so
    /// the same bits; a tail shorter than 16 goes through a zero-padded copy.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub unsafe fn silu_mul16(gate: &mut [f32], up: &[f32]) {
        let n = gate.len().min(up.len());
        let full = n / 16 * 16;
        let (gp, up_) = (gate.as_mut_ptr(), up.as_ptr());
        for i in (0..full).step_by(16) {
            let (g, u) = (_mm512_loadu_ps(gp.add(i)), _mm512_loadu_ps(up_.add(i)));
            _mm512_storeu_ps(gp.add(i), super::cephes::silu_mul(g, u));
        }
        if full < n {
            let (mut g, mut u) = ([0f32; 16], [0f32; 16]);
            g[..n - full].copy_from_slice(&gate[full..n]);
            u[..n - full].copy_from_slice(&up[full..n]);
            let (gv, uv) = (_mm512_loadu_ps(g.as_ptr()), _mm512_loadu_ps(u.as_ptr()));
            _mm512_storeu_ps(g.as_mut_ptr(), super::cephes::silu_mul(gv, uv));
            gate[full..n].copy_from_slice(&g[..n - full]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// `e^x` in 8 lanes (`cephes::exp`: Cephes `expf`), within 2 ulp of the exact value over
    /// the softmax range (x <= 0).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn exp8(x: __m256) -> __m256 {
        // SAFETY: AVX2 and FMA enabled here.
        unsafe { super::cephes::exp(x) }
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
        let full = n / 8 * 8;
        let (gp, up_) = (gate.as_mut_ptr(), up.as_ptr());
        for i in (0..full).step_by(8) {
            let r =
                super::cephes::silu_mul(_mm256_loadu_ps(gp.add(i)), _mm256_loadu_ps(up_.add(i)));
            _mm256_storeu_ps(gp.add(i), r);
        }
        if full < n {
            let (mut g, mut u) = ([0f32; 8], [0f32; 8]);
            g[..n - full].copy_from_slice(&gate[full..n]);
            u[..n - full].copy_from_slice(&up[full..n]);
            let r =
                super::cephes::silu_mul(_mm256_loadu_ps(g.as_ptr()), _mm256_loadu_ps(u.as_ptr()));
            _mm256_storeu_ps(g.as_mut_ptr(), r);
            gate[full..n].copy_from_slice(&g[..n - full]);
        }
    }
}
