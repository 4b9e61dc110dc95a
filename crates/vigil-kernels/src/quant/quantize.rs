//! f32 → 8-bit activation blocks, with ggml's reference semantics (`quantize_row_q8_0_ref`,
//! `quantize_row_q8_1_ref`, `quantize_row_q8_K_ref`):
//!
//! - Q8_0 / Q8_1: `d = amax / 127`, `q = roundf(x / d)` (half away from zero), `d` stored as
//!   f16; Q8_1 adds `s = f16(d * sum(q))` with the f32 `d`.
//! - Q8_K: `iscale = -127 / max` where `max` is the first value of largest magnitude,
//!   `q = min(127, round_half_even(iscale * x))`, `d = 1 / iscale`, `bsums` = sums of 16.
//!
//! The AVX2 versions are bit-identical to the scalar ones (same IEEE operations, exact
//! rounding emulation), so the integer part of every quantized dot product is the same on
//! every path.

use super::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_1, QK, QK_K};
use half::f16;

/// Quantize `x` (a multiple of 32 values) into `out` (`x.len() / 32` blocks).
pub fn quantize_row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    assert_eq!(
        x.len(),
        out.len() * QK,
        "quantize_row_q8_0: length mismatch"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::features().avx2_fma_f16c {
        // SAFETY: the CPU supports the enabled features.
        return unsafe { avx2::quantize_row_q8_0(x, out) };
    }
    quantize_row_q8_0_scalar(x, out)
}

/// Quantize `x` (a multiple of 32 values) into `out` (`x.len() / 32` blocks).
pub fn quantize_row_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
    assert_eq!(
        x.len(),
        out.len() * QK,
        "quantize_row_q8_1: length mismatch"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::features().avx2_fma_f16c {
        // SAFETY: the CPU supports the enabled features.
        return unsafe { avx2::quantize_row_q8_1(x, out) };
    }
    quantize_row_q8_1_scalar(x, out)
}

/// Quantize `x` (a multiple of 256 values) into `out` (`x.len() / 256` blocks).
pub fn quantize_row_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
    assert_eq!(
        x.len(),
        out.len() * QK_K,
        "quantize_row_q8_k: length mismatch"
    );
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::features().avx2_fma_f16c {
        // SAFETY: the CPU supports the enabled features.
        return unsafe { avx2::quantize_row_q8_k(x, out) };
    }
    quantize_row_q8_k_scalar(x, out)
}

/// The `d` of a Q8_0/Q8_1 block and its reciprocal (0 for an all-zero block).
fn scale_for_amax(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (d, id)
}

pub fn quantize_row_q8_0_scalar(x: &[f32], out: &mut [BlockQ8_0]) {
    for (xb, yb) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (d, id) = scale_for_amax(amax);
        yb.d = f16::from_f32(d);
        for (q, v) in yb.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
    }
}

pub fn quantize_row_q8_1_scalar(x: &[f32], out: &mut [BlockQ8_1]) {
    for (xb, yb) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (d, id) = scale_for_amax(amax);
        yb.d = f16::from_f32(d);
        let mut sum = 0i32;
        for (q, v) in yb.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        yb.s = f16::from_f32(sum as f32 * d);
    }
}

/// ggml's `nearest_int`: round half to even via the 1.5 * 2^23 trick (valid for |v| < 2^22).
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0f32).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

pub fn quantize_row_q8_k_scalar(x: &[f32], out: &mut [BlockQ8K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *yb = BlockQ8K {
                d: 0.0,
                qs: [0; QK_K],
                bsums: [0; QK_K / 16],
            };
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        fill_bsums(yb);
        yb.d = 1.0 / iscale;
    }
}

