//! The decode tile for Q4_K and Q5_K matrices interleaved at load (`BlockQ4Kx8`,
//! `BlockQ5Kx8`): one activation row × 8 weight rows, one i32 lane per row from the first
//! multiply to the fold.
//!
//! `avx2_k_decode` reads Q4_K rows as the checkpoint stores them: each row's block is
//! unpacked on its own (its 12 scale bytes, its nibbles into 8 chunks of one row) and its
//! lanes are summed into one per row at the end. Interleaved, one 256-bit load holds a dword
//! of all 8 rows, so a block of 8 rows is: the 8 rows' scales and mins unpacked together
//! (ggml's `kmask` steps, on 32-bit lanes: 3 loads), 32 loads of quants split into nibbles,
//! 64 dot steps against the activation's dwords broadcast from memory, one scale step per
//! sub-block, and no horizontal sum. Q5_K ors each value's fifth bit in from its 8 `qh`
//! dwords (3 vector ops a load and sub-block).
//!
//! The scale step: with VNNI, a sub-block's 8 `vpdpbusd` leave its exact sum `s` per row
//! (|s| <= 32 · 31 · 128 < 2^23); a `vpshufb` makes each lane the i16 pair `(s & 0xFF,
//! s >> 8)` and one `vpdpwssd` against `(sc, 256 · sc)` adds `s · sc`. AVX2 sums the 8
//! `maddubs` in i16 (at most 16 · 15 · 128 = 30720; Q5_K's 5-bit values 4 at a time, at most
//! 8 · 31 · 128 = 31744) and one `madd` against `(sc, sc)` adds `s · sc`. Either is the exact integer the scalar path computes, and the fold is
//! `super::acc_k` per lane with no fused multiply-add, so every output has its bits.

// Index loops mirror the block layout.
#![allow(clippy::needless_range_loop)]

use super::avx2::{prefetch_sweep, IntDot};
use super::avx2_k_decode::fifth_bit;
use super::avx2_kgemm::bcast4;
use super::avx2_q4_decode::GroupTiles;
use super::Acts32;
use crate::quant::blocks::{BlockQ4Kx8, BlockQ5Kx8, BlockQ8K};
use half::f16;
use std::arch::x86_64::*;
use std::marker::PhantomData;

/// An interleaved Q4_K or Q5_K block of 8 rows, as this tile and the GEMM's packing
/// (`kgemm_pack`) read it.
pub trait K4x8 {
    /// Q5_K: a fifth bit per value in `qh`.
    const FIVE: bool;
    fn d(&self) -> &[f16; 8];
    fn dmin(&self) -> &[f16; 8];
    fn scales(&self) -> &[[u8; 32]; 3];
    fn qs(&self) -> &[[u8; 32]; 32];
    /// Q5_K's `qh` (Q4_K: none).
    fn qh(&self) -> &[[u8; 32]];
}

macro_rules! k4x8 {
    ($x8:ty, $five:expr, |$x:ident| $qh:expr) => {
        impl K4x8 for $x8 {
            const FIVE: bool = $five;
            fn d(&self) -> &[f16; 8] {
                &self.d
            }
            fn dmin(&self) -> &[f16; 8] {
                &self.dmin
            }
            fn scales(&self) -> &[[u8; 32]; 3] {
                &self.scales
            }
            fn qs(&self) -> &[[u8; 32]; 32] {
                &self.qs
            }
            fn qh(&self) -> &[[u8; 32]] {
                let $x = self;
                $qh
            }
        }
    };
}

k4x8!(BlockQ4Kx8, false, |_x| &[]);
k4x8!(BlockQ5Kx8, true, |x| &x.qh);

/// Interleaved Q4_K or Q5_K (`B`), as `avx2_q4_decode::rows_x8_with` drives its tiles.
pub struct KX8<B>(PhantomData<B>);
/// Interleaved Q4_K.
pub type Q4KX8 = KX8<BlockQ4Kx8>;
/// Interleaved Q5_K.
pub type Q5KX8 = KX8<BlockQ5Kx8>;

