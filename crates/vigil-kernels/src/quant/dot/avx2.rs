//! AVX2 tiles for the 32-value formats (Q4_0, Q4_1 and Q8_0 weights).
//!
//! A tile computes `MR × NR = 8` (activation row, weight row) pairs at once: per block it
//! unpacks each weight block once, takes each pair's exact integer dot as 8 i32 lanes
//! (`IntDot::dot4`: `maddubs` + `madd` here, one `vpdpbusd` when `vnni` compiles the same
//! code), reduces the 8 pairs' lanes with one `hadd` tree into one vector whose lane `k` is
//! pair `(i = k % MR, j = k / MR)`, and folds that into a per-pair f32 lane with the same
//! operations as `super::acc_q8` / `super::acc_q4_1`. Every pair therefore gets the scalar
//! path's result bit for bit, whatever tile shape computed it.
//!
//! Shapes: 4 × 2 for prefill (each weight block serves 4 activation rows), 1 × 8 for decode
//! and for the activation rows left over (`m % 4`); for Q4_0 and Q4_1 the 1 × 8 tile is
//! `avx2_q4_decode`'s, which gets the same lanes with fewer shuffles.

// Index loops mirror the block layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::Acts32;
use crate::quant::blocks::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1};
use std::arch::x86_64::*;

/// Activation rows per pass over a thread's weight rows in prefill; their quantized blocks
/// stay in L2 while each weight tile is reused across them.
const ROW_CHUNK: usize = 64;

/// One 32-value weight format as the tiles see it.
pub trait Fmt32 {
    type W: bytemuck::Pod;
    type A: bytemuck::Pod;
    /// Q4_1: add `mx * sy` per block.
    const HAS_MIN: bool;
    /// Q4_0: the quants are stored +8; add `-8 * Σy` (`Acts32::neg8_ysum`) to the integer dot.
    const OFFSET8: bool;
    /// The weight quants (`[0]`) and, for signed formats, their magnitudes (`[1]`).
    ///
    /// # Safety
    /// Requires AVX2; `w` points to a valid block.
    unsafe fn weight_values(w: *const Self::W) -> [__m256i; 2];
    /// # Safety
    /// Requires AVX2; `a` points to a valid block.
    unsafe fn act_values(a: *const Self::A) -> __m256i;
    /// 8 i32 lanes summing to the block's integer dot, with `D`'s instructions.
    ///
    /// # Safety
    /// Requires AVX2 and `D`'s features.
    unsafe fn pair_dot<D: IntDot>(w: [__m256i; 2], y: __m256i) -> __m256i;
    /// f16 bits of the weight block's scale and min.
    fn weight_d_m(w: &Self::W) -> (u16, u16);
    /// 4-bit quants, 16 bytes a block (low nibbles values 0–15, high 16–31): decode takes
    /// `avx2_q4_decode`'s tile, which reads them through `weight_qs`.
    const NIBBLES: bool = false;
    /// The block's 16 bytes of nibbles (formats with `NIBBLES` only).
    ///
    /// # Safety
    /// `w` points to a valid block.
    unsafe fn weight_qs(w: *const Self::W) -> *const u8 {
        unreachable!("{:p}: not a 4-bit format", w)
    }
    /// The activation block's 32 quants.
    ///
    /// # Safety
    /// `a` points to a valid block.
    unsafe fn act_qs(a: *const Self::A) -> *const i8;
}

pub struct Q4_0;
pub struct Q4_1;
pub struct Q8_0;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(qs: &[u8; 16]) -> __m256i {
    // SAFETY: 16 bytes.
    let q = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
    let hi = _mm_srli_epi16::<4>(q);
    _mm256_and_si256(_mm256_set_m128i(hi, q), _mm256_set1_epi8(0x0F))
}

