//! `out = x · Wᵀ` for every weight format: activations `x` (`m` rows × `w.cols`) times a weight
//! matrix `w` (`w.rows` × `w.cols`), giving `m` rows × `w.rows`.
//!
//! Activations are quantized once per call to the format the weights pair with (as ggml:
//! Q4_0, Q8_0 → Q8_0; Q4_1 → Q8_1; k-quants → Q8_K; float weights stay f32) into a reused
//! per-thread scratch. The weight rows (output columns) are then split across the pool's
//! threads, so each thread streams its own part of the weights once: in decode that is the
//! whole cost; in prefill each loaded weight block serves a tile of activation rows.
//!
//! Determinism: each output element is reduced in a fixed order (see `quant::dot`) that does
//! not depend on `m`, on the other rows of `x`, on the thread split or on the tile shape.

mod acts;
mod paths;

use crate::cpu::{self, Isa};
use crate::pool::SyncPtr;
use crate::pool::ThreadPool;
use crate::quant::blocks::*;
use crate::quant::packed_bf16::PackedBf16;
use crate::{DType, Layout, QMatrix};
use acts::{Quantizer, Scratch};
use paths::{
    rows_32, rows_float, rows_k, rows_packed_bf16, rows_q4k_x8, rows_q5k_x8, rows_x8, Q4KFmt,
    Q4_0Fmt, Q4_1Fmt, Q5KFmt, Q6KFmt, Q8_0Fmt,
};
use std::cell::RefCell;

