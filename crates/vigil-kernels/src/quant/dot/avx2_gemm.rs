//! AVX2 prefill micro-kernel for the 4-bit 32-value formats (Q4_0, Q4_1 weights × Q8_0 / Q8_1
//! activations), over weights repacked 8 rows at a time.
//!
//! For each group of 8 weight rows the thread repacks the blocks into an L1-resident buffer
//! (`Packed`): per block, the 8 rows' scales (and Q4_1 mins) as f32 lanes, and their quants
//! interleaved 4 values per row and already split into bytes, so that one 256-bit vector holds
//! values `4h..4h + 4` of every row and the next one values `16 + 4h..16 + 4h + 4`.
//! Multiplying such a vector (`maddubs`) by the activation's matching 4 bytes broadcast to
//! every lane puts row `k`'s partial dot in lane pair `k`; summing the 8 partial vectors
//! (exactly, in i16: each term is at most 2 · 15 · 128, eight of them fit) and one `madd` gives
//! each row's exact integer block dot in i32 lane `k`, with no horizontal reduction. The
//! per-lane float fold is `super::acc_q4_1` / `super::acc_q8` in block order, so every output
//! equals the scalar path bit for bit (see `super`).
//!
//! A tile is 2 activation rows × two groups (16 weight rows, `Packed2`): each broadcast
//! activation dword feeds two `maddubs`, and each weight vector serves both rows from
//! registers. On Zen 3 the tile is bound by how many vector instructions it issues (the
//! broadcasts included: the same loop with its operands in L1 takes 34 cycles a block of 4
//! rows × 8, where no single port needs more than 25), so the shape issuing the fewest per
//! product wins. Splitting the nibbles at packing (once per group and chunk) takes 3 of them
//! per 8 products out of the tile; with both, one thread multiplies SmolLM2's matrices at
//! m = 512 in 10–15 % less time than 4 rows × 8 splitting in the tile, and the pair shape
//! splitting in the tile is slower than either. The loop over chunks, groups and
//! tiles is `gemm_driver::drive`, shared with the other repacked kernels through the
//! `Repacked` trait. The packing (`pack_block`, `pack`) is shared too: `vnni_gemm` streams
//! the same `Packed` blocks one group at a time, `avx512_gemm` two groups' worth.

// Index loops mirror the block layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::gemm_driver::{drive, with_buffer, Repacked};
use super::Acts32;
use crate::quant::blocks::{BlockQ4_0, BlockQ4_0x8, BlockQ4_1, BlockQ4_1x8, BlockQ8_0, BlockQ8_1};
use half::f16;
use std::arch::x86_64::*;
use std::marker::PhantomData;

/// One block of 8 weight rows, as the micro-kernel streams it: the rows' scales and mins, and
/// their quants as bytes (0..15), `q[2h]` values `4h..4h + 4` of each row (lane `k`: row `k`),
/// `q[2h + 1]` values `16 + 4h..16 + 4h + 4`.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct Packed {
    pub(super) d: [f32; 8],
    pub(super) m: [f32; 8],
    pub(super) q: [[u8; 32]; 8],
}
const _: () = assert!(std::mem::size_of::<Packed>() == 320);

/// Two groups' blocks side by side: 16 weight rows, the unit the tile streams.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct Packed2([Packed; 2]);

impl<G: Group8> Repacked for G {
    type W = G::W;
    type A = <G::F as Nibble32>::A;
    type Packed = Packed2;
    type Lanes = [__m256; 2];
    const NR: usize = 16;
    #[inline]
    unsafe fn pack(w: &[G::W], nb: usize, j0: usize, r1: usize, out: &mut [Packed2]) {
        let src = [G::group(w, nb, j0, r1), G::group(w, nb, j0 + 8, r1)];
        for (b, p) in out[..nb].iter_mut().enumerate() {
            pack_one::<G>(src[0], b, &mut p.0[0]);
            pack_one::<G>(src[1], b, &mut p.0[1]);
        }
    }
    #[inline]
    unsafe fn tile<const R: usize>(
        pk: &[Packed2],
        acts: &Acts32<Self::A>,
        i0: usize,
    ) -> [[__m256; 2]; R] {
        tile::<G::F, R>(pk, acts, i0)
    }
    #[inline]
    unsafe fn store(dst: *mut f32, v: [__m256; 2], n: usize) {
        store8(dst, v[0], n.min(8));
        if n > 8 {
            store8(dst.add(8), v[1], n - 8);
        }
    }
}

