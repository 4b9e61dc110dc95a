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
//!
//! Matrices interleaved at load (`storage::Layout::Interleaved8`) take `tile_x8` instead: a
//! block of 8 rows is one run of bytes holding one dword of every row per 256-bit vector and
//! the 8 scales side by side, so a block is 4 loads, 8 multiplies summed without any
//! horizontal step (`IntDot::dot4_sum8`) and one scale load: about half the instructions of
//! `tile`, whose shuffles and per-row scale gathers bound it below the DRAM rate. Two groups
//! go through together (`tile_x8` with `G` = 2), so each activation dword is broadcast once per 16
//! rows: one thread's pass over SmolLM2's layer in L2 takes 6–7 % less time on Zen 3.

use super::avx2::{fold_block, prefetch_sweep, Avx2, Fmt32, IntDot};
use super::avx2_gemm::{store8, Nibble32};
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
            prefetch_sweep::<_MM_HINT_T0>(ahead, b, 8 * std::mem::size_of::<F::W>());
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

/// The activation's 8 dwords of block `y` broadcast to every lane: `[2h]` bytes `4h..4h + 4`,
/// `[2h + 1]` bytes `16 + 4h..16 + 4h + 4`, the partners of `split`'s vectors.
///
/// # Safety
/// AVX2; `y` addresses 32 bytes.
#[inline(always)]
unsafe fn broadcast_dwords(y: *const i8) -> [__m256i; 8] {
    std::array::from_fn(|k| {
        let at = 16 * (k % 2) + 4 * (k / 2);
        _mm256_set1_epi32(y.add(at).cast::<i32>().read_unaligned())
    })
}

/// The 8 rows' nibbles of one interleaved block as bytes: `[2h]` the low nibbles of dword `h`
/// of every row (lane `k`: row `k`), `[2h + 1]` its high nibbles.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn split<F: Nibble32>(x: &F::X8) -> [__m256i; 8] {
    let low = _mm256_set1_epi8(0x0F);
    let qs = F::x8_qs(x);
    let mut u = [_mm256_setzero_si256(); 8];
    for h in 0..4 {
        let raw = _mm256_loadu_si256(qs[h].as_ptr().cast());
        u[2 * h] = _mm256_and_si256(raw, low);
        u[2 * h + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low);
    }
    u
}

/// `acc` plus one block's term of `super::acc_q8` / `super::acc_q4_1` for the 8 rows of `x`,
/// from their exact integer dots `sumi`, against the activation block whose side-array index
/// is `side`; `dy` (and `sy`, Q4_1) are that block's scale (and scaled sum) broadcast.
///
/// # Safety
/// AVX2+F16C; `side` indexes the filled side arrays.
#[inline(always)]
unsafe fn fold_x8<F: Nibble32>(
    acc: __m256,
    mut sumi: __m256i,
    x: &F::X8,
    acts: &Acts32<F::A>,
    side: usize,
    dy: __m256,
    sy: __m256,
) -> __m256 {
    if F::OFFSET8 {
        sumi = _mm256_add_epi32(sumi, _mm256_set1_epi32(*acts.neg8_ysum.get_unchecked(side)));
    }
    let dx = _mm256_cvtph_ps(_mm_loadu_si128(F::x8_d(x).as_ptr().cast()));
    let mut t = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dx, dy));
    if F::HAS_MIN {
        let mx = _mm256_cvtph_ps(_mm_loadu_si128(F::x8_m(x).as_ptr().cast()));
        t = _mm256_add_ps(t, _mm256_mul_ps(mx, sy));
    }
    _mm256_add_ps(acc, t)
}

/// The 8 rows of each of `G` adjacent interleaved groups (`g`: their `G * nb` blocks) against
/// activation row `i`; lane `k` of result `[j]` is row `k` of group `j`. Per block, lane `k`
/// gets its row's exact integer dot (`Σ_h` of the low nibbles of dword `h` times the
/// activation's bytes `4h..4h + 4`, and of the high nibbles times bytes `16 + 4h..`), then
/// `super::acc_q8` / `super::acc_q4_1` in block order: the scalar path's bits, whatever `G`.
/// The groups share each activation block's broadcasts. `prefetch`: bytes from `g` to the
/// blocks after the `G` groups, swept by `prefetch_sweep` (0: none).
///
/// # Safety
/// AVX2+F16C and `D`'s features (inlined into an entry point enabling them); `g` addresses
/// `G * nb` blocks; the activation side arrays cover row `i`.
#[inline(always)]
pub unsafe fn tile_x8<D: IntDot, F: Nibble32, const G: usize>(
    g: *const F::X8,
    acts: &Acts32<F::A>,
    i: usize,
    prefetch: isize,
) -> [__m256; G] {
    let (m, nb) = (acts.m, acts.nb);
    let a = acts.blocks.as_ptr().add(i * nb);
    let step = std::mem::size_of::<F::X8>();
    let ahead = g.cast::<i8>().wrapping_offset(prefetch);
    let mut acc = [_mm256_setzero_ps(); G];
    for b in 0..nb {
        if prefetch != 0 {
            for j in 0..G {
                prefetch_sweep::<_MM_HINT_T0>(ahead.wrapping_add(j * nb * step), b, step);
            }
        }
        let s = broadcast_dwords(F::act_qs(&*a.add(b)).as_ptr());
        let side = b * m + i;
        let (dy, sy) = side_scales::<F>(acts, side);
        for (j, acc) in acc.iter_mut().enumerate() {
            let x = &*g.add(j * nb + b);
            let sumi = D::dot4_sum8(&split::<F>(x), &s);
            *acc = fold_x8::<F>(*acc, sumi, x, acts, side, dy, sy);
        }
    }
    acc
}