/// Weight rows are split between threads in multiples of this (the decode tile's width).
const ROW_ALIGN: usize = 8;
/// From this many activation rows, Q4_0 / Q4_1 / Q8_0 use the repacked-weight GEMM kernels
/// (`avx2_gemm`, `avx2_gemm_q8`, `vnni_gemm`, `avx512_gemm`), Q4_K / Q6_K theirs
/// (`avx2_kgemm`, `avx512_kgemm`); below it (decode), the row tiles that stream the weights in
/// place.
const GEMM_MIN_ROWS: usize = 4;
/// From this many, where `cpu::amx_int8` allows, the Q8_0 GEMM takes its integer dots on AMX
/// tiles (`amx_gemm`), whose tiles are 16 activation rows (fewer run on `avx512_gemm`'s
/// tiles, one row at a time).
const AMX_MIN_ROWS: usize = 16;
/// The same for row-major Q4_K and Q6_K (`avx2_kgemm`, `avx512_kgemm`), whose packing is 8
/// rows at a time in registers (`kgemm_pack`; it was word by word, and these were 8 and 16).
/// Gemma 3 270M's shapes (640 × 1024 and 640 × 2048), one thread, 2 rounds, the row tiles
/// against the GEMM per layer: at 3 rows Q4_K 0.183 against 0.124–0.128 ms on AVX-512 and
/// 0.161–0.181 against 0.144–0.163 held to AVX2, Q6_K 0.207–0.212 against 0.166–0.168 and
/// 0.226–0.246 against 0.143–0.161; at 2 rows Q6_K 0.139–0.142 against 0.144–0.152 on
/// AVX-512; at 8 rows Q6_K 0.435–0.447 against 0.176–0.251 (`docs/benchmarks.md`).
const Q4K_GEMM_MIN_ROWS: usize = 3;
const Q6K_GEMM_MIN_ROWS: usize = 3;
/// The same for Q5_K (Q4_K's tiles with the fifth bit or-ed in), against the row tiles it took
/// at every row count before: at 3 rows 0.206–0.227 ms against the GEMM's 0.176–0.178 on
/// AVX-512 but 0.225–0.226 against 0.263–0.264 held to AVX2; at 4 rows 0.242–0.246 against
/// 0.203–0.216 and 0.296–0.321 against 0.208–0.211; at 128 rows 8.1–8.4 against 1.6–1.7 and
/// 8.7–8.9 against 3.9 (`docs/results/kquant-prefill-xeon-1207/q5k-gemm.txt`).
const Q5K_GEMM_MIN_ROWS: usize = 4;
/// The same for Q4_K and Q5_K interleaved at load, whose packing copies (or unpacks) the
/// quants and unpacks the scales 8 rows at a time, against their decode tile
/// (`avx2_q4k_decode`). Gemma 3 270M's shapes, one thread, 3 rounds, at 3 rows the tile
/// against the GEMM: Q4_K 0.089-0.099 ms against 0.082-0.087 on AVX-512, 0.099-0.106 against
/// 0.088-0.099 held to AVX2; Q5_K 0.160-0.164 against 0.130-0.148 and 0.203-0.229 against
/// 0.119-0.131 (`docs/results/kquant-bytes-xeon-1207b/x8-gemm-from-3.txt`).
const K_X8_GEMM_MIN_ROWS: usize = 3;
/// From this many activation rows the AVX-512 Q4_K / Q5_K GEMM packs the quants as bytes
/// (`kgemm_pack::PackedK4B`), below it as stored (the AVX2 GEMM always as bytes). Gemma 3
/// 270M's shapes, one thread, quants as stored against bytes, per layer: Q4_K interleaved at 32
/// rows 0.375–0.378 ms against 0.379–0.393, at 64 rows 0.713–0.734 against 0.704–0.738, at 128
/// 1.35–1.48 against 1.29–1.34; Q5_K at 16 rows 0.248–0.261 against 0.289–0.305, at 24
/// 0.378–0.386 against 0.350–0.374, at 128 1.61–1.73 against 1.35–1.49.
const Q4K_BYTES_MIN_ROWS: usize = 64;
const Q5K_BYTES_MIN_ROWS: usize = 24;
/// The same for the float formats (`avx2_float_gemm`): widening and packing each weight block
/// pays off from about 8 rows (BF16 1024 × 1024, one thread: at 4 rows the row tiles took
/// 0.17 ms and the GEMM 0.25 ms; at 8 rows 0.34 ms and 0.28 ms).
const FLOAT_GEMM_MIN_ROWS: usize = 8;
/// Tasks per thread for the float GEMM: two, not `CHUNKS_PER_THREAD`. Every task copies all
/// `m × cols` activations into its tiles' layout afresh (`avx2_float_gemm`'s `pack_x`) and
/// starts its weight rows' prefetch anew. Qwen3-0.6B shape, BF16, pp512, 2 threads of an
/// AVX-512 Xeon, 3 alternated rounds of four / two / one tasks a thread: 298-301 / 304-308 /
/// 287-311 tok/s, and beside a CPU-bound process 151-153 / 147-157 / 129-135: with one, the
/// thread left alone cannot take over the busy one's share; with two it still takes half
/// (`docs/results/float-gemm-tasks-xeon-1206h`).
const FLOAT_GEMM_TASKS_PER_THREAD: usize = 2;
/// Below this much work (weight bytes × activation rows) the call stays on one thread.
const PARALLEL_MIN_WORK: usize = 64 * 1024;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The kernels a call runs: `Isa::Scalar` the portable ones; `Avx2` the AVX2 ones; `AvxVnni`
/// and `Avx512` the VNNI ones for the quantized formats (prefill GEMM: `vnni_gemm`,
/// `avx512_gemm`; row tiles and k-quants: the AVX2 code compiled with 256-bit VNNI, `vnni`)
/// and the AVX2 ones for the float formats.
type Path = Isa;

/// `out[i * w.rows + j] = dot(x[i * w.cols..][..w.cols], row j of w)` for `i in 0..m`,
/// on the pool's threads with the fastest kernels this CPU supports (and `cpu::features()`
/// allows).
pub fn matmul(pool: &ThreadPool, w: &QMatrix, x: &[f32], m: usize, out: &mut [f32]) {
    matmul_on(Some(pool), cpu::features().best(), w, x, m, out)
}

/// [`matmul`] on the kernels of level `isa`, whatever `VIGIL_MAX_ISA` says: for tests and
/// benchmarks that compare the paths. Quantized weights give the same bits on every level.
///
/// # Panics
/// If the CPU lacks `isa` (`cpu::detected()`).
pub fn matmul_isa(pool: &ThreadPool, isa: Isa, w: &QMatrix, x: &[f32], m: usize, out: &mut [f32]) {
    assert!(
        cpu::detected().has(isa),
        "matmul_isa: this CPU lacks {}",
        isa.name()
    );
    matmul_on(Some(pool), isa, w, x, m, out)
}

