//! AVX2 prefill micro-kernel for Q8_0 weights × Q8_0 activations, over weights repacked 8 rows
//! at a time (the Q8_0 counterpart of `avx2_gemm`).
//!
//! For each group of 8 weight rows the thread repacks the blocks into an L1-resident buffer
//! (`Packed`): per block, the 8 rows' scales as f32 lanes and their 32 signed quants
//! interleaved 4 bytes per row, so that vector `h` holds bytes `4h..4h + 4` of every row.
//! Multiplying it by the activation's bytes `4h..4h + 4` broadcast to every lane puts row `k`'s
//! partial dot in lane pair `k`. The product is signed × signed, so the weight's sign moves
//! onto the activation: `maddubs(|w|, y · sign w)`. `|w|` read as unsigned keeps w = -128
//! exact, and activations from our quantizer never reach -128, so `y · sign w` cannot
//! overflow. A `maddubs` pair sum reaches 2 · 128 · 127 = 32512, so two of them could overflow
//! i16: each `h`'s pairs are widened (`madd` by ones) and summed in i32, giving each row's
//! exact integer block dot in i32 lane `k` with no horizontal reduction. The per-lane float
//! fold is `super::acc_q8` in block order, so every output equals the scalar path bit for bit.
//!
//! Tiles, chunks and the per-thread buffer are `gemm_driver::drive`'s, which runs this kernel
//! through `Repacked` (entry point: `avx2_gemm::matmul_rows`). `vnni_gemm` streams the same
//! `Packed` blocks; `avx512_gemm` packs two groups' worth with `pack_block`.

// Index loops mirror the block layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::avx2_gemm::{group_rows, store8, X8};
use super::gemm_driver::Repacked;
use super::Acts32;
use crate::quant::blocks::{BlockQ8_0, BlockQ8_0x8};
use std::arch::x86_64::*;

/// One block of 8 weight rows, as the micro-kernel streams it.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub struct Packed {
    pub(super) d: [f32; 8],
    pub(super) qs: [[i8; 32]; 8],
}

/// Where a kernel's groups of 8 Q8_0 weight rows come from: a row-major matrix
/// (`avx2::Q8_0`: each block of the 8 rows is transposed at packing, `pack_block`) or one
/// interleaved at load (`X8<avx2::Q8_0>`: each block is already in `Packed`'s order, so
/// packing is loads and a scale conversion).
pub trait Q8Group {
    /// What the matrix holds.
    type W: bytemuck::Pod;
    /// One group's blocks.
    type Src<'a>: Copy;
    /// Weight rows `j0..j0 + 8` (rows `>= r1` repeat row `r1 - 1` or are padding; their
    /// outputs are dropped); `j0` is a multiple of 8 for `X8`.
    fn group(w: &[Self::W], nb: usize, j0: usize, r1: usize) -> Self::Src<'_>;
    /// Block `b` of the group: the 8 interleaved quant vectors and the scales (as f32;
    /// f16 → f32 is exact, so converting here changes no result).
    ///
    /// # Safety
    /// AVX2+F16C (inlined into the kernel's ISA); `b` < the group's blocks.
    unsafe fn block(src: Self::Src<'_>, b: usize) -> ([__m256i; 8], __m256);
}

impl Q8Group for super::avx2::Q8_0 {
    type W = BlockQ8_0;
    type Src<'a> = [&'a [BlockQ8_0]; 8];
    #[inline(always)]
    fn group(w: &[BlockQ8_0], nb: usize, j0: usize, r1: usize) -> [&[BlockQ8_0]; 8] {
        group_rows(w, nb, j0, r1)
    }
    #[inline(always)]
    unsafe fn block(src: [&[BlockQ8_0]; 8], b: usize) -> ([__m256i; 8], __m256) {
        pack_block(&src, b)
    }
}

impl Q8Group for X8<super::avx2::Q8_0> {
    type W = BlockQ8_0x8;
    type Src<'a> = &'a [BlockQ8_0x8];
    #[inline(always)]
    fn group(w: &[BlockQ8_0x8], nb: usize, j0: usize, r1: usize) -> &[BlockQ8_0x8] {
        let g = j0.min(r1 - 1) / 8;
        &w[g * nb..(g + 1) * nb]
    }
    #[inline(always)]
    unsafe fn block(src: &[BlockQ8_0x8], b: usize) -> ([__m256i; 8], __m256) {
        let x = src.get_unchecked(b);
        let v = std::array::from_fn(|h| _mm256_loadu_si256(x.qs[h].as_ptr().cast()));
        (v, _mm256_cvtph_ps(_mm_loadu_si128(x.d.as_ptr().cast())))
    }
}

