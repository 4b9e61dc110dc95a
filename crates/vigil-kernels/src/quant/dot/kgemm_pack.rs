//! The repacked weight layout of the k-quant prefill GEMM kernels (`avx2_kgemm`: 8 weight
//! rows a group, `avx512_kgemm`: 16): one Q4_K, Q5_K or Q6_K super-block of `N` weight rows,
//! unpacked once per group so that the tile's inner loop is a load and a dot.
//!
//! Q4_K and Q5_K have two layouts (`K4Packed`): quants unpacked to bytes (`PackedK4B`), and
//! quants as stored (`PackedK4`), whose tile unpacks nibbles (and Q5_K's fifth bits) at every
//! load. Bytes cost twice the packed bytes and more packing work, repaid once a group serves
//! enough tiles: the AVX2 GEMM always takes them, the AVX-512 one from `Q4K_BYTES_MIN_ROWS` /
//! `Q5K_BYTES_MIN_ROWS` activation rows (`matmul`).
//!
//! Quants are interleaved 4 bytes per row: entry `[v][k]` (a `u32`) holds 4 consecutive quants
//! of weight row `k`, so one vector load gives the same 4 positions of every row, ready for a
//! `maddubs` / `vpdpbusd` against the activation's matching 4 bytes broadcast to every lane.
//! Scales and mins are i32 lanes `[sub-block][k]` holding i16 pairs, the operand of a `madd` /
//! `vpdpwssd` against 2 activation values (or pair sums): `dup(x)` puts `x` in both halves,
//! `pair(a, b)` puts `a` in the low one. The super-block's `d` (and `dmin`) are f32 lanes (f16
//! to f32 is exact, so converting here changes no result).
//!
//! Packing runs once per group and activation-row chunk (see `gemm_driver`), 8 weight rows at
//! a time in AVX2 registers: the quants are an 8 × 8 word transpose (then unpacked 8 rows a
//! vector), the scales a widening of each sub-block's 8 bytes. (Word by word in scalar code it
//! was 8–10 % of a Q4_K_M prefill.)

// Index loops mirror the block layouts.
#![allow(clippy::needless_range_loop)]

use super::avx2_k_decode::fifth_bit;
use super::avx2_q4k_decode::{scales_mins, shuffle, K4x8, SCALE_DUP};
use super::scales_mins_k4;
use crate::quant::blocks::{BlockQ4K, BlockQ5K, BlockQ6K};
use std::arch::x86_64::*;

/// The scales of one Q4_K or Q5_K super-block of `N` weight rows, the same in both layouts.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct K4Head<const N: usize> {
    pub(super) d: [f32; N],
    pub(super) dmin: [f32; N],
    /// `dup(scale)` of sub-block `j` (0..63).
    pub(super) sc: [[i32; N]; 8],
    /// `dup(min)` of sub-block `j` (0..63).
    pub(super) mins: [[i32; N]; 8],
}

/// One Q4_K (`QH` = 0) or Q5_K (`QH` = 8) super-block of `N` weight rows, its quants as
/// stored: the layout for a few activation rows, whose tile (one pass) unpacks them as it goes.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct PackedK4<const N: usize, const QH: usize> {
    pub(super) hd: K4Head<N>,
    /// `qs[c][h][k]`: bytes `32c + 4h..32c + 4h + 4` of row `k`'s `qs`: in their low nibbles
    /// the values `4h..4h + 4` of sub-block `2c`, in their high nibbles those of `2c + 1`.
    pub(super) qs: [[[u32; N]; 8]; 4],
    /// Q5_K: `qh[h][k]`, bytes `4h..4h + 4` of row `k`'s `qh`: bit `j` of each is the fifth bit
    /// of value `4h..4h + 4` of sub-block `j`.
    pub(super) qh: [[u32; N]; QH],
}

/// One Q4_K (`QH` = 0) or Q5_K (`QH` = 8) super-block of `N` weight rows, its quants unpacked
/// to bytes: the layout for many activation rows, whose tiles' inner loop is then a load and a
/// dot (unpacking there cost 2 vector ops a load for Q4_K, 5 for Q5_K, in every tile), at
/// twice the bytes to write once and read in every tile.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub struct PackedK4B<const N: usize, const QH: usize> {
    pub(super) hd: K4Head<N>,
    /// `q[8j + h][k]`: values `4h..4h + 4` of sub-block `j` of row `k` (0..15, Q5_K 0..31).
    pub(super) q: [[u32; N]; 64],
}

