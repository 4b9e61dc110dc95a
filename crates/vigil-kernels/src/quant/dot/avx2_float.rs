//! AVX2 tiles for float weights (F32, F16 via F16C, BF16 by shifting) × f32 activations.
//!
//! Per (activation row, weight row) pair: one 8-lane FMA accumulator over the chunks of 8 in
//! order, the lanes summed by `hsum8`'s fixed tree, then the `cols % 8` tail added in order.
//! Every tile shape runs exactly that sequence per pair, so results do not depend on batching.
//! BF16 packed into 12 bits a value (`quant::packed_bf16`) gives the same bits: its decode tile
//! unpacks each pair of steps in registers (`unpack_pair`, `gemv_packed`); several activation
//! rows run these tiles on groups unpacked into a buffer (`unpack_group`).

// Index loops mirror the block layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use crate::quant::packed_bf16::{patch, Exception, PackedBf16, PAIR_BYTES, PAIR_COLS};
use std::arch::x86_64::*;

const ROW_CHUNK: usize = 64;

/// A float weight element format.
pub trait FloatW {
    const BYTES: usize;
    /// BF16: an interleaved group's decode takes `tile_bf16_x8`, two rows a load.
    const BF16: bool = false;
    /// 8 weights starting at `p`, as f32.
    ///
    /// # Safety
    /// AVX2+F16C; `p` addresses `8 * BYTES` readable bytes.
    unsafe fn load8(p: *const u8) -> __m256;
    /// One weight at `p`.
    ///
    /// # Safety
    /// `p` addresses `BYTES` readable bytes.
    unsafe fn load1(p: *const u8) -> f32;
}

pub struct F32;
pub struct F16;
pub struct BF16;

impl FloatW for F32 {
    const BYTES: usize = 4;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_loadu_ps(p.cast())
    }
    #[inline]
    unsafe fn load1(p: *const u8) -> f32 {
        f32::from_bits(u32::from_le_bytes(p.cast::<[u8; 4]>().read()))
    }
}

impl FloatW for F16 {
    const BYTES: usize = 2;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    #[inline]
    unsafe fn load1(p: *const u8) -> f32 {
        half::f16::from_le_bytes(p.cast::<[u8; 2]>().read()).to_f32()
    }
}

impl FloatW for BF16 {
    const BYTES: usize = 2;
    const BF16: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const u8) -> __m256 {
        let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
    }
    #[inline]
    unsafe fn load1(p: *const u8) -> f32 {
        half::bf16::from_le_bytes(p.cast::<[u8; 2]>().read()).to_f32()
    }
}

/// The fixed lane-summing tree every float pair ends with.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// A float matrix's bytes as the kernels address them: rows one after another, or interleaved
/// 8 rows at a time (`quant::interleave`: chunk `s` of row `8g + k` at
/// `((g * cols / 8 + s) * 8 + k) * 8` values, `cols` a multiple of 8, the last group padded).
#[derive(Clone, Copy)]
pub struct FloatRows<'a> {
    pub w: &'a [u8],
    pub cols: usize,
    pub x8: bool,
}

impl FloatRows<'_> {
    /// Where row `j`'s first chunk of 8 values starts.
    #[inline]
    pub fn row<W: FloatW>(&self, j: usize) -> *const u8 {
        let at = if self.x8 {
            (j / 8 * 8 * self.cols + j % 8 * 8) * W::BYTES
        } else {
            j * self.cols * W::BYTES
        };
        self.w[at..].as_ptr()
    }

    /// Bytes from one chunk of 8 values of a row to its next.
    #[inline]
    pub fn stride<W: FloatW>(&self) -> usize {
        8 * W::BYTES * if self.x8 { 8 } else { 1 }
    }
}

/// How far ahead an interleaved group's decode tile fetches its run: on the Xeon measured, 2 KiB
/// read fastest (farther, the lines start to leave L1 before use; a whole group ahead, as the
/// rows layout fetches, was the slowest).
const X8_PREFETCH: usize = 2048;

