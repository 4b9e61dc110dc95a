//! 512-bit VNNI prefill micro-kernels for Q4_0 / Q4_1 / Q8_0 weights: `vnni_gemm`'s tiles on
//! zmm registers, over groups of 16 weight rows instead of 8.
//!
//! A group's packed block (`Packed16`, `Packed16Q8`) is two 8-row `avx2_gemm` /
//! `avx2_gemm_q8` blocks side by side: vector `h` holds the 8-row layout's vector `h` of rows
//! `j0..j0 + 8` in its low 256 bits and of rows `j0 + 8..j0 + 16` in its high 256 bits, so i32
//! lane `k` (0..16) is weight row `j0 + k`. (Q4_0 / Q4_1 store the low and high nibbles apart,
//! split once at packing instead of in every tile.) Each activation broadcast and each
//! `vpdpbusd` thus serves 16 weight rows instead of 8; the integer dots are the same exact
//! sums, and the float fold is `super::acc_q8` / `super::acc_q4_1` per lane in block order, as
//! in `avx2_gemm::fold`, so every output equals the scalar path bit for bit. Offsets start the
//! integer chains: `-8 · Σy` for Q4_0, `-128 · Σy` for Q8_0, whose weights enter as `w + 128`
//! as in `vnni_gemm`.
//!
//! Measured on an AMX / AVX512-FP16-class Xeon, one thread, m = 512, SmolLM2-135M shapes
//! (times include quantizing the activations): about 150 GMAC/s, against 95 for `vnni_gemm`
//! (AVX-VNNI, 8 rows) and 80 for `avx2_gemm`.
//!
//! The matmul splits weight rows between threads in multiples of 16 on this path, so only a
//! matrix's last group can be partial (its missing rows repeat the last row; their outputs are
//! dropped by a masked store).

// Index loops mirror the block layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::avx2_gemm::{Group8, Nibble32, X8};
use super::avx2_gemm_q8::Q8Group;
use super::gemm_driver::{drive, with_buffer, Repacked};
use super::Acts32;
use crate::quant::blocks::BlockQ8_0;
use std::arch::x86_64::*;
use std::marker::PhantomData;

/// Activation rows per register tile: 8 independent `vpdpbusd` chains hide its latency with
/// one chain per row, and 8 rows amortize each weight load (4 rows: about 15% slower).
const MR: usize = 8;

/// One block of 16 Q4_0 / Q4_1 weight rows.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Packed16 {
    d: [f32; 16],
    m: [f32; 16],
    /// `qs[h]`: the low nibbles of the interleaved vector `h`; `qs[4 + h]`: its high nibbles.
    qs: [[u8; 64]; 8],
}

/// One block of 16 Q8_0 weight rows.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct Packed16Q8 {
    pub(super) d: [f32; 16],
    pub(super) qs: [[i8; 64]; 8],
}

/// The 16-row kernel for weight format `F` (`avx2::Q4_0`, `Q4_1` or `Q8_0`).
pub struct Zmm<F>(PhantomData<F>);

impl<G: Group8> Repacked for Zmm<G> {
    type W = G::W;
    type A = <G::F as Nibble32>::A;
    type Packed = Packed16;
    type Lanes = __m512;
    const NR: usize = 16;
    #[inline]
    unsafe fn pack(w: &[G::W], nb: usize, j0: usize, r1: usize, out: &mut [Packed16]) {
        pack_q4::<G>(w, nb, j0, r1, out)
    }
    #[inline]
    unsafe fn tile<const R: usize>(
        pk: &[Packed16],
        acts: &Acts32<Self::A>,
        i0: usize,
    ) -> [__m512; R] {
        tile_q4::<G::F, R>(pk, acts, i0)
    }
    #[inline]
    unsafe fn store(dst: *mut f32, v: __m512, n: usize) {
        store16(dst, v, n)
    }
}