/// The portable reference path: scalar kernels, one thread. Same results as [`matmul`]
/// bit for bit for quantized weights, to float rounding for float weights.
pub fn matmul_scalar(w: &QMatrix, x: &[f32], m: usize, out: &mut [f32]) {
    matmul_on(None, Path::Scalar, w, x, m, out)
}

/// `outs[g] = x · ws[g]ᵀ` for matrices that share their input (a layer's Q, K and V
/// projections, or its gate and up): when they have one format and width, the activations are
/// quantized once and every matrix's rows go to the pool in one dispatch, instead of a
/// quantization and a dispatch per matrix. Same bits as [`matmul`] on each.
pub fn matmul_group(
    pool: &ThreadPool,
    ws: &[&QMatrix],
    x: &[f32],
    m: usize,
    outs: &mut [&mut [f32]],
) {
    matmul_group_on(Some(pool), cpu::features().best(), ws, x, m, outs)
}

/// [`matmul_group`] on the kernels of level `isa`: for tests that compare the paths.
///
/// # Panics
/// If the CPU lacks `isa` (`cpu::detected()`).
pub fn matmul_group_isa(
    pool: &ThreadPool,
    isa: Isa,
    ws: &[&QMatrix],
    x: &[f32],
    m: usize,
    outs: &mut [&mut [f32]],
) {
    assert!(
        cpu::detected().has(isa),
        "matmul_group_isa: this CPU lacks {}",
        isa.name()
    );
    matmul_group_on(Some(pool), isa, ws, x, m, outs)
}

fn matmul_group_on(
    pool: Option<&ThreadPool>,
    path: Path,
    ws: &[&QMatrix],
    x: &[f32],
    m: usize,
    outs: &mut [&mut [f32]],
) {
    assert_eq!(ws.len(), outs.len(), "matmul_group: one output per matrix");
    let Some(first) = ws.first() else { return };
    // Q5_0 is widened per call when a loader did not (`matmul_on`); those go one by one.
    let shared = (ws.iter())
        .all(|w| w.dtype == first.dtype && w.cols == first.cols && w.dtype != DType::Q5_0);
    if !shared {
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            matmul_on(pool, path, w, x, m, out);
        }
        return;
    }
    for (w, out) in ws.iter().zip(outs.iter()) {
        check_shapes(w, x, m, out);
    }
    if m == 0 {
        return;
    }
    let parts: Vec<Part> = (ws.iter().zip(outs.iter_mut()))
        .map(|(w, out)| Part {
            w,
            out: SyncPtr(out.as_mut_ptr()),
        })
        .collect();
    run_with_scratch(pool, path, &parts, x, m);
}

/// One matrix of a call and where its `m × w.rows` outputs go.
struct Part<'a> {
    w: &'a QMatrix,
    out: SyncPtr<f32>,
}

fn check_shapes(w: &QMatrix, x: &[f32], m: usize, out: &[f32]) {
    assert!(
        w.cols.is_multiple_of(w.dtype.block_size()),
        "matmul: {} columns is not a whole number of {} blocks",
        w.cols,
        w.dtype
    );
    assert!(
        x.len() >= m * w.cols,
        "matmul: x has {} values, need {m} × {}",
        x.len(),
        w.cols
    );
    assert!(
        out.len() >= m * w.rows,
        "matmul: out has {} values, need {m} × {}",
        out.len(),
        w.rows
    );
    if w.layout == Layout::PackedBf16 {
        let b = w.data.bytes();
        assert!(
            w.dtype == DType::BF16
                && w.cols.is_multiple_of(crate::quant::packed_bf16::PAIR_COLS)
                && b.len() >= 64
                && b.len() >= crate::quant::packed_bf16::packed_len(b, w.rows, w.cols),
            "matmul: {} × {} {} is not a packed BF16 matrix",
            w.rows,
            w.cols,
            w.dtype
        );
        return;
    }
    assert!(
        w.data.bytes().len() >= w.rows * w.row_bytes(),
        "matmul: weight data shorter than {} rows",
        w.rows
    );
    if w.layout == Layout::Interleaved8 {
        let float =
            w.dtype.is_float() && w.cols.is_multiple_of(crate::quant::interleave::FLOAT_CHUNK);
        assert!(
            matches!(
                w.dtype,
                DType::Q4_0 | DType::Q4_1 | DType::Q8_0 | DType::Q4K | DType::Q5K
            ) || float,
            "matmul: {} × {} {} has no interleaved layout",
            w.rows,
            w.cols,
            w.dtype
        );
        #[cfg(target_arch = "x86_64")]
        assert!(
            !(w.dtype == DType::BF16 && cpu::bf16_dots()),
            "matmul: BF16 dots (VIGIL_BF16_DOTS) read BF16 matrices as rows"
        );
        assert!(
            w.data.bytes().len() >= w.rows.div_ceil(8) * 8 * w.row_bytes(),
            "matmul: interleaved weight data shorter than {} groups of 8 rows",
            w.rows.div_ceil(8)
        );
    }
}

