//! AVX2 prefill micro-kernels for Q4_K, Q5_K and Q6_K weights × Q8_K activations, over super-blocks
//! of 8 weight rows repacked by `kgemm_pack` (i32 lane `k` is weight row `j0 + k`).
//!
//! Per super-block and activation row, `maddubs` multiplies the unsigned weight quants by the
//! activation's 4 bytes broadcast to every lane, giving each row's pair sums in its two i16
//! lanes; these add up in i16 while they fit, and one `madd` with the row's sub-block scale
//! (the `dup(scale)` lane) turns them into the exact scaled sub-block dot in i32 lane `k`:
//!
//! - Q4_K: a sub-block's 32 values add up in i16 (at most 8 · 2 · 15 · 128 = 30720), then
//!   `madd` with the scale; the min term is one `madd` per sub-block of `dup(min)` with the
//!   activation's `bsums` pair. Folded as `super::acc_k`.
//! - Q5_K: Q4_K's; its values (0..31) fill i16 in half a sub-block (4 · 2 · 31 · 128 =
//!   31744), so two `madd`s a sub-block.
//!
//! Q4_K and Q5_K quants are packed as bytes (`kgemm_pack::PackedK4B`), fifth bits included:
//! unpacking them in the tile cost 2 (Q4_K) and 5 (Q5_K) vector ops per load in every tile, and
//! from 4 activation rows on the bytes were as fast or faster (Gemma 3 270M's shapes, one
//! thread, held to AVX2 on an AVX-512 Xeon: at 128 rows Q4_K 2.65–2.72 → 2.27–2.30 ms, Q5_K
//! 4.08–4.20 → 2.45–2.67).
//! - Q6_K: quants enter unsigned (`q + 32`, 0..63), so pairs of vectors add up in i16 (at most
//!   2 · 2 · 63 · 128 = 32256); `-32 · Σ_s sc_s · bsum_s` removes the offset. Folded as
//!   `super::acc_q6k`.
//!
//! The float fold is the scalar path's IEEE operations per lane in block order, so every
//! output equals `scalar::dot_q4k_q8k` / `dot_q5k_q8k` / `dot_q6k_q8k` bit for bit. The kernels are generic
//! over `IntDot`, so the AVX-VNNI entry point compiles the `madd` + `add` as one `vpdpwssd`.

// Index loops mirror the block layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::avx2::IntDot;
use super::avx2_gemm::store8;
use super::gemm_driver::{drive, with_buffer, Repacked};
use super::kgemm_pack::{
    pack_k4, pack_k4_x8, pack_q6k, PackedK4B, PackedQ4KB, PackedQ5KB, PackedQ6K,
};
use super::Acts32;
use crate::quant::blocks::{BlockQ4K, BlockQ4Kx8, BlockQ5K, BlockQ5Kx8, BlockQ6K, BlockQ8K};
use std::arch::x86_64::*;
use std::marker::PhantomData;

/// Activation rows per register tile (AVX2 has 16 vector registers: 3 accumulators a row).
const MR: usize = 4;

/// The 8-row Q4_K kernel with integer dot `D`.
pub struct Q4K8<D>(PhantomData<D>);
/// The 8-row Q4_K kernel with integer dot `D`, on a matrix interleaved at load
/// (`BlockQ4Kx8`).
pub struct Q4K8X8<D>(PhantomData<D>);
/// The 8-row Q5_K kernel with integer dot `D`.
pub struct Q5K8<D>(PhantomData<D>);
/// The 8-row Q5_K kernel with integer dot `D`, on a matrix interleaved at load
/// (`BlockQ5Kx8`).
pub struct Q5K8X8<D>(PhantomData<D>);
/// The 8-row Q6_K kernel with integer dot `D`.
pub struct Q6K8<D>(PhantomData<D>);

