//! 512-bit VNNI prefill micro-kernels for Q4_K, Q5_K and Q6_K weights × Q8_K activations, over
//! super-blocks of 16 weight rows repacked by `kgemm_pack` (i32 lane `k` is weight row
//! `j0 + k`).
//!
//! Per super-block and activation row, each sub-block's exact integer dot accumulates in one
//! i32 lane per weight row with `vpdpbusd` (unsigned weight quants × the activation's 4 bytes
//! broadcast) and is multiplied by the row's sub-block scale as it is summed over the
//! sub-blocks. The sums do not fit the i16 operands of `vpdpwssd`, but their low byte and the
//! rest do: a `vpshufb` makes each lane the pair `(s & 0xFF, s >> 8)` and one `vpdpwssd`
//! against `(sc, 256 · sc)` adds `s · sc` (a `vpmulld` + `vpaddd` cost three uops on the
//! port the `vpdpbusd` chains need; the shuffle runs on another):
//!
//! - Q4_K: `sumi = Σ_j sc_j · Σ q·y` (8 sub-blocks of 32, quants 0..15) and
//!   `summ = Σ_j min_j · (bsum_2j + bsum_2j+1)` (one `vpdpwssd` per sub-block on the
//!   activation's `bsums`), folded as `super::acc_k`.
//! - Q5_K: Q4_K's (sums at most 32 · 31 · 128, below 2^23 too). With the quants packed as
//!   stored (`kgemm_pack::PackedK4`, for fewer activation rows) the tile unpacks the nibbles of
//!   each weight vector and ors in Q5_K's fifth bits from `qh`; packed as bytes (`PackedK4B`)
//!   it loads them.
//! - Q6_K: the quants enter unsigned (`q + 32`, 0..63), so `Σ_s sc_s · Σ (q + 32)·y` is
//!   corrected by `-32 · Σ_s sc_s · bsum_s` (8 `vpdpwssd`); folded as `super::acc_q6k`.
//!
//! Every integer step is exact (at most 32 · 15 · 128 per Q4_K sub-block, 16 · 63 · 128 per
//! Q6_K one: below 2^23, so `s >> 8` fits an i16; well inside i32 after scaling) and the float
//! fold is the scalar path's IEEE operations per lane in block order, so every output equals
//! `scalar::dot_q4k_q8k` / `dot_q5k_q8k` / `dot_q6k_q8k` bit for bit. The loop over chunks,
//! groups and tiles is `gemm_driver::drive`.

// Index loops mirror the block layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::gemm_driver::{drive, with_buffer, Repacked};
use super::kgemm_pack::{
    pack_k4, pack_k4_x8, pack_q6k, K4Packed, PackedQ4K, PackedQ4KB, PackedQ5K, PackedQ5KB,
    PackedQ6K,
};
use super::Acts32;
use crate::quant::blocks::{BlockQ4K, BlockQ4Kx8, BlockQ5K, BlockQ5Kx8, BlockQ6K, BlockQ8K};
use std::arch::x86_64::*;

/// Activation rows per register tile: 8 `vpdpbusd` chains (one per row) hide its latency
/// and amortize each weight load over 8 rows.
const MR: usize = 8;

/// The 16-row Q4_K kernel.
pub struct Q4K16;
/// The 16-row Q4_K kernel on a matrix interleaved at load (`BlockQ4Kx8`).
pub struct Q4K16X8;
/// The 16-row Q5_K kernel.
pub struct Q5K16;
/// The 16-row Q6_K kernel.
pub struct Q6K16;
/// `Q4K16` with the quants packed as bytes, for many activation rows.
pub struct Q4K16B;
/// `Q4K16X8` with the quants packed as bytes.
pub struct Q4K16X8B;
/// `Q5K16` with the quants packed as bytes.
pub struct Q5K16B;
/// The 16-row Q5_K kernel on a matrix interleaved at load (`BlockQ5Kx8`).
pub struct Q5K16X8;
/// `Q5K16X8` with the quants packed as bytes.
pub struct Q5K16X8B;

/// `Repacked` for a 16-row kernel: `$w` blocks packed by `$pack` into `$packed`, multiplied by
/// `$tile`.
macro_rules! repacked16 {
    ($name:ident, $w:ty, $packed:ty, $pack:ident, $tile:ident) => {
        impl Repacked for $name {
            type W = $w;
            type A = BlockQ8K;
            type Packed = $packed;
            type Lanes = __m512;
            const NR: usize = 16;
            #[inline]
            unsafe fn pack(w: &[$w], nb: usize, j0: usize, r1: usize, out: &mut [$packed]) {
                $pack(w, nb, j0, r1, out)
            }
            #[inline]
            unsafe fn tile<const R: usize>(
                pk: &[$packed],
                acts: &Acts32<BlockQ8K>,
                i0: usize,
            ) -> [__m512; R] {
                $tile(pk, acts, i0)
            }
            #[inline]
            unsafe fn store(dst: *mut f32, v: __m512, n: usize) {
                store16(dst, v, n)
            }
        }
    };
}

