//! The k-quant decode tile for row-major matrices (Q5_K, Q6_K, and Q4_K where the loader did
//! not interleave it: `avx2_q4k_decode` takes interleaved Q4_K) × one Q8_K activation row: 8
//! weight rows at a time, each row's block dot left in i32 lanes and the 8 rows' lanes reduced
//! together, so a block's float fold runs once for the 8 rows.
//!
//! `avx2_k::tile` (one weight row, up to 4 activation rows) suits a few activation rows, but a
//! decode step has one: there each weight block paid two horizontal sums (its dot and Q6_K's
//! offset), its scales were built with 16 broadcasts from scalar registers, and its fold was
//! scalar. Qwen3-0.6B-shaped Q4_K_M decode read its weights at 35 % of a plain read of them
//! from DRAM, slower than llama.cpp's. Here the scales are unpacked in vector registers and
//! each chunk's scale is a broadcast from memory (Q4_K, Q5_K) or one shuffle (Q6_K, whose chunk
//! spans two sub-blocks), Q6_K's `-32 · Σ sc · bsum` offset is taken from the lanes before they
//! are summed, the 8 rows' lanes are reduced with 6 `hadd`s, the VNNI multiply-add stays one
//! instruction (`IntDot::madd_acc_whole`), and the next groups' blocks are prefetched as the
//! weights stream (each of the 8 rows is its own run of blocks).
//!
//! The integer dots are the exact sums `avx2_k` computes; the fold is `super::acc_k` /
//! `super::acc_q6k` per lane, with no fused multiply-add, so every output has the scalar
//! path's bits.

// Index loops mirror the block layouts and the tile's rows.
#![allow(clippy::needless_range_loop)]

use super::avx2::{Avx2, IntDot};
use super::avx2_k::{self, FmtK, Q4K, Q5K, Q6K};
use crate::quant::blocks::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use std::arch::x86_64::*;

/// Weight rows a tile reduces together (one i32 / f32 lane each).
const ROWS: usize = 8;

/// One k-quant format's block, as the decode tile dots it.
pub trait KDecode: FmtK {
    /// Q4_K / Q5_K: a second integer sum, of the mins against the activation's pair sums.
    const HAS_MIN: bool;
    /// Lanes whose sum is the block's exact scale-weighted integer dot with `y` (Q6_K's with
    /// its `+32` offset already removed), and (`HAS_MIN`) 4 lanes whose sum is
    /// `Σ_j mins[j] · pairs[j]`, `pairs` being `y`'s 16-value sums added in pairs.
    ///
    /// # Safety
    /// AVX2 and `D`'s features (inlined into an entry point enabling them).
    unsafe fn dot<D: IntDot>(w: &Self::W, y: &BlockQ8K, pairs: __m128i) -> (__m256i, __m128i);
    /// The block's `d` and (`HAS_MIN`) `dmin`, as f16 bits.
    fn scales_f16(w: &Self::W) -> (u16, u16);
}

/// The i16 in word `lo` of each 128-bit lane of `v` broadcast over the low lane, word `hi`
/// over the high one (`lo`, `hi` < 8).
#[inline(always)]
unsafe fn spread_words(v: __m256i, lo: i32, hi: i32) -> __m256i {
    let pick = |w: i32| (2 * w) | ((2 * w + 1) << 8);
    let mask = _mm256_set_m128i(
        _mm_set1_epi16(pick(hi) as i16),
        _mm_set1_epi16(pick(lo) as i16),
    );
    _mm256_shuffle_epi8(v, mask)
}

