//! AVX2 prefill GEMM for float weights (F32, F16, BF16) × f32 activations.
//!
//! Same numerics as the row tiles of `avx2_float`, bit for bit: per (activation row, weight
//! row) pair one 8-lane FMA accumulator over the column chunks of 8 in order, `hsum8`'s tree,
//! then the `cols % 8` tail in order. What changes is only where the operands come from:
//!
//! - A group of `NR` weight rows is widened to f32 once per block of `KC` columns into a
//!   thread-local, 32-byte aligned buffer (the `NR` rows' chunk `s` side by side), so the
//!   tile does plain aligned loads from L1 instead of converting every load (widening BF16 /
//!   F16 to f32 is exact, so the products do not change).
//! - A tile is `MR` activation rows × `NR` weight rows: 12 accumulators, so each activation
//!   vector (streamed from L2) serves `NR` FMAs.
//! - Columns are blocked by `KC` so the widened block stays in L1 and the chunk's activation
//!   block in L2 even for wide rows. The accumulators are stored to a per-chunk buffer
//!   between blocks and reloaded: the register value carried across is the same, so the
//!   per-pair sequence of FMAs is unchanged.

// Index loops mirror the buffer layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::avx2_float::{hsum8, FloatW};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Activation rows per tile.
const MR: usize = 3;
/// Weight rows per group and tile: with `MR`, 12 accumulators, 3 activation and 1 weight
/// register.
const NR: usize = 4;
/// Columns per block (a multiple of 8): the `NR` widened rows of a block take 8 KiB of L1.
const KC: usize = 512;
/// Most activation rows per pass over a thread's weight groups.
const MAX_CHUNK: usize = 96;
/// Bytes of packed activations per pass. Every pass streams all of the thread's weights
/// again, so the passes are long: the tiles read the packed activations sequentially (the
/// hardware prefetches them), while the weights are prefetched a block ahead by hand.
const CHUNK_BYTES: usize = 768 * 1024;

/// 8 aligned floats: the unit of the per-thread buffers.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct V8([f32; 8]);

/// The packed activation chunk, the widened weight block and the carried accumulators.
#[derive(Default)]
struct Bufs {
    x: Vec<V8>,
    w: Vec<V8>,
    acc: Vec<V8>,
}

thread_local! {
    static BUFS: RefCell<Bufs> = RefCell::new(Bufs::default());
}

/// Widen columns `k0..k0 + 8 * steps` of the `NR` rows `w` into `out`: chunk `s` of row `j`
/// at `out[s * NR + j]`.
///
/// # Safety
/// AVX2+F16C; each row addresses `k0 + 8 * steps` elements; `out` holds `steps * NR`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_w<W: FloatW, const NR: usize>(
    w: &[*const u8; NR],
    k0: usize,
    steps: usize,
    out: *mut V8,
) {
    for s in 0..steps {
        for j in 0..NR {
            let v = W::load8(w[j].add((k0 + 8 * s) * W::BYTES));
            _mm256_store_ps(out.add(s * NR + j).cast(), v);
        }
    }
}

/// Copy the first `8 * steps` columns of the `MR` rows `x` into `out`: chunk `s` of row `i` at
/// `out[s * MR + i]`, so a tile streams one sequential run.
///
/// # Safety
/// AVX; each row addresses `8 * steps` floats; `out` holds `steps * MR`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_x<const MR: usize>(x: &[*const f32; MR], steps: usize, out: *mut V8) {
    for s in 0..steps {
        for i in 0..MR {
            _mm256_store_ps(out.add(s * MR + i).cast(), _mm256_loadu_ps(x[i].add(8 * s)));
        }
    }
}

/// Run `steps` chunks of a packed activation tile against the widened weight block,
/// carrying the accumulators `acc[i * NR + j]` in memory.
///
/// # Safety
/// AVX2+FMA; `px` holds `steps * MR` vectors, `pw` `steps * NR`; `acc` `MR * NR`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const MR: usize, const NR: usize>(
    px: *const V8,
    pw: *const V8,
    steps: usize,
    acc: *mut V8,
) {
    let mut a = [[_mm256_setzero_ps(); NR]; MR];
    for i in 0..MR {
        for j in 0..NR {
            a[i][j] = _mm256_load_ps(acc.add(i * NR + j).cast());
        }
    }
    for s in 0..steps {
        let mut xv = [_mm256_setzero_ps(); MR];
        for i in 0..MR {
            xv[i] = _mm256_load_ps(px.add(s * MR + i).cast());
        }
        for j in 0..NR {
            let wv = _mm256_load_ps(pw.add(s * NR + j).cast());
            for i in 0..MR {
                a[i][j] = _mm256_fmadd_ps(wv, xv[i], a[i][j]);
            }
        }
    }
    for i in 0..MR {
        for j in 0..NR {
            _mm256_store_ps(acc.add(i * NR + j).cast(), a[i][j]);
        }
    }
}

/// `hsum8` of the 4 vectors at `a`, as one vector: the same tree (high half onto low half,
/// lanes 2, 3 onto 0, 1, lane 1 onto lane 0) done for 4 accumulators at once after a 4 × 4
/// transpose, so each lane gets exactly `hsum8`'s sums.
///
/// # Safety
/// AVX; `a` addresses 4 vectors.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum8x4(a: *const V8) -> __m128 {
    let h: [__m128; 4] = std::array::from_fn(|j| {
        let v = _mm256_load_ps(a.add(j).cast());
        _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v))
    });
    // Transpose: t[k] holds lane k of h[0..4].
    let (l01, h01) = (_mm_unpacklo_ps(h[0], h[1]), _mm_unpackhi_ps(h[0], h[1]));
    let (l23, h23) = (_mm_unpacklo_ps(h[2], h[3]), _mm_unpackhi_ps(h[2], h[3]));
    let t0 = _mm_movelh_ps(l01, l23);
    let t1 = _mm_movehl_ps(l23, l01);
    let t2 = _mm_movelh_ps(h01, h23);
    let t3 = _mm_movehl_ps(h23, h01);
    _mm_add_ps(_mm_add_ps(t0, t2), _mm_add_ps(t1, t3))
}