/// A `vpshufb` index that builds each dword from bytes of the same dword: byte `src[i]`
/// (0..4) into byte `i`, or zero where `src[i]` is negative.
const fn dword_bytes(src: [i8; 4]) -> [i8; 32] {
    let mut t = [0i8; 32];
    let mut i = 0;
    while i < 32 {
        let (d, b) = (i / 4 % 4, i % 4);
        t[i] = if src[b] < 0 {
            -128
        } else {
            4 * d as i8 + src[b]
        };
        i += 1;
    }
    t
}

/// `dup(sc)` (the i16 pair `(sc, sc)`) of the scale in byte `b` of each dword.
pub(super) const SCALE_DUP: [[i8; 32]; 4] = [
    dword_bytes([0, -1, 0, -1]),
    dword_bytes([1, -1, 1, -1]),
    dword_bytes([2, -1, 2, -1]),
    dword_bytes([3, -1, 3, -1]),
];

/// `(sc, 256 · sc)` of the scale in byte `b` of each dword.
const SCALE_SPLIT: [[i8; 32]; 4] = [
    dword_bytes([0, -1, -1, 0]),
    dword_bytes([1, -1, -1, 1]),
    dword_bytes([2, -1, -1, 2]),
    dword_bytes([3, -1, -1, 3]),
];

/// The i16 pair `(min_2p, min_2p+1)` of bytes `2p`, `2p + 1` of each dword.
const MIN_PAIR: [[i8; 32]; 2] = [dword_bytes([0, -1, 1, -1]), dword_bytes([2, -1, 3, -1])];

/// `(s & 0xFF, s >> 8)` of each i32 `s` with |s| < 2^23.
const SUM_SPLIT: [i8; 32] = dword_bytes([0, -1, 1, 2]);

#[inline(always)]
pub(super) unsafe fn shuffle(v: __m256i, index: &[i8; 32]) -> __m256i {
    _mm256_shuffle_epi8(v, _mm256_loadu_si256(index.as_ptr().cast()))
}

/// The 8 rows' scales and mins of a block whose packed scales are `scales`, one dword a row:
/// byte `j % 4` of lane `k` of `[scales 0..4, scales 4..8, mins 0..4, mins 4..8][j / 4 (+ 2)]`
/// is row `k`'s scale (min) `j` (`super::scales_mins_k4`).
#[inline(always)]
pub(super) unsafe fn scales_mins(scales: &[[u8; 32]; 3]) -> [__m256i; 4] {
    let word = |i: usize| _mm256_loadu_si256(scales[i].as_ptr().cast());
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let low6 = _mm256_set1_epi32(0x3f3f_3f3f);
    let nib = _mm256_set1_epi32(0x0f0f_0f0f);
    let two = _mm256_set1_epi32(0x0303_0303);
    // Scales and mins 4..8 take their top 2 bits from the top of bytes 0..4 (scales) or 4..8.
    let tops = |v| _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(v), two));
    [
        _mm256_and_si256(w0, low6),
        _mm256_or_si256(_mm256_and_si256(w2, nib), tops(w0)),
        _mm256_and_si256(w1, low6),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(w2), nib), tops(w1)),
    ]
}