/// The 8 scales and 8 mins of a Q4_K / Q5_K block's 12 packed bytes at `p` (16 bytes are
/// read: the block's quants follow), as bytes 0..8 and 8..16: `super::scales_mins_k4` on 32-bit
/// lanes (ggml's `kmask` form), in vector registers, where the result is needed.
#[inline(always)]
unsafe fn k4_scales_mins(p: *const u8) -> __m128i {
    let v = _mm_loadu_si128(p.cast());
    let k2 = _mm_set1_epi32(0x0f0f_0f0f);
    // [scales 0..4, mins 0..4]: the low 6 bits of words 0 and 1.
    let low = _mm_and_si128(v, _mm_set1_epi32(0x3f3f_3f3f));
    // [scales 4..8, mins 4..8]: the nibbles of word 2, each with the top 2 bits of word 0's
    // (scales) or word 1's (mins) byte above it.
    let nibbles = _mm_and_si128(
        _mm_srlv_epi32(
            _mm_shuffle_epi32::<0b1010_1010>(v),
            _mm_set_epi32(0, 0, 4, 0),
        ),
        k2,
    );
    let tops = _mm_slli_epi32::<4>(_mm_and_si128(
        _mm_srli_epi32::<6>(v),
        _mm_set1_epi32(0x0303_0303),
    ));
    _mm_unpacklo_epi32(low, _mm_or_si128(nibbles, tops))
}

/// The dword at `p` in every lane, straight from memory: a load-port operation, where a
/// broadcast from a register takes the shuffle port (which the block's other work needs).
///
/// # Safety
/// `p` is readable for 4 bytes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn broadcast_dword(p: *const i32) -> __m256i {
    let r: __m256i;
    std::arch::asm!(
        "vpbroadcastd {r}, dword ptr [{p}]",
        p = in(reg) p,
        r = lateout(ymm_reg) r,
        options(pure, readonly, nostack, preserves_flags),
    );
    r
}

/// Bit `j` of each byte of `qh` moved to bit 4 (the fifth bit of a Q5_K value of sub-block
/// `j`), every other bit clear: one shift of the 16-bit lanes, then a mask.
#[inline(always)]
pub(super) unsafe fn fifth_bit(qh: __m256i, j: usize) -> __m256i {
    let moved = if j <= 4 {
        _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - j as i32))
    } else {
        _mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32 - 4))
    };
    _mm256_and_si256(moved, _mm256_set1_epi8(0x10))
}

/// The scale-weighted dot of 8 chunks of 32 unsigned quants with `y`, chunk `c` scaled by
/// `scale(c)` (i16 lanes): `maddubs` pairs stay within i16 (at most 2 · 63 · 127).
#[inline(always)]
unsafe fn chunk_dots<D: IntDot>(
    q: &[__m256i; 8],
    y: &BlockQ8K,
    scale: impl Fn(usize) -> __m256i,
) -> __m256i {
    // Two sums, even and odd chunks, so that the multiply-adds wait on each other half as long.
    let mut acc = [_mm256_setzero_si256(); 2];
    for c in 0..8 {
        let yv = _mm256_loadu_si256(y.qs.as_ptr().add(32 * c).cast());
        acc[c % 2] = D::madd_acc_whole(acc[c % 2], _mm256_maddubs_epi16(q[c], yv), scale(c));
    }
    _mm256_add_epi32(acc[0], acc[1])
}

/// A Q4_K / Q5_K block's dot, its 4-bit (plus `qh`) quants in `q`, its packed scales at
/// `scales`.
#[inline(always)]
unsafe fn k4_dot<D: IntDot>(
    q: &[__m256i; 8],
    scales: *const u8,
    y: &BlockQ8K,
    pairs: __m128i,
) -> (__m256i, __m128i) {
    let sm = k4_scales_mins(scales);
    // Chunk c is sub-block c: scale c in both i16 halves of every dword.
    let sc = _mm256_cvtepu8_epi32(sm);
    let mut dup = [0i32; 8];
    _mm256_storeu_si256(
        dup.as_mut_ptr().cast(),
        _mm256_or_si256(sc, _mm256_slli_epi32::<16>(sc)),
    );
    let dots = chunk_dots::<D>(q, y, |c| broadcast_dword(dup.as_ptr().add(c)));
    let mins = _mm_unpackhi_epi8(sm, _mm_setzero_si128());
    (dots, _mm_madd_epi16(mins, pairs))
}

