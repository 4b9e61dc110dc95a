//! Element-wise math in SIMD lanes shared by several kernels: `exp` (SwiGLU, the sampler's
//! log-sum-exp), `exp2` (attention's softmax, whose scores are kept in base-2 units) and the
//! SwiGLU built on `exp`.

/// Cephes `expf` and `exp2f` written once over a vector type, so the 8- and 16-lane versions
/// are the same operations lane for lane and give the same bits.
#[cfg(target_arch = "x86_64")]
mod cephes {
    use std::arch::x86_64::*;

    /// The lane operations `exp` takes. Implementations are `#[inline(always)]`, so they are
    /// compiled with the features of the entry point that inlines them.
    pub trait Lanes: Copy {
        /// Floats a vector holds.
        const N: usize;
        unsafe fn load(p: *const f32) -> Self;
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
        /// Round to the nearest integer, ties to even.
        unsafe fn round(self) -> Self;
        /// `self * 2^n` for integral `n` by adding `n` to the exponent field: exact while
        /// the result stays a normal number.
        unsafe fn add_exponent(self, n: Self) -> Self;
    }

    impl Lanes for __m256 {
        const N: usize = 8;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            _mm256_loadu_ps(p)
        }
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
        #[inline(always)]
        unsafe fn round(self) -> Self {
            _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self)
        }
        #[inline(always)]
        unsafe fn add_exponent(self, n: Self) -> Self {
            let e = _mm256_slli_epi32::<23>(_mm256_cvtps_epi32(n));
            _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(self), e))
        }
    }

    impl Lanes for __m512 {
        const N: usize = 16;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            _mm512_loadu_ps(p)
        }
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
        /// `_mm256_round_ps`'s nearest-even result.
        #[inline(always)]
        unsafe fn round(self) -> Self {
            _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self)
        }
        #[inline(always)]
        unsafe fn add_exponent(self, n: Self) -> Self {
            let e = _mm512_slli_epi32::<23>(_mm512_cvtps_epi32(n));
            _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(self), e))
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

    /// `2^x` per lane for `x <= 0` (Cephes `exp2f`): `x` clamped at -125, split exactly into
    /// `n = round(x)` and `f = x - n` in [-0.5, 0.5], `2^f` by a degree-6 polynomial, and `n`
    /// added to the exponent field (the result stays normal: at least 2^-125.5). Within 0.7
    /// ulp-widths (`f32::EPSILON` relative) of the exact value over [-125, 0]. Where `exp`
    /// takes 19 operations a vector, this takes 12: the base-2 split needs no two-step
    /// reduction and no multiply by the exponent's power.
    ///
    /// # Safety
    /// Inlined into an entry point with `L`'s features.
    #[inline(always)]
    pub unsafe fn exp2<L: Lanes>(x: L) -> L {
        let x = x.max(L::splat(-125.0));
        let n = x.round();
        let f = x.sub(n);
        let mut y = L::splat(1.535_336_2e-4);
        for c in [
            1.339_887_4e-3,
            9.618_437e-3,
            5.550_332_5e-2,
            0.240_226_48,
            std::f32::consts::LN_2,
            1.0,
        ] {
            y = y.fmadd(f, L::splat(c));
        }
        y.add_exponent(n)
    }

    /// The lane-wise max over `x`'s whole vectors (`x.len() / L::N` of them; `-inf` for none),
    /// in four chains, so no `max` waits on the one before it (attention's `exp_run` says what
    /// that cost). A max is exact, so the order changes no bit. (Not a Cephes function: it
    /// shares the lane operations.)
    ///
    /// # Safety
    /// As `exp`.
    #[inline(always)]
    pub unsafe fn max_lanes<L: Lanes>(x: &[f32]) -> L {
        let (w, p) = (L::N, x.as_ptr());
        let full = x.len() / w * w;
        let full4 = x.len() / (4 * w) * (4 * w);
        let mut m = [L::splat(f32::NEG_INFINITY); 4];
        for i in (0..full4).step_by(4 * w) {
            for (j, m) in m.iter_mut().enumerate() {
                *m = m.max(L::load(p.add(i + w * j)));
            }
        }
        for i in (full4..full).step_by(w) {
            m[0] = m[0].max(L::load(p.add(i)));
        }
        m[0].max(m[1]).max(m[2].max(m[3]))
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

    /// `avx2::exp2_8` in 16 lanes: the same operations lane for lane (`cephes::exp2`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub fn exp2_16(x: __m512) -> __m512 {
        // SAFETY: AVX-512 F enabled here.
        unsafe { super::cephes::exp2(x) }
    }

    /// `cephes::max_lanes` in 16 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub fn max_lanes16(x: &[f32]) -> __m512 {
        // SAFETY: AVX-512 F enabled here; the loads stay within `x`.
        unsafe { super::cephes::max_lanes(x) }
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

    /// `cephes::max_lanes` in 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn max_lanes8(x: &[f32]) -> __m256 {
        // SAFETY: AVX2 enabled here; the loads stay within `x`.
        unsafe { super::cephes::max_lanes(x) }
    }

    /// The largest of `v`'s 8 lanes (none NaN).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn hmax8(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_movehdup_ps(m));
        _mm_cvtss_f32(m)
    }

    /// `e^x` in 8 lanes (`cephes::exp`: Cephes `expf`), within 2 ulp of the exact value over
    /// the softmax range (x <= 0).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn exp8(x: __m256) -> __m256 {
        // SAFETY: AVX2 and FMA enabled here.
        unsafe { super::cephes::exp(x) }
    }

    /// `2^x` in 8 lanes for `x <= 0` (`cephes::exp2`: Cephes `exp2f`), within 0.7
    /// `f32::EPSILON` of the exact value relative to it over [-125, 0].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn exp2_8(x: __m256) -> __m256 {
        // SAFETY: AVX2 and FMA enabled here.
        unsafe { super::cephes::exp2(x) }
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

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use std::arch::x86_64::*;

    /// `exp2_8` over the softmax's range: within 0.7 `f32::EPSILON` of the exact value,
    /// relative to it, including the clamp at -125 and 0 itself; `exp2_16` gives its bits.
    #[test]
    fn exp2_is_within_an_ulp_and_the_same_in_16_lanes() {
        let cpu = crate::cpu::features();
        if !cpu.avx2_fma_f16c {
            eprintln!("skipped: CPU lacks avx2/fma/f16c");
            return;
        }
        let wide = cpu.has(crate::cpu::Isa::Avx512);
        if !wide {
            eprintln!("skipped (16 lanes): CPU lacks avx512");
        }
        let xs: Vec<f32> = (0..400_000)
            .map(|i| -(i as f32) * 3.2e-4)
            .chain([0.0, -0.5, -1.5, -124.5, -125.0, -200.0, f32::NEG_INFINITY])
            .collect();
        for chunk in xs.chunks(16) {
            let mut x = [0f32; 16];
            x[..chunk.len()].copy_from_slice(chunk);
            let (mut got, mut got16) = ([0f32; 16], [0f32; 16]);
            // SAFETY: AVX2+FMA checked above (and AVX-512 F for the 16-lane call).
            unsafe {
                for h in 0..2 {
                    let v = super::avx2::exp2_8(_mm256_loadu_ps(x[8 * h..].as_ptr()));
                    _mm256_storeu_ps(got[8 * h..].as_mut_ptr(), v);
                }
                if wide {
                    let v = super::avx512::exp2_16(_mm512_loadu_ps(x.as_ptr()));
                    _mm512_storeu_ps(got16.as_mut_ptr(), v);
                }
            }
            for (k, &xk) in x.iter().enumerate().take(chunk.len()) {
                let want = (xk.max(-125.0) as f64).exp2();
                let err = (got[k] as f64 - want).abs() / want;
                assert!(
                    err <= 0.7 * f32::EPSILON as f64,
                    "2^{xk}: {} vs {want}",
                    got[k]
                );
                if wide {
                    assert_eq!(got16[k].to_bits(), got[k].to_bits(), "16 lanes, 2^{xk}");
                }
            }
        }
    }
}
