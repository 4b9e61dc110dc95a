//! TEMPORARY float-only matmul stand-in (replaced by the kernels work).
use crate::pool::ThreadPool;
use crate::{DType, QMatrix};
pub fn matmul(_pool: &ThreadPool, w: &QMatrix, x: &[f32], m: usize, out: &mut [f32]) {
    let bytes = w.data.bytes();
    let mut row = vec![0f32; w.cols];
    for j in 0..w.rows {
        let rb = &bytes[j * w.row_bytes()..(j + 1) * w.row_bytes()];
        match w.dtype {
            DType::F32 => row.iter_mut().zip(rb.chunks_exact(4)).for_each(|(r, c)| *r = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::BF16 => row.iter_mut().zip(rb.chunks_exact(2)).for_each(|(r, c)| *r = half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            DType::F16 => row.iter_mut().zip(rb.chunks_exact(2)).for_each(|(r, c)| *r = half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
            _ => unimplemented!(),
        }
        for i in 0..m {
            out[i * w.rows + j] = x[i * w.cols..(i + 1) * w.cols].iter().zip(&row).map(|(a, b)| a * b).sum();
        }
    }
}