/// Where a kernel's groups of 8 weight rows come from: a row-major matrix of format `F`
/// (the marker types `avx2::Q4_0`, `avx2::Q4_1` themselves: each block of the 8 rows is
/// transposed at packing, `pack_block`) or the same format interleaved at load (`X8<F>`:
/// each block is already in `Packed`'s order, and packing is loads).
pub trait Group8 {
    type F: Nibble32;
    /// What the matrix holds.
    type W: bytemuck::Pod;
    /// One group's blocks.
    type Src<'a>: Copy;
    /// Weight rows `j0..j0 + 8` (rows `>= r1` repeat row `r1 - 1` or are padding; their
    /// outputs are dropped); `j0` is a multiple of 8 for `X8`.
    fn group(w: &[Self::W], nb: usize, j0: usize, r1: usize) -> Self::Src<'_>;
    /// Block `b` of the group: the 4 interleaved quant vectors, the scales and the mins (as
    /// f32; f16 → f32 is exact, so converting here changes no result).
    ///
    /// # Safety
    /// AVX2+F16C (inlined into the kernel's ISA); `b` < the group's blocks.
    unsafe fn block(src: Self::Src<'_>, b: usize) -> ([__m256i; 4], __m256, __m256);
}

impl<F: Nibble32> Group8 for F {
    type F = F;
    type W = F::W;
    type Src<'a> = [&'a [F::W]; 8];
    #[inline(always)]
    fn group(w: &[F::W], nb: usize, j0: usize, r1: usize) -> [&[F::W]; 8] {
        group_rows(w, nb, j0, r1)
    }
    #[inline(always)]
    unsafe fn block(src: [&[F::W]; 8], b: usize) -> ([__m256i; 4], __m256, __m256) {
        pack_block::<F>(&src, b)
    }
}

/// Format `F` in its load-time interleaved layout (`storage::Layout::Interleaved8`).
pub struct X8<F>(PhantomData<F>);

impl<F: Nibble32> Group8 for X8<F> {
    type F = F;
    type W = F::X8;
    type Src<'a> = &'a [F::X8];
    #[inline(always)]
    fn group(w: &[F::X8], nb: usize, j0: usize, r1: usize) -> &[F::X8] {
        let g = j0.min(r1 - 1) / 8;
        &w[g * nb..(g + 1) * nb]
    }
    #[inline(always)]
    unsafe fn block(src: &[F::X8], b: usize) -> ([__m256i; 4], __m256, __m256) {
        let x = src.get_unchecked(b);
        let qs = F::x8_qs(x);
        let v = std::array::from_fn(|h| _mm256_loadu_si256(qs[h].as_ptr().cast()));
        let d = _mm256_cvtph_ps(_mm_loadu_si128(F::x8_d(x).as_ptr().cast()));
        let m = if F::HAS_MIN {
            _mm256_cvtph_ps(_mm_loadu_si128(F::x8_m(x).as_ptr().cast()))
        } else {
            _mm256_setzero_ps()
        };
        (v, d, m)
    }
}

/// A 4-bit weight format and its activation format, as this kernel sees them.
pub trait Nibble32 {
    type W: bytemuck::Pod;
    type A: bytemuck::Pod;
    /// Q4_1: add `mx * sy` per block.
    const HAS_MIN: bool;
    /// Q4_0: the quants are stored +8; add `-8 * Σy` (`Acts32::neg8_ysum`) to the integer dot.
    const OFFSET8: bool;
    /// The block's 16 quant bytes.
    fn qs(w: &Self::W) -> &[u8; 16];
    /// f16 bits of the block's scale and min.
    fn d_m(w: &Self::W) -> (u16, u16);
    /// The activation block's 32 quants.
    fn act_qs(a: &Self::A) -> &[i8; 32];
    /// The interleaved block of 8 rows (`BlockQ4_0x8`, `BlockQ4_1x8`).
    type X8: bytemuck::Pod;
    /// Its quants: `[h][4k..4k + 4]` = bytes `4h..4h + 4` of row `k`.
    fn x8_qs(x: &Self::X8) -> &[[u8; 32]; 4];
    /// Its 8 scales.
    fn x8_d(x: &Self::X8) -> &[f16; 8];
    /// Its 8 mins (Q4_1; Q4_0 has none and gives its scales).
    fn x8_m(x: &Self::X8) -> &[f16; 8];
}

impl Nibble32 for super::avx2::Q4_0 {
    type W = BlockQ4_0;
    type A = BlockQ8_0;
    const HAS_MIN: bool = false;
    const OFFSET8: bool = true;
    fn qs(w: &BlockQ4_0) -> &[u8; 16] {
        &w.qs
    }
    fn d_m(w: &BlockQ4_0) -> (u16, u16) {
        (w.d.to_bits(), 0)
    }
    fn act_qs(a: &BlockQ8_0) -> &[i8; 32] {
        &a.qs
    }
    type X8 = BlockQ4_0x8;
    fn x8_qs(x: &BlockQ4_0x8) -> &[[u8; 32]; 4] {
        &x.qs
    }
    fn x8_d(x: &BlockQ4_0x8) -> &[f16; 8] {
        &x.d
    }
    fn x8_m(x: &BlockQ4_0x8) -> &[f16; 8] {
        &x.d
    }
}