repacked16!(Q4K16, BlockQ4K, PackedQ4K<16>, pack_k4, tile_k4);
repacked16!(Q4K16X8, BlockQ4Kx8, PackedQ4K<16>, pack_k4_x8, tile_k4);
repacked16!(Q5K16, BlockQ5K, PackedQ5K<16>, pack_k4, tile_k4);
repacked16!(Q4K16B, BlockQ4K, PackedQ4KB<16>, pack_k4, tile_k4);
repacked16!(Q4K16X8B, BlockQ4Kx8, PackedQ4KB<16>, pack_k4_x8, tile_k4);
repacked16!(Q5K16B, BlockQ5K, PackedQ5KB<16>, pack_k4, tile_k4);
repacked16!(Q5K16X8, BlockQ5Kx8, PackedQ5K<16>, pack_k4_x8, tile_k4);
repacked16!(Q5K16X8B, BlockQ5Kx8, PackedQ5KB<16>, pack_k4_x8, tile_k4);
repacked16!(Q6K16, BlockQ6K, PackedQ6K<16>, pack_q6k, tile_q6k);

/// 4 bytes at `p`, broadcast to every i32 lane.
#[inline(always)]
unsafe fn bcast4<T>(p: *const T) -> __m512i {
    _mm512_set1_epi32(p.cast::<i32>().read_unaligned())
}

#[inline(always)]
unsafe fn load<T>(p: &T) -> __m512i {
    _mm512_load_si512((p as *const T).cast())
}

/// 64 aligned bytes at `p`.
#[inline(always)]
unsafe fn load_at(p: *const u32) -> __m512i {
    _mm512_load_si512(p.cast())
}

/// The activation rows `i0..i0 + R` as block pointers.
#[inline(always)]
unsafe fn act_rows<const R: usize>(acts: &Acts32<BlockQ8K>, i0: usize) -> [*const BlockQ8K; R] {
    std::array::from_fn(|i| acts.blocks.as_ptr().add((i0 + i) * acts.nb))
}

/// The `vpshufb` index that turns each i32 lane `s` (|s| < 2^23) into the i16 pair
/// `(s & 0xFF, s >> 8)`: byte 0 zero-extended, then bytes 1 and 2.
#[inline(always)]
unsafe fn split_index() -> __m512i {
    let lane = |d: i32| (4 * d) | (0x80 << 8) | ((4 * d + 1) << 16) | ((4 * d + 2) << 24);
    _mm512_broadcast_i32x4(_mm_setr_epi32(lane(0), lane(1), lane(2), lane(3)))
}

/// `pair(sc, 256 · sc)` from `dup(sc)` (|sc| <= 128, so `256 · sc` fits an i16): against
/// `split_index`'s pair, one `vpdpwssd` adds `(s & 0xFF) · sc + (s >> 8) · 256 · sc = s · sc`.
#[inline(always)]
unsafe fn scale_split(dup: __m512i) -> __m512i {
    _mm512_mask_blend_epi16(0xAAAA_AAAA, dup, _mm512_slli_epi16::<8>(dup))
}

/// `vpdpwssd` in inline assembly: given the intrinsic, LLVM splits it into `vpmaddwd` +
/// `vpaddd`, two uops on the port the `vpdpbusd` chains need.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    std::arch::asm!(
        "vpdpwssd {acc}, {a}, {b}",
        acc = inout(zmm_reg) acc,
        a = in(zmm_reg) a,
        b = in(zmm_reg) b,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// Q4_K or Q5_K in either layout (`P`): the `R × 16` outputs of activation rows `i0..i0 + R`
