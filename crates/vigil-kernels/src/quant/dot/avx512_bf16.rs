//! BF16 weights × activations rounded to BF16, on `vdpbf16ps` (AVX512_BF16): 32 products per
//! instruction, for decode and prefill alike. Opt-in (`VIGIL_BF16_DOTS=1`, `cpu::bf16_dots`):
//! on the Emerald Rapids Xeon measured here the instruction issues at a third or less of the
//! f32 FMA's rate (`examples/bf16_dot_rate.rs`), so BF16 Qwen3-0.6B shapes at 512 rows reach
//! about 200 GFLOP/s on 2 cores, against 270-280 for the f32 GEMM (`avx512_float_gemm`); a CPU
//! that issues it as fast as an FMA would double the f32 path.
//!
//! The numerics are this path's own, so they are stated here and held by
//! `tests/matmul_float_gemm.rs` bit for bit:
//! - each activation row is rounded to BF16 once per call (round to nearest even), padded with
//!   zeros to a multiple of 32 columns (a BF16 checkpoint's own activations are BF16, so this is
//!   the rounding its reference implementation does too);
//! - per (activation row, weight row) pair, one 16-lane f32 accumulator over the column chunks
//!   of 32 in order, the weights past `cols` read as zero; lane `l` of chunk `c` adds the
//!   product of columns `32c + 2l + 1` and then that of `32c + 2l`, each as an f32 fused
//!   multiply-add rounded to nearest even, denormals flushed (the instruction's definition);
//! - the 16 lanes are summed as lane `l` + lane `l + 8`, then `hsum8`'s tree.
//!
//! The per-pair sequence never depends on the tile, the batch or the thread, so decode and
//! prefill agree bit for bit. Without it, BF16 weights keep the f32 path (the activations
//! unrounded): the setting picks one contract for the whole process.
//!
//! Tiles: 1 activation row × 8 weight rows for fewer than 3 rows (decode, prefetching the next
//! 8 weight rows a line at a time), 3 × 8 (24 accumulators) otherwise, over chunks of activation
//! rows that fit in L2 while each group of 8 weight rows stays in L1.

// Index loops mirror the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::avx2_float::hsum8;
use std::arch::x86_64::*;

/// Columns per `vdpbf16ps`.
const STEP: usize = 32;
/// Activation rows and weight rows per prefill tile.
const MR: usize = 3;
const NR: usize = 8;
/// Bytes of BF16 activations per pass over a thread's weight groups.
const CHUNK_BYTES: usize = 768 * 1024;

/// The same 512 bits as 32 BF16 values.
#[inline]
fn as_bh(v: __m512i) -> __m512bh {
    // SAFETY: both are 64 plain bytes; every bit pattern is valid for either.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(v) }
}

/// The `n` lowest bits set (`n <= 16`).
#[inline]
fn mask16(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

/// `x` rounded to BF16 (nearest even) into `out`, which is `x.len()` rounded up to 32 long;
/// the padding gets zeros.
///
/// # Safety
/// AVX-512 F/BW/VL and AVX512_BF16; `out.len() == x.len().next_multiple_of(32)`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
pub unsafe fn round_row(x: &[f32], out: &mut [u16]) {
    debug_assert_eq!(out.len(), x.len().next_multiple_of(STEP));
    let n = x.len();
    for k in (0..out.len()).step_by(STEP) {
        let rest = n - k;
        let (lo, hi) = if rest >= STEP {
            (
                _mm512_loadu_ps(x.as_ptr().add(k)),
                _mm512_loadu_ps(x.as_ptr().add(k + 16)),
            )
        } else {
            // A masked-off lane is never read, so the addresses past `x` are not touched.
            (
                _mm512_maskz_loadu_ps(mask16(rest.min(16)), x.as_ptr().add(k)),
                _mm512_maskz_loadu_ps(
                    mask16(rest.saturating_sub(16)),
                    x.as_ptr().wrapping_add(k + 16),
                ),
            )
        };
        // The low 16 BF16 values come from the second operand.
        let v = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(out.as_mut_ptr().add(k).cast(), v);
    }
}

/// The 16 lanes of `acc` summed: lane `l` + lane `l + 8`, then `hsum8`'s tree.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn hsum16(acc: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(acc);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
    hsum8(_mm256_add_ps(lo, hi))
}

