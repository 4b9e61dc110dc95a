//! AVX2 tiles for the 32-value formats (Q4_0, Q4_1 and Q8_0 weights).
//!
//! A tile computes `MR × NR = 8` (activation row, weight row) pairs at once: per block it
//! unpacks each weight block once, takes each pair's exact integer dot as 8 i32 lanes
//! (`maddubs` + `madd`), reduces the 8 pairs' lanes with one `hadd` tree into one vector whose
//! lane `k` is pair `(i = k % MR, j = k / MR)`, and folds that into a per-pair f32 lane with
//! the same operations as `super::acc_q8` / `super::acc_q4_1`. Every pair therefore gets the
//! scalar path's result bit for bit, whatever tile shape computed it.
//!
//! Shapes: 4 × 2 for prefill (each weight block serves 4 activation rows), 1 × 8 for decode
//! and for the activation rows left over (`m % 4`).

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
    /// Q4_0: the quants are stored +8; subtract `8 * Σy` from the integer dot.
    const OFFSET8: bool;
    /// The weight quants (`[0]`) and, for signed formats, their magnitudes (`[1]`).
    ///
    /// # Safety
    /// Requires AVX2; `w` points to a valid block.
    unsafe fn weight_values(w: *const Self::W) -> [__m256i; 2];
    /// # Safety
    /// Requires AVX2; `a` points to a valid block.
    unsafe fn act_values(a: *const Self::A) -> __m256i;
    /// 8 i32 lanes summing to the block's integer dot.
    ///
    /// # Safety
    /// Requires AVX2.
    unsafe fn pair_dot(w: [__m256i; 2], y: __m256i) -> __m256i;
    /// f16 bits of the weight block's scale and min.
    fn weight_d_m(w: &Self::W) -> (u16, u16);
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

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unsigned_dot(w: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, y), _mm256_set1_epi16(1))
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
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pair_dot(w: [__m256i; 2], y: __m256i) -> __m256i {
        unsigned_dot(w[0], y)
    }
    fn weight_d_m(w: &BlockQ4_0) -> (u16, u16) {
        (w.d.to_bits(), 0)
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
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pair_dot(w: [__m256i; 2], y: __m256i) -> __m256i {
        unsigned_dot(w[0], y)
    }
    fn weight_d_m(w: &BlockQ4_1) -> (u16, u16) {
        (w.d.to_bits(), w.m.to_bits())
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
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pair_dot(w: [__m256i; 2], y: __m256i) -> __m256i {
        unsigned_dot(w[1], _mm256_sign_epi8(y, w[0]))
    }
    fn weight_d_m(w: &BlockQ8_0) -> (u16, u16) {
        (w.d.to_bits(), 0)
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

/// Per block, the weight scales (and mins) in the tile's lane order: lane `k` = row `k / MR`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weight_lanes<F: Fmt32, const MR: usize, const NR: usize>(
    w: &[*const F::W; NR],
    nb: usize,
    d: &mut Vec<[f32; 8]>,
    m: &mut Vec<[f32; 8]>,
) {
    d.clear();
    m.clear();
    for b in 0..nb {
        let mut db = [0u16; 8];
        let mut mb = [0u16; 8];
        for k in 0..8 {
            (db[k], mb[k]) = F::weight_d_m(&*w[k / MR].add(b));
        }
        let mut df = [0f32; 8];
        _mm256_storeu_ps(
            df.as_mut_ptr(),
            _mm256_cvtph_ps(_mm_loadu_si128(db.as_ptr().cast())),
        );
        d.push(df);
        if F::HAS_MIN {
            let mut mf = [0f32; 8];
            _mm256_storeu_ps(
                mf.as_mut_ptr(),
                _mm256_cvtph_ps(_mm_loadu_si128(mb.as_ptr().cast())),
            );
            m.push(mf);
        }
    }
}

/// The 8 pairs of one tile over all `nb` blocks; lane `k` is pair `(k % MR, k / MR)`.
///
/// # Safety
/// AVX2; every pointer addresses `nb` blocks; `wd`/`wm` hold `nb` lane vectors (`wm` only
/// for `HAS_MIN`); the activation side arrays cover rows `i0..i0 + MR`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<F: Fmt32, const MR: usize, const NR: usize>(
    w: &[*const F::W; NR],
    a: &[*const F::A; MR],
    wd: &[[f32; 8]],
    wm: &[[f32; 8]],
    acts: &Acts32<F::A>,
    i0: usize,
    nb: usize,
) -> [f32; 8] {
    let m = acts.m;
    let mut acc = _mm256_setzero_ps();
    for b in 0..nb {
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
                p[j * MR + i] = F::pair_dot(wv[j], y[i]);
            }
        }
        let mut sumi = reduce8(&p);
        let side = b * m + i0;
        if F::OFFSET8 {
            let ysum = act_lanes_i32::<MR>(acts.ysum.as_ptr().add(side));
            sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<3>(ysum));
        }
        let dy = act_lanes::<MR>(acts.d.as_ptr().add(side));
        let dd = _mm256_mul_ps(_mm256_loadu_ps(wd.as_ptr().add(b).cast()), dy);
        let mut t = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), dd);
        if F::HAS_MIN {
            let sy = act_lanes::<MR>(acts.s.as_ptr().add(side));
            let mx = _mm256_loadu_ps(wm.as_ptr().add(b).cast());
            t = _mm256_add_ps(t, _mm256_mul_ps(mx, sy));
        }
        acc = _mm256_add_ps(acc, t);
    }
    let mut r = [0f32; 8];
    _mm256_storeu_ps(r.as_mut_ptr(), acc);
    r
}

/// Scratch for one thread's weight-scale lanes.
#[derive(Default)]
pub struct TileScratch {
    d: Vec<[f32; 8]>,
    m: Vec<[f32; 8]>,
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
    scratch: &mut TileScratch,
) {
    let nb = acts.nb;
    let m = acts.m;
    let wrow = |j: usize| w.as_ptr().add(j.min(r1 - 1) * nb);
    let arow = |i: usize| acts.blocks.as_ptr().add(i * nb);
    let m4 = m / 4 * 4;
    for c0 in (0..m4).step_by(ROW_CHUNK) {
        let c1 = (c0 + ROW_CHUNK).min(m4);
        for j0 in (r0..r1).step_by(2) {
            let wp = [wrow(j0), wrow(j0 + 1)];
            weight_lanes::<F, 4, 2>(&wp, nb, &mut scratch.d, &mut scratch.m);
            for i0 in (c0..c1).step_by(4) {
                let ap = [arow(i0), arow(i0 + 1), arow(i0 + 2), arow(i0 + 3)];
                let r = tile::<F, 4, 2>(&wp, &ap, &scratch.d, &scratch.m, acts, i0, nb);
                store(out, rows, &r, 4, i0, j0, r1);
            }
        }
    }
    for i0 in m4..m {
        for j0 in (r0..r1).step_by(8) {
            let wp: [*const F::W; 8] = std::array::from_fn(|k| wrow(j0 + k));
            weight_lanes::<F, 1, 8>(&wp, nb, &mut scratch.d, &mut scratch.m);
            let r = tile::<F, 1, 8>(&wp, &[arow(i0)], &scratch.d, &scratch.m, acts, i0, nb);
            store(out, rows, &r, 1, i0, j0, r1);
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
