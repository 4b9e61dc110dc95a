//! 256-bit VNNI prefill micro-kernels for Q4_0 / Q4_1 / Q8_0 weights, over the same repacked
//! 8-row groups as `avx2_gemm` / `avx2_gemm_q8` (same `Packed` blocks, same packing, same
//! fold), with `vpdpbusd` in place of the `maddubs` / `add` / `madd` chain.
//!
//! `vpdpbusd` multiplies unsigned bytes by signed bytes and adds each group of 4 products into
//! an i32 lane, exactly (no i16 stage, no saturation). Lane `k` of a packed vector holds 4
//! quants of weight row `k`, and the activation's matching 4 bytes are broadcast to every lane,
//! so each row's exact integer block dot accumulates in its own i32 lane as in `avx2_gemm`,
//! and the float fold (`avx2_gemm::fold`, the same IEEE ops in block order) gives the scalar
//! path's bits.
//!
//! - Q4_0 / Q4_1: the nibbles are already unsigned (0..15); low and high nibbles accumulate in
//!   two chains per activation row so the tile is not bound by `vpdpbusd`'s latency. Q4_0's
//!   `-8 · Σy` is where the low chain starts.
//! - Q8_0: the weights are signed, so they enter as `w + 128` (`w ^ 0x80` read unsigned,
//!   0..255) and a chain starts at `-128 · Σy` (16 times the Q8_0 activations' `neg8_ysum`):
//!   `Σ (w + 128) · y - 128 · Σ y = Σ w · y`, exact for every byte value.
//!
//! The kernels are generic over the encoding (`vnni::Vnni256`) and `#[inline(always)]`; the
//! entry point `matmul_rows_avx_vnni` compiles them with AVX-VNNI (VEX). AVX-512 CPUs run
//! `avx512_gemm`'s 16-row kernels instead, which measured faster than these on 256 bits.

// Index loops mirror the block layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::avx2_gemm::{self, fold, store8, Group8, Nibble32, Packed};
use super::avx2_gemm_q8::{self, Packed as PackedQ8, Q8Group};
use super::gemm_driver::{drive, with_buffer, Repacked};
use super::vnni::{AvxVnni, Vnni256};
use super::Acts32;
use crate::quant::blocks::BlockQ8_0;
use std::arch::x86_64::*;
use std::marker::PhantomData;

/// Activation rows per register tile: with two accumulator chains per row, 4 rows keep 8
/// `vpdpbusd` chains in flight (the instruction's latency is about 5 cycles, 2 issue a cycle).
const MR: usize = 4;

/// The VNNI kernel for weight format `F` (`avx2::Q4_0`, `Q4_1` or `Q8_0`) in encoding `D`.
pub struct Vnni<D, F>(PhantomData<(D, F)>);

impl<D: Vnni256, G: Group8> Repacked for Vnni<D, G> {
    type W = G::W;
    type A = <G::F as Nibble32>::A;
    type Packed = Packed;
    type Lanes = __m256;
    const NR: usize = 8;
    #[inline(always)]
    unsafe fn pack(w: &[G::W], nb: usize, j0: usize, r1: usize, out: &mut [Packed]) {
        avx2_gemm::pack::<G>(w, nb, j0, r1, out)
    }
    #[inline(always)]
    unsafe fn tile<const R: usize>(
        pk: &[Packed],
        acts: &Acts32<Self::A>,
        i0: usize,
    ) -> [__m256; R] {
        tile_q4::<D, G::F, R>(pk, acts, i0)
    }
    #[inline(always)]
    unsafe fn store(dst: *mut f32, v: __m256, n: usize) {
        store8(dst, v, n)
    }
}

/// Q8_0 from either source (`avx2_gemm_q8::Q8Group`: row-major or interleaved at load).
macro_rules! repacked_q8 {
    ($src:ty) => {
        impl<D: Vnni256> Repacked for Vnni<D, $src> {
            type W = <$src as Q8Group>::W;
            type A = BlockQ8_0;
            type Packed = PackedQ8;
            type Lanes = __m256;
            const NR: usize = 8;
            #[inline(always)]
            unsafe fn pack(w: &[Self::W], nb: usize, j0: usize, r1: usize, out: &mut [PackedQ8]) {
                avx2_gemm_q8::pack::<$src>(w, nb, j0, r1, out)
            }
            #[inline(always)]
            unsafe fn tile<const R: usize>(
                pk: &[PackedQ8],
                acts: &Acts32<BlockQ8_0>,
                i0: usize,
            ) -> [__m256; R] {
                tile_q8::<D, R>(pk, acts, i0)
            }
            #[inline(always)]
            unsafe fn store(dst: *mut f32, v: __m256, n: usize) {
                store8(dst, v, n)
            }
        }
    };
}
repacked_q8!(super::avx2::Q8_0);
repacked_q8!(avx2_gemm::X8<super::avx2::Q8_0>);