/// The integer dot steps the row tiles (and `avx2_k`) are written against: AVX2 here, the
/// 256-bit VNNI encodings in `vnni`. Every implementation gives the same exact integers.
pub trait IntDot {
    /// A VNNI encoding (`vnni`): on the CPUs that have one, some tiles prefetch differently.
    const VNNI: bool = false;
    /// `Σ_4 u8(u) · i8(s)` per i32 lane. Callers keep each i16 pair sum `u·s + u·s` within
    /// i16 (AVX2 saturates there; VNNI has no i16 stage).
    ///
    /// # Safety
    /// AVX2 and the implementation's features (inlined into an entry point enabling them).
    unsafe fn dot4(u: __m256i, s: __m256i) -> __m256i;
    /// `acc + Σ_2 i16(a) · i16(b)` per i32 lane.
    ///
    /// # Safety
    /// As `dot4`.
    unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// `madd_acc`, as one instruction on the VNNI encodings even where LLVM would split it
    /// (`vnni::Vnni256::dpwssd_whole`).
    ///
    /// # Safety
    /// As `dot4`.
    #[inline(always)]
    unsafe fn madd_acc_whole(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        Self::madd_acc(acc, a, b)
    }
    /// `acc + dot4(u, s)` (one instruction with VNNI).
    ///
    /// # Safety
    /// As `dot4`.
    #[inline(always)]
    unsafe fn dot4_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(acc, Self::dot4(u, s))
    }
    /// `Σ_k dot4(u[k], s[k])` per i32 lane. AVX2 sums the 8 `maddubs` results in i16 and
    /// widens once, so callers keep each i16 lane's sum over all 8 pairs within i16 (4-bit
    /// weights: 8 · 2 · 15 · 127 = 30,480).
    ///
    /// # Safety
    /// As `dot4`.
    #[inline(always)]
    unsafe fn dot4_sum8(u: &[__m256i; 8], s: &[__m256i; 8]) -> __m256i {
        let mut t = _mm256_maddubs_epi16(u[0], s[0]);
        for k in 1..8 {
            t = _mm256_add_epi16(t, _mm256_maddubs_epi16(u[k], s[k]));
        }
        _mm256_madd_epi16(t, _mm256_set1_epi16(1))
    }
}

/// `maddubs` + `madd`, `madd` + `add`.
pub enum Avx2 {}

impl IntDot for Avx2 {
    #[inline(always)]
    unsafe fn dot4(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }
    #[inline(always)]
    unsafe fn madd_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }
}