/// The 8 chunks of 32 4-bit quants of a Q4_K / Q5_K block's `qs`: chunk `2c` the low nibbles
/// of bytes `32c..32c + 32`, chunk `2c + 1` their high nibbles.
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 128]) -> [__m256i; 8] {
    let low = _mm256_set1_epi8(0x0F);
    let mut q = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        let raw = _mm256_loadu_si256(qs.as_ptr().add(32 * c).cast());
        q[2 * c] = _mm256_and_si256(raw, low);
        q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low);
    }
    q
}

impl KDecode for Q4K {
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn dot<D: IntDot>(w: &BlockQ4K, y: &BlockQ8K, pairs: __m128i) -> (__m256i, __m128i) {
        k4_dot::<D>(&nibbles(&w.qs), w.scales.as_ptr(), y, pairs)
    }
    fn scales_f16(w: &BlockQ4K) -> (u16, u16) {
        (w.d.to_bits(), w.dmin.to_bits())
    }
}

impl KDecode for Q5K {
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn dot<D: IntDot>(w: &BlockQ5K, y: &BlockQ8K, pairs: __m128i) -> (__m256i, __m128i) {
        let qh = _mm256_loadu_si256(w.qh.as_ptr().cast());
        let mut q = nibbles(&w.qs);
        for (j, q) in q.iter_mut().enumerate() {
            *q = _mm256_or_si256(*q, fifth_bit(qh, j));
        }
        k4_dot::<D>(&q, w.scales.as_ptr(), y, pairs)
    }
    fn scales_f16(w: &BlockQ5K) -> (u16, u16) {
        (w.d.to_bits(), w.dmin.to_bits())
    }
}

impl KDecode for Q6K {
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn dot<D: IntDot>(w: &BlockQ6K, y: &BlockQ8K, _: __m128i) -> (__m256i, __m128i) {
        let q = avx2_k::q6k_quants(w);
        // The 16 scales as i16; chunk c (values 32c..32c + 32) is sub-blocks 2c and 2c + 1,
        // one a 128-bit lane.
        let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.scales.as_ptr().cast()));
        let first = _mm256_permute2x128_si256::<0x00>(sc, sc);
        let last = _mm256_permute2x128_si256::<0x11>(sc, sc);
        let dots = chunk_dots::<D>(&q, y, |c| {
            let (half, w) = if c < 4 {
                (first, 2 * c)
            } else {
                (last, 2 * c - 8)
            };
            spread_words(half, w as i32, w as i32 + 1)
        });
        // The quants were taken unsigned (q + 32): remove 32 · Σ sc · (16-value sum of y).
        let bsums = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc, bsums));
        (_mm256_sub_epi32(dots, offset), _mm_setzero_si128())
    }
    fn scales_f16(w: &BlockQ6K) -> (u16, u16) {
        (w.d.to_bits(), 0)
    }
}

/// Lane `k` = the sum of the 8 lanes of `v[k]`.
#[inline(always)]
unsafe fn reduce8(v: &[__m256i; ROWS]) -> __m256i {
    let t0 = _mm256_hadd_epi32(v[0], v[1]);
    let t1 = _mm256_hadd_epi32(v[2], v[3]);
    let t2 = _mm256_hadd_epi32(v[4], v[5]);
    let t3 = _mm256_hadd_epi32(v[6], v[7]);
    // Per 128-bit lane: rows 0..4 in `u0`, 4..8 in `u1`, each the sum of that lane's half.
    let u0 = _mm256_hadd_epi32(t0, t1);
    let u1 = _mm256_hadd_epi32(t2, t3);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(u0, u1),
        _mm256_permute2x128_si256::<0x31>(u0, u1),
    )
}

/// Lane `k` = the sum of the 4 lanes of `v[k]`.
#[inline(always)]
unsafe fn reduce8_128(v: &[__m128i; ROWS]) -> __m256i {
    let lo = _mm_hadd_epi32(_mm_hadd_epi32(v[0], v[1]), _mm_hadd_epi32(v[2], v[3]));
    let hi = _mm_hadd_epi32(_mm_hadd_epi32(v[4], v[5]), _mm_hadd_epi32(v[6], v[7]));
    _mm256_set_m128i(hi, lo)
}

