//! TEMPORARY dequantizing matmul stand-in (replaced by the kernels work).
use crate::pool::ThreadPool;
use crate::QMatrix;
pub fn matmul(_pool: &ThreadPool, w: &QMatrix, x: &[f32], m: usize, out: &mut [f32]) {
    let mut row = vec![0f32; w.cols];
    for j in 0..w.rows {
        crate::quant::dequant::dequantize_row(w, j, &mut row);
        for i in 0..m {
            out[i * w.rows + j] = x[i * w.cols..(i + 1) * w.cols].iter().zip(&row).map(|(a, b)| a * b).sum();
        }
    }
}
