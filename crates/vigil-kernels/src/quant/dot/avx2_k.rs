//! AVX2 kernels for the k-quants (Q4_K, Q5_K, Q6_K weights × Q8_K activations).
//!
//! Each weight super-block is unpacked once into 8 vectors of 32 unsigned quants in value
//! order plus one i16 scale vector per vector, then dotted with up to `MR` activation rows:
//! `maddubs` (quant × activation, pairs) → `madd` with the scales → i32 lanes → exact
//! horizontal sum. The kernels are generic over `IntDot`, so `vnni` compiles the same code
//! with `vpdpwssd` in place of `madd` + `add`. The float fold is `super::acc_k` /
//! `super::acc_q6k`, as in the scalar path, so results are bit-identical to it.
//!
//! Decode takes `avx2_k_decode`'s 8-row tile and from 3–4 activation rows the k-quants take
//! their GEMMs (`avx2_kgemm`, `avx512_kgemm`), so this row tile serves the last group of fewer
//! than 8 weight rows of a decode.

// Index loops mirror the block layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::avx2::IntDot;
use super::{acc_k, acc_q6k, k_min_sum, scales_mins_k4};
use crate::quant::blocks::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};
use std::arch::x86_64::*;

const ROW_CHUNK: usize = 32;

/// An unpacked weight super-block.
pub struct Unpacked {
    q: [__m256i; 8],
    scales: [__m256i; 8],
    dx: f32,
    dmin: f32,
    mins: [u8; 8],
    /// Q6_K: the 16 scales as i16, for the `-32 · Σ sc · bsum` correction.
    sc6: __m256i,
}

/// One k-quant weight format.
pub trait FmtK {
    type W: bytemuck::Pod;
    /// # Safety
    /// AVX2+F16C.
    unsafe fn unpack(w: &Self::W) -> Unpacked;
    /// Fold one super-block's integer dot into `sum`.
    ///
    /// # Safety
    /// AVX2 (inlined into each entry point).
    unsafe fn fold(sum: f32, u: &Unpacked, sumi: i32, y: &BlockQ8K) -> f32;
}

pub struct Q4K;
pub struct Q5K;
pub struct Q6K;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_to_f32(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_scales(scales: &[u8; 12]) -> ([__m256i; 8], [u8; 8]) {
    let (sc, mins) = scales_mins_k4(scales);
    let mut v = [_mm256_setzero_si256(); 8];
    for c in 0..8 {
        v[c] = _mm256_set1_epi16(sc[c] as i16);
    }
    (v, mins)
}

fn fold_k4(sum: f32, u: &Unpacked, sumi: i32, y: &BlockQ8K) -> f32 {
    acc_k(sum, sumi, k_min_sum(&u.mins, &y.bsums), u.dx, u.dmin, y.d)
}

impl FmtK for Q4K {
    type W = BlockQ4K;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(w: &BlockQ4K) -> Unpacked {
        let (scales, mins) = k4_scales(&w.scales);
        let low = _mm256_set1_epi8(0x0F);
        let mut q = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            let raw = _mm256_loadu_si256(w.qs.as_ptr().add(32 * c).cast());
            q[2 * c] = _mm256_and_si256(raw, low);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low);
        }
        Unpacked {
            q,
            scales,
            dx: f16_to_f32(w.d.to_bits()),
            dmin: f16_to_f32(w.dmin.to_bits()),
            mins,
            sc6: _mm256_setzero_si256(),
        }
    }
    #[inline(always)]
    unsafe fn fold(sum: f32, u: &Unpacked, sumi: i32, y: &BlockQ8K) -> f32 {
        fold_k4(sum, u, sumi, y)
    }
}

impl FmtK for Q5K {
    type W = BlockQ5K;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(w: &BlockQ5K) -> Unpacked {
        let (scales, mins) = k4_scales(&w.scales);
        let low = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let qh = _mm256_loadu_si256(w.qh.as_ptr().cast());
        let mut q = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            let raw = _mm256_loadu_si256(w.qs.as_ptr().add(32 * c).cast());
            let nib = [
                _mm256_and_si256(raw, low),
                _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low),
            ];
            for (h, n) in nib.into_iter().enumerate() {
                let j = 2 * c + h;
                let bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)), one);
                q[j] = _mm256_or_si256(n, _mm256_slli_epi16::<4>(bit));
            }
        }
        Unpacked {
            q,
            scales,
            dx: f16_to_f32(w.d.to_bits()),
            dmin: f16_to_f32(w.dmin.to_bits()),
            mins,
            sc6: _mm256_setzero_si256(),
        }
    }
    #[inline(always)]
    unsafe fn fold(sum: f32, u: &Unpacked, sumi: i32, y: &BlockQ8K) -> f32 {
        fold_k4(sum, u, sumi, y)
    }
}