/// Weight rows `w`, `w + nb`, ... (8 rows of `nb` blocks) against activation row `y`; lane `k`
/// is row `k`'s dot. `prefetch` (0: none): bytes from each row to the next group's same row,
/// prefetched block by block into L1, and twice as far into L2.
///
/// # Safety
/// AVX2+F16C and `D`'s features (inlined into an entry point enabling them); `w` addresses 8
/// rows of `nb` blocks and `y` `nb` blocks.
#[inline(always)]
unsafe fn tile<D: IntDot, F: KDecode>(
    w: *const F::W,
    nb: usize,
    y: &[BlockQ8K],
    prefetch: isize,
) -> __m256 {
    let size = std::mem::size_of::<F::W>();
    let mut sum = _mm256_setzero_ps();
    for b in 0..nb {
        let yb = &y[b];
        let pairs = if F::HAS_MIN {
            let s = yb.bsums.as_ptr().cast::<__m128i>();
            _mm_hadd_epi16(_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)))
        } else {
            _mm_setzero_si128()
        };
        let mut dots = [_mm256_setzero_si256(); ROWS];
        let mut mins = [_mm_setzero_si128(); ROWS];
        let mut d = [0u16; ROWS];
        let mut dmin = [0u16; ROWS];
        for k in 0..ROWS {
            let wb = w.add(k * nb + b);
            if prefetch != 0 {
                let next = wb.cast::<i8>().wrapping_offset(prefetch);
                for line in (0..size).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T1>(next.wrapping_offset(prefetch).wrapping_add(line));
                    _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(line));
                }
            }
            (dots[k], mins[k]) = F::dot::<D>(&*wb, yb, pairs);
            (d[k], dmin[k]) = F::scales_f16(&*wb);
        }
        let dy = _mm256_set1_ps(yb.d);
        let dx = _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().cast()));
        let mut t = _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(reduce8(&dots)));
        if F::HAS_MIN {
            let dm = _mm256_cvtph_ps(_mm_loadu_si128(dmin.as_ptr().cast()));
            let summ = _mm256_cvtepi32_ps(reduce8_128(&mins));
            t = _mm256_sub_ps(t, _mm256_mul_ps(_mm256_mul_ps(dm, dy), summ));
        }
        sum = _mm256_add_ps(sum, t);
    }
    sum
}

/// `out[i * rows + j]` for all `m` activation rows and weight rows `j in r0..r1`, 8 weight
/// rows at a time (a last group of fewer goes through `avx2_k`'s row tile).
///
/// # Safety
/// AVX2+FMA+F16C; `r0` is a multiple of 8; `w` holds `rows * nb` blocks; `acts` holds
/// `m * nb`; `out` addresses `m * rows` floats and no other thread writes columns `r0..r1`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn matmul_rows<F: KDecode>(
    w: &[F::W],
    rows: usize,
    acts: &[BlockQ8K],
    m: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    rows_with::<Avx2, F>(w, rows, acts, m, r0, r1, out)
}

/// `matmul_rows` with `D`'s integer dot: the body every entry point (here and in `vnni`)
/// compiles for its ISA.
///
/// # Safety
/// As `matmul_rows`, plus `D`'s features.
#[inline(always)]
pub unsafe fn rows_with<D: IntDot, F: KDecode>(
    w: &[F::W],
    rows: usize,
    acts: &[BlockQ8K],
    m: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    debug_assert!(r0.is_multiple_of(ROWS));
    let nb = acts.len() / m;
    // Decode streams the weights once: each row's blocks of the next group are 8 rows on.
    let next = (ROWS * nb * std::mem::size_of::<F::W>()) as isize;
    let mut j0 = r0;
    while j0 + ROWS <= r1 {
        let g = w.as_ptr().add(j0 * nb);
        for i in 0..m {
            let y = &acts[i * nb..(i + 1) * nb];
            let s = tile::<D, F>(g, nb, y, if i == 0 { next } else { 0 });
            _mm256_storeu_ps(out.add(i * rows + j0), s);
        }
        j0 += ROWS;
    }
    if j0 < r1 {
        avx2_k::rows_with::<D, F>(w, rows, acts, m, j0, r1, out);
    }
}