/// A packed Q4_K / Q5_K super-block of `N` weight rows in either layout, as the packing
/// writes it and the tiles read it.
pub trait K4Packed<const N: usize>: Copy {
    /// Q5_K (quants up to 31: the AVX2 tile's i16 sums fill sooner).
    const FIVE: bool;
    /// Quants as bytes (`PackedK4B`), not nibbles.
    const BYTES: bool;
    fn head(&self) -> &K4Head<N>;
    fn head_mut(&mut self) -> &mut K4Head<N>;
    /// The quant words: `PackedK4`'s `qs` or `PackedK4B`'s `q`, flattened.
    fn words(&self) -> *const u32;
    /// `PackedK4`'s `qh`, flattened (Q5_K).
    fn qh(&self) -> *const u32;
    /// Store the quants of weight rows `g..g + 8` (`x`: each one's block).
    ///
    /// # Safety
    /// AVX2 available; `g + 8 <= N`.
    unsafe fn store_rows<B: K4Block>(&mut self, g: usize, x: [&B; T]);
    /// Store the quants of an interleaved Q4_K or Q5_K group as weight rows `g..g + 8`.
    ///
    /// # Safety
    /// AVX2 available; `g + 8 <= N`.
    unsafe fn store_x8<X: K4x8>(&mut self, g: usize, x: &X);
}

impl<const N: usize, const QH: usize> K4Packed<N> for PackedK4<N, QH> {
    const FIVE: bool = QH > 0;
    const BYTES: bool = false;
    fn head(&self) -> &K4Head<N> {
        &self.hd
    }
    fn head_mut(&mut self) -> &mut K4Head<N> {
        &mut self.hd
    }
    fn words(&self) -> *const u32 {
        self.qs.as_ptr().cast()
    }
    fn qh(&self) -> *const u32 {
        self.qh.as_ptr().cast()
    }
    #[inline(always)]
    unsafe fn store_rows<B: K4Block>(&mut self, g: usize, x: [&B; T]) {
        let qs = self.qs.as_mut_ptr().cast::<i32>().add(g);
        for w0 in (0..32).step_by(T) {
            let v = std::array::from_fn(|t| load8(x[t].qs().as_ptr().add(4 * w0)));
            transpose_store(v, qs.add(w0 * N), N);
        }
        if QH > 0 {
            let v = std::array::from_fn(|t| load8(x[t].qh().as_ptr()));
            transpose_store(v, self.qh.as_mut_ptr().cast::<i32>().add(g), N);
        }
    }
    #[inline(always)]
    unsafe fn store_x8<X: K4x8>(&mut self, g: usize, x: &X) {
        let qs = self.qs.as_mut_ptr().cast::<i32>().add(g);
        for (v, words) in x.qs().iter().enumerate() {
            _mm256_storeu_si256(qs.add(v * N).cast(), load8(words.as_ptr()));
        }
        if QH > 0 {
            let qh = self.qh.as_mut_ptr().cast::<i32>().add(g);
            for (h, words) in x.qh().iter().enumerate() {
                _mm256_storeu_si256(qh.add(h * N).cast(), load8(words.as_ptr()));
            }
        }
    }
}

impl<const N: usize, const QH: usize> K4Packed<N> for PackedK4B<N, QH> {
    const FIVE: bool = QH > 0;
    const BYTES: bool = true;
    fn head(&self) -> &K4Head<N> {
        &self.hd
    }
    fn head_mut(&mut self) -> &mut K4Head<N> {
        &mut self.hd
    }
    fn words(&self) -> *const u32 {
        self.q.as_ptr().cast()
    }
    fn qh(&self) -> *const u32 {
        std::ptr::null()
    }
    #[inline(always)]
    unsafe fn store_rows<B: K4Block>(&mut self, g: usize, x: [&B; T]) {
        // Transposed first (`qh[h]`, `raw[h]`: word `h` of the 8 rows), so that each nibble
        // and fifth-bit step serves 8 rows.
        let qh = if QH > 0 {
            transpose(std::array::from_fn(|t| load8(x[t].qh().as_ptr())))
        } else {
            [_mm256_setzero_si256(); T]
        };
        let q = self.q.as_mut_ptr().cast::<i32>().add(g);
        for c in 0..4 {
            let raw = transpose(std::array::from_fn(|t| {
                load8(x[t].qs().as_ptr().add(32 * c))
            }));
            for h in 0..8 {
                for half in 0..2 {
                    let j = 2 * c + half;
                    let mut v = nibbles(raw[h], half);
                    if QH > 0 {
                        v = _mm256_or_si256(v, fifth_bit(qh[h], j));
                    }
                    _mm256_storeu_si256(q.add((8 * j + h) * N).cast(), v);
                }
            }
        }
    }
    #[inline(always)]
    unsafe fn store_x8<X: K4x8>(&mut self, g: usize, x: &X) {
        // Word `v = 8c + h` of the group holds sub-blocks `2c` and `2c + 1`.
        let qh: [__m256i; T] = if QH > 0 {
            std::array::from_fn(|h| load8(x.qh()[h].as_ptr()))
        } else {
            [_mm256_setzero_si256(); T]
        };
        let q = self.q.as_mut_ptr().cast::<i32>().add(g);
        for (v, words) in x.qs().iter().enumerate() {
            let (c, h) = (v / 8, v % 8);
            let raw = load8(words.as_ptr());
            for half in 0..2 {
                let j = 2 * c + half;
                let mut b = nibbles(raw, half);
                if QH > 0 {
                    b = _mm256_or_si256(b, fifth_bit(qh[h], j));
                }
                _mm256_storeu_si256(q.add((8 * j + h) * N).cast(), b);
            }
        }
    }
}

