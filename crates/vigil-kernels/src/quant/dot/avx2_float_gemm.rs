//! AVX2 prefill GEMM for float weights (F32, F16, BF16) × f32 activations, and the driver the
//! AVX-512 tiles (`avx512_float_gemm`) share.
//!
//! Same numerics as the row tiles of `avx2_float`, bit for bit: per (activation row, weight
//! row) pair one 8-lane FMA accumulator over the column chunks of 8 in order, `hsum8`'s tree,
//! then the `cols % 8` tail in order. What changes is only where the operands come from:
//!
//! - A group of `NR` weight rows is widened to f32 once per block of `Tiles::KC` columns into
//!   a thread-local, 64-byte aligned buffer (the `NR` rows' chunk `s` side by side), so the
//!   tile does plain aligned loads from L1 instead of converting every load (widening BF16 /
//!   F16 to f32 is exact, so the products do not change).
//! - A tile is `MR` activation rows × `NR` weight rows (AVX2: 3 × 4, 12 accumulators), so
//!   each activation vector (streamed from L2) serves `NR` FMAs.
//! - Columns are blocked so the widened block stays in L1 and the chunk's activation block
//!   in L2 even for wide rows. The accumulators are stored to a per-chunk buffer
//!   between blocks and reloaded: the register value carried across is the same, so the
//!   per-pair sequence of FMAs is unchanged. On a row's last block the tile sums its
//!   accumulators with `hsum8`'s tree in registers and writes the results itself (storing
//!   them for a separate pass to reload and sum took 6 % of the GEMM at 512 rows).

// Index loops mirror the buffer layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::avx2_float::{hsum8, FloatRows, FloatW};
use crate::unroll::unrolled4;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// A tile kernel the driver runs: `MR` activation rows × `NR` weight rows (a multiple of 4).
pub(crate) trait Tiles {
    const MR: usize;
    const NR: usize;
    /// Columns per block (a multiple of 8): the `NR` widened rows of a block take
    /// `NR * KC * 4` bytes of L1 (16 KiB for both tiles here).
    const KC: usize;
    /// Run one tile of `r` (1..=MR) activation rows: see `TileCall`.
    ///
    /// # Safety
    /// The kernel's ISA; `c` as `TileCall` says.
    unsafe fn tile(r: usize, c: &TileCall);
}

/// One tile's run: `steps` chunks of a packed tile of activation rows against the widened
/// weight block. The accumulators start at zero on the `first` block, else from
/// `acc[i * NR + j]`; they are stored back there, or, on the last block when `out` is not
/// null, summed with `hsum8`'s tree in registers and written as row `i`'s `NR` results at
/// `out + i * ld`.
///
/// The pointers are valid for what the tile reads and writes: `px` holds `steps * r` vectors,
/// `pw` `steps * NR` (64-byte aligned), `acc` `MR * NR` (64-byte aligned), and a non-null
/// `out` addresses `NR` floats at each of `out + i * ld`, `i < r`.
pub(crate) struct TileCall {
    pub px: *const V8,
    pub pw: *const V8,
    pub steps: usize,
    pub acc: *mut V8,
    pub first: bool,
    pub out: *mut f32,
    pub ld: usize,
}

/// `T::tile`'s `(first, out)` cases as const parameters, for a tile function generic over
/// `R` rows, `FIRST` and `OUT` that takes the `TileCall`.
macro_rules! tile_cases {
    ($f:ident, $r:literal, $c:expr) => {
        match ($c.first, !$c.out.is_null()) {
            (true, true) => $f::<$r, true, true>($c),
            (true, false) => $f::<$r, true, false>($c),
            (false, true) => $f::<$r, false, true>($c),
            (false, false) => $f::<$r, false, false>($c),
        }
    };
}
pub(crate) use tile_cases;

/// The AVX2 tiles: 3 activation rows × 4 weight rows.
pub(crate) struct Avx2;

impl Tiles for Avx2 {
    const MR: usize = 3;
    const NR: usize = 4;
    /// A Qwen3-0.6B row (1,024 columns) in one block, so its tiles never carry accumulators
    /// through memory: BF16 at m = 512 on 2 threads 179-185 GFLOP/s at 512 columns, 182-188
    /// at 768, 194 at 1,024 (`matmul_bench 512 2 10 bf16x8`, Emerald Rapids held to AVX2).
    /// The block is 16 KiB, half of a Zen 3 L1.
    const KC: usize = 1024;
    #[inline]
    unsafe fn tile(r: usize, c: &TileCall) {
        match r {
            1 => tile_cases!(tile, 1, c),
            2 => tile_cases!(tile, 2, c),
            _ => tile_cases!(tile, 3, c),
        }
    }
}

/// The largest `MR` and `NR` of any tiles.
const MAX_MR: usize = 8;
const MAX_NR: usize = 16;
/// Most activation rows per pass over a thread's weight groups.
const MAX_CHUNK: usize = 96;
/// Bytes of packed activations per pass. Every pass streams all of the thread's weights
/// again, so the passes are long: the tiles read the packed activations sequentially (the
/// hardware prefetches them), while the weights are prefetched a block ahead by hand.
const CHUNK_BYTES: usize = 768 * 1024;