/// 4 activation bytes at `p`, broadcast to every i32 lane.
#[inline(always)]
unsafe fn bcast4(p: *const i8) -> __m256i {
    _mm256_set1_epi32(p.cast::<i32>().read_unaligned())
}

/// Q4_0 / Q4_1: the `R × 8` outputs of activation rows `i0..i0 + R` against one packed group.
#[inline(always)]
unsafe fn tile_q4<D: Vnni256, F: Nibble32, const R: usize>(
    pk: &[Packed],
    acts: &Acts32<F::A>,
    i0: usize,
) -> [__m256; R] {
    let (m, nb) = (acts.m, acts.nb);
    let ya: [*const i8; R] =
        std::array::from_fn(|i| F::act_qs(&acts.blocks[(i0 + i) * nb]).as_ptr());
    let stride = std::mem::size_of::<F::A>();
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let p = pk.as_ptr().add(b);
        let side = b * m + i0;
        // Q4_0's `-8 · Σy` is where the low chain starts.
        let mut s_lo: [__m256i; R] = std::array::from_fn(|i| {
            if F::OFFSET8 {
                _mm256_set1_epi32(*acts.neg8_ysum.get_unchecked(side + i))
            } else {
                _mm256_setzero_si256()
            }
        });
        let mut s_hi = [_mm256_setzero_si256(); R];
        for h in 0..4 {
            let lo = _mm256_load_si256((*p).q[2 * h].as_ptr().cast());
            let hi = _mm256_load_si256((*p).q[2 * h + 1].as_ptr().cast());
            for i in 0..R {
                let y = ya[i].add(b * stride);
                s_lo[i] = D::dpbusd(s_lo[i], lo, bcast4(y.add(4 * h)));
                s_hi[i] = D::dpbusd(s_hi[i], hi, bcast4(y.add(16 + 4 * h)));
            }
        }
        for i in 0..R {
            let sumi = _mm256_add_epi32(s_lo[i], s_hi[i]);
            acc[i] = fold::<F>(acc[i], sumi, &*p, acts, side + i);
        }
    }
    acc
}

/// Q8_0: the `R × 8` outputs of activation rows `i0..i0 + R` against one packed group.
#[inline(always)]
unsafe fn tile_q8<D: Vnni256, const R: usize>(
    pk: &[PackedQ8],
    acts: &Acts32<BlockQ8_0>,
    i0: usize,
) -> [__m256; R] {
    let (m, nb) = (acts.m, acts.nb);
    let flip = _mm256_set1_epi8(i8::MIN);
    let ya: [*const i8; R] = std::array::from_fn(|i| acts.blocks[(i0 + i) * nb].qs.as_ptr());
    let stride = std::mem::size_of::<BlockQ8_0>();
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..nb {
        let p = pk.as_ptr().add(b);
        let side = b * m + i0;
        // Even and odd `h` in two chains per row, against `vpdpbusd`'s latency; the weights
        // enter as `w + 128`, so the even chain starts at `-128 · Σy`.
        let mut s = [[_mm256_setzero_si256(); R]; 2];
        for i in 0..R {
            s[0][i] = _mm256_set1_epi32(16 * *acts.neg8_ysum.get_unchecked(side + i));
        }
        for h in 0..8 {
            let w = _mm256_xor_si256(_mm256_load_si256((*p).qs[h].as_ptr().cast()), flip);
            for i in 0..R {
                let y = bcast4(ya[i].add(b * stride + 4 * h));
                s[h % 2][i] = D::dpbusd(s[h % 2][i], w, y);
            }
        }
        let dx = _mm256_load_ps((*p).d.as_ptr());
        for i in 0..R {
            let sumi = _mm256_add_epi32(s[0][i], s[1][i]);
            // super::acc_q8 per lane.
            let dy = _mm256_set1_ps(*acts.d.get_unchecked(side + i));
            let t = _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dx, dy));
            acc[i] = _mm256_add_ps(acc[i], t);
        }
    }
    acc
}

/// `out[i * rows + j]` for all activation rows `i` and weight rows `j in r0..r1`, with
/// AVX-VNNI; `F` is `avx2::Q4_0`, `Q4_1` or `Q8_0`.
///
/// # Safety
/// AVX2+FMA+F16C+AVX-VNNI available; `w` holds `rows * nb` blocks; `out` addresses
/// `m * rows` floats and no other thread writes columns `r0..r1`; the activation side arrays
/// are filled.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn matmul_rows_avx_vnni<F>(
    w: &[<Vnni<AvxVnni, F> as Repacked>::W],
    rows: usize,
    acts: &Acts32<<Vnni<AvxVnni, F> as Repacked>::A>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) where
    Vnni<AvxVnni, F>: Repacked<Lanes = __m256>,
{
    with_buffer(acts.nb, |pk| {
        drive::<Vnni<AvxVnni, F>, MR>(pk, w, rows, acts, r0, r1, out)
    })
}