/// Q8_0 from either source (`avx2_gemm_q8::Q8Group`: row-major or interleaved at load).
macro_rules! repacked_q8 {
    ($src:ty) => {
        impl Repacked for Zmm<$src> {
            type W = <$src as Q8Group>::W;
            type A = BlockQ8_0;
            type Packed = Packed16Q8;
            type Lanes = __m512;
            const NR: usize = 16;
            #[inline]
            unsafe fn pack(w: &[Self::W], nb: usize, j0: usize, r1: usize, out: &mut [Packed16Q8]) {
                pack_q8::<$src>(w, nb, j0, r1, out)
            }
            #[inline]
            unsafe fn tile<const R: usize>(
                pk: &[Packed16Q8],
                acts: &Acts32<BlockQ8_0>,
                i0: usize,
            ) -> [__m512; R] {
                tile_q8::<R>(pk, acts, i0)
            }
            #[inline]
            unsafe fn store(dst: *mut f32, v: __m512, n: usize) {
                store16(dst, v, n)
            }
        }
    };
}
repacked_q8!(super::avx2::Q8_0);
repacked_q8!(X8<super::avx2::Q8_0>);

/// Two 8-row vectors as one: `lo` in bits 0..256, `hi` in 256..512.
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// Repack weight rows `j0..j0 + 16` (rows `>= r1` repeat row `r1 - 1`) into `out[..nb]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pack_q4<G: Group8>(w: &[G::W], nb: usize, j0: usize, r1: usize, out: &mut [Packed16]) {
    let (ra, rb) = (G::group(w, nb, j0, r1), G::group(w, nb, j0 + 8, r1));
    let mask = _mm512_set1_epi8(0x0F);
    for (b, p) in out[..nb].iter_mut().enumerate() {
        let (va, da, ma) = G::block(ra, b);
        let (vb, db, mb) = G::block(rb, b);
        for h in 0..4 {
            let raw = join(va[h], vb[h]);
            let lo = _mm512_and_si512(raw, mask);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), mask);
            _mm512_store_si512(p.qs[h].as_mut_ptr().cast(), lo);
            _mm512_store_si512(p.qs[4 + h].as_mut_ptr().cast(), hi);
        }
        _mm256_store_ps(p.d.as_mut_ptr(), da);
        _mm256_store_ps(p.d.as_mut_ptr().add(8), db);
        _mm256_store_ps(p.m.as_mut_ptr(), ma);
        _mm256_store_ps(p.m.as_mut_ptr().add(8), mb);
    }
}

/// Repack weight rows `j0..j0 + 16` (rows `>= r1` repeat row `r1 - 1`) into `out[..nb]`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn pack_q8<S: Q8Group>(
    w: &[S::W],
    nb: usize,
    j0: usize,
    r1: usize,
    out: &mut [Packed16Q8],
) {
    let (ra, rb) = (S::group(w, nb, j0, r1), S::group(w, nb, j0 + 8, r1));
    for (b, p) in out[..nb].iter_mut().enumerate() {
        let (va, da) = S::block(ra, b);
        let (vb, db) = S::block(rb, b);
        for h in 0..8 {
            _mm512_store_si512(p.qs[h].as_mut_ptr().cast(), join(va[h], vb[h]));
        }
        _mm256_store_ps(p.d.as_mut_ptr(), da);
        _mm256_store_ps(p.d.as_mut_ptr().add(8), db);
    }
}

/// 4 activation bytes at `p`, broadcast to every i32 lane.
#[inline(always)]
unsafe fn bcast4(p: *const i8) -> __m512i {
    _mm512_set1_epi32(p.cast::<i32>().read_unaligned())
}