/// How far ahead the interleaved float decode tiles (this one and `avx512_float`'s) also ask
/// for their run into L2 (`_MM_HINT_T1`). On the Xeon (`gemv_bandwidth bf16x8`), held to AVX2:
/// 26.1-27.0 GB/s (81-84 % of a plain read) without it, 31.5-32.3 (98-103 %) with it; AVX-512:
/// 30.4-31.1 (87-91 %) without, 32.6-33.7 (96-99 %) with. 6-16 KiB were alike; the plain read
/// itself gains nothing from it.
pub(super) const X8_PREFETCH_L2: usize = 8192;

/// The 8 pairs `(i = k % MR, j = k / MR)` of one tile. `stride`: bytes from one chunk of 8 of
/// a row to its next (`FloatRows::stride`); the `cols % 8` tail exists only for rows, whose
/// chunks are `8 * BYTES` apart. `prefetch` (0: none): as rows, the line that far past each
/// row's current one; interleaved (`X8`), the group's run that far past its current chunk.
///
/// # Safety
/// AVX2+FMA+F16C; every pointer addresses its row's `cols` elements at that stride.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<W: FloatW, const MR: usize, const NR: usize, const X8: bool>(
    w: &[*const u8; NR],
    x: &[*const f32; MR],
    cols: usize,
    stride: usize,
    prefetch: isize,
) -> [f32; 8] {
    let mut acc = [_mm256_setzero_ps(); 8];
    let n8 = cols / 8 * 8;
    for k in (0..n8).step_by(8) {
        let at = k / 8 * stride;
        if prefetch != 0 && X8 {
            // The group's 8 chunks are one run of `stride` bytes: fetch the lines ahead of it.
            for l in (0..stride).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(w[0].add(at + l).wrapping_offset(prefetch).cast());
            }
        } else if prefetch != 0 && (k * W::BYTES) % 64 == 0 {
            // The same line of the next tile's rows, so DRAM streams ahead of use.
            for j in 0..NR {
                let ahead = w[j].add(at).wrapping_offset(prefetch);
                _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
            }
        }
        let mut xv = [_mm256_setzero_ps(); MR];
        for i in 0..MR {
            xv[i] = _mm256_loadu_ps(x[i].add(k));
        }
        for j in 0..NR {
            let wv = W::load8(w[j].add(at));
            for i in 0..MR {
                acc[j * MR + i] = _mm256_fmadd_ps(wv, xv[i], acc[j * MR + i]);
            }
        }
    }
    let mut r = [0f32; 8];
    for (p, rp) in r.iter_mut().enumerate() {
        let (i, j) = (p % MR, p / MR);
        let mut s = hsum8(acc[p]);
        for k in n8..cols {
            s += W::load1(w[j].add(k * W::BYTES)) * *x[i].add(k);
        }
        *rp = s;
    }
    r
}