fn run_with_scratch(pool: Option<&ThreadPool>, path: Path, parts: &[Part], x: &[f32], m: usize) {
    let work: usize = parts.iter().map(|p| p.w.rows * p.w.row_bytes() * m).sum();
    let pool = pool.filter(|p| p.num_threads() > 1 && work >= PARALLEL_MIN_WORK);
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => run(pool, path, parts, x, m, &mut scratch),
        // Re-entered from inside a task on this thread: use a fresh scratch.
        Err(_) => run(pool, path, parts, x, m, &mut Scratch::default()),
    });
}

fn matmul_on(
    pool: Option<&ThreadPool>,
    path: Path,
    w: &QMatrix,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) {
    check_shapes(w, x, m, out);
    if m == 0 || w.rows == 0 {
        return;
    }
    // Loaders widen Q5_0 once (`quant::widen`); a caller that did not pays it per call.
    if let Some(wide) = crate::quant::widen::widened(w) {
        return matmul_on(pool, path, &wide, x, m, out);
    }
    let part = Part {
        w,
        out: SyncPtr(out.as_mut_ptr()),
    };
    run_with_scratch(pool, path, &[part], x, m);
}

/// Call `f(part, r0, r1)` on disjoint, `align`-aligned ranges of each part's weight rows,
/// covering all of them, spread over the pool's threads as one dispatch of a few tasks a
/// thread (`CHUNKS_PER_THREAD`), so a thread the OS has descheduled loses only one.
fn split_rows(
    pool: Option<&ThreadPool>,
    parts: &[Part],
    align: usize,
    f: impl Fn(&Part, usize, usize) + Sync,
) {
    split_rows_in(pool, parts, align, crate::pool::CHUNKS_PER_THREAD, f)
}

/// `split_rows` in `per_thread` tasks a thread, for a kernel whose every task repeats work
/// (the float GEMM's copy of the activations).
fn split_rows_in(
    pool: Option<&ThreadPool>,
    parts: &[Part],
    align: usize,
    per_thread: usize,
    f: impl Fn(&Part, usize, usize) + Sync,
) {
    let Some(pool) = pool else {
        return parts.iter().for_each(|p| f(p, 0, p.w.rows));
    };
    // Units of `align` rows, numbered across the parts in order.
    let units: Vec<usize> = parts.iter().map(|p| p.w.rows.div_ceil(align)).collect();
    let total: usize = units.iter().sum();
    let tasks = (pool.num_threads() * per_thread.max(1)).min(total).max(1);
    pool.run(tasks, |t| {
        let (u0, u1) = (t * total / tasks, (t + 1) * total / tasks);
        let mut start = 0;
        for (p, &n) in parts.iter().zip(&units) {
            let (a, b) = (u0.max(start), u1.min(start + n));
            if a < b {
                let r0 = ((a - start) * align).min(p.w.rows);
                let r1 = ((b - start) * align).min(p.w.rows);
                f(p, r0, r1);
            }
            start += n;
        }
    });
}

