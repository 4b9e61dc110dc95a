//! The decode tile for Q8_0 matrices interleaved at load (`storage::Layout::Interleaved8`,
//! `BlockQ8_0x8`): one activation row against two groups of 8 weight rows at a time.
//!
//! A block of 8 rows is one run of bytes: 8 vectors each holding one dword of every row, and
//! the 8 scales side by side. Each vector meets the activation's matching dword broadcast to
//! every lane, so lane `k` collects row `k`'s exact integer block dot with no horizontal step,
//! and one scale load and one multiply-add fold all 8 rows (`super::acc_q8`, in block order:
//! the scalar path's bits). The product is signed × signed: `|w| · (y · sign w)`, as the
//! row-major tile (`avx2::Q8_0`). The two groups share the activation's broadcasts.
//!
//! The same packing feeds the prefill GEMMs (`avx2_gemm_q8::Q8Group`), where a row-major
//! matrix is transposed block by block on every call: SmolLM2's 49,152 × 576 output
//! projection at 8 rows spent about half its time there.

use super::avx2::{prefetch_sweep, IntDot, Q8_0};
use super::avx2_q4_decode::GroupTiles;
use super::Acts32;
use crate::quant::blocks::{BlockQ8_0, BlockQ8_0x8};
use std::arch::x86_64::*;

/// The 8 rows of each of `G` adjacent interleaved groups (`g`: their `G * nb` blocks) against
/// activation row `i`; lane `k` of result `[j]` is row `k` of group `j`. `prefetch`: bytes
/// from `g` to the blocks after the `G` groups; those are swept into L1 and the ones as far
/// again into L2 (0: no sweeps).
///
/// # Safety
/// AVX2+F16C and `D`'s features (inlined into an entry point enabling them); `g` addresses
/// `G * nb` blocks; the activation side arrays cover row `i`.
#[inline(always)]
unsafe fn tile_x8<D: IntDot, const G: usize>(
    g: *const BlockQ8_0x8,
    acts: &Acts32<BlockQ8_0>,
    i: usize,
    prefetch: isize,
) -> [__m256; G] {
    let (m, nb) = (acts.m, acts.nb);
    let a = acts.blocks.as_ptr().add(i * nb);
    let step = std::mem::size_of::<BlockQ8_0x8>();
    // As the row-major Q8_0 tile (`avx2::tile`): the group after next into L2, the next one
    // into L1, so a matrix streamed from DRAM keeps its reads in flight.
    let ahead = g.cast::<i8>().wrapping_offset(prefetch);
    let after_next = ahead.wrapping_offset(prefetch);
    let mut acc = [_mm256_setzero_ps(); G];
    for b in 0..nb {
        if prefetch != 0 {
            for j in 0..G {
                prefetch_sweep::<_MM_HINT_T1>(after_next.wrapping_add(j * nb * step), b, step);
                prefetch_sweep::<_MM_HINT_T0>(ahead.wrapping_add(j * nb * step), b, step);
            }
        }
        let y = (*a.add(b)).qs.as_ptr();
        let s: [__m256i; 8] =
            std::array::from_fn(|h| _mm256_set1_epi32(y.add(4 * h).cast::<i32>().read_unaligned()));
        let dy = _mm256_set1_ps(*acts.d.get_unchecked(b * m + i));
        for (j, acc) in acc.iter_mut().enumerate() {
            let x = &*g.add(j * nb + b);
            // Two chains, so that VNNI's one instruction a dword is not bound by its latency.
            let mut sumi = [_mm256_setzero_si256(); 2];
            for h in 0..8 {
                let w = _mm256_loadu_si256(x.qs[h].as_ptr().cast());
                let (u, sy) = (_mm256_sign_epi8(w, w), _mm256_sign_epi8(s[h], w));
                sumi[h % 2] = D::dot4_acc(sumi[h % 2], u, sy);
            }
            let sumi = _mm256_add_epi32(sumi[0], sumi[1]);
            let dx = _mm256_cvtph_ps(_mm_loadu_si128(x.d.as_ptr().cast()));
            let t = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dx, dy));
            *acc = _mm256_add_ps(*acc, t);
        }
    }
    acc
}

/// How far ahead of its current blocks the VNNI decode tile sweeps (and as far again into L2).
/// On the Xeon measured (`gemv_bandwidth q8_0x8`, Qwen3 shapes, huge pages; a plain read
/// 30-32 GB/s), 1.5 KiB ahead read at 29.1-29.9 GB/s where the two groups ahead (17 KiB for
/// Qwen3's 1,024 columns) read at 23.1-27.6; 1-2 KiB at 28.3-29.0, 3-8 KiB at 25.7-27.8. AVX2
/// keeps the two groups ahead, its distance on the AMD EPYC (Zen 3) it was tuned on.
const VNNI_PREFETCH: isize = 1536;

impl GroupTiles for Q8_0 {
    type X8 = BlockQ8_0x8;
    type A = BlockQ8_0;
    #[inline(always)]
    unsafe fn tiles<D: IntDot, const G: usize>(
        g: *const BlockQ8_0x8,
        acts: &Acts32<BlockQ8_0>,
        i: usize,
        prefetch: isize,
    ) -> [__m256; G] {
        tile_x8::<D, G>(g, acts, i, prefetch)
    }
    #[inline(always)]
    fn prefetch<D: IntDot>(next: isize) -> isize {
        if D::VNNI {
            VNNI_PREFETCH
        } else {
            2 * next
        }
    }
}
