//! Lossless widening of formats that have no kernels of their own to one that does: Q5_0's
//! 5-bit values (`q - 16`, in -16..=15) with their f16 scale are exactly a Q8_0 block with the
//! same scale, so a Q5_0 matrix runs on the Q8_0 kernels (row tiles and prefill GEMM) with the
//! same dequantized values and the same integer dot products. The cost is memory: 34 bytes a
//! block instead of 22.

use super::blocks::{BlockQ5_0, BlockQ8_0};
use crate::storage::{AlignedBytes, WeightData};
use crate::{DType, QMatrix};
use std::sync::Arc;

/// Q5_0 blocks as Q8_0 blocks of the same values.
pub fn q5_0_to_q8_0(blocks: &[BlockQ5_0]) -> Vec<BlockQ8_0> {
    blocks
        .iter()
        .map(|b| BlockQ8_0 {
            d: b.d,
            qs: b.values(),
        })
        .collect()
}

/// `m` widened to a format the kernels multiply, when it is stored in one they do not (Q5_0
/// → Q8_0); `None` when it needs no widening.
pub fn widened(m: &QMatrix) -> Option<QMatrix> {
    match m.dtype {
        DType::Q5_0 => {
            let blocks: &[BlockQ5_0] = bytemuck::cast_slice(m.data.bytes());
            let wide = q5_0_to_q8_0(blocks);
            Some(QMatrix {
                layout: crate::Layout::Rows,
                dtype: DType::Q8_0,
                rows: m.rows,
                cols: m.cols,
                data: WeightData::Owned(Arc::new(AlignedBytes::from_bytes(bytemuck::cast_slice(
                    &wide,
                )))),
            })
        }
        _ => None,
    }
}