/// The decode tile (1 activation row × 8 weight rows) on an interleaved BF16 group, the same
/// sums as `tile::<BF16, 1, 8, true>` bit for bit in fewer instructions: one 256-bit load holds
/// two rows' chunks of 8, and unpacking it with zeros widens columns 0-3 of both rows into one
/// vector and columns 4-7 into another (a BF16 value is the top half of its f32). The
/// accumulators are laid out to match: `lo[p]` holds rows `2p`, `2p + 1` at columns 0-3,
/// `hi[p]` at columns 4-7, against the activations' columns 0-3 (4-7) in both halves. Every
/// lane still adds one (row, column mod 8) product a step, in column order, so each row's 8
/// lanes, put back together, are the plain tile's accumulator.
///
/// # Safety
/// AVX2+FMA; `g` addresses the group's `8 * cols` values, `x` `cols` floats, `cols % 8 == 0`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_bf16_x8(g: *const u8, x: *const f32, cols: usize) -> [f32; 8] {
    let zero = _mm256_setzero_si256();
    let mut lo = [_mm256_setzero_ps(); 4];
    let mut hi = [_mm256_setzero_ps(); 4];
    for s in 0..cols / 8 {
        // 8 rows × 8 values × 2 bytes: two lines a step.
        let at = g.add(s * 128);
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(X8_PREFETCH).cast());
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(X8_PREFETCH + 64).cast());
        _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(X8_PREFETCH_L2).cast());
        _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(X8_PREFETCH_L2 + 64).cast());
        let xv = _mm256_loadu_si256(x.add(8 * s).cast());
        let xlo = _mm256_castsi256_ps(_mm256_permute4x64_epi64::<0x44>(xv));
        let xhi = _mm256_castsi256_ps(_mm256_permute4x64_epi64::<0xEE>(xv));
        for p in 0..4 {
            let v = _mm256_loadu_si256(at.add(32 * p).cast());
            let wlo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
            let whi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
            lo[p] = _mm256_fmadd_ps(wlo, xlo, lo[p]);
            hi[p] = _mm256_fmadd_ps(whi, xhi, hi[p]);
        }
    }
    finish(lo, hi)
}

/// The 8 rows' sums out of `tile_bf16_x8`'s accumulators.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn finish(lo: [__m256; 4], hi: [__m256; 4]) -> [f32; 8] {
    let mut r = [0f32; 8];
    for p in 0..4 {
        r[2 * p] = hsum8(_mm256_permute2f128_ps::<0x20>(lo[p], hi[p]));
        r[2 * p + 1] = hsum8(_mm256_permute2f128_ps::<0x31>(lo[p], hi[p]));
    }
    r
}

/// A packed pair's (`quant::packed_bf16`) two steps as `interleave` stores them: for step `t`,
/// the four vectors `tile_bf16_x8` loads (rows 0-1, 2-3, 4-5, 6-7). The 64 code bytes become
/// each step's high bytes by one table shuffle a 32 bytes; `punpcklbw` / `punpckhbw` of low and
/// high bytes give the rows' words. `e`: the next of `exc` (the group's exceptions, in order)
/// not yet applied; moved past the pair's.
///
/// # Safety
/// AVX2; `at` addresses the pair's `PAIR_BYTES` bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack_pair(
    at: *const u8,
    table: __m256i,
    q: usize,
    exc: &[Exception],
    e: &mut usize,
) -> [[__m256i; 4]; 2] {
    let nibble = _mm256_set1_epi8(15);
    let codes = [
        _mm256_loadu_si256(at.add(128).cast()),
        _mm256_loadu_si256(at.add(160).cast()),
    ];
    let mut high = [[_mm256_setzero_si256(); 2]; 2];
    for h in 0..2 {
        high[0][h] = _mm256_shuffle_epi8(table, _mm256_and_si256(codes[h], nibble));
        let up = _mm256_srli_epi16::<4>(codes[h]);
        high[1][h] = _mm256_shuffle_epi8(table, _mm256_and_si256(up, nibble));
    }
    if *e < exc.len() && exc[*e].pair as usize == q {
        let mut bytes = [0u8; 128];
        for t in 0..2 {
            for h in 0..2 {
                _mm256_storeu_si256(bytes.as_mut_ptr().add(64 * t + 32 * h).cast(), high[t][h]);
            }
        }
        *e = patch(&mut bytes, exc, *e, q);
        for t in 0..2 {
            for h in 0..2 {
                high[t][h] = _mm256_loadu_si256(bytes.as_ptr().add(64 * t + 32 * h).cast());
            }
        }
    }
    let mut v = [[_mm256_setzero_si256(); 4]; 2];
    for t in 0..2 {
        let low = [
            _mm256_loadu_si256(at.add(64 * t).cast()),
            _mm256_loadu_si256(at.add(64 * t + 32).cast()),
        ];
        v[t] = [
            _mm256_unpacklo_epi8(low[0], high[t][0]),
            _mm256_unpacklo_epi8(low[1], high[t][1]),
            _mm256_unpackhi_epi8(low[0], high[t][0]),
            _mm256_unpackhi_epi8(low[1], high[t][1]),
        ];
    }
    v
}