/// Block `x` of 8 rows against activation block `y` (`pairs`: its 16-value sums added in
/// pairs, two i16 a dword): per row lane, the scale-weighted dot and the min-weighted sum.
#[inline(always)]
unsafe fn block<D: IntDot, B: K4x8>(x: &B, y: &BlockQ8K, pairs: &[i32; 4]) -> (__m256i, __m256i) {
    let sm = scales_mins(x.scales());
    let low = _mm256_set1_epi8(0x0F);
    let scale_dup = |j: usize| shuffle(sm[j / 4], &SCALE_DUP[j % 4]);
    let mut sumi = [_mm256_setzero_si256(); 2];
    for c in 0..4 {
        // Bytes 32c..32c + 32 of each row: sub-block 2c in the low nibbles, 2c + 1 in the
        // high ones, values 4h..4h + 4 in dword h.
        let ys = [y.qs.as_ptr().add(64 * c), y.qs.as_ptr().add(64 * c + 32)];
        let mut s = [_mm256_setzero_si256(); 2];
        for h in 0..8 {
            let raw = _mm256_loadu_si256(x.qs()[8 * c + h].as_ptr().cast());
            let mut q = [
                _mm256_and_si256(raw, low),
                _mm256_and_si256(_mm256_srli_epi16::<4>(raw), low),
            ];
            if B::FIVE {
                let qh = _mm256_loadu_si256(x.qh()[h].as_ptr().cast());
                for half in 0..2 {
                    q[half] = _mm256_or_si256(q[half], fifth_bit(qh, 2 * c + half));
                }
            }
            for half in 0..2 {
                let yv = bcast4(ys[half].add(4 * h));
                s[half] = if D::VNNI {
                    D::dot4_acc(s[half], q[half], yv)
                } else {
                    _mm256_add_epi16(s[half], _mm256_maddubs_epi16(q[half], yv))
                };
            }
            // Q5_K's 5-bit values fill AVX2's i16 sums in 4 steps.
            if B::FIVE && !D::VNNI && h == 3 {
                for half in 0..2 {
                    sumi[half] = D::madd_acc(sumi[half], s[half], scale_dup(2 * c + half));
                    s[half] = _mm256_setzero_si256();
                }
            }
        }
        for half in 0..2 {
            let j = 2 * c + half;
            sumi[half] = if D::VNNI {
                let sc = shuffle(sm[j / 4], &SCALE_SPLIT[j % 4]);
                D::madd_acc_whole(sumi[half], shuffle(s[half], &SUM_SPLIT), sc)
            } else {
                D::madd_acc(sumi[half], s[half], scale_dup(j))
            };
        }
    }
    let mut summ = _mm256_setzero_si256();
    for p in 0..4 {
        let mins = shuffle(sm[2 + p / 2], &MIN_PAIR[p % 2]);
        summ = D::madd_acc_whole(summ, mins, _mm256_set1_epi32(pairs[p]));
    }
    (_mm256_add_epi32(sumi[0], sumi[1]), summ)
}

impl<B: K4x8> GroupTiles for KX8<B> {
    type X8 = B;
    type A = BlockQ8K;
    #[inline(always)]
    unsafe fn tiles<D: IntDot, const G: usize>(
        g: *const B,
        acts: &Acts32<BlockQ8K>,
        i: usize,
        prefetch: isize,
    ) -> [__m256; G] {
        let nb = acts.nb;
        let a = acts.blocks.as_ptr().add(i * nb);
        let step = std::mem::size_of::<B>();
        // `prefetch` on into L1 and as far again into L2: from DRAM, 1 GiB of Qwen3-shaped
        // matrices (`gemv_bandwidth q4_kx8 2 1024 5`) read at 83 % of a plain read so, at
        // 73-77 % with the L1 sweep alone, at 61-63 % with none.
        let near = g.cast::<i8>().wrapping_offset(prefetch);
        let far = near.wrapping_offset(prefetch);
        let mut acc = [_mm256_setzero_ps(); G];
        for b in 0..nb {
            if prefetch != 0 {
                for j in 0..G {
                    prefetch_sweep::<_MM_HINT_T0>(near.wrapping_add(j * nb * step), b, step);
                    prefetch_sweep::<_MM_HINT_T1>(far.wrapping_add(j * nb * step), b, step);
                }
            }
            let y = &*a.add(b);
            let s = y.bsums.as_ptr().cast::<__m128i>();
            let mut pairs = [0i32; 4];
            _mm_storeu_si128(
                pairs.as_mut_ptr().cast(),
                _mm_hadd_epi16(_mm_loadu_si128(s), _mm_loadu_si128(s.add(1))),
            );
            let dy = _mm256_set1_ps(y.d);
            for (j, acc) in acc.iter_mut().enumerate() {
                let x = &*g.add(j * nb + b);
                let (sumi, summ) = block::<D, B>(x, y, &pairs);
                // super::acc_k per lane.
                let dx = _mm256_cvtph_ps(_mm_loadu_si128(x.d().as_ptr().cast()));
                let dm = _mm256_cvtph_ps(_mm_loadu_si128(x.dmin().as_ptr().cast()));
                let a = _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(sumi));
                let m = _mm256_mul_ps(_mm256_mul_ps(dm, dy), _mm256_cvtepi32_ps(summ));
                *acc = _mm256_add_ps(*acc, _mm256_sub_ps(a, m));
            }
        }
        acc
    }
}