/// The activation block `side`'s scale and (Q4_1) scaled sum, broadcast.
///
/// # Safety
/// AVX; `side` indexes the filled side arrays.
#[inline(always)]
unsafe fn side_scales<F: Nibble32>(acts: &Acts32<F::A>, side: usize) -> (__m256, __m256) {
    let dy = _mm256_set1_ps(*acts.d.get_unchecked(side));
    let sy = if F::HAS_MIN {
        _mm256_set1_ps(*acts.s.get_unchecked(side))
    } else {
        _mm256_setzero_ps()
    };
    (dy, sy)
}

/// `out[i * rows + j]` for all activation rows `i` and weight rows `j in r0..r1` of an
/// interleaved matrix (`w`: its groups of `nb` blocks) of any format with group tiles (Q4_0,
/// Q4_1 here, Q8_0 in `avx2_q8_decode`), two groups at a time; the groups' blocks stay in L1
/// for the activation rows after the first.
///
/// # Safety
/// AVX2+FMA+F16C available; `r0` is a multiple of 8 and `w` holds the groups of rows
/// `< r1`; `out` addresses `m * rows` floats and no other thread writes columns `r0..r1`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn matmul_rows_x8<T: GroupTiles>(
    w: &[T::X8],
    rows: usize,
    acts: &Acts32<T::A>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    rows_x8_with::<Avx2, T>(w, rows, acts, r0, r1, out)
}

/// A format's decode tile over interleaved groups, as `rows_x8_with` drives it: the 4-bit
/// formats' `tile_x8` here, Q8_0's in `avx2_q8_decode`.
pub trait GroupTiles {
    /// The interleaved block of 8 rows.
    type X8;
    /// The activation block.
    type A;
    /// The 8 rows of each of `G` adjacent groups against activation row `i` (as `tile_x8`).
    ///
    /// # Safety
    /// As `tile_x8`.
    unsafe fn tiles<D: IntDot, const G: usize>(
        g: *const Self::X8,
        acts: &Acts32<Self::A>,
        i: usize,
        prefetch: isize,
    ) -> [__m256; G];
    /// The `prefetch` a decode pass over two groups gives `tiles`, `next` bytes a group: by
    /// default the two groups after them.
    #[inline(always)]
    fn prefetch<D: IntDot>(next: isize) -> isize {
        2 * next
    }
}

impl<F: Nibble32> GroupTiles for F {
    type X8 = F::X8;
    type A = F::A;
    #[inline(always)]
    unsafe fn tiles<D: IntDot, const G: usize>(
        g: *const F::X8,
        acts: &Acts32<F::A>,
        i: usize,
        prefetch: isize,
    ) -> [__m256; G] {
        tile_x8::<D, F, G>(g, acts, i, prefetch)
    }
}

/// `matmul_rows_x8` with `D`'s integer dot and `T`'s tile: the body every interleaved decode
/// entry point (here, in `avx2_q8_decode` and in `vnni`) compiles for its ISA.
///
/// # Safety
/// As `matmul_rows_x8`, plus `D`'s features.
#[inline(always)]
pub unsafe fn rows_x8_with<D: IntDot, T: GroupTiles>(
    w: &[T::X8],
    rows: usize,
    acts: &Acts32<T::A>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    debug_assert!(r0.is_multiple_of(8));
    let nb = acts.nb;
    // Decode streams the weights once: sweep the next group while computing this one.
    let next = (nb * std::mem::size_of::<T::X8>()) as isize;
    let mut j0 = r0;
    // Two groups at a time share the activation's broadcasts; an odd last group goes alone.
    while j0 + 8 < r1 {
        let g = w.as_ptr().add(j0 / 8 * nb);
        for i in 0..acts.m {
            let acc = T::tiles::<D, 2>(g, acts, i, if i == 0 { T::prefetch::<D>(next) } else { 0 });
            store8(out.add(i * rows + j0), acc[0], 8);
            store8(out.add(i * rows + j0 + 8), acc[1], (r1 - j0 - 8).min(8));
        }
        j0 += 16;
    }
    if j0 < r1 {
        let g = w.as_ptr().add(j0 / 8 * nb);
        for i in 0..acts.m {
            let [acc] = T::tiles::<D, 1>(g, acts, i, if i == 0 { next } else { 0 });
            store8(out.add(i * rows + j0), acc, (r1 - j0).min(8));
        }
    }
}