/// 8 floats: the unit of the packed layouts.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(crate) struct V8([f32; 8]);

/// 16 floats, 64-byte aligned: the unit the per-thread buffers are allocated in, so that the
/// AVX-512 tiles load two `V8`s at once from an aligned address.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct V16([f32; 16]);

/// The packed activation chunk, the widened weight block and the carried accumulators.
#[derive(Default)]
struct Bufs {
    x: Vec<V16>,
    w: Vec<V16>,
    acc: Vec<V16>,
}

thread_local! {
    static BUFS: RefCell<Bufs> = RefCell::new(Bufs::default());
}

/// Widen columns `k0..k0 + 8 * steps` of the `nr = w.len()` rows `w` (a row's chunks of 8
/// `stride` bytes apart, `FloatRows::stride`) into `out`: chunk `s` of row `j` at
/// `out[s * nr + j]`.
///
/// # Safety
/// AVX2+F16C; each row addresses `k0 + 8 * steps` elements; `out` holds `steps * nr`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_w<W: FloatW>(w: &[*const u8], stride: usize, k0: usize, steps: usize, out: *mut V8) {
    let nr = w.len();
    for s in 0..steps {
        for (j, row) in w.iter().enumerate() {
            let v = W::load8(row.add((k0 / 8 + s) * stride));
            _mm256_store_ps(out.add(s * nr + j).cast(), v);
        }
    }
}

/// Copy the first `8 * steps` columns of the `r = x.len()` rows `x` into `out`: chunk `s` of
/// row `i` at `out[s * r + i]`, so a tile streams one sequential run.
///
/// # Safety
/// AVX; each row addresses `8 * steps` floats; `out` holds `steps * r`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_x(x: &[*const f32], steps: usize, out: *mut V8) {
    let r = x.len();
    for s in 0..steps {
        for (i, row) in x.iter().enumerate() {
            _mm256_store_ps(out.add(s * r + i).cast(), _mm256_loadu_ps(row.add(8 * s)));
        }
    }
}

/// `Tiles::tile` for 3 × 4 tiles (`MR` rows of them).
///
/// # Safety
/// AVX2+FMA; see `Tiles::tile`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const MR: usize, const FIRST: bool, const OUT: bool>(c: &TileCall) {
    const NR: usize = 4;
    let (px, pw, steps, acc, out, ld) = (c.px, c.pw, c.steps, c.acc, c.out, c.ld);
    let mut a = [[_mm256_setzero_ps(); NR]; MR];
    if !FIRST {
        for i in 0..MR {
            for j in 0..NR {
                a[i][j] = _mm256_load_ps(acc.add(i * NR + j).cast());
            }
        }
    }
    unrolled4(steps, |s| {
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
    });
    for i in 0..MR {
        if OUT {
            _mm_storeu_ps(out.add(i * ld), hsum8x4(a[i]));
        } else {
            for j in 0..NR {
                _mm256_store_ps(acc.add(i * NR + j).cast(), a[i][j]);
            }
        }
    }
}

/// `hsum8` of the 4 vectors `a`, as one vector: the same tree (high half onto low half,
/// lanes 2, 3 onto 0, 1, lane 1 onto lane 0) done for 4 accumulators at once after a 4 × 4
/// transpose, so each lane gets exactly `hsum8`'s sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum8x4(a: [__m256; 4]) -> __m128 {
    let h: [__m128; 4] = std::array::from_fn(|j| {
        _mm_add_ps(
            _mm256_castps256_ps128(a[j]),
            _mm256_extractf128_ps::<1>(a[j]),
        )
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

/// `out[i * rows + j]` for all `m` activation rows and weight rows `j in r0..r1`, on the tiles
/// `T` (`Avx2` here, `avx512_float_gemm::Avx512`).
///
/// # Safety
/// AVX2+FMA+F16C and `T`'s ISA; `w` holds `rows * cols` elements (interleaved: whole groups of
/// 8 rows); `x` holds `m * cols`; `out` addresses `m * rows` floats and no other thread writes
/// columns `r0..r1`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matmul_rows<T: Tiles, W: FloatW>(
    w: FloatRows,
    rows: usize,
    x: &[f32],
    m: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    BUFS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut bufs) => run::<T, W>(&mut bufs, w, rows, x, m, r0, r1, out),
        // Re-entered on this thread (not expected): use private buffers.
        Err(_) => run::<T, W>(&mut Bufs::default(), w, rows, x, m, r0, r1, out),
    })
}

/// At least `n` `V8`s of `v`, 64-byte aligned.
fn grow(v: &mut Vec<V16>, n: usize) -> *mut V8 {
    let n16 = n.div_ceil(2);
    if v.len() < n16 {
        v.resize(n16, V16([0.0; 16]));
    }
    v.as_mut_ptr().cast()
}