fn fill_bsums(b: &mut BlockQ8K) {
    for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i16).sum();
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::vector_math::avx2::hmax8;
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn abs_ps(v: __m256) -> __m256 {
        _mm256_andnot_ps(_mm256_set1_ps(-0.0), v)
    }

    /// C `roundf` on every lane: truncate, then step away from zero when the dropped part
    /// is at least one half (exact: the subtraction of an integral part is exact).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn round_half_away_ps(v: __m256) -> __m256 {
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
        let frac = abs_ps(_mm256_sub_ps(v, t));
        let step = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0)), _mm256_set1_ps(1.0));
        let need = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
        _mm256_add_ps(t, _mm256_and_ps(need, step))
    }

    /// Four vectors of 8 integral f32 in [-128, 127] → 32 i8 in order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn pack_i8(v: [__m256; 4]) -> __m256i {
        let i0 = _mm256_cvtps_epi32(v[0]);
        let i1 = _mm256_cvtps_epi32(v[1]);
        let i2 = _mm256_cvtps_epi32(v[2]);
        let i3 = _mm256_cvtps_epi32(v[3]);
        let a = _mm256_packs_epi32(i0, i1);
        let b = _mm256_packs_epi32(i2, i3);
        let p = _mm256_packs_epi16(a, b);
        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// Load 32 values and return them with their largest magnitude.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn load32(xb: &[f32]) -> ([__m256; 4], f32) {
        assert!(xb.len() >= 32);
        // SAFETY: 32 values checked above.
        let v = unsafe {
            let p = xb.as_ptr();
            [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ]
        };
        let m = _mm256_max_ps(
            _mm256_max_ps(abs_ps(v[0]), abs_ps(v[1])),
            _mm256_max_ps(abs_ps(v[2]), abs_ps(v[3])),
        );
        (v, hmax8(m))
    }

    /// Quantize 32 values to Q8_0/Q8_1 integers; returns the packed values and their sum.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn q8_32(v: [__m256; 4], id: f32) -> (__m256i, i32) {
        let idv = _mm256_set1_ps(id);
        let r = [
            round_half_away_ps(_mm256_mul_ps(v[0], idv)),
            round_half_away_ps(_mm256_mul_ps(v[1], idv)),
            round_half_away_ps(_mm256_mul_ps(v[2], idv)),
            round_half_away_ps(_mm256_mul_ps(v[3], idv)),
        ];
        let sum = _mm256_add_ps(_mm256_add_ps(r[0], r[1]), _mm256_add_ps(r[2], r[3]));
        let sum = _mm256_cvtps_epi32(sum); // exact: integers of magnitude < 2^24
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256::<1>(sum),
        );
        let s = _mm_hadd_epi32(s, s);
        let s = _mm_hadd_epi32(s, s);
        (pack_i8(r), _mm_cvtsi128_si32(s))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn quantize_row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
        for (xb, yb) in x.chunks_exact(QK).zip(out.iter_mut()) {
            let (v, amax) = load32(xb);
            let (d, id) = scale_for_amax(amax);
            yb.d = f16::from_f32(d);
            let (q, _) = q8_32(v, id);
            // SAFETY: `qs` is 32 bytes.
            unsafe { _mm256_storeu_si256(yb.qs.as_mut_ptr().cast(), q) };
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn quantize_row_q8_1(x: &[f32], out: &mut [BlockQ8_1]) {
        for (xb, yb) in x.chunks_exact(QK).zip(out.iter_mut()) {
            let (v, amax) = load32(xb);
            let (d, id) = scale_for_amax(amax);
            yb.d = f16::from_f32(d);
            let (q, sum) = q8_32(v, id);
            yb.s = f16::from_f32(sum as f32 * d);
            // SAFETY: `qs` is 32 bytes.
            unsafe { _mm256_storeu_si256(yb.qs.as_mut_ptr().cast(), q) };
        }
    }

    /// The index of the first value of `xb` whose magnitude is `amax`, if any is (none where
    /// the values hold a NaN).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn first_at(xb: &[f32], amax: f32) -> Option<usize> {
        let target = _mm256_set1_ps(amax);
        for (k, c) in xb.chunks_exact(8).enumerate() {
            // SAFETY: 8 values.
            let v = abs_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) });
            let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(v, target));
            if hit != 0 {
                return Some(8 * k + hit.trailing_zeros() as usize);
            }
        }
        xb.iter().position(|v| v.abs() == amax)
    }

    /// The sums of each 4 consecutive i8 of `q`, as 8 i32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn sums_of_4(q: __m256i) -> __m256i {
        let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
        _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
    }

    /// A Q8_K block's 16 `bsums` from `sums_of_4` of its 8 chunks of 32 values.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn bsums(s: &[__m256i; 8]) -> [i16; QK_K / 16] {
        // Lanes 0..4 of `half(c)`: the first 16 values' sums of chunks c..c + 4, lanes 4..8
        // their second 16 values'.
        let half = |c: usize| {
            let a = _mm256_hadd_epi32(s[c], s[c + 1]);
            let b = _mm256_hadd_epi32(s[c + 2], s[c + 3]);
            _mm256_hadd_epi32(a, b)
        };
        // bsums 0, 2, .., 14 in the low 128 bits, 1, 3, .., 15 in the high (at most
        // 16 · 128 in magnitude: `packs` keeps them exactly).
        let p = _mm256_packs_epi32(half(0), half(4));
        let (even, odd) = (_mm256_castsi256_si128(p), _mm256_extracti128_si256::<1>(p));
        let mut out = [0i16; QK_K / 16];
        // SAFETY: 16 i16 out.
        unsafe {
            _mm_storeu_si128(out.as_mut_ptr().cast(), _mm_unpacklo_epi16(even, odd));
            _mm_storeu_si128(
                out.as_mut_ptr().add(8).cast(),
                _mm_unpackhi_epi16(even, odd),
            );
        }
        out
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn quantize_row_q8_k(x: &[f32], out: &mut [BlockQ8K]) {
        for (xb, yb) in x.chunks_exact(QK_K).zip(out.iter_mut()) {
            let mut m = _mm256_setzero_ps();
            for c in xb.chunks_exact(8) {
                // SAFETY: 8 values.
                m = _mm256_max_ps(m, abs_ps(unsafe { _mm256_loadu_ps(c.as_ptr()) }));
            }
            let amax = hmax8(m);
            if amax == 0.0 {
                *yb = BlockQ8K {
                    d: 0.0,
                    qs: [0; QK_K],
                    bsums: [0; QK_K / 16],
                };
                continue;
            }
            // The reference keeps the first value whose magnitude is the maximum.
            let max = first_at(xb, amax).map_or(amax, |i| xb[i]);
            let iscale = -127.0 / max;
            let isv = _mm256_set1_ps(iscale);
            let mut sums = [_mm256_setzero_si256(); 8];
            for ((xc, qc), sum) in xb
                .chunks_exact(32)
                .zip(yb.qs.chunks_exact_mut(32))
                .zip(&mut sums)
            {
                // SAFETY: 32 values in, 32 bytes out.
                unsafe {
                    let p = xc.as_ptr();
                    let mut r = [_mm256_setzero_ps(); 4];
                    for (k, rk) in r.iter_mut().enumerate() {
                        let scaled = _mm256_mul_ps(_mm256_loadu_ps(p.add(8 * k)), isv);
                        *rk = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                            scaled,
                        );
                    }
                    // `packs` saturates at 127: the reference's `min(127, q)`.
                    let q = pack_i8(r);
                    _mm256_storeu_si256(qc.as_mut_ptr().cast(), q);
                    *sum = sums_of_4(q);
                }
            }
            yb.bsums = bsums(&sums);
            yb.d = 1.0 / iscale;
        }
    }
}
