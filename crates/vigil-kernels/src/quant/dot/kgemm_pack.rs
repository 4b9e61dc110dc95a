//! The repacked weight layout of the k-quant prefill GEMM kernels (`avx2_kgemm`: 8 weight
//! rows a group, `avx512_kgemm`: 16): one Q4_K or Q6_K super-block of `N` weight rows,
//! unpacked once per group so that the tile's inner loop is a load and a dot.
//!
//! Quants are interleaved 4 bytes per row: entry `[v][k]` (a `u32`) holds 4 consecutive quants
//! of weight row `k`, so one vector load gives the same 4 positions of every row, ready for a
//! `maddubs` / `vpdpbusd` against the activation's matching 4 bytes broadcast to every lane.
//! Scales and mins are i32 lanes `[sub-block][k]` holding i16 pairs, the operand of a `madd` /
//! `vpdpwssd` against 2 activation values (or pair sums): `dup(x)` puts `x` in both halves,
//! `pair(a, b)` puts `a` in the low one. The super-block's `d` (and `dmin`) are f32 lanes (f16
//! to f32 is exact, so converting here changes no result).
//!
//! Packing is plain scalar code: it runs once per group and activation-row chunk (see
//! `gemm_driver`) and is a few percent of a tile's work.

// Index loops mirror the block layouts.
#![allow(clippy::needless_range_loop)]

use super::scales_mins_k4;
use crate::quant::blocks::{BlockQ4K, BlockQ6K};

/// One Q4_K super-block of `N` weight rows.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct PackedQ4K<const N: usize> {
    pub(super) d: [f32; N],
    pub(super) dmin: [f32; N],
    /// `dup(scale)` of sub-block `j` (0..63).
    pub(super) sc: [[i32; N]; 8],
    /// `dup(min)` of sub-block `j` (0..63).
    pub(super) mins: [[i32; N]; 8],
    /// `qs[c][h][k]`: bytes `32c + 4h..32c + 4h + 4` of row `k`'s `qs`: in their low nibbles
    /// the values `4h..4h + 4` of sub-block `2c`, in their high nibbles those of `2c + 1`.
    pub(super) qs: [[[u32; N]; 8]; 4],
}

/// One Q6_K super-block of `N` weight rows.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct PackedQ6K<const N: usize> {
    pub(super) d: [f32; N],
    /// `dup(scale)` of sub-block `s` (16 values, signed).
    pub(super) sc: [[i32; N]; 16],
    /// `pair(scale[2t], scale[2t + 1])`, against the activation's `bsums[2t..2t + 2]`.
    pub(super) scp: [[i32; N]; 8],
    /// `q[v][k]`: values `4v..4v + 4` of row `k` as unsigned quants `q + 32` (0..63).
    pub(super) q: [[u32; N]; 64],
}

/// Two i16 in one i32 lane: `lo` in bits 0..16, `hi` in 16..32.
#[inline(always)]
fn pair(lo: i16, hi: i16) -> i32 {
    (lo as u16 as u32 | (hi as u16 as u32) << 16) as i32
}

#[inline(always)]
fn dup(x: i16) -> i32 {
    pair(x, x)
}

/// Bytes `at..at + 4` of `b` as a little-endian word (4 quants).
#[inline(always)]
fn word(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The low nibble, and the low two bits, of each byte of a word.
const NIB: u32 = 0x0F0F_0F0F;
const TWO: u32 = 0x0303_0303;

/// Weight row `k` of the group starting at `j0`; rows `>= r1` repeat row `r1 - 1` (their
/// outputs are dropped).
#[inline(always)]
fn row<W>(w: &[W], nb: usize, j0: usize, k: usize, r1: usize) -> &[W] {
    let j = (j0 + k).min(r1 - 1);
    &w[j * nb..(j + 1) * nb]
}

/// Repack Q4_K weight rows `j0..j0 + N` (rows `>= r1` repeat row `r1 - 1`) into `out[..nb]`.
///
/// # Panics
/// If `w` holds fewer than `r1 * nb` blocks or `j0 >= r1`.
pub fn pack_q4k<const N: usize>(
    w: &[BlockQ4K],
    nb: usize,
    j0: usize,
    r1: usize,
    out: &mut [PackedQ4K<N>],
) {
    for k in 0..N {
        for (x, p) in row(w, nb, j0, k, r1).iter().zip(&mut out[..nb]) {
            p.d[k] = x.d.to_f32();
            p.dmin[k] = x.dmin.to_f32();
            let (sc, mn) = scales_mins_k4(&x.scales);
            for j in 0..8 {
                p.sc[j][k] = dup(sc[j] as i16);
                p.mins[j][k] = dup(mn[j] as i16);
            }
            for c in 0..4 {
                for h in 0..8 {
                    p.qs[c][h][k] = word(&x.qs, 32 * c + 4 * h);
                }
            }
        }
    }
}

/// Repack Q6_K weight rows `j0..j0 + N` (rows `>= r1` repeat row `r1 - 1`) into `out[..nb]`.
///
/// # Panics
/// If `w` holds fewer than `r1 * nb` blocks or `j0 >= r1`.
pub fn pack_q6k<const N: usize>(
    w: &[BlockQ6K],
    nb: usize,
    j0: usize,
    r1: usize,
    out: &mut [PackedQ6K<N>],
) {
    for k in 0..N {
        for (x, p) in row(w, nb, j0, k, r1).iter().zip(&mut out[..nb]) {
            p.d[k] = x.d.to_f32();
            for s in 0..16 {
                p.sc[s][k] = dup(x.scales[s] as i16);
            }
            for t in 0..8 {
                p.scp[t][k] = pair(x.scales[2 * t] as i16, x.scales[2 * t + 1] as i16);
            }
            // `scalar::q6k_values` + 32, 4 values a word: the low nibbles from `ql`, two
            // bits each from `qh`, for values `l`, `l + 32`, `l + 64`, `l + 96` of each half.
            for n in 0..2 {
                for l in (0..32).step_by(4) {
                    let (lo, hi) = (word(&x.ql, 64 * n + l), word(&x.ql, 64 * n + 32 + l));
                    let qh = word(&x.qh, 32 * n + l);
                    let v = (128 * n + l) / 4;
                    p.q[v][k] = (lo & NIB) | ((qh & TWO) << 4);
                    p.q[v + 8][k] = (hi & NIB) | (((qh >> 2) & TWO) << 4);
                    p.q[v + 16][k] = ((lo >> 4) & NIB) | (((qh >> 4) & TWO) << 4);
                    p.q[v + 24][k] = ((hi >> 4) & NIB) | (((qh >> 6) & TWO) << 4);
                }
            }
        }
    }
}
