//! The AVX-512 decode tile for BF16 weights interleaved 8 rows at a time
//! (`quant::interleave`): `avx2_float::tile_bf16_x8`'s sums, bit for bit, at twice the width.
//!
//! A step of a group's run is 128 bytes: chunk `s` (8 values) of rows 0-7, one row's chunk a
//! 128-bit lane. One 512-bit load holds four rows' chunks; unpacking it with zeros widens
//! columns 0-3 of each row into its lane of one vector and columns 4-7 into another (a BF16
//! value is the top half of its f32), against the activations' columns 0-3 (4-7) broadcast to
//! every lane. Each row's 4 + 4 lanes are then exactly the 8 lanes of the AVX2 tile's
//! accumulator, summed by the same `hsum8`. Half the loads, unpacks and FMAs a byte: the
//! decode streams its weights from DRAM, and fewer instructions a line let the core keep more
//! lines in flight.

// Index loops mirror the register layout.
#![allow(clippy::needless_range_loop)]

use super::avx2_float::{hsum8, X8_PREFETCH_L2};
use crate::quant::packed_bf16::{patch, Exception, PAIR_BYTES};
use std::arch::x86_64::*;

/// How far ahead along the group's run the tile fetches. Measured on the Xeon
/// (`gemv_bandwidth bf16x8`, huge pages; a plain read of the same bytes 32-33 GB/s): 2.5-3.25 KiB
/// read at 30.6-31.9 GB/s, 1-1.5 KiB at 28.8-30.2, 4-8 KiB at 29.4-29.7, and 2 KiB, the AVX2
/// tile's best, at only 25.4-26.9; in a Qwen3-shape decode step 2.5-3 KiB were best too.
const PREFETCH: usize = 3072;

/// The decode tile (1 activation row × 8 weight rows) on an interleaved BF16 group.
///
/// # Safety
/// AVX-512 F/BW; `g` addresses the group's `8 * cols` values, `x` `cols` floats,
/// `cols % 8 == 0`.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
pub(super) unsafe fn tile_bf16_x8(g: *const u8, x: *const f32, cols: usize) -> [f32; 8] {
    let zero = _mm512_setzero_si512();
    let mut lo = [_mm512_setzero_ps(); 2];
    let mut hi = [_mm512_setzero_ps(); 2];
    for s in 0..cols / 8 {
        let at = g.add(s * 128);
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH).cast());
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH + 64).cast());
        _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(X8_PREFETCH_L2).cast());
        _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(X8_PREFETCH_L2 + 64).cast());
        let xlo = _mm512_broadcast_f32x4(_mm_loadu_ps(x.add(8 * s)));
        let xhi = _mm512_broadcast_f32x4(_mm_loadu_ps(x.add(8 * s + 4)));
        for p in 0..2 {
            let v = _mm512_loadu_si512(at.add(64 * p).cast());
            let wlo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, v));
            let whi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, v));
            lo[p] = _mm512_fmadd_ps(wlo, xlo, lo[p]);
            hi[p] = _mm512_fmadd_ps(whi, xhi, hi[p]);
        }
    }
    finish(lo, hi)
}

/// The 8 rows' sums out of the accumulators, each row's 4 + 4 lanes as the AVX2 tile's 8.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
unsafe fn finish(lo: [__m512; 2], hi: [__m512; 2]) -> [f32; 8] {
    let mut r = [0f32; 8];
    for p in 0..2 {
        let (mut l, mut h) = ([0f32; 16], [0f32; 16]);
        _mm512_storeu_ps(l.as_mut_ptr(), lo[p]);
        _mm512_storeu_ps(h.as_mut_ptr(), hi[p]);
        for k in 0..4 {
            // Row 4p + k: its lane's columns 0-3 then 4-7, the AVX2 tile's 8 lanes.
            let (a, b) = (
                _mm_loadu_ps(l[4 * k..].as_ptr()),
                _mm_loadu_ps(h[4 * k..].as_ptr()),
            );
            r[4 * p + k] = hsum8(_mm256_set_m128(b, a));
        }
    }
    r
}

/// `tile_bf16_x8` on a group packed by `quant::packed_bf16`, the same sums bit for bit: each
/// pair's 64 code bytes become the two steps' high bytes by one table shuffle each, and
/// interleaving them with the low bytes (`punpcklbw` / `punpckhbw`) gives exactly the vectors
/// `tile_bf16_x8` loads. A pair with exceptions has its high bytes patched first. The words are
/// widened without shuffles, as in `avx2_float`'s packed tile: even columns shifted, odd ones
/// masked, against the activations laid out by `avx2_float::even_odd`, the two sets of
/// accumulators interleaved at the end into `tile_bf16_x8`'s.
///
/// # Safety
/// AVX-512 F/BW; `run` addresses the group's `pairs * PAIR_BYTES` bytes, `x` `16 * pairs`
/// floats laid out by `even_odd`; `exc` are the group's exceptions, in order.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
pub(super) unsafe fn tile_packed_bf16_x8(
    run: *const u8,
    table: &[u8; 16],
    x: *const f32,
    pairs: usize,
    exc: &[Exception],
) -> [f32; 8] {
    let nibble = _mm512_set1_epi8(15);
    let odd = _mm512_set1_epi32(0xffff_0000_u32 as i32);
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(table.as_ptr().cast()));
    let mut ev = [_mm512_setzero_ps(); 2];
    let mut od = [_mm512_setzero_ps(); 2];
    let mut e = 0;
    for q in 0..pairs {
        let at = run.add(q * PAIR_BYTES);
        for l in (0..PAIR_BYTES).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH + l).cast());
            _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(X8_PREFETCH_L2 + l).cast());
        }
        let codes = _mm512_loadu_si512(at.add(128).cast());
        let mut high = [
            _mm512_shuffle_epi8(table, _mm512_and_si512(codes, nibble)),
            _mm512_shuffle_epi8(
                table,
                _mm512_and_si512(_mm512_srli_epi16::<4>(codes), nibble),
            ),
        ];
        if e < exc.len() && exc[e].pair as usize == q {
            let mut bytes = [0u8; 128];
            _mm512_storeu_si512(bytes.as_mut_ptr().cast(), high[0]);
            _mm512_storeu_si512(bytes.as_mut_ptr().add(64).cast(), high[1]);
            e = patch(&mut bytes, exc, e, q);
            high = [
                _mm512_loadu_si512(bytes.as_ptr().cast()),
                _mm512_loadu_si512(bytes.as_ptr().add(64).cast()),
            ];
        }
        for t in 0..2 {
            let s = 2 * q + t;
            let low = _mm512_loadu_si512(at.add(64 * t).cast());
            let xe = _mm512_broadcast_f32x4(_mm_loadu_ps(x.add(8 * s)));
            let xo = _mm512_broadcast_f32x4(_mm_loadu_ps(x.add(8 * s + 4)));
            let v = [
                _mm512_unpacklo_epi8(low, high[t]),
                _mm512_unpackhi_epi8(low, high[t]),
            ];
            for p in 0..2 {
                let we = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v[p]));
                let wo = _mm512_castsi512_ps(_mm512_and_si512(v[p], odd));
                ev[p] = _mm512_fmadd_ps(we, xe, ev[p]);
                od[p] = _mm512_fmadd_ps(wo, xo, od[p]);
            }
        }
    }
    let lo = std::array::from_fn(|p| _mm512_unpacklo_ps(ev[p], od[p]));
    let hi = std::array::from_fn(|p| _mm512_unpackhi_ps(ev[p], od[p]));
    finish(lo, hi)
}