impl Fmt32 for Q4_0 {
    type W = BlockQ4_0;
    type A = BlockQ8_0;
    const HAS_MIN: bool = false;
    const OFFSET8: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weight_values(w: *const BlockQ4_0) -> [__m256i; 2] {
        let v = nibbles(&(*w).qs);
        [v, v]
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn act_values(a: *const BlockQ8_0) -> __m256i {
        _mm256_loadu_si256((*a).qs.as_ptr().cast())
    }
    #[inline(always)]
    unsafe fn pair_dot<D: IntDot>(w: [__m256i; 2], y: __m256i) -> __m256i {
        D::dot4(w[0], y)
    }
    fn weight_d_m(w: &BlockQ4_0) -> (u16, u16) {
        (w.d.to_bits(), 0)
    }
    const NIBBLES: bool = true;
    unsafe fn weight_qs(w: *const BlockQ4_0) -> *const u8 {
        (*w).qs.as_ptr()
    }
    unsafe fn act_qs(a: *const BlockQ8_0) -> *const i8 {
        (*a).qs.as_ptr()
    }
}

impl Fmt32 for Q4_1 {
    type W = BlockQ4_1;
    type A = BlockQ8_1;
    const HAS_MIN: bool = true;
    const OFFSET8: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weight_values(w: *const BlockQ4_1) -> [__m256i; 2] {
        let v = nibbles(&(*w).qs);
        [v, v]
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn act_values(a: *const BlockQ8_1) -> __m256i {
        _mm256_loadu_si256((*a).qs.as_ptr().cast())
    }
    #[inline(always)]
    unsafe fn pair_dot<D: IntDot>(w: [__m256i; 2], y: __m256i) -> __m256i {
        D::dot4(w[0], y)
    }
    fn weight_d_m(w: &BlockQ4_1) -> (u16, u16) {
        (w.d.to_bits(), w.m.to_bits())
    }
    const NIBBLES: bool = true;
    unsafe fn weight_qs(w: *const BlockQ4_1) -> *const u8 {
        (*w).qs.as_ptr()
    }
    unsafe fn act_qs(a: *const BlockQ8_1) -> *const i8 {
        (*a).qs.as_ptr()
    }
}

impl Fmt32 for Q8_0 {
    type W = BlockQ8_0;
    type A = BlockQ8_0;
    const HAS_MIN: bool = false;
    const OFFSET8: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn weight_values(w: *const BlockQ8_0) -> [__m256i; 2] {
        let v = _mm256_loadu_si256((*w).qs.as_ptr().cast());
        [v, _mm256_sign_epi8(v, v)]
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn act_values(a: *const BlockQ8_0) -> __m256i {
        _mm256_loadu_si256((*a).qs.as_ptr().cast())
    }
    /// `|w| · (y · sign w)`: `|w|` as unsigned keeps w = -128 exact; activations from our
    /// quantizer never reach -128, so `y · sign w` cannot overflow.
    #[inline(always)]
    unsafe fn pair_dot<D: IntDot>(w: [__m256i; 2], y: __m256i) -> __m256i {
        D::dot4(w[1], _mm256_sign_epi8(y, w[0]))
    }
    fn weight_d_m(w: &BlockQ8_0) -> (u16, u16) {
        (w.d.to_bits(), 0)
    }
    unsafe fn act_qs(a: *const BlockQ8_0) -> *const i8 {
        (*a).qs.as_ptr()
    }
}

/// Sum each of 8 vectors' lanes: lane `k` of the result is the sum of `p[k]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce8(p: &[__m256i; 8]) -> __m256i {
    let t0 = _mm256_hadd_epi32(p[0], p[1]);
    let t1 = _mm256_hadd_epi32(p[2], p[3]);
    let t2 = _mm256_hadd_epi32(p[4], p[5]);
    let t3 = _mm256_hadd_epi32(p[6], p[7]);
    let u0 = _mm256_hadd_epi32(t0, t1);
    let u1 = _mm256_hadd_epi32(t2, t3);
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(u0, u1),
        _mm256_permute2x128_si256::<0x31>(u0, u1),
    )
}

/// Lanes `k` = `p[k % MR]`, for the activation-side scales.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn act_lanes<const MR: usize>(p: *const f32) -> __m256 {
    match MR {
        1 => _mm256_set1_ps(*p),
        4 => {
            let v = _mm_loadu_ps(p);
            _mm256_set_m128(v, v)
        }
        _ => unreachable!("tile shape"),
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn act_lanes_i32<const MR: usize>(p: *const i32) -> __m256i {
    match MR {
        1 => _mm256_set1_epi32(*p),
        4 => _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast())),
        _ => unreachable!("tile shape"),
    }
}

/// The 32 bits at the start of a weight block: its f16 scale and, for Q4_1, its f16 min.
#[inline(always)]
unsafe fn head32<W>(w: *const W) -> i32 {
    w.cast::<i32>().read_unaligned()
}

/// Block `b`'s weight scales and mins in the tile's lane order (lane `k` = row `k / MR`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weight_lanes<F: Fmt32, const MR: usize, const NR: usize>(
    w: &[*const F::W; NR],
    b: usize,
) -> (__m256, __m256) {
    match (MR, NR) {
        (4, 2) => {
            // [d0 m0 d1 m1] → lanes [d0 ×4, d1 ×4] and [m0 ×4, m1 ×4].
            let dm = _mm_unpacklo_epi32(
                _mm_cvtsi32_si128(head32(w[0].add(b))),
                _mm_cvtsi32_si128(head32(w[1].add(b))),
            );
            let f = _mm256_castps128_ps256(_mm_cvtph_ps(dm));
            let d = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
            let m = _mm256_permutevar8x32_ps(f, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
            (d, m)
        }
        (1, 8) => {
            // Broadcast loads blended together: no shuffle-port inserts.
            let mut h = [_mm256_setzero_si256(); 8];
            for k in 0..8 {
                h[k] = _mm256_set1_epi32(head32(w[k].add(b)));
            }
            let g = _mm256_blend_epi32::<0b1111_0000>(
                _mm256_blend_epi32::<0b1100_1100>(
                    _mm256_blend_epi32::<0b1010_1010>(h[0], h[1]),
                    _mm256_blend_epi32::<0b1010_1010>(h[2], h[3]),
                ),
                _mm256_blend_epi32::<0b1100_1100>(
                    _mm256_blend_epi32::<0b1010_1010>(h[4], h[5]),
                    _mm256_blend_epi32::<0b1010_1010>(h[6], h[7]),
                ),
            );
            // Per 128-bit lane: d bytes to the low 8 bytes, m bytes to the high 8.
            let split = _mm256_setr_epi8(
                0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2,
                3, 6, 7, 10, 11, 14, 15,
            );
            let s = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(g, split));
            (
                _mm256_cvtph_ps(_mm256_castsi256_si128(s)),
                _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(s)),
            )
        }
        _ => unreachable!("tile shape"),
    }
}