/// One Q4_K super-block of `N` weight rows, quants as stored.
pub type PackedQ4K<const N: usize> = PackedK4<N, 0>;
/// One Q5_K super-block of `N` weight rows, quants as stored.
pub type PackedQ5K<const N: usize> = PackedK4<N, 8>;
/// One Q4_K super-block of `N` weight rows, quants as bytes.
pub type PackedQ4KB<const N: usize> = PackedK4B<N, 0>;
/// One Q5_K super-block of `N` weight rows, quants as bytes.
pub type PackedQ5KB<const N: usize> = PackedK4B<N, 8>;

/// A Q4_K or Q5_K block as `pack_k4` reads it.
pub trait K4Block {
    /// Words of the fifth bits (`qh`): 0 for Q4_K, 8 for Q5_K.
    const QH: usize;
    fn d_dmin(&self) -> (u16, u16);
    fn scales(&self) -> &[u8; 12];
    fn qs(&self) -> &[u8; 128];
    /// Q5_K's `qh` (Q4_K: none).
    fn qh(&self) -> &[u8];
}

macro_rules! k4_block {
    ($block:ty, $qh:expr, |$x:ident| $qh_bytes:expr) => {
        impl K4Block for $block {
            const QH: usize = $qh;
            fn d_dmin(&self) -> (u16, u16) {
                (self.d.to_bits(), self.dmin.to_bits())
            }
            fn scales(&self) -> &[u8; 12] {
                &self.scales
            }
            fn qs(&self) -> &[u8; 128] {
                &self.qs
            }
            fn qh(&self) -> &[u8] {
                let $x = self;
                $qh_bytes
            }
        }
    };
}

k4_block!(BlockQ4K, 0, |_x| &[]);
k4_block!(BlockQ5K, 8, |x| &x.qh);

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

/// Weight rows packed together: one AVX2 vector holds a word (4 quants) of each.
pub const T: usize = 8;

/// The low nibble, and the low two bits, of each byte of a word.
const NIB: i32 = 0x0F0F_0F0F;
const TWO: i32 = 0x0303_0303;

/// The low (`half` = 0) or high nibble of each byte.
#[inline(always)]
unsafe fn nibbles(raw: __m256i, half: usize) -> __m256i {
    let nib = _mm256_set1_epi32(NIB);
    if half == 0 {
        _mm256_and_si256(raw, nib)
    } else {
        _mm256_and_si256(_mm256_srli_epi32::<4>(raw), nib)
    }
}

/// Weight row `k` of the group starting at `j0`; rows `>= r1` repeat row `r1 - 1` (their
/// outputs are dropped).
#[inline(always)]
fn row<W>(w: &[W], nb: usize, j0: usize, k: usize, r1: usize) -> &[W] {
    let j = (j0 + k).min(r1 - 1);
    &w[j * nb..(j + 1) * nb]
}