impl Nibble32 for super::avx2::Q4_1 {
    type W = BlockQ4_1;
    type A = BlockQ8_1;
    const HAS_MIN: bool = true;
    const OFFSET8: bool = false;
    fn qs(w: &BlockQ4_1) -> &[u8; 16] {
        &w.qs
    }
    fn d_m(w: &BlockQ4_1) -> (u16, u16) {
        (w.d.to_bits(), w.m.to_bits())
    }
    fn act_qs(a: &BlockQ8_1) -> &[i8; 32] {
        &a.qs
    }
    type X8 = BlockQ4_1x8;
    fn x8_qs(x: &BlockQ4_1x8) -> &[[u8; 32]; 4] {
        &x.qs
    }
    fn x8_d(x: &BlockQ4_1x8) -> &[f16; 8] {
        &x.d
    }
    fn x8_m(x: &BlockQ4_1x8) -> &[f16; 8] {
        &x.m
    }
}

/// Weight rows `j0..j0 + 8`, rows `>= r1` repeating row `r1 - 1`.
#[inline(always)]
pub(super) fn group_rows<W>(w: &[W], nb: usize, j0: usize, r1: usize) -> [&[W]; 8] {
    std::array::from_fn(|k| {
        let j = (j0 + k).min(r1 - 1);
        &w[j * nb..(j + 1) * nb]
    })
}

/// Block `b` of 8 weight rows in `Packed` form: the 4 interleaved quant vectors, the scales
/// and the mins (as f32; f16 → f32 is exact, so converting here changes no result).
///
/// # Safety
/// AVX2+F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack_block<F: Nibble32>(
    rows: &[&[F::W]; 8],
    b: usize,
) -> ([__m256i; 4], __m256, __m256) {
    let q = |k: usize| _mm_loadu_si128(F::qs(&rows[k][b]).as_ptr().cast());
    // Row k in the low half, row k + 4 in the high half; then a 4 × 4 dword transpose per
    // half gives vector h = dword h of rows 0..8.
    let y: [__m256i; 4] = std::array::from_fn(|k| _mm256_set_m128i(q(k + 4), q(k)));
    let t0 = _mm256_unpacklo_epi32(y[0], y[1]);
    let t1 = _mm256_unpackhi_epi32(y[0], y[1]);
    let t2 = _mm256_unpacklo_epi32(y[2], y[3]);
    let t3 = _mm256_unpackhi_epi32(y[2], y[3]);
    let v = [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ];
    let mut d = [0u16; 8];
    let mut m = [0u16; 8];
    for k in 0..8 {
        (d[k], m[k]) = F::d_m(&rows[k][b]);
    }
    (
        v,
        _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().cast())),
        _mm256_cvtph_ps(_mm_loadu_si128(m.as_ptr().cast())),
    )
}

/// Repack weight rows `j0..j0 + 8` (rows `>= r1` repeat row `r1 - 1` or are padding; their
/// outputs are dropped) into `out[..nb]`.
///
/// # Safety
/// AVX2+F16C; `w` holds the matrix's blocks of rows `< r1`; `j0 < r1`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack<G: Group8>(
    w: &[G::W],
    nb: usize,
    j0: usize,
    r1: usize,
    out: &mut [Packed],
) {
    let src = G::group(w, nb, j0, r1);
    for (b, p) in out[..nb].iter_mut().enumerate() {
        pack_one::<G>(src, b, p);
    }
}

/// Block `b` of a group, packed into `p`.
///
/// # Safety
/// AVX2+F16C (inlined into the caller's ISA); `b` < the group's blocks.
#[inline(always)]
unsafe fn pack_one<G: Group8>(src: G::Src<'_>, b: usize, p: &mut Packed) {
    let mask = _mm256_set1_epi8(0x0F);
    let (v, d, m) = G::block(src, b);
    for h in 0..4 {
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v[h]), mask);
        _mm256_store_si256(p.q[2 * h].as_mut_ptr().cast(), _mm256_and_si256(v[h], mask));
        _mm256_store_si256(p.q[2 * h + 1].as_mut_ptr().cast(), hi);
    }
    _mm256_store_ps(p.d.as_mut_ptr(), d);
    _mm256_store_ps(p.m.as_mut_ptr(), m);
}