/// against one group.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_k4<const R: usize, P: K4Packed<16>>(
    pk: &[P],
    acts: &Acts32<BlockQ8K>,
    i0: usize,
) -> [__m512; R] {
    let mask = _mm512_set1_epi8(0x0F);
    let split = split_index();
    let ya = act_rows::<R>(acts, i0);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..acts.nb {
        let p = &*pk.as_ptr().add(b);
        let (hd, words) = (p.head(), p.words());
        let y: [&BlockQ8K; R] = std::array::from_fn(|i| &*ya[i].add(b));
        let mut sumi = [_mm512_setzero_si512(); R];
        for j in 0..8 {
            let mut s = [_mm512_setzero_si512(); R];
            for h in 0..8 {
                let q = if P::BYTES {
                    load_at(words.add((8 * j + h) * 16))
                } else {
                    let raw = load_at(words.add((8 * (j / 2) + h) * 16));
                    let q = if j % 2 == 0 {
                        _mm512_and_si512(raw, mask)
                    } else {
                        _mm512_and_si512(_mm512_srli_epi16::<4>(raw), mask)
                    };
                    if P::FIVE {
                        // Q5_K: bit j of each `qh` byte to bit 4.
                        let qh = load_at(p.qh().add(h * 16));
                        let moved = if j <= 4 {
                            _mm512_sll_epi16(qh, _mm_cvtsi32_si128(4 - j as i32))
                        } else {
                            _mm512_srl_epi16(qh, _mm_cvtsi32_si128(j as i32 - 4))
                        };
                        _mm512_or_si512(q, _mm512_and_si512(moved, _mm512_set1_epi8(0x10)))
                    } else {
                        q
                    }
                };
                for i in 0..R {
                    s[i] =
                        _mm512_dpbusd_epi32(s[i], q, bcast4(y[i].qs.as_ptr().add(32 * j + 4 * h)));
                }
            }
            let sc = scale_split(load(&hd.sc[j]));
            for i in 0..R {
                sumi[i] = dpwssd(sumi[i], _mm512_shuffle_epi8(s[i], split), sc);
            }
        }
        let dx = _mm512_load_ps(hd.d.as_ptr());
        let dm = _mm512_load_ps(hd.dmin.as_ptr());
        // One chain per row, interleaved (one row's chain after another's would wait on
        // `vpdpwssd`'s latency).
        let mut summ = [_mm512_setzero_si512(); R];
        for j in 0..8 {
            let mn = load(&hd.mins[j]);
            for i in 0..R {
                summ[i] = dpwssd(summ[i], mn, bcast4(y[i].bsums.as_ptr().add(2 * j)));
            }
        }
        for i in 0..R {
            // super::acc_k per lane.
            let dy = _mm512_set1_ps(y[i].d);
            let a = _mm512_mul_ps(_mm512_mul_ps(dx, dy), _mm512_cvtepi32_ps(sumi[i]));
            let m = _mm512_mul_ps(_mm512_mul_ps(dm, dy), _mm512_cvtepi32_ps(summ[i]));
            acc[i] = _mm512_add_ps(acc[i], _mm512_sub_ps(a, m));
        }
    }
    acc
}

/// Q6_K: the `R × 16` outputs of activation rows `i0..i0 + R` against one group.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_q6k<const R: usize>(
    pk: &[PackedQ6K<16>],
    acts: &Acts32<BlockQ8K>,
    i0: usize,
) -> [__m512; R] {
    let split = split_index();
    let ya = act_rows::<R>(acts, i0);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..acts.nb {
        let p = &*pk.as_ptr().add(b);
        let y: [&BlockQ8K; R] = std::array::from_fn(|i| &*ya[i].add(b));
        let mut sumi = [_mm512_setzero_si512(); R];
        for s in 0..16 {
            let mut t = [_mm512_setzero_si512(); R];
            for v in 0..4 {
                let q = load(&p.q[4 * s + v]);
                for i in 0..R {
                    t[i] =
                        _mm512_dpbusd_epi32(t[i], q, bcast4(y[i].qs.as_ptr().add(16 * s + 4 * v)));
                }
            }
            let sc = scale_split(load(&p.sc[s]));
            for i in 0..R {
                sumi[i] = dpwssd(sumi[i], _mm512_shuffle_epi8(t[i], split), sc);
            }
        }
        let dx = _mm512_load_ps(p.d.as_ptr());
        // Remove the +32 of the unsigned quants: `32 · Σ_s sc_s · bsum_s`, one chain per row,
        // interleaved.
        let mut off = [_mm512_setzero_si512(); R];
        for t in 0..8 {
            let scp = load(&p.scp[t]);
            for i in 0..R {
                off[i] = dpwssd(off[i], scp, bcast4(y[i].bsums.as_ptr().add(2 * t)));
            }
        }
        for i in 0..R {
            let sumi = _mm512_sub_epi32(sumi[i], _mm512_slli_epi32::<5>(off[i]));
            // super::acc_q6k per lane.
            let dy = _mm512_set1_ps(y[i].d);
            let t = _mm512_mul_ps(_mm512_mul_ps(dx, dy), _mm512_cvtepi32_ps(sumi));
            acc[i] = _mm512_add_ps(acc[i], t);
        }
    }
    acc
}

/// Write the first `n <= 16` lanes of `v` to `dst[..n]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn store16(dst: *mut f32, v: __m512, n: usize) {
    _mm512_mask_storeu_ps(dst, ((1u32 << n) - 1) as __mmask16, v)
}

/// `out[i * rows + j]` for all activation rows `i` and weight rows `j in r0..r1`, 16 weight
/// rows a group; `K` is `Q4K16`, `Q4K16X8`, `Q5K16` or `Q6K16`.
///
/// # Safety
/// AVX2+FMA+F16C and AVX-512 F/BW/VL/VNNI available; `w` holds `rows * nb` blocks; `acts`
/// holds `m * nb` blocks; `out` addresses `m * rows` floats and no other thread writes
/// columns `r0..r1`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn matmul_rows<K: Repacked<A = BlockQ8K, Lanes = __m512>>(
    w: &[K::W],
    rows: usize,
    acts: &Acts32<BlockQ8K>,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    with_buffer(acts.nb, |pk| drive::<K, MR>(pk, w, rows, acts, r0, r1, out))
}
