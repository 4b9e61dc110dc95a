//! TEMPORARY float-only stand-in (replaced by the formats work).
use crate::{DType, QMatrix};
pub fn dequantize_row(m: &QMatrix, row: usize, out: &mut [f32]) {
    let rb = m.row(row);
    match m.dtype {
        DType::F32 => out.iter_mut().zip(rb.chunks_exact(4)).for_each(|(r, c)| *r = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        DType::BF16 => out.iter_mut().zip(rb.chunks_exact(2)).for_each(|(r, c)| *r = half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        DType::F16 => out.iter_mut().zip(rb.chunks_exact(2)).for_each(|(r, c)| *r = half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
        _ => unimplemented!(),
    }
}
