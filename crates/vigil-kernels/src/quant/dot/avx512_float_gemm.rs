//! AVX-512 tiles for the float-weight prefill GEMM (`avx2_float_gemm`'s driver): twice the FMA
//! width of the AVX2 tiles with the same numerics, bit for bit.
//!
//! The contract keeps one 8-lane accumulator per (activation row, weight row) pair, so a
//! 16-lane register holds two pairs side by side: lanes 0-7 weight row `2p`, lanes 8-15 row
//! `2p + 1`, both against the same activation row. The driver's widened weight block already
//! lays chunk `s` of rows `2p` and `2p + 1` next to each other (64-byte aligned), so one load
//! fetches both, and the activation chunk is broadcast to both halves. Each half then runs
//! exactly the FMA sequence of an AVX2 accumulator, and the driver sums it with `hsum8`'s tree.
//! A tile is 6 activation rows × 8 weight rows: 24 accumulators, 6 activation registers and
//! one weight register of the 32.
//!
//! On a row's last column block the tile sums its accumulators in registers, two activation
//! rows (16 results) at a time, through three rounds of shuffles and adds whose pairs are
//! exactly `hsum8`'s (high half onto low half, lanes 2, 3 onto 0, 1, lane 1 onto lane 0), and
//! writes the results: storing 24 accumulators for the driver to reload and sum 4 at a time
//! held BF16 at 512 rows to 269-274 GFLOP/s on 2 threads of an Emerald Rapids Xeon, against
//! 290-292 this way (`matmul_bench 512 2 10 bf16x8`; the 512-bit FMA peak is 425-465 as
//! the host's clock moves, `examples/fma_peak.rs`).

// Index loops mirror the buffer layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::avx2_float_gemm::{tile_cases, TileCall, Tiles};
use crate::unroll::unrolled4;
use std::arch::x86_64::*;

/// Weight-row pairs per tile.
const NP: usize = 4;

/// The AVX-512 tiles: 6 activation rows × 8 weight rows, for `avx2_float_gemm::matmul_rows`.
pub(crate) struct Avx512;

impl Tiles for Avx512 {
    const MR: usize = 6;
    const NR: usize = 2 * NP;
    /// 1,024 columns measured no faster here, and slower at 3,072 (a 32 KiB block).
    const KC: usize = 512;
    #[inline]
    unsafe fn tile(r: usize, c: &TileCall) {
        match r {
            1 => tile_cases!(tile, 1, c),
            2 => tile_cases!(tile, 2, c),
            3 => tile_cases!(tile, 3, c),
            4 => tile_cases!(tile, 4, c),
            5 => tile_cases!(tile, 5, c),
            _ => tile_cases!(tile, 6, c),
        }
    }
}

/// `Tiles::tile` for 6 × 8 tiles (`MR` rows of them): accumulator `acc[i * 8 + j]` (a `V8`) is
/// lanes `8 * (j % 2)..` of register `(i, j / 2)`.
///
/// # Safety
/// AVX-512F; see `Tiles::tile`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const MR: usize, const FIRST: bool, const OUT: bool>(c: &TileCall) {
    let (px, pw, steps, acc, out, ld) = (c.px, c.pw, c.steps, c.acc, c.out, c.ld);
    let mut a = [[_mm512_setzero_ps(); NP]; MR];
    if !FIRST {
        for i in 0..MR {
            for p in 0..NP {
                a[i][p] = _mm512_load_ps(acc.add(i * 2 * NP + 2 * p).cast());
            }
        }
    }
    unrolled4(steps, |s| {
        let mut xv = [_mm512_setzero_ps(); MR];
        for i in 0..MR {
            // `vbroadcastf64x4` (AVX-512F; the f32x8 form needs DQ): the same 32 bytes twice.
            let chunk = _mm256_load_pd(px.add(s * MR + i).cast());
            xv[i] = _mm512_castpd_ps(_mm512_broadcast_f64x4(chunk));
        }
        for p in 0..NP {
            let wv = _mm512_load_ps(pw.add(s * 2 * NP + 2 * p).cast());
            for i in 0..MR {
                a[i][p] = _mm512_fmadd_ps(wv, xv[i], a[i][p]);
            }
        }
    });
    if OUT {
        for i in (0..MR).step_by(2) {
            // An odd last row pairs with itself; only its low half is stored.
            let v = sums16(&a[i], &a[(i + 1).min(MR - 1)]);
            _mm256_storeu_ps(out.add(i * ld), _mm512_castps512_ps256(v));
            if i + 1 < MR {
                let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v));
                _mm256_storeu_ps(out.add((i + 1) * ld), _mm256_castpd_ps(hi));
            }
        }
        return;
    }
    for i in 0..MR {
        for p in 0..NP {
            _mm512_store_ps(acc.add(i * 2 * NP + 2 * p).cast(), a[i][p]);
        }
    }
}

/// The 8 + 8 results of two activation rows' accumulators `a` and `b` (register `p` holding
/// weight rows `2p` and `2p + 1`): lane `j` is `hsum8` of `a`'s weight row `j`, lane `8 + j`
/// that of `b`'s. Each round adds the pairs `hsum8` adds, for every accumulator at once.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn sums16(a: &[__m512; NP], b: &[__m512; NP]) -> __m512 {
    // Round 1, high half onto low half: x and y hold weight rows (0, 1) and (2, 3) of a
    // group of 4, as 128-bit quarters (row 0 low, row 0 high, row 1 low, row 1 high); the sum
    // of the low quarters and the high ones leaves quarter k = weight row k's 4 partial sums.
    let halves = |x: __m512, y: __m512| {
        let lo = _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y);
        let hi = _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y);
        _mm512_add_ps(lo, hi)
    };
    // Round 2, lanes 2, 3 onto 0, 1: x holds weight rows 0-3 and y rows 4-7, a row a
    // quarter; the result's quarter k holds row k's 2 partial sums, then row k + 4's.
    let pairs = |x: __m512, y: __m512| {
        let lo = _mm512_shuffle_ps::<0b01_00_01_00>(x, y);
        let hi = _mm512_shuffle_ps::<0b11_10_11_10>(x, y);
        _mm512_add_ps(lo, hi)
    };
    let ua = pairs(halves(a[0], a[1]), halves(a[2], a[3]));
    let ub = pairs(halves(b[0], b[1]), halves(b[2], b[3]));
    // Round 3, lane 1 onto lane 0: quarter k = (a: row k, a: row k + 4, b: row k, b: row k + 4).
    let lo = _mm512_shuffle_ps::<0b10_00_10_00>(ua, ub);
    let hi = _mm512_shuffle_ps::<0b11_01_11_01>(ua, ub);
    let v = _mm512_add_ps(lo, hi);
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, v)
}