/// The 8 pairs of one tile over all `nb` blocks; lane `k` is pair `(k % MR, k / MR)`.
///
/// # Safety
/// AVX2 and `D`'s features (it is inlined into each entry point); every pointer addresses
/// `nb` blocks; the activation side arrays cover rows `i0..i0 + MR`.
#[inline(always)]
unsafe fn tile<D: IntDot, F: Fmt32, const MR: usize, const NR: usize>(
    w: &[*const F::W; NR],
    a: &[*const F::A; MR],
    acts: &Acts32<F::A>,
    i0: usize,
    nb: usize,
    prefetch: isize,
) -> [f32; 8] {
    let mut acc = _mm256_setzero_ps();
    // The group after next is swept into L2 and the next one from there into L1: with only
    // the L1 sweep, each line held a fill buffer for a whole DRAM round trip and the tile's 8
    // interleaved row streams (Q8_0 decode) waited on them. Q8_0 matrices from DRAM
    // (`gemv_bandwidth q8_0 2 1024 5`, Xeon, against a plain read of the same bytes):
    // Qwen3-0.6B's 78–83 → 95 %, SmolLM2's 83–84 → 92 %; cache-resident unchanged. (Into L2
    // alone: 90 %, and 3–4 % slower from L3.) The interleaved Q4 tiles, one stream a group,
    // are at the plain read with the L1 sweep alone.
    let ahead = w[0].cast::<i8>().wrapping_offset(prefetch);
    let after_next = ahead.wrapping_offset(prefetch);
    let step = NR * std::mem::size_of::<F::W>();
    for b in 0..nb {
        if prefetch != 0 {
            prefetch_sweep::<_MM_HINT_T1>(after_next, b, step);
            prefetch_sweep::<_MM_HINT_T0>(ahead, b, step);
        }
        let mut wv = [[_mm256_setzero_si256(); 2]; NR];
        for j in 0..NR {
            wv[j] = F::weight_values(w[j].add(b));
        }
        let mut y = [_mm256_setzero_si256(); MR];
        for i in 0..MR {
            y[i] = F::act_values(a[i].add(b));
        }
        let mut p = [_mm256_setzero_si256(); 8];
        for j in 0..NR {
            for i in 0..MR {
                p[j * MR + i] = F::pair_dot::<D>(wv[j], y[i]);
            }
        }
        acc = fold_block::<F, MR, NR>(acc, reduce8(&p), w, acts, b, i0);
    }
    let mut r = [0f32; 8];
    _mm256_storeu_ps(r.as_mut_ptr(), acc);
    r
}

/// Prefetch block `b`'s share of the next group of weight rows, which starts at `ahead`,
/// into the cache level `HINT` names (`_MM_HINT_T0`: L1, `_MM_HINT_T1`: L2): the rows of a
/// group are contiguous, so a tile of `step`-byte blocks (a block of each row) sweeps the next
/// group's bytes linearly, a line at a time, and DRAM streams ahead of use without any line
/// being asked for once per row (a Q4_0 block is 18 bytes).
#[inline(always)]
pub(super) unsafe fn prefetch_sweep<const HINT: i32>(ahead: *const i8, b: usize, step: usize) {
    for line in (0..step).step_by(64) {
        _mm_prefetch::<HINT>(ahead.wrapping_add(b * step + line));
    }
}