/// The `R × C` pairs of weight rows `w` and BF16 activation rows `x`: `steps` whole chunks of
/// 32, then, when `tail` is not empty, one chunk whose weights past the row are masked to zero
/// (the activations are zero-padded). `prefetch`: when not 0, each step also fetches the line
/// that far past each weight row's current one.
///
/// # Safety
/// AVX-512 F/BW/VL and AVX512_BF16; each weight row addresses `32 * steps + popcnt(tail)`
/// values, each activation row `32 * (steps + (tail != 0))`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn tile<const R: usize, const C: usize>(
    w: &[*const u16; C],
    x: &[*const u16; R],
    steps: usize,
    tail: __mmask32,
    prefetch: isize,
) -> [[f32; C]; R] {
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    for s in 0..steps {
        let k = s * STEP;
        if prefetch != 0 {
            for j in 0..C {
                _mm_prefetch::<_MM_HINT_T0>(w[j].add(k).wrapping_byte_offset(prefetch).cast());
            }
        }
        step::<R, C>(w, x, k, !0, &mut acc);
    }
    if tail != 0 {
        step::<R, C>(w, x, steps * STEP, tail, &mut acc);
    }
    let mut r = [[0f32; C]; R];
    for i in 0..R {
        for j in 0..C {
            r[i][j] = hsum16(acc[i][j]);
        }
    }
    r
}

/// One chunk of 32 columns from column `k` into the accumulators; weights outside `mask` read
/// as zero (a masked-off value is never loaded).
///
/// # Safety
/// As `tile`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn step<const R: usize, const C: usize>(
    w: &[*const u16; C],
    x: &[*const u16; R],
    k: usize,
    mask: __mmask32,
    acc: &mut [[__m512; C]; R],
) {
    let mut xv = [as_bh(_mm512_setzero_si512()); R];
    for i in 0..R {
        xv[i] = as_bh(_mm512_loadu_si512(x[i].add(k).cast()));
    }
    for j in 0..C {
        let wj = as_bh(_mm512_maskz_loadu_epi16(mask, w[j].add(k).cast()));
        for i in 0..R {
            acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wj, xv[i]);
        }
    }
}

/// Write a tile's sums to `out` (row `i0 + i`, column `j0 + j`), dropping weight rows `>= r1`.
#[inline]
unsafe fn store<const R: usize, const C: usize>(
    out: *mut f32,
    rows: usize,
    r: &[[f32; C]; R],
    i0: usize,
    j0: usize,
    r1: usize,
) {
    for i in 0..R {
        for j in 0..C.min(r1 - j0) {
            *out.add((i0 + i) * rows + j0 + j) = r[i][j];
        }
    }
}

/// `out[i * rows + j]` for all `m` activation rows (`xb`: BF16, `round_row`'s padded rows) and
/// weight rows `j in r0..r1` (`w`: BF16, `rows × cols`).
///
/// # Safety
/// AVX-512 F/BW/VL and AVX512_BF16; `w` holds `rows * cols` BF16 values, `xb` holds
/// `m * cols.next_multiple_of(32)`; `out` addresses `m * rows` floats and no other thread
/// writes columns `r0..r1`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_rows(
    w: &[u8],
    rows: usize,
    cols: usize,
    xb: &[u16],
    m: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    let cols32 = cols.next_multiple_of(STEP);
    let steps = cols / STEP;
    let rest = cols % STEP;
    let tail: __mmask32 = if rest == 0 { 0 } else { (1u32 << rest) - 1 };
    // Rows past r1 repeat row r1 - 1; their outputs are dropped.
    let wrow = |j: usize| w.as_ptr().cast::<u16>().add(j.min(r1 - 1) * cols);
    let xrow = |i: usize| xb.as_ptr().add(i * cols32);
    if m < MR {
        // Decode streams the weights once: fetch the next group (8 rows on) meanwhile (a
        // prefetch past the matrix is dropped, never faults).
        let prefetch = (NR * cols * 2) as isize;
        for j0 in (r0..r1).step_by(NR) {
            let wp: [*const u16; NR] = std::array::from_fn(|k| wrow(j0 + k));
            for i in 0..m {
                let r = tile::<1, NR>(&wp, &[xrow(i)], steps, tail, prefetch);
                store(out, rows, &r, i, j0, r1);
            }
        }
        return;
    }
    let budget = (CHUNK_BYTES / (2 * cols32)).max(MR);
    let chunk = m.div_ceil(m.div_ceil(budget)).next_multiple_of(MR);
    for c0 in (0..m).step_by(chunk) {
        let c1 = (c0 + chunk).min(m);
        for j0 in (r0..r1).step_by(NR) {
            let wp: [*const u16; NR] = std::array::from_fn(|k| wrow(j0 + k));
            for i0 in (c0..c1).step_by(MR) {
                match c1 - i0 {
                    1 => {
                        let r = tile::<1, NR>(&wp, &[xrow(i0)], steps, tail, 0);
                        store(out, rows, &r, i0, j0, r1);
                    }
                    2 => {
                        let r = tile::<2, NR>(&wp, &[xrow(i0), xrow(i0 + 1)], steps, tail, 0);
                        store(out, rows, &r, i0, j0, r1);
                    }
                    _ => {
                        let xp = [xrow(i0), xrow(i0 + 1), xrow(i0 + 2)];
                        let r = tile::<MR, NR>(&wp, &xp, steps, tail, 0);
                        store(out, rows, &r, i0, j0, r1);
                    }
                }
            }
        }
    }
}