/// `Repacked` for an 8-row kernel with integer dot `D`: `$w` blocks packed by `$pack` into
/// `$packed`, multiplied by `$tile::<D, R $(, $qh)?>`.
macro_rules! repacked8 {
    ($name:ident, $w:ty, $packed:ty, $pack:ident, $tile:ident $(, $qh:expr)?) => {
        impl<D: IntDot> Repacked for $name<D> {
            type W = $w;
            type A = BlockQ8K;
            type Packed = $packed;
            type Lanes = __m256;
            const NR: usize = 8;
            #[inline(always)]
            unsafe fn pack(w: &[$w], nb: usize, j0: usize, r1: usize, out: &mut [$packed]) {
                $pack(w, nb, j0, r1, out)
            }
            #[inline(always)]
            unsafe fn tile<const R: usize>(
                pk: &[$packed],
                acts: &Acts32<BlockQ8K>,
                i0: usize,
            ) -> [__m256; R] {
                $tile::<D, R $(, $qh)?>(pk, acts, i0)
            }
            #[inline(always)]
            unsafe fn store(dst: *mut f32, v: __m256, n: usize) {
                store8(dst, v, n)
            }
        }
    };
}

repacked8!(Q4K8, BlockQ4K, PackedQ4KB<8>, pack_k4, tile_k4, 0);
repacked8!(Q4K8X8, BlockQ4Kx8, PackedQ4KB<8>, pack_k4_x8, tile_k4, 0);
repacked8!(Q5K8, BlockQ5K, PackedQ5KB<8>, pack_k4, tile_k4, 8);
repacked8!(Q5K8X8, BlockQ5Kx8, PackedQ5KB<8>, pack_k4_x8, tile_k4, 8);
repacked8!(Q6K8, BlockQ6K, PackedQ6K<8>, pack_q6k, tile_q6k);

/// 4 bytes at `p`, broadcast to every i32 lane.
#[inline(always)]
pub(super) unsafe fn bcast4<T>(p: *const T) -> __m256i {
    _mm256_set1_epi32(p.cast::<i32>().read_unaligned())
}

#[inline(always)]
unsafe fn load<T>(p: &T) -> __m256i {
    _mm256_load_si256((p as *const T).cast())
}

/// The activation rows `i0..i0 + R` as block pointers.
#[inline(always)]
unsafe fn act_rows<const R: usize>(acts: &Acts32<BlockQ8K>, i0: usize) -> [*const BlockQ8K; R] {
    std::array::from_fn(|i| acts.blocks.as_ptr().add((i0 + i) * acts.nb))
}

/// Q4_K (`QH` = 0) or Q5_K (`QH` = 8), quants packed as bytes: the `R × 8` outputs of
/// activation rows `i0..i0 + R` against one group.
#[inline(always)]
unsafe fn tile_k4<D: IntDot, const R: usize, const QH: usize>(
    pk: &[PackedK4B<8, QH>],
    acts: &Acts32<BlockQ8K>,
    i0: usize,
) -> [__m256; R] {
    let ya = act_rows::<R>(acts, i0);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..acts.nb {
        let p = &*pk.as_ptr().add(b);
        let hd = &p.hd;
        let y: [&BlockQ8K; R] = std::array::from_fn(|i| &*ya[i].add(b));
        let mut sumi = [_mm256_setzero_si256(); R];
        for j in 0..8 {
            let sc = load(&hd.sc[j]);
            let mut s16 = [_mm256_setzero_si256(); R];
            for h in 0..8 {
                let q = load(&p.q[8 * j + h]);
                for i in 0..R {
                    let yv = bcast4(y[i].qs.as_ptr().add(32 * j + 4 * h));
                    s16[i] = _mm256_add_epi16(s16[i], _mm256_maddubs_epi16(q, yv));
                }
                // Q5_K's 5-bit quants fill i16 in 4 steps (4 · 2 · 31 · 128 = 31744).
                if QH > 0 && h == 3 {
                    for i in 0..R {
                        sumi[i] = D::madd_acc(sumi[i], s16[i], sc);
                        s16[i] = _mm256_setzero_si256();
                    }
                }
            }
            for i in 0..R {
                sumi[i] = D::madd_acc(sumi[i], s16[i], sc);
            }
        }
        let dx = _mm256_load_ps(hd.d.as_ptr());
        let dm = _mm256_load_ps(hd.dmin.as_ptr());
        for i in 0..R {
            let mut summ = _mm256_setzero_si256();
            for j in 0..8 {
                summ = D::madd_acc(
                    summ,
                    load(&hd.mins[j]),
                    bcast4(y[i].bsums.as_ptr().add(2 * j)),
                );
            }
            // super::acc_k per lane.
            let dy = _mm256_set1_ps(y[i].d);
            let a = _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(sumi[i]));
            let m = _mm256_mul_ps(_mm256_mul_ps(dm, dy), _mm256_cvtepi32_ps(summ));
            acc[i] = _mm256_add_ps(acc[i], _mm256_sub_ps(a, m));
        }
    }
    acc
}

