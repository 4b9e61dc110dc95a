//! The decode tile (one activation row × 8 weight rows) for the 4-bit 32-value formats (Q4_0,
//! Q4_1), written for the shuffle port.
//!
//! `avx2::tile` spends most of a decode block on port 5: each row's nibbles are widened with
//! an in-register insert, and each row's 8 i32 lanes go through a 6-`hadd` tree. Here rows `k`
//! and `k + 4` share a register: their 16 bytes of nibbles are loaded into its two halves
//! (the insert comes from memory), the low nibbles (values 0–15) meet the activation's first
//! 16 quants broadcast to both halves, the high nibbles its last 16, so each row leaves 4 i32
//! lanes and 3 `hadd`s reduce all 8 rows. The integer block sums are exact, and the float
//! steps are `avx2::fold_block`'s, so every lane gets `avx2::tile`'s bits.

use super::avx2::{fold_block, prefetch_sweep, Fmt32, IntDot};
use super::Acts32;
use std::arch::x86_64::*;

/// Weight rows `w[0..8]` against activation row `i0` (`a`) over `nb` blocks; lane `k` is row
/// `k`. `prefetch`: bytes from these rows to the next group's, swept by `prefetch_sweep` (0: none).
///
/// # Safety
/// AVX2 and `D`'s features (inlined into an entry point enabling them); every pointer
/// addresses `nb` blocks; `F::NIBBLES`.
#[inline(always)]
pub unsafe fn tile<D: IntDot, F: Fmt32>(
    w: &[*const F::W; 8],
    a: *const F::A,
    acts: &Acts32<F::A>,
    i0: usize,
    nb: usize,
    prefetch: isize,
) -> [f32; 8] {
    let low = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let ahead = w[0].cast::<i8>().wrapping_offset(prefetch);
    for b in 0..nb {
        if prefetch != 0 {
            prefetch_sweep(ahead, b, 8 * std::mem::size_of::<F::W>());
        }
        let y = F::act_qs(a.add(b));
        let y_lo = _mm256_broadcastsi128_si256(_mm_loadu_si128(y.cast()));
        let y_hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(y.add(16).cast()));
        // No closure here: it would not inherit the entry point's target features.
        let mut p = [_mm256_setzero_si256(); 4];
        for k in 0..4 {
            let q = _mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(F::weight_qs(w[k].add(b)).cast())),
                _mm_loadu_si128(F::weight_qs(w[k + 4].add(b)).cast()),
            );
            let lo = _mm256_and_si256(q, low);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low);
            p[k] = D::dot4_acc(D::dot4(lo, y_lo), hi, y_hi);
        }
        // [row k: 4 lanes | row k + 4: 4 lanes] → [rows 0–3 | rows 4–7].
        let sumi = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        acc = fold_block::<F, 1, 8>(acc, sumi, w, acts, b, i0);
    }
    let mut r = [0f32; 8];
    _mm256_storeu_ps(r.as_mut_ptr(), acc);
    r
}