/// `tile_bf16_x8` on a group packed by `quant::packed_bf16` (`unpack_pair`), the same sums
/// bit for bit, widening without shuffles: a dword of two BF16 words shifted left 16 is the
/// even column's f32, and-ed with `0xffff0000` the odd one's. So `ev[p]` sums rows `2p`,
/// `2p + 1` at columns 0, 2, 4, 6 and `od[p]` at 1, 3, 5, 7, against the activations in that
/// order (`x` as `even_odd` lays it out); interleaving the two at the end gives
/// `tile_bf16_x8`'s accumulators, every lane having added the same products in the same order.
/// (Its 16 widening shuffles a pair were the tile's limit: they share one port.)
///
/// # Safety
/// AVX2+FMA; `run` addresses the group's `pairs * PAIR_BYTES` bytes, `x` `16 * pairs` floats
/// laid out by `even_odd`; `exc` are the group's exceptions, in order.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_packed_bf16_x8(
    run: *const u8,
    table: &[u8; 16],
    x: *const f32,
    pairs: usize,
    exc: &[Exception],
) -> [f32; 8] {
    let odd = _mm256_set1_epi32(0xffff_0000_u32 as i32);
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr().cast()));
    let mut ev = [_mm256_setzero_ps(); 4];
    let mut od = [_mm256_setzero_ps(); 4];
    let mut e = 0;
    for q in 0..pairs {
        let at = run.add(q * PAIR_BYTES);
        for l in (0..PAIR_BYTES).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(X8_PREFETCH + l).cast());
            _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(X8_PREFETCH_L2 + l).cast());
        }
        let v = unpack_pair(at, table, q, exc, &mut e);
        for t in 0..2 {
            let xs = x.add(8 * (2 * q + t));
            let xe = _mm256_broadcast_ps(&*xs.cast::<__m128>());
            let xo = _mm256_broadcast_ps(&*xs.add(4).cast::<__m128>());
            for p in 0..4 {
                let we = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v[t][p]));
                let wo = _mm256_castsi256_ps(_mm256_and_si256(v[t][p], odd));
                ev[p] = _mm256_fmadd_ps(we, xe, ev[p]);
                od[p] = _mm256_fmadd_ps(wo, xo, od[p]);
            }
        }
    }
    let lo = std::array::from_fn(|p| _mm256_unpacklo_ps(ev[p], od[p]));
    let hi = std::array::from_fn(|p| _mm256_unpackhi_ps(ev[p], od[p]));
    finish(lo, hi)
}

/// `x`'s chunks of 8 with their even columns first, then their odd ones (0, 2, 4, 6, 1, 3, 5,
/// 7): the order the packed decode tiles' accumulators take them in.
pub(super) fn even_odd(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(8)
        .flat_map(|c| [c[0], c[2], c[4], c[6], c[1], c[3], c[5], c[7]])
        .collect()
}

/// Group `g` of `w` as `interleave` stores it, into `out` (`16 * w.cols` bytes).
///
/// # Safety
/// AVX2; `out` addresses `16 * w.cols` writable bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn unpack_group(w: &PackedBf16, g: usize, out: *mut u8) {
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(w.table.as_ptr().cast()));
    let (run, exc) = (w.group(g).as_ptr(), w.group_exceptions(g));
    let mut e = 0;
    for q in 0..w.cols / PAIR_COLS {
        let v = unpack_pair(run.add(q * PAIR_BYTES), table, q, exc, &mut e);
        for t in 0..2 {
            for p in 0..4 {
                let dst = out.add(q * 256 + 128 * t + 32 * p);
                _mm256_storeu_si256(dst.cast(), v[t][p]);
            }
        }
    }
}