/// The `R × 16` outputs of activation rows `i0..i0 + R` against two packed groups, lane `k`
/// of result `[i][g]` being weight row `k` of group `g`.
///
/// # Safety
/// AVX2; `pk` holds `nb` blocks; `acts` covers rows `i0..i0 + R`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<F: Nibble32, const R: usize>(
    pk: &[Packed2],
    acts: &Acts32<F::A>,
    i0: usize,
) -> [[__m256; 2]; R] {
    let (m, nb) = (acts.m, acts.nb);
    let ones = _mm256_set1_epi16(1);
    let stride = std::mem::size_of::<F::A>();
    let mut ya: [*const i8; R] =
        std::array::from_fn(|i| F::act_qs(&acts.blocks[(i0 + i) * nb]).as_ptr());
    let mut side = i0;
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for p in &pk[..nb] {
        let mut s16 = [[_mm256_setzero_si256(); 2]; R];
        for h in 0..4 {
            let w: [[__m256i; 2]; 2] = std::array::from_fn(|g| {
                std::array::from_fn(|k| _mm256_load_si256(p.0[g].q[2 * h + k].as_ptr().cast()))
            });
            for i in 0..R {
                let ylo = _mm256_set1_epi32(ya[i].add(4 * h).cast::<i32>().read_unaligned());
                let yhi = _mm256_set1_epi32(ya[i].add(16 + 4 * h).cast::<i32>().read_unaligned());
                for g in 0..2 {
                    let s = _mm256_add_epi16(
                        _mm256_maddubs_epi16(w[g][0], ylo),
                        _mm256_maddubs_epi16(w[g][1], yhi),
                    );
                    s16[i][g] = if h == 0 {
                        s
                    } else {
                        _mm256_add_epi16(s16[i][g], s)
                    };
                }
            }
        }
        for i in 0..R {
            // Q4_0's offset is the activation row's: one broadcast serves both groups.
            let offset = if F::OFFSET8 {
                _mm256_set1_epi32(*acts.neg8_ysum.get_unchecked(side + i))
            } else {
                _mm256_setzero_si256()
            };
            for g in 0..2 {
                let mut sumi = _mm256_madd_epi16(s16[i][g], ones);
                if F::OFFSET8 {
                    sumi = _mm256_add_epi32(sumi, offset);
                }
                acc[i][g] = fold::<F>(acc[i][g], sumi, &p.0[g], acts, side + i);
            }
            ya[i] = ya[i].add(stride);
        }
        side += m;
    }
    acc
}

/// `acc + t` per lane, `t` being one block's term of `super::acc_q8` (Q4_0) or
/// `super::acc_q4_1` (Q4_1) for the exact integer dots `sumi` (lane `k`: weight row `k`; for
/// Q4_0 with the `-8 · Σy` offset applied) of the activation row whose side-array index is
/// `s`.
///
/// # Safety
/// AVX2 (it is inlined into each caller's ISA); `s` indexes the filled side arrays.
#[inline(always)]
pub(super) unsafe fn fold<F: Nibble32>(
    acc: __m256,
    sumi: __m256i,
    p: &Packed,
    acts: &Acts32<F::A>,
    s: usize,
) -> __m256 {
    let dx = _mm256_load_ps(p.d.as_ptr());
    let dy = _mm256_set1_ps(*acts.d.get_unchecked(s));
    let mut t = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dx, dy));
    if F::HAS_MIN {
        let mx = _mm256_load_ps(p.m.as_ptr());
        let sy = _mm256_set1_ps(*acts.s.get_unchecked(s));
        t = _mm256_add_ps(t, _mm256_mul_ps(mx, sy));
    }
    _mm256_add_ps(acc, t)
}

/// Write the first `n <= 8` lanes of `v` to `dst[..n]`.
///
/// # Safety
/// AVX; `dst` addresses `n` floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn store8(dst: *mut f32, v: __m256, n: usize) {
    if n == 8 {
        _mm256_storeu_ps(dst, v);
    } else {
        let mut r = [0f32; 8];
        _mm256_storeu_ps(r.as_mut_ptr(), v);
        for (k, &x) in r.iter().enumerate().take(n) {
            *dst.add(k) = x;
        }
    }
}

/// `out[i * rows + j]` for all activation rows `i` and weight rows `j in r0..r1`, for any
/// AVX2 `Repacked` kernel (Q4_0 and Q4_1 here, Q8_0 in `avx2_gemm_q8`).
///
/// # Safety
/// AVX2+FMA+F16C available; `w` holds `rows * nb` blocks; `out` addresses `m * rows` floats
/// and no other thread writes columns `r0..r1`; the activation side arrays are filled.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn matmul_rows<K: Repacked>(
    w: &[K::W],
    rows: usize,
    acts: &Acts32<K::A>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    // Activation rows per tile: 2 against 16 weight rows, 4 against 8; either way 8
    // registers of i16 sums and 8 of accumulators (more spills).
    if K::NR == 16 {
        with_buffer(acts.nb, |pk| drive::<K, 2>(pk, w, rows, acts, r0, r1, out))
    } else {
        with_buffer(acts.nb, |pk| drive::<K, 4>(pk, w, rows, acts, r0, r1, out))
    }
}
