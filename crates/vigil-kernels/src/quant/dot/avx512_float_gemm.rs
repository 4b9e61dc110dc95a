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

// Index loops mirror the buffer layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::avx2_float_gemm::{Tiles, V8};
use crate::unroll::unrolled4;
use std::arch::x86_64::*;

/// Weight-row pairs per tile.
const NP: usize = 4;

/// The AVX-512 tiles: 6 activation rows × 8 weight rows, for `avx2_float_gemm::matmul_rows`.
pub(crate) struct Avx512;

impl Tiles for Avx512 {
    const MR: usize = 6;
    const NR: usize = 2 * NP;
    #[inline]
    unsafe fn tile(r: usize, px: *const V8, pw: *const V8, steps: usize, acc: *mut V8) {
        match r {
            1 => tile::<1>(px, pw, steps, acc),
            2 => tile::<2>(px, pw, steps, acc),
            3 => tile::<3>(px, pw, steps, acc),
            4 => tile::<4>(px, pw, steps, acc),
            5 => tile::<5>(px, pw, steps, acc),
            _ => tile::<6>(px, pw, steps, acc),
        }
    }
}

/// `steps` chunks of `MR` packed activation rows against the widened block of 8 weight rows;
/// accumulator `acc[i * 8 + j]` (a `V8`) is lanes `8 * (j % 2)..` of register `(i, j / 2)`.
///
/// # Safety
/// AVX-512F; `px` holds `steps * MR` vectors, `pw` `steps * 8` and `acc` `MR * 8`, the last
/// two 64-byte aligned.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const MR: usize>(px: *const V8, pw: *const V8, steps: usize, acc: *mut V8) {
    let mut a = [[_mm512_setzero_ps(); NP]; MR];
    for i in 0..MR {
        for p in 0..NP {
            a[i][p] = _mm512_load_ps(acc.add(i * 2 * NP + 2 * p).cast());
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
    for i in 0..MR {
        for p in 0..NP {
            _mm512_store_ps(acc.add(i * 2 * NP + 2 * p).cast(), a[i][p]);
        }
    }
}