/// Q4_0 / Q4_1: the `R × 16` outputs of activation rows `i0..i0 + R` against one group.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_q4<F: Nibble32, const R: usize>(
    pk: &[Packed16],
    acts: &Acts32<F::A>,
    i0: usize,
) -> [__m512; R] {
    let (m, nb) = (acts.m, acts.nb);
    let ya: [*const i8; R] =
        std::array::from_fn(|i| F::act_qs(&acts.blocks[(i0 + i) * nb]).as_ptr());
    let stride = std::mem::size_of::<F::A>();
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..nb {
        let p = &*pk.as_ptr().add(b);
        let side = b * m + i0;
        // One chain per row (`MR` rows keep enough in flight); Q4_0's `-8 · Σy` is its start.
        let mut sumi: [__m512i; R] = std::array::from_fn(|i| {
            if F::OFFSET8 {
                _mm512_set1_epi32(*acts.neg8_ysum.get_unchecked(side + i))
            } else {
                _mm512_setzero_si512()
            }
        });
        for h in 0..4 {
            let lo = _mm512_load_si512(p.qs[h].as_ptr().cast());
            let hi = _mm512_load_si512(p.qs[4 + h].as_ptr().cast());
            for i in 0..R {
                let y = ya[i].add(b * stride);
                sumi[i] = _mm512_dpbusd_epi32(sumi[i], lo, bcast4(y.add(4 * h)));
                sumi[i] = _mm512_dpbusd_epi32(sumi[i], hi, bcast4(y.add(16 + 4 * h)));
            }
        }
        let dx = _mm512_load_ps(p.d.as_ptr());
        for i in 0..R {
            // super::acc_q8 / super::acc_q4_1 per lane.
            let dy = _mm512_set1_ps(*acts.d.get_unchecked(side + i));
            let mut t = _mm512_mul_ps(_mm512_cvtepi32_ps(sumi[i]), _mm512_mul_ps(dx, dy));
            if F::HAS_MIN {
                let mx = _mm512_load_ps(p.m.as_ptr());
                let sy = _mm512_set1_ps(*acts.s.get_unchecked(side + i));
                t = _mm512_add_ps(t, _mm512_mul_ps(mx, sy));
            }
            acc[i] = _mm512_add_ps(acc[i], t);
        }
    }
    acc
}

/// Q8_0: the `R × 16` outputs of activation rows `i0..i0 + R` against one group.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn tile_q8<const R: usize>(
    pk: &[Packed16Q8],
    acts: &Acts32<BlockQ8_0>,
    i0: usize,
) -> [__m512; R] {
    let (m, nb) = (acts.m, acts.nb);
    let flip = _mm512_set1_epi8(i8::MIN);
    let ya: [*const i8; R] = std::array::from_fn(|i| acts.blocks[(i0 + i) * nb].qs.as_ptr());
    let stride = std::mem::size_of::<BlockQ8_0>();
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..nb {
        let p = &*pk.as_ptr().add(b);
        let side = b * m + i0;
        // The weights enter as `w + 128`: each row's chain starts at `-128 · Σy`.
        let mut sumi: [__m512i; R] = std::array::from_fn(|i| {
            _mm512_set1_epi32(16 * *acts.neg8_ysum.get_unchecked(side + i))
        });
        for h in 0..8 {
            let w = _mm512_xor_si512(_mm512_load_si512(p.qs[h].as_ptr().cast()), flip);
            for i in 0..R {
                let y = bcast4(ya[i].add(b * stride + 4 * h));
                sumi[i] = _mm512_dpbusd_epi32(sumi[i], w, y);
            }
        }
        let dx = _mm512_load_ps(p.d.as_ptr());
        for i in 0..R {
            // super::acc_q8 per lane.
            let dy = _mm512_set1_ps(*acts.d.get_unchecked(side + i));
            let t = _mm512_mul_ps(_mm512_cvtepi32_ps(sumi[i]), _mm512_mul_ps(dx, dy));
            acc[i] = _mm512_add_ps(acc[i], t);
        }
    }
    acc
}

/// Write the first `n <= 16` lanes of `v` to `dst[..n]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn store16(dst: *mut f32, v: __m512, n: usize) {
    _mm512_mask_storeu_ps(dst, ((1u32 << n) - 1) as __mmask16, v)
}

/// `out[i * rows + j]` for all activation rows `i` and weight rows `j in r0..r1`, 16 weight
/// rows a group; `F` is `avx2::Q4_0`, `Q4_1` or `Q8_0`.
///
/// # Safety
/// AVX2+FMA+F16C and AVX-512 F/BW/VL/VNNI available; `w` holds `rows * nb` blocks; `out`
/// addresses `m * rows` floats and no other thread writes columns `r0..r1`; the activation
/// side arrays are filled.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn matmul_rows<F>(
    w: &[<Zmm<F> as Repacked>::W],
    rows: usize,
    acts: &Acts32<<Zmm<F> as Repacked>::A>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) where
    Zmm<F>: Repacked<Lanes = __m512>,
{
    with_buffer(acts.nb, |pk| {
        drive::<Zmm<F>, MR>(pk, w, rows, acts, r0, r1, out)
    })
}