/// An 8 × 8 transpose of words: word `r` of result `t` is word `t` of `v[r]`.
#[inline(always)]
unsafe fn transpose(v: [__m256i; T]) -> [__m256i; T] {
    let lo32 = |a, b| _mm256_unpacklo_epi32(a, b);
    let hi32 = |a, b| _mm256_unpackhi_epi32(a, b);
    let t = [
        lo32(v[0], v[1]),
        hi32(v[0], v[1]),
        lo32(v[2], v[3]),
        hi32(v[2], v[3]),
        lo32(v[4], v[5]),
        hi32(v[4], v[5]),
        lo32(v[6], v[7]),
        hi32(v[6], v[7]),
    ];
    // `u[w]` (w < 4): word `w` of rows 0..4 in its low half, word `w + 4` in its high half;
    // `u[w + 4]` the same of rows 4..8.
    let u = [
        _mm256_unpacklo_epi64(t[0], t[2]),
        _mm256_unpackhi_epi64(t[0], t[2]),
        _mm256_unpacklo_epi64(t[1], t[3]),
        _mm256_unpackhi_epi64(t[1], t[3]),
        _mm256_unpacklo_epi64(t[4], t[6]),
        _mm256_unpackhi_epi64(t[4], t[6]),
        _mm256_unpacklo_epi64(t[5], t[7]),
        _mm256_unpackhi_epi64(t[5], t[7]),
    ];
    std::array::from_fn(|w| {
        if w < 4 {
            _mm256_permute2x128_si256::<0x20>(u[w], u[w + 4])
        } else {
            _mm256_permute2x128_si256::<0x31>(u[w - 4], u[w])
        }
    })
}

/// Write word `t` of every `v[r]` to `dst[t * stride + r]`.
#[inline(always)]
unsafe fn transpose_store(v: [__m256i; T], dst: *mut i32, stride: usize) {
    for (t, w) in transpose(v).into_iter().enumerate() {
        _mm256_storeu_si256(dst.add(t * stride).cast(), w);
    }
}

/// 8 words at `p` (unaligned).
#[inline(always)]
unsafe fn load8(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

/// 8 f16 (as bits) to f32, stored at `dst` (exact).
#[inline(always)]
unsafe fn halves_to_f32(bits: [u16; T], dst: *mut f32) {
    _mm256_storeu_ps(dst, _mm256_cvtph_ps(_mm_loadu_si128(bits.as_ptr().cast())));
}

/// `pair(lo[r], hi[r])` for 8 i32 lanes holding i16 values.
#[inline(always)]
unsafe fn pairs(lo: __m256i, hi: __m256i) -> __m256i {
    _mm256_or_si256(
        _mm256_and_si256(lo, _mm256_set1_epi32(0xFFFF)),
        _mm256_slli_epi32::<16>(hi),
    )
}

/// Each of 8 unsigned bytes as an i32 lane.
#[inline(always)]
unsafe fn widen_u8(b: &[u8; T]) -> __m256i {
    _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.as_ptr().cast()))
}

/// Each of 8 signed bytes as an i32 lane.
#[inline(always)]
unsafe fn widen_i8(b: &[i8; T]) -> __m256i {
    _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.as_ptr().cast()))
}

#[inline(always)]
unsafe fn store(dst: &mut [i32], v: __m256i) {
    debug_assert!(dst.len() >= T);
    _mm256_storeu_si256(dst.as_mut_ptr().cast(), v)
}

/// Repack Q4_K or Q5_K weight rows `j0..j0 + N` (rows `>= r1` repeat row `r1 - 1`) into
/// `out[..nb]`, in `P`'s layout.
///
/// # Safety
/// AVX2 and F16C available.
///
/// # Panics
/// If `w` holds fewer than `r1 * nb` blocks, `j0 >= r1` or `out` holds fewer than `nb`.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn pack_k4<B: K4Block, P: K4Packed<N>, const N: usize>(
    w: &[B],
    nb: usize,
    j0: usize,
    r1: usize,
    out: &mut [P],
) {
    const { assert!(N.is_multiple_of(T) && P::FIVE == (B::QH > 0)) };
    for g in (0..N).step_by(T) {
        let rows: [&[B]; T] = std::array::from_fn(|t| row(w, nb, j0, g + t, r1));
        for (b, p) in out[..nb].iter_mut().enumerate() {
            let x: [&B; T] = std::array::from_fn(|t| &rows[t][b]);
            let hd = p.head_mut();
            halves_to_f32(x.map(|x| x.d_dmin().0), hd.d[g..g + T].as_mut_ptr());
            halves_to_f32(x.map(|x| x.d_dmin().1), hd.dmin[g..g + T].as_mut_ptr());
            let (mut sc, mut mn) = ([[0u8; T]; 8], [[0u8; T]; 8]);
            for t in 0..T {
                let (s, m) = scales_mins_k4(x[t].scales());
                for j in 0..8 {
                    (sc[j][t], mn[j][t]) = (s[j], m[j]);
                }
            }
            for j in 0..8 {
                let (s, m) = (widen_u8(&sc[j]), widen_u8(&mn[j]));
                store(&mut hd.sc[j][g..], pairs(s, s));
                store(&mut hd.mins[j][g..], pairs(m, m));
            }
            p.store_rows(g, x);
        }
    }
}

