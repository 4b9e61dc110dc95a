//! Activation quantization for one matmul call into a reused per-thread scratch, in the layout
//! the kernels read (`Acts32` side arrays `[block][row]`).

use crate::pool::{SyncPtr, ThreadPool};
use crate::quant::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_1, QK, QK_K};
use crate::quant::dot::Acts32;
use crate::quant::quantize::{
    quantize_row_q8_0, quantize_row_q8_0_scalar, quantize_row_q8_1, quantize_row_q8_1_scalar,
    quantize_row_q8_k, quantize_row_q8_k_scalar,
};
use bytemuck::Zeroable;

/// Below this many activation values, quantize on the calling thread.
const PARALLEL_QUANTIZE_MIN: usize = 32 * 1024;

/// Buffers reused across calls so decode does not allocate.
#[derive(Default)]
pub struct Scratch {
    q8_0: Vec<BlockQ8_0>,
    q8_1: Vec<BlockQ8_1>,
    q8k: Vec<BlockQ8K>,
    d: Vec<f32>,
    s: Vec<f32>,
    neg8_ysum: Vec<i32>,
    bf16: Vec<u16>,
}

/// Quantize the `m` rows of `x` (`cols` each) into `out` (`nb` blocks per row) with `q`.
fn quantize_rows<B: Send>(
    pool: Option<&ThreadPool>,
    x: &[f32],
    m: usize,
    cols: usize,
    out: &mut [B],
    q: impl Fn(&[f32], &mut [B]) + Sync,
) {
    let nb = out.len() / m;
    match pool {
        Some(pool) if m > 1 && m * cols >= PARALLEL_QUANTIZE_MIN => {
            let base = SyncPtr(out.as_mut_ptr());
            pool.run(m, |i| {
                // SAFETY: row `i` owns blocks `i*nb..(i+1)*nb` of `out`; rows are disjoint.
                let row = unsafe { std::slice::from_raw_parts_mut(base.get().add(i * nb), nb) };
                q(&x[i * cols..(i + 1) * cols], row);
            });
        }
        _ => {
            for (xr, row) in x.chunks_exact(cols).zip(out.chunks_exact_mut(nb)).take(m) {
                q(xr, row);
            }
        }
    }
}

/// Grow `v` to at least `n` items (never shrinks: the buffers are reused) and return `n`.
fn grow<T: Zeroable + Clone>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::zeroed());
    }
    &mut v[..n]
}

/// Which quantizer to run: the dispatched one (AVX2 when available) or the portable one.
/// Both produce identical blocks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Quantizer {
    Dispatched,
    Portable,
}

impl Scratch {
    /// Q8_0 activations (for Q4_0 and Q8_0 weights); `side`: also fill the tile side arrays.
    pub fn q8_0(
        &mut self,
        pool: Option<&ThreadPool>,
        how: Quantizer,
        x: &[f32],
        (m, cols): (usize, usize),
        side: bool,
    ) -> Acts32<'_, BlockQ8_0> {
        let nb = cols / QK;
        let blocks = grow(&mut self.q8_0, m * nb);
        match how {
            Quantizer::Dispatched => quantize_rows(pool, x, m, cols, blocks, quantize_row_q8_0),
            Quantizer::Portable => {
                quantize_rows(pool, x, m, cols, blocks, quantize_row_q8_0_scalar)
            }
        }
        let n_side = if side { m * nb } else { 0 };
        let d = grow(&mut self.d, n_side);
        let neg8_ysum = grow(&mut self.neg8_ysum, n_side);
        if side {
            for (i, row) in blocks.chunks_exact(nb).enumerate() {
                for (b, blk) in row.iter().enumerate() {
                    d[b * m + i] = blk.d.to_f32();
                    neg8_ysum[b * m + i] = -8 * blk.qs.iter().map(|&q| q as i32).sum::<i32>();
                }
            }
        }
        Acts32 {
            blocks,
            d,
            s: &[],
            neg8_ysum,
            m,
            nb,
        }
    }

    /// Q8_1 activations (for Q4_1 weights); `side`: also fill the tile side arrays.
    pub fn q8_1(
        &mut self,
        pool: Option<&ThreadPool>,
        how: Quantizer,
        x: &[f32],
        (m, cols): (usize, usize),
        side: bool,
    ) -> Acts32<'_, BlockQ8_1> {
        let nb = cols / QK;
        let blocks = grow(&mut self.q8_1, m * nb);
        match how {
            Quantizer::Dispatched => quantize_rows(pool, x, m, cols, blocks, quantize_row_q8_1),
            Quantizer::Portable => {
                quantize_rows(pool, x, m, cols, blocks, quantize_row_q8_1_scalar)
            }
        }
        let n_side = if side { m * nb } else { 0 };
        let d = grow(&mut self.d, n_side);
        let s = grow(&mut self.s, n_side);
        if side {
            for (i, row) in blocks.chunks_exact(nb).enumerate() {
                for (b, blk) in row.iter().enumerate() {
                    d[b * m + i] = blk.d.to_f32();
                    s[b * m + i] = blk.s.to_f32();
                }
            }
        }
        Acts32 {
            blocks,
            d,
            s,
            neg8_ysum: &[],
            m,
            nb,
        }
    }

    /// Q8_K activations (for the k-quants).
    pub fn q8k(
        &mut self,
        pool: Option<&ThreadPool>,
        how: Quantizer,
        x: &[f32],
        (m, cols): (usize, usize),
    ) -> &[BlockQ8K] {
        let blocks = grow(&mut self.q8k, m * (cols / QK_K));
        match how {
            Quantizer::Dispatched => quantize_rows(pool, x, m, cols, blocks, quantize_row_q8_k),
            Quantizer::Portable => {
                quantize_rows(pool, x, m, cols, blocks, quantize_row_q8_k_scalar)
            }
        }
        blocks
    }

    /// BF16 activations (for BF16 weights on `vdpbf16ps`): each row rounded to nearest even
    /// and zero-padded to a multiple of 32 columns (`quant::dot::avx512_bf16::round_row`).
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL and AVX512_BF16 (`cpu::avx512_bf16`).
    #[cfg(target_arch = "x86_64")]
    pub unsafe fn bf16(
        &mut self,
        pool: Option<&ThreadPool>,
        x: &[f32],
        (m, cols): (usize, usize),
    ) -> &[u16] {
        use crate::quant::dot::avx512_bf16::round_row;
        let rows = grow(&mut self.bf16, m * cols.next_multiple_of(32));
        // SAFETY: the caller checked the CPU; each row gets its padded width.
        quantize_rows(pool, x, m, cols, rows, |xr, row| unsafe {
            round_row(xr, row)
        });
        rows
    }
}