/// `out[i * rows + j]` for all `m` activation rows and weight rows `j in r0..r1`.
///
/// # Safety
/// AVX2+FMA+F16C; `w` holds `rows * cols` elements; `x` holds `m * cols`; `out` addresses
/// `m * rows` floats and no other thread writes columns `r0..r1`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_rows<W: FloatW>(
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    m: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    BUFS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut bufs) => run::<W>(&mut bufs, w, rows, cols, x, m, r0, r1, out),
        // Re-entered on this thread (not expected): use private buffers.
        Err(_) => run::<W>(&mut Bufs::default(), w, rows, cols, x, m, r0, r1, out),
    })
}

fn grow(v: &mut Vec<V8>, n: usize) -> *mut V8 {
    if v.len() < n {
        v.resize(n, V8([0.0; 8]));
    }
    v.as_mut_ptr()
}

/// # Safety
/// See `matmul_rows`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn run<W: FloatW>(
    bufs: &mut Bufs,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    m: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    let n8 = cols / 8 * 8;
    let nsteps = n8 / 8;
    // Equal chunks of at most the budget's rows, whole tiles each.
    let budget = (CHUNK_BYTES / (4 * n8.max(8))).clamp(MR, MAX_CHUNK);
    let chunk = m.div_ceil(m.div_ceil(budget)).next_multiple_of(MR);
    let tiles_max = chunk / MR;
    let px = grow(&mut bufs.x, tiles_max * nsteps * MR);
    let pw = grow(&mut bufs.w, KC / 8 * NR);
    let acc = grow(&mut bufs.acc, tiles_max * MR * NR);
    let xrow = |i: usize| x.as_ptr().add(i * cols);
    for c0 in (0..m).step_by(chunk) {
        let c1 = (c0 + chunk).min(m);
        let tiles = (c1 - c0).div_ceil(MR);
        // The last tile may be narrower: `rest` rows, packed `rest` to a step.
        let rest = c1 - c0 - (tiles - 1) * MR;
        // Every thread packs the chunk for itself: one shared packing per call measured slower
        // (this packing also pulls the chunk into the thread's L2 just before its tiles).
        for t in 0..tiles {
            let xs: [*const f32; MR] = std::array::from_fn(|i| xrow((c0 + t * MR + i).min(c1 - 1)));
            let dst = px.add(t * nsteps * MR);
            match if t + 1 < tiles { MR } else { rest } {
                1 => pack_x::<1>(&[xs[0]], nsteps, dst),
                2 => pack_x::<2>(&[xs[0], xs[1]], nsteps, dst),
                _ => pack_x::<MR>(&xs, nsteps, dst),
            }
        }
        for j0 in (r0..r1).step_by(NR) {
            // Rows past r1 repeat row r1 - 1; their outputs are dropped.
            let wp: [*const u8; NR] =
                std::array::from_fn(|j| w.as_ptr().add((j0 + j).min(r1 - 1) * cols * W::BYTES));
            std::slice::from_raw_parts_mut(acc, tiles * MR * NR).fill(V8([0.0; 8]));
            for k0 in (0..n8).step_by(KC) {
                let steps = KC.min(n8 - k0) / 8;
                pack_w::<W, NR>(&wp, k0, steps, pw);
                // The weights packed next: this block's continuation, or the next group's
                // first block. Fetch them while the tiles run, a share per tile.
                let (nj, nk) = if k0 + KC < n8 {
                    (j0, k0 + KC)
                } else {
                    (j0 + NR, 0)
                };
                let lines = if nj < r1 {
                    KC.min(n8 - nk) * W::BYTES / 64
                } else {
                    0
                };
                let next: [*const u8; NR] = std::array::from_fn(|j| {
                    w.as_ptr()
                        .add(((nj + j).min(r1 - 1) * cols + nk) * W::BYTES)
                });
                let per_tile = (lines * NR).div_ceil(tiles);
                let (mut j, mut l) = (0, 0);
                for t in 0..tiles {
                    for _ in 0..per_tile {
                        if l == lines {
                            (j, l) = (j + 1, 0);
                        }
                        if j < NR {
                            _mm_prefetch::<_MM_HINT_T0>(next[j].add(l * 64).cast());
                            l += 1;
                        }
                    }
                    let r = if t + 1 < tiles { MR } else { rest };
                    let (xt, at) = (px.add(t * nsteps * MR + k0 / 8 * r), acc.add(t * MR * NR));
                    match r {
                        1 => tile::<1, NR>(xt, pw, steps, at),
                        2 => tile::<2, NR>(xt, pw, steps, at),
                        _ => tile::<MR, NR>(xt, pw, steps, at),
                    }
                }
            }
            for i in c0..c1 {
                let dst = out.add(i * rows + j0);
                let a = acc.add((i - c0) * NR);
                if NR == 4 && n8 == cols && j0 + 4 <= r1 {
                    _mm_storeu_ps(dst, hsum8x4(a));
                    continue;
                }
                for j in 0..NR.min(r1 - j0) {
                    let mut s = hsum8(_mm256_load_ps(a.add(j).cast()));
                    for k in n8..cols {
                        s += W::load1(wp[j].add(k * W::BYTES)) * *xrow(i).add(k);
                    }
                    *dst.add(j) = s;
                }
            }
        }
    }
}