/// `pack_k4` from a Q4_K or Q5_K matrix interleaved at load (`w`: its groups of 8 rows, `nb`
/// blocks each): the quants are already in `PackedK4`'s order (a copy), the scales unpack 8
/// rows at a time (`avx2_q4k_decode::scales_mins`). Groups past row `r1 - 1`'s repeat it.
///
/// # Safety
/// AVX2 and F16C available.
///
/// # Panics
/// If `w` holds fewer groups than row `r1 - 1`'s, `j0 >= r1` or `out` holds fewer than `nb`.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn pack_k4_x8<X: K4x8, P: K4Packed<N>, const N: usize>(
    w: &[X],
    nb: usize,
    j0: usize,
    r1: usize,
    out: &mut [P],
) {
    const { assert!(N.is_multiple_of(T) && P::FIVE == X::FIVE) };
    for g in (0..N).step_by(T) {
        let group = (j0 + g).min(r1 - 1) / T;
        let src = &w[group * nb..(group + 1) * nb];
        for (x, p) in src.iter().zip(&mut out[..nb]) {
            let hd = p.head_mut();
            halves_to_f32(x.d().map(|d| d.to_bits()), hd.d[g..g + T].as_mut_ptr());
            halves_to_f32(
                x.dmin().map(|d| d.to_bits()),
                hd.dmin[g..g + T].as_mut_ptr(),
            );
            let sm = scales_mins(x.scales());
            for j in 0..8 {
                store(&mut hd.sc[j][g..], shuffle(sm[j / 4], &SCALE_DUP[j % 4]));
                store(
                    &mut hd.mins[j][g..],
                    shuffle(sm[2 + j / 4], &SCALE_DUP[j % 4]),
                );
            }
            p.store_x8(g, x);
        }
    }
}

/// Repack Q6_K weight rows `j0..j0 + N` (rows `>= r1` repeat row `r1 - 1`) into `out[..nb]`.
///
/// # Safety
/// AVX2 and F16C available.
///
/// # Panics
/// If `w` holds fewer than `r1 * nb` blocks, `j0 >= r1` or `out` holds fewer than `nb`.
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn pack_q6k<const N: usize>(
    w: &[BlockQ6K],
    nb: usize,
    j0: usize,
    r1: usize,
    out: &mut [PackedQ6K<N>],
) {
    const { assert!(N.is_multiple_of(T)) };
    let (nib, two) = (_mm256_set1_epi32(NIB), _mm256_set1_epi32(TWO));
    for g in (0..N).step_by(T) {
        let rows: [&[BlockQ6K]; T] = std::array::from_fn(|t| row(w, nb, j0, g + t, r1));
        for (b, p) in out[..nb].iter_mut().enumerate() {
            let x: [&BlockQ6K; T] = std::array::from_fn(|t| &rows[t][b]);
            halves_to_f32(x.map(|x| x.d.to_bits()), p.d[g..g + T].as_mut_ptr());
            let mut sc = [[0i8; T]; 16];
            for t in 0..T {
                for s in 0..16 {
                    sc[s][t] = x[t].scales[s];
                }
            }
            for s in 0..16 {
                let v = widen_i8(&sc[s]);
                store(&mut p.sc[s][g..], pairs(v, v));
            }
            for t in 0..8 {
                store(
                    &mut p.scp[t][g..],
                    pairs(widen_i8(&sc[2 * t]), widen_i8(&sc[2 * t + 1])),
                );
            }
            // `scalar::q6k_values` + 32, 4 values a word: for half `n`, the low nibbles from
            // `ql`, two bits each from `qh`, for values `l`, `l + 32`, `l + 64`, `l + 96`
            // (words `32n + l / 4` + 0, 8, 16, 24).
            let q = p.q.as_mut_ptr().cast::<i32>().add(g);
            for n in 0..2 {
                for part in 0..4 {
                    let v = std::array::from_fn(|t| {
                        let ql = load8(x[t].ql.as_ptr().add(64 * n + 32 * (part % 2)));
                        let qh = load8(x[t].qh.as_ptr().add(32 * n));
                        let (ql, qh) = match part {
                            0 => (ql, qh),
                            1 => (ql, _mm256_srli_epi32::<2>(qh)),
                            2 => (_mm256_srli_epi32::<4>(ql), _mm256_srli_epi32::<4>(qh)),
                            _ => (_mm256_srli_epi32::<4>(ql), _mm256_srli_epi32::<6>(qh)),
                        };
                        _mm256_or_si256(
                            _mm256_and_si256(ql, nib),
                            _mm256_slli_epi32::<4>(_mm256_and_si256(qh, two)),
                        )
                    });
                    transpose_store(v, q.add((32 * n + 8 * part) * N), N);
                }
            }
        }
    }
}