/// `acc` plus block `b`'s term for the tile's 8 pairs (lane `k` = pair `(k % MR, k / MR)`),
/// from their exact integer dots `sumi`: `super::acc_q8` / `super::acc_q4_1` per lane.
///
/// # Safety
/// As `tile`.
#[inline(always)]
pub(super) unsafe fn fold_block<F: Fmt32, const MR: usize, const NR: usize>(
    acc: __m256,
    mut sumi: __m256i,
    w: &[*const F::W; NR],
    acts: &Acts32<F::A>,
    b: usize,
    i0: usize,
) -> __m256 {
    let side = b * acts.m + i0;
    if F::OFFSET8 {
        sumi = _mm256_add_epi32(sumi, act_lanes_i32::<MR>(acts.neg8_ysum.as_ptr().add(side)));
    }
    let dy = act_lanes::<MR>(acts.d.as_ptr().add(side));
    let (dx, mx) = weight_lanes::<F, MR, NR>(w, b);
    let dd = _mm256_mul_ps(dx, dy);
    let mut t = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), dd);
    if F::HAS_MIN {
        let sy = act_lanes::<MR>(acts.s.as_ptr().add(side));
        t = _mm256_add_ps(t, _mm256_mul_ps(mx, sy));
    }
    _mm256_add_ps(acc, t)
}

/// `out[i * rows + j]` for all activation rows `i` and weight rows `j in r0..r1`.
///
/// # Safety
/// AVX2+FMA+F16C available; `w` holds `rows * nb` blocks; `out` addresses `m * rows` floats
/// and no other thread writes columns `r0..r1`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn matmul_rows<F: Fmt32>(
    w: &[F::W],
    rows: usize,
    acts: &Acts32<F::A>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    rows_with::<Avx2, F>(w, rows, acts, r0, r1, out)
}

/// `matmul_rows` with `D`'s integer dot: the body every entry point (here and in `vnni`)
/// compiles for its ISA.
///
/// # Safety
/// As `matmul_rows`, plus `D`'s features.
#[inline(always)]
pub unsafe fn rows_with<D: IntDot, F: Fmt32>(
    w: &[F::W],
    rows: usize,
    acts: &Acts32<F::A>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    let nb = acts.nb;
    let m = acts.m;
    let wrow = |j: usize| w.as_ptr().add(j.min(r1 - 1) * nb);
    let arow = |i: usize| acts.blocks.as_ptr().add(i * nb);
    // Decode streams the weights once: prefetch the next group (8 rows on) while computing.
    let prefetch = (8 * nb * std::mem::size_of::<F::W>()) as isize;
    for c0 in (0..m).step_by(ROW_CHUNK) {
        let c1 = (c0 + ROW_CHUNK).min(m);
        let full = c0 + (c1 - c0) / 4 * 4;
        // Each group of 8 weight rows serves every activation row of the chunk while it is
        // in L1: 4 × 2 tiles for whole groups of 4 rows, 1 × 8 for the rest (all of decode).
        for j0 in (r0..r1).step_by(8) {
            for i0 in (c0..full).step_by(4) {
                let ap = [arow(i0), arow(i0 + 1), arow(i0 + 2), arow(i0 + 3)];
                for jj in (j0..(j0 + 8).min(r1)).step_by(2) {
                    let wp = [wrow(jj), wrow(jj + 1)];
                    let r = tile::<D, F, 4, 2>(&wp, &ap, acts, i0, nb, 0);
                    store(out, rows, &r, 4, i0, jj, r1);
                }
            }
            let wp: [*const F::W; 8] = std::array::from_fn(|k| wrow(j0 + k));
            for i0 in full..c1 {
                let r = if F::NIBBLES {
                    super::avx2_q4_decode::tile::<D, F>(&wp, arow(i0), acts, i0, nb, prefetch)
                } else {
                    tile::<D, F, 1, 8>(&wp, &[arow(i0)], acts, i0, nb, prefetch)
                };
                store(out, rows, &r, 1, i0, j0, r1);
            }
        }
    }
}

/// Write a tile's lanes (pair `(k % mr, k / mr)`) to `out`, dropping weight rows `>= r1`.
#[inline]
pub(crate) unsafe fn store(
    out: *mut f32,
    rows: usize,
    r: &[f32; 8],
    mr: usize,
    i0: usize,
    j0: usize,
    r1: usize,
) {
    for (k, &v) in r.iter().enumerate() {
        let j = j0 + k / mr;
        if j < r1 {
            *out.add((i0 + k % mr) * rows + j) = v;
        }
    }
}