/// The kernel over either source (`Q8Group`).
macro_rules! repacked_q8 {
    ($src:ty) => {
        impl Repacked for $src {
            type W = <$src as Q8Group>::W;
            type A = BlockQ8_0;
            type Packed = Packed;
            type Lanes = __m256;
            const NR: usize = 8;
            #[inline]
            unsafe fn pack(w: &[Self::W], nb: usize, j0: usize, r1: usize, out: &mut [Packed]) {
                pack::<$src>(w, nb, j0, r1, out)
            }
            #[inline]
            unsafe fn tile<const R: usize>(
                pk: &[Packed],
                acts: &Acts32<BlockQ8_0>,
                i0: usize,
            ) -> [__m256; R] {
                tile::<R>(pk, acts, i0)
            }
            #[inline]
            unsafe fn store(dst: *mut f32, v: __m256, n: usize) {
                store8(dst, v, n)
            }
        }
    };
}
repacked_q8!(super::avx2::Q8_0);
repacked_q8!(X8<super::avx2::Q8_0>);

/// Block `b` of 8 weight rows in `Packed` form: the 8 interleaved quant vectors and the
/// scales (as f32; f16 → f32 is exact, so converting here changes no result).
///
/// # Safety
/// AVX2+F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack_block(rows: &[&[BlockQ8_0]; 8], b: usize) -> ([__m256i; 8], __m256) {
    // An 8 × 8 dword transpose: r[k] holds row k's dwords, v[h] dword h of every row.
    let r: [__m256i; 8] =
        std::array::from_fn(|k| _mm256_loadu_si256(rows[k][b].qs.as_ptr().cast()));
    let t: [__m256i; 8] = std::array::from_fn(|k| {
        let (x, y) = (r[k / 2 * 2], r[k / 2 * 2 + 1]);
        if k % 2 == 0 {
            _mm256_unpacklo_epi32(x, y)
        } else {
            _mm256_unpackhi_epi32(x, y)
        }
    });
    // u[4g + c]: dwords c and c + 4 of rows 4g..4g + 4 (c = 0..4).
    let u: [__m256i; 8] = std::array::from_fn(|k| {
        let (g, c) = (k / 4, k % 4);
        let (x, y) = (t[4 * g + c / 2], t[4 * g + 2 + c / 2]);
        if c % 2 == 0 {
            _mm256_unpacklo_epi64(x, y)
        } else {
            _mm256_unpackhi_epi64(x, y)
        }
    });
    let v: [__m256i; 8] = std::array::from_fn(|h| {
        let c = h % 4;
        if h < 4 {
            _mm256_permute2x128_si256::<0x20>(u[c], u[4 + c])
        } else {
            _mm256_permute2x128_si256::<0x31>(u[c], u[4 + c])
        }
    });
    let d: [u16; 8] = std::array::from_fn(|k| rows[k][b].d.to_bits());
    (v, _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().cast())))
}

/// Repack weight rows `j0..j0 + 8` (rows `>= r1` repeat row `r1 - 1`; their outputs are
/// dropped) into `out[..nb]`.
///
/// # Safety
/// AVX2+F16C; `w` holds at least `r1 * nb` blocks; `j0 < r1`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack<S: Q8Group>(
    w: &[S::W],
    nb: usize,
    j0: usize,
    r1: usize,
    out: &mut [Packed],
) {
    let src = S::group(w, nb, j0, r1);
    for (b, p) in out[..nb].iter_mut().enumerate() {
        let (v, d) = S::block(src, b);
        for h in 0..8 {
            _mm256_store_si256(p.qs[h].as_mut_ptr().cast(), v[h]);
        }
        _mm256_store_ps(p.d.as_mut_ptr(), d);
    }
}

/// The `R × 8` outputs of activation rows `i0..i0 + R` against one packed group, lane `k` of
/// result `i` being weight row `k` of the group.
///
/// # Safety
/// AVX2; `pk` holds `nb` blocks; `acts` covers rows `i0..i0 + R`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const R: usize>(pk: &[Packed], acts: &Acts32<BlockQ8_0>, i0: usize) -> [__m256; R] {
    let (m, nb) = (acts.m, acts.nb);
    let ones = _mm256_set1_epi16(1);
    let ya: [*const i8; R] = std::array::from_fn(|i| acts.blocks[(i0 + i) * nb].qs.as_ptr());
    let stride = std::mem::size_of::<BlockQ8_0>();
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let p = pk.as_ptr().add(b);
        let mut sumi = [_mm256_setzero_si256(); R];
        for h in 0..8 {
            let w = _mm256_load_si256((*p).qs[h].as_ptr().cast());
            let abs_w = _mm256_sign_epi8(w, w);
            for i in 0..R {
                let y = ya[i].add(b * stride + 4 * h).cast::<i32>().read_unaligned();
                let y_signed = _mm256_sign_epi8(_mm256_set1_epi32(y), w);
                let pairs = _mm256_maddubs_epi16(abs_w, y_signed);
                sumi[i] = _mm256_add_epi32(sumi[i], _mm256_madd_epi16(pairs, ones));
            }
        }
        let dx = _mm256_load_ps((*p).d.as_ptr());
        let side = b * m + i0;
        for i in 0..R {
            let dy = _mm256_set1_ps(*acts.d.get_unchecked(side + i));
            let t = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi[i]), _mm256_mul_ps(dx, dy));
            acc[i] = _mm256_add_ps(acc[i], t);
        }
    }
    acc
}
