//! Q5_0 runs on the Q8_0 kernels after a lossless widening: the widened blocks dequantize to
//! the same values bit for bit, and a Q5_0 matrix multiplies exactly as its widened copy.

use vigil_kernels::pool::ThreadPool;
use vigil_kernels::quant::blocks::BlockQ5_0;
use vigil_kernels::quant::dequant::dequantize;
use vigil_kernels::quant::widen::{q5_0_to_q8_0, widened};
use vigil_kernels::storage::{AlignedBytes, WeightData};
use vigil_kernels::{matmul, DType, QMatrix};

fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../../tests/fixtures/dequant/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn widened_blocks_hold_the_same_values() {
    let bytes = fixture("random_q5_0.in.bin");
    let blocks: Vec<BlockQ5_0> = bytemuck::pod_collect_to_vec(&bytes);
    let wide = q5_0_to_q8_0(&blocks);
    let n = blocks.len() * 32;
    let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
    dequantize(DType::Q5_0, &bytes, &mut a).unwrap();
    dequantize(DType::Q8_0, bytemuck::cast_slice(&wide), &mut b).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b));
}

#[test]
fn a_q5_0_matrix_multiplies_as_its_widened_copy() {
    // 256 blocks = 32 rows of 256 columns.
    let bytes = fixture("random_q5_0.in.bin");
    let (rows, cols) = (32, 256);
    let w = QMatrix {
        layout: vigil_kernels::Layout::Rows,
        dtype: DType::Q5_0,
        rows,
        cols,
        data: WeightData::Owned(std::sync::Arc::new(AlignedBytes::from_bytes(&bytes))),
    };
    let wide = widened(&w).expect("Q5_0 widens");
    assert_eq!(wide.dtype, DType::Q8_0);
    let pool = ThreadPool::new(2);
    for m in [1usize, 3, 9] {
        let x: Vec<f32> = (0..m * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let (mut a, mut b) = (vec![0f32; m * rows], vec![0f32; m * rows]);
        matmul::matmul(&pool, &w, &x, m, &mut a);
        matmul::matmul(&pool, &wide, &x, m, &mut b);
        assert_eq!(a, b, "m = {m}");
        assert!(a.iter().all(|v| v.is_finite()));
    }
}