/// # Safety
/// See `matmul_rows`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn run<T: Tiles, W: FloatW>(
    bufs: &mut Bufs,
    w: FloatRows,
    rows: usize,
    x: &[f32],
    m: usize,
    r0: usize,
    r1: usize,
    out: *mut f32,
) {
    let (mr, nr) = (T::MR, T::NR);
    let (cols, stride) = (w.cols, w.stride::<W>());
    let n8 = cols / 8 * 8;
    let nsteps = n8 / 8;
    // Equal chunks of at most the budget's rows, whole tiles each.
    let budget = (CHUNK_BYTES / (4 * n8.max(8))).clamp(mr, MAX_CHUNK);
    let chunk = m.div_ceil(m.div_ceil(budget)).next_multiple_of(mr);
    let tiles_max = chunk / mr;
    let px = grow(&mut bufs.x, tiles_max * nsteps * mr);
    let kc = T::KC;
    let pw = grow(&mut bufs.w, kc / 8 * nr);
    let acc = grow(&mut bufs.acc, tiles_max * mr * nr);
    let xrow = |i: usize| x.as_ptr().add(i * cols);
    // Rows of whole 8-column chunks can go from the last block's registers straight to `out`.
    let whole = n8 > 0 && n8 == cols;
    for c0 in (0..m).step_by(chunk) {
        let c1 = (c0 + chunk).min(m);
        let tiles = (c1 - c0).div_ceil(mr);
        // The last tile may be narrower: `rest` rows, packed `rest` to a step.
        let rest = c1 - c0 - (tiles - 1) * mr;
        // Every thread packs the chunk for itself: one shared packing per call measured slower
        // (this packing also pulls the chunk into the thread's L2 just before its tiles).
        let mut xs = [std::ptr::null::<f32>(); MAX_MR];
        for t in 0..tiles {
            let r = if t + 1 < tiles { mr } else { rest };
            for (i, p) in xs[..r].iter_mut().enumerate() {
                *p = xrow(c0 + t * mr + i);
            }
            pack_x(&xs[..r], nsteps, px.add(t * nsteps * mr));
        }
        let mut wp = [std::ptr::null::<u8>(); MAX_NR];
        let mut next = [std::ptr::null::<u8>(); MAX_NR];
        for j0 in (r0..r1).step_by(nr) {
            // Rows past r1 repeat row r1 - 1; their outputs are dropped.
            for (j, p) in wp[..nr].iter_mut().enumerate() {
                *p = w.row::<W>((j0 + j).min(r1 - 1));
            }
            // So they do in a group all of whose `nr` weight rows are this call's; the others
            // go through `acc` and the loop below.
            let direct = whole && j0 + nr <= r1;
            if n8 == 0 {
                std::slice::from_raw_parts_mut(acc, tiles * mr * nr).fill(V8([0.0; 8]));
            }
            for k0 in (0..n8).step_by(kc) {
                let steps = kc.min(n8 - k0) / 8;
                pack_w::<W>(&wp[..nr], stride, k0, steps, pw);
                // The weights packed next: this block's continuation, or the next group's
                // first block. Fetch them while the tiles run, a share per tile.
                let (nj, nk) = if k0 + kc < n8 {
                    (j0, k0 + kc)
                } else {
                    (j0 + nr, 0)
                };
                // As rows, `nr` runs of a block's columns each; interleaved, the runs of the
                // groups of 8 rows the `nr` rows are in (the whole group: the other rows'
                // chunks share its lines, and the group's next `nr` rows are packed soon).
                let (runs, run_bytes) = if w.x8 {
                    (nr.div_ceil(8), kc.min(n8 - nk) / 8 * stride)
                } else {
                    (nr, kc.min(n8 - nk) * W::BYTES)
                };
                let lines = if nj < r1 { run_bytes / 64 } else { 0 };
                for (j, p) in next[..runs].iter_mut().enumerate() {
                    let row = if w.x8 { nj / 8 * 8 + 8 * j } else { nj + j };
                    *p = w.row::<W>(row.min(r1 - 1)).add(nk / 8 * stride);
                }
                let per_tile = (lines * runs).div_ceil(tiles);
                let (mut j, mut l) = (0, 0);
                for t in 0..tiles {
                    for _ in 0..per_tile {
                        if l == lines {
                            (j, l) = (j + 1, 0);
                        }
                        if j < runs {
                            _mm_prefetch::<_MM_HINT_T0>(next[j].add(l * 64).cast());
                            l += 1;
                        }
                    }
                    let r = if t + 1 < tiles { mr } else { rest };
                    let (xt, at) = (px.add(t * nsteps * mr + k0 / 8 * r), acc.add(t * mr * nr));
                    let dst = if direct && k0 + kc >= n8 {
                        out.add((c0 + t * mr) * rows + j0)
                    } else {
                        std::ptr::null_mut()
                    };
                    let call = TileCall {
                        px: xt,
                        pw,
                        steps,
                        acc: at,
                        first: k0 == 0,
                        out: dst,
                        ld: rows,
                    };
                    T::tile(r, &call);
                }
            }
            if direct {
                continue;
            }
            for i in c0..c1 {
                let dst = out.add(i * rows + j0);
                let a = acc.add((i - c0) * nr);
                for j in 0..nr.min(r1 - j0) {
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