/// A Q6_K block's 256 quants + 32 (0..63) in value order, 32 a vector
/// (`scalar::q6k_values` + 32).
///
/// # Safety
/// AVX2 (inlined into a function enabling it).
#[inline(always)]
pub(super) unsafe fn q6k_quants(w: &BlockQ6K) -> [__m256i; 8] {
    let low = _mm256_set1_epi8(0x0F);
    let mut q = [_mm256_setzero_si256(); 8];
    for n in 0..2 {
        let ql0 = _mm256_loadu_si256(w.ql.as_ptr().add(64 * n).cast());
        let ql1 = _mm256_loadu_si256(w.ql.as_ptr().add(64 * n + 32).cast());
        let qh = _mm256_loadu_si256(w.qh.as_ptr().add(32 * n).cast());
        let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)));
        let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C)));
        let h2 = _mm256_and_si256(qh, _mm256_set1_epi8(0x30));
        let h3 = _mm256_and_si256(_mm256_srli_epi16::<2>(qh), _mm256_set1_epi8(0x30));
        q[4 * n] = _mm256_or_si256(_mm256_and_si256(ql0, low), h0);
        q[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low), h1);
        q[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low), h2);
        q[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low), h3);
    }
    q
}

impl FmtK for Q6K {
    type W = BlockQ6K;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(w: &BlockQ6K) -> Unpacked {
        let q = q6k_quants(w);
        let mut scales = [_mm256_setzero_si256(); 8];
        for c in 0..8 {
            scales[c] = _mm256_set_m128i(
                _mm_set1_epi16(w.scales[2 * c + 1] as i16),
                _mm_set1_epi16(w.scales[2 * c] as i16),
            );
        }
        Unpacked {
            q,
            scales,
            dx: f16_to_f32(w.d.to_bits()),
            dmin: 0.0,
            mins: [0; 8],
            sc6: _mm256_cvtepi8_epi16(_mm_loadu_si128(w.scales.as_ptr().cast())),
        }
    }
    #[inline(always)]
    unsafe fn fold(sum: f32, u: &Unpacked, sumi: i32, y: &BlockQ8K) -> f32 {
        // The quants were taken unsigned (0..63); remove the +32 offset exactly. Written on
        // 256 bits: left to the compiler, an AVX-512 entry point vectorizes this sum on zmm,
        // and one 512-bit instruction in the loop costs the 256-bit ones a port (Q6_K prefill
        // ran 27% slower).
        let bsums = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        let offset = hsum_i32(_mm256_madd_epi16(u.sc6, bsums));
        acc_q6k(sum, sumi - 32 * offset, u.dx, y.d)
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0x4E>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0xB1>(s));
    _mm_cvtsi128_si32(s)
}

/// The scale-weighted integer dot of an unpacked super-block with one activation block. The
/// quant × activation pair sums stay within i16 (at most 2 · 63 · 127), so `maddubs` is exact;
/// `D::madd_acc` scales and accumulates them (`madd` + `add`, or one `vpdpwssd`).
#[inline(always)]
unsafe fn block_dot<D: IntDot>(u: &Unpacked, y: &BlockQ8K) -> i32 {
    let mut acc = _mm256_setzero_si256();
    for c in 0..8 {
        let yv = _mm256_loadu_si256(y.qs.as_ptr().add(32 * c).cast());
        let p = _mm256_maddubs_epi16(u.q[c], yv);
        acc = D::madd_acc(acc, p, u.scales[c]);
    }
    hsum_i32(acc)
}

/// `MR` activation rows × one weight row.
#[inline(always)]
unsafe fn tile<D: IntDot, F: FmtK, const MR: usize>(
    w: &[F::W],
    a: &[&[BlockQ8K]; MR],
) -> [f32; MR] {
    let mut sum = [0f32; MR];
    for (b, wb) in w.iter().enumerate() {
        let u = F::unpack(wb);
        for i in 0..MR {
            let y = &a[i][b];
            sum[i] = F::fold(sum[i], &u, block_dot::<D>(&u, y), y);
        }
    }
    sum
}

/// `out[i * rows + j]` for all `m` activation rows and weight rows `j in r0..r1`, with `D`'s
/// integer dot: the last group of fewer than 8 weight rows of `avx2_k_decode`'s entry points,
/// compiled for their ISA.
///
/// # Safety
/// AVX2+FMA+F16C and `D`'s features; `w` holds `rows * nb` blocks; `acts` holds `m * nb`;
/// `out` addresses `m * rows` floats and no other thread writes columns `r0..r1`.
#[inline(always)]
pub unsafe fn rows_with<D: IntDot, F: FmtK>(
    w: &[F::W],
    rows: usize,
    acts: &[BlockQ8K],
    m: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    let nb = acts.len() / m;
    debug_assert_eq!(nb * QK_K * m, acts.len() * QK_K);
    let wrow = |j: usize| &w[j * nb..(j + 1) * nb];
    let arow = |i: usize| &acts[i * nb..(i + 1) * nb];
    for c0 in (0..m).step_by(ROW_CHUNK) {
        let c1 = (c0 + ROW_CHUNK).min(m);
        let full = c0 + (c1 - c0) / 4 * 4;
        // Each weight row serves every activation row of the chunk while it is in L1.
        for j in r0..r1 {
            for i0 in (c0..full).step_by(4) {
                let ap = [arow(i0), arow(i0 + 1), arow(i0 + 2), arow(i0 + 3)];
                let r = tile::<D, F, 4>(wrow(j), &ap);
                for (i, v) in r.into_iter().enumerate() {
                    *out.add((i0 + i) * rows + j) = v;
                }
            }
            for i in full..c1 {
                *out.add(i * rows + j) = tile::<D, F, 1>(wrow(j), &[arow(i)])[0];
            }
        }
    }
}
