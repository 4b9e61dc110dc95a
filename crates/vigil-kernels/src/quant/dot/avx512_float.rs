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

use super::avx2_float::{hsum8, X8_PREFETCH_L2};
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