/// `matmul_rows::<BF16, AVX512>` for one activation row on a matrix packed by
/// `quant::packed_bf16`, on the packed decode tile: the same bits.
///
/// # Safety
/// As `matmul_rows` with `m = 1`, `r0` a multiple of 8.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gemv_packed<const AVX512: bool>(
    w: &PackedBf16,
    rows: usize,
    x: &[f32],
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    let pairs = w.cols / PAIR_COLS;
    let x = even_odd(&x[..w.cols]);
    for j0 in (r0..r1).step_by(8) {
        let (run, exc) = (w.group(j0 / 8).as_ptr(), w.group_exceptions(j0 / 8));
        let r = if AVX512 {
            super::avx512_float::tile_packed_bf16_x8(run, &w.table, x.as_ptr(), pairs, exc)
        } else {
            tile_packed_bf16_x8(run, &w.table, x.as_ptr(), pairs, exc)
        };
        super::avx2::store(out, rows, &r, 1, 0, j0, r1);
    }
}

/// `out[i * rows + j]` for all `m` activation rows and weight rows `j in r0..r1`. `AVX512`: an
/// interleaved BF16 group decodes on `avx512_float`'s tile (the same bits).
///
/// # Safety
/// AVX2+FMA+F16C, and AVX-512 F/BW if `AVX512`; `w` holds `rows * cols` elements
/// (interleaved: whole groups of 8 rows, and `r0` a multiple of 8); `x` holds `m * cols`;
/// `out` addresses `m * rows` floats and no other thread writes columns `r0..r1`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn matmul_rows<W: FloatW, const AVX512: bool>(
    w: FloatRows,
    rows: usize,
    x: &[f32],
    m: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    let (cols, stride) = (w.cols, w.stride::<W>());
    let wrow = |j: usize| w.row::<W>(j.min(r1 - 1));
    let xrow = |i: usize| x.as_ptr().add(i * cols);
    for c0 in (0..m).step_by(ROW_CHUNK) {
        let c1 = (c0 + ROW_CHUNK).min(m);
        let full = c0 + (c1 - c0) / 4 * 4;
        // As in `avx2::matmul_rows`: a group of 8 weight rows serves the whole chunk.
        for j0 in (r0..r1).step_by(8) {
            for i0 in (c0..full).step_by(4) {
                let xp = [xrow(i0), xrow(i0 + 1), xrow(i0 + 2), xrow(i0 + 3)];
                for jj in (j0..(j0 + 8).min(r1)).step_by(2) {
                    let wp = [wrow(jj), wrow(jj + 1)];
                    let r = if w.x8 {
                        tile::<W, 4, 2, true>(&wp, &xp, cols, stride, 0)
                    } else {
                        tile::<W, 4, 2, false>(&wp, &xp, cols, stride, 0)
                    };
                    super::avx2::store(out, rows, &r, 4, i0, jj, r1);
                }
            }
            let wp: [*const u8; 8] = std::array::from_fn(|k| wrow(j0 + k));
            // Decode streams the weights once: fetch ahead meanwhile, as rows the next group
            // (8 rows on), interleaved a little way along the group's run (a prefetch past the
            // matrix is dropped, never faults).
            let prefetch = if w.x8 {
                X8_PREFETCH
            } else {
                8 * cols * W::BYTES
            } as isize;
            for i0 in full..c1 {
                let r = match (w.x8, W::BF16) {
                    (true, true) if AVX512 => {
                        super::avx512_float::tile_bf16_x8(wp[0], xrow(i0), cols)
                    }
                    (true, true) => tile_bf16_x8(wp[0], xrow(i0), cols),
                    (true, false) => {
                        tile::<W, 1, 8, true>(&wp, &[xrow(i0)], cols, stride, prefetch)
                    }
                    _ => tile::<W, 1, 8, false>(&wp, &[xrow(i0)], cols, stride, prefetch),
                };
                super::avx2::store(out, rows, &r, 1, i0, j0, r1);
            }
        }
    }
}