/// Q6_K: the `R × 8` outputs of activation rows `i0..i0 + R` against one group.
#[inline(always)]
unsafe fn tile_q6k<D: IntDot, const R: usize>(
    pk: &[PackedQ6K<8>],
    acts: &Acts32<BlockQ8K>,
    i0: usize,
) -> [__m256; R] {
    let ya = act_rows::<R>(acts, i0);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..acts.nb {
        let p = &*pk.as_ptr().add(b);
        let y: [&BlockQ8K; R] = std::array::from_fn(|i| &*ya[i].add(b));
        let mut sumi = [_mm256_setzero_si256(); R];
        for s in 0..16 {
            let sc = load(&p.sc[s]);
            for half in 0..2 {
                let v = 4 * s + 2 * half;
                let (q0, q1) = (load(&p.q[v]), load(&p.q[v + 1]));
                for i in 0..R {
                    let yq = y[i].qs.as_ptr().add(4 * v);
                    let s16 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(q0, bcast4(yq)),
                        _mm256_maddubs_epi16(q1, bcast4(yq.add(4))),
                    );
                    sumi[i] = D::madd_acc(sumi[i], s16, sc);
                }
            }
        }
        let dx = _mm256_load_ps(p.d.as_ptr());
        for i in 0..R {
            // Remove the +32 of the unsigned quants: `32 · Σ_s sc_s · bsum_s`.
            let mut off = _mm256_setzero_si256();
            for t in 0..8 {
                off = D::madd_acc(off, load(&p.scp[t]), bcast4(y[i].bsums.as_ptr().add(2 * t)));
            }
            let sumi = _mm256_sub_epi32(sumi[i], _mm256_slli_epi32::<5>(off));
            // super::acc_q6k per lane.
            let dy = _mm256_set1_ps(y[i].d);
            let t = _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(sumi));
            acc[i] = _mm256_add_ps(acc[i], t);
        }
    }
    acc
}

/// `out[i * rows + j]` for all activation rows `i` and weight rows `j in r0..r1`, 8 weight
/// rows a group, with AVX2; `K` is `Q4K8`, `Q4K8X8`, `Q5K8` or `Q6K8` of `avx2::Avx2`.
///
/// # Safety
/// AVX2+FMA+F16C available; `w` holds `rows * nb` blocks; `acts` holds `m * nb` blocks; `out`
/// addresses `m * rows` floats and no other thread writes columns `r0..r1`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn matmul_rows<K: Repacked<A = BlockQ8K, Lanes = __m256>>(
    w: &[K::W],
    rows: usize,
    acts: &Acts32<BlockQ8K>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    with_buffer(acts.nb, |pk| drive::<K, MR>(pk, w, rows, acts, r0, r1, out))
}

/// `matmul_rows` with AVX-VNNI (`vpdpwssd` for `madd` + `add`); `K` is `Q4K8`, `Q4K8X8`, `Q5K8`
/// or `Q6K8` of `vnni::AvxVnni`.
///
/// # Safety
/// AVX2+FMA+F16C+AVX-VNNI available; otherwise as `matmul_rows`.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub unsafe fn matmul_rows_avx_vnni<K: Repacked<A = BlockQ8K, Lanes = __m256>>(
    w: &[K::W],
    rows: usize,
    acts: &Acts32<BlockQ8K>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    with_buffer(acts.nb, |pk| drive::<K, MR>(pk, w, rows, acts, r0, r1, out))
}