/// The 8-row groups of an interleaved matrix (`quant::interleave`), `X` its group block.
fn groups_of<X: bytemuck::Pod>(w: &QMatrix) -> &[X] {
    let nb = w.cols / w.dtype.block_size();
    let bytes = &w.data.bytes()[..w.rows.div_ceil(8) * nb * std::mem::size_of::<X>()];
    bytemuck::try_cast_slice(bytes).unwrap_or_else(|e| {
        panic!(
            "matmul: interleaved {} weight data misaligned: {e}",
            w.dtype
        )
    })
}

fn blocks_of<B: bytemuck::Pod>(w: &QMatrix) -> &[B] {
    let bytes = &w.data.bytes()[..w.rows * w.row_bytes()];
    bytemuck::try_cast_slice(bytes).unwrap_or_else(|e| {
        panic!(
            "matmul: {} weight data misaligned for its block type: {e}",
            w.dtype
        )
    })
}

/// Every part shares `x`, its format and its width (`matmul_group_on` checks).
fn run(
    pool: Option<&ThreadPool>,
    path: Path,
    parts: &[Part],
    x: &[f32],
    m: usize,
    scratch: &mut Scratch,
) {
    let Some(first) = parts.first() else { return };
    let (dtype, cols) = (first.w.dtype, first.w.cols);
    let how = match path {
        Path::Scalar => Quantizer::Portable,
        _ => Quantizer::Dispatched,
    };
    let side = path != Path::Scalar;
    let shape = (m, cols);
    // The 16-row GEMM tiles (`avx512_gemm`, `avx512_kgemm`, the AVX2 Q4 one in `avx2_gemm`)
    // want 16-row thread ranges, so that only the matrix's last tile can be partial (Q5_K has
    // no GEMM: 8 is its tile).
    let align32 = if matches!(path, Path::Avx512 | Path::Avx2) && m >= GEMM_MIN_ROWS {
        16
    } else {
        ROW_ALIGN
    };
    let align_k = |min_rows| {
        if path == Path::Avx512 && m >= min_rows {
            16
        } else {
            ROW_ALIGN
        }
    };
    match dtype {
        // Widened before `run` (`matmul_on`).
        DType::Q5_0 => debug_assert!(false, "Q5_0 reaches `run` only widened"),
        DType::Q4_0 => {
            let acts = scratch.q8_0(pool, how, x, shape, side);
            split_rows(pool, parts, align32, |p, r0, r1| match p.w.layout {
                Layout::Rows => {
                    let wb = blocks_of::<BlockQ4_0>(p.w);
                    rows_32::<Q4_0Fmt>(path, wb, p.w.rows, &acts, r0, r1, p.out)
                }
                Layout::Interleaved8 => {
                    let wb = groups_of::<BlockQ4_0x8>(p.w);
                    rows_x8::<Q4_0Fmt>(path, wb, p.w.rows, &acts, r0, r1, p.out)
                }
                Layout::PackedBf16 => unreachable!("only BF16 is packed (check_shapes)"),
            });
        }
        DType::Q4_1 => {
            let acts = scratch.q8_1(pool, how, x, shape, side);
            split_rows(pool, parts, align32, |p, r0, r1| match p.w.layout {
                Layout::Rows => {
                    let wb = blocks_of::<BlockQ4_1>(p.w);
                    rows_32::<Q4_1Fmt>(path, wb, p.w.rows, &acts, r0, r1, p.out)
                }
                Layout::Interleaved8 => {
                    let wb = groups_of::<BlockQ4_1x8>(p.w);
                    rows_x8::<Q4_1Fmt>(path, wb, p.w.rows, &acts, r0, r1, p.out)
                }
                Layout::PackedBf16 => unreachable!("only BF16 is packed (check_shapes)"),
            });
        }
        DType::Q8_0 => {
            let acts = scratch.q8_0(pool, how, x, shape, side);
            split_rows(pool, parts, align32, |p, r0, r1| match p.w.layout {
                Layout::Rows => {
                    let wb = blocks_of::<BlockQ8_0>(p.w);
                    rows_32::<Q8_0Fmt>(path, wb, p.w.rows, &acts, r0, r1, p.out)
                }
                Layout::Interleaved8 => {
                    let wb = groups_of::<BlockQ8_0x8>(p.w);
                    rows_x8::<Q8_0Fmt>(path, wb, p.w.rows, &acts, r0, r1, p.out)
                }
                Layout::PackedBf16 => unreachable!("only BF16 is packed (check_shapes)"),
            });
        }
        DType::Q4K | DType::Q5K => {
            let acts = scratch.q8k(pool, how, x, shape);
            let min_rows = match (first.w.layout, first.w.dtype) {
                (Layout::Interleaved8, _) => K_X8_GEMM_MIN_ROWS,
                (_, DType::Q4K) => Q4K_GEMM_MIN_ROWS,
                _ => Q5K_GEMM_MIN_ROWS,
            };
            split_rows(pool, parts, align_k(min_rows), |p, r0, r1| {
                let (w, rows, out) = (p.w, p.w.rows, p.out);
                match (w.dtype, w.layout) {
                    (DType::Q4K, Layout::Rows) => {
                        rows_k::<Q4KFmt>(path, blocks_of(w), rows, acts, m, r0, r1, out)
                    }
                    (DType::Q4K, Layout::Interleaved8) => {
                        rows_q4k_x8(path, groups_of(w), rows, acts, m, r0, r1, out)
                    }
                    (_, Layout::Rows) => {
                        rows_k::<Q5KFmt>(path, blocks_of(w), rows, acts, m, r0, r1, out)
                    }
                    (_, Layout::Interleaved8) => {
                        rows_q5k_x8(path, groups_of(w), rows, acts, m, r0, r1, out)
                    }
                    (_, Layout::PackedBf16) => unreachable!("only BF16 is packed (check_shapes)"),
                }
            });
        }
        DType::Q6K => {
            let acts = scratch.q8k(pool, how, x, shape);
            split_rows(pool, parts, align_k(Q6K_GEMM_MIN_ROWS), |p, r0, r1| {
                let wb = blocks_of::<BlockQ6K>(p.w);
                rows_k::<Q6KFmt>(path, wb, p.w.rows, acts, m, r0, r1, p.out)
            });
        }
        #[cfg(target_arch = "x86_64")]
        DType::BF16 if path == Path::Avx512 && cpu::bf16_dots() => {
            // SAFETY: the CPU has AVX512_BF16 (checked just above) and the avx512 level.
            let xb = unsafe { scratch.bf16(pool, &x[..m * cols], shape) };
            split_rows(pool, parts, ROW_ALIGN, |p, r0, r1| {
                let (w, rows) = (p.w, p.w.rows);
                let wbytes = &w.data.bytes()[..rows * w.row_bytes()];
                // SAFETY: as above; this thread owns columns r0..r1 of the output.
                unsafe {
                    crate::quant::dot::avx512_bf16::matmul_rows(
                        wbytes, rows, cols, xb, m, r0, r1, p.out.0,
                    )
                }
            });
        }
        DType::F32 | DType::F16 | DType::BF16 => {
            let x = &x[..m * cols];
            // The SIMD paths take the GEMM from FLOAT_GEMM_MIN_ROWS rows (`paths::rows_float`).
            let per_thread = if side && m >= FLOAT_GEMM_MIN_ROWS {
                FLOAT_GEMM_TASKS_PER_THREAD
            } else {
                crate::pool::CHUNKS_PER_THREAD
            };
            split_rows_in(pool, parts, ROW_ALIGN, per_thread, |p, r0, r1| {
                let (w, rows) = (p.w, p.w.rows);
                if w.layout == Layout::PackedBf16 {
                    let packed = PackedBf16::new(w.data.bytes(), rows, cols);
                    return rows_packed_bf16(path, packed, rows, x, m, r0, r1, p.out);
                }
                let x8 = w.layout == Layout::Interleaved8;
                let stored = if x8 { rows.div_ceil(8) * 8 } else { rows };
                let wbytes = &w.data.bytes()[..stored * w.row_bytes()];
                rows_float(path, dtype, wbytes, x8, rows, cols, x, m, r0, r1, p.out)
            });
        }
    }
}
