//! The repacked-weight GEMM kernels that `matmul` picks on this CPU, for Q4_0 / Q4_1 / Q8_0
//! (`quant::dot::avx2_gemm` and `avx2_gemm_q8`, `vnni_gemm` or `avx512_gemm`) and Q4_K / Q6_K
//! (`avx2_kgemm` or `avx512_kgemm`; each level is also tested on purpose in `matmul_isa`),
//! used from 4 activation rows on (Q4_K: 8, Q6_K: 16), against the scalar path, bit for bit: random shapes with
//! ragged edges (weight rows not a multiple of 8 or 16, activation rows not a multiple of the
//! tile or the 128-row chunk), 1 and 2 threads, and the largest integer block dots the i16
//! partial sums must hold.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use vigil_kernels::matmul::{matmul, matmul_scalar};
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::storage::AlignedBytes;
use vigil_kernels::{DType, QMatrix, WeightData};

/// The weight formats with a repacked-weight GEMM kernel.
const GEMM_DTYPES: [DType; 5] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q4K,
    DType::Q6K,
];

fn matrix(dtype: DType, rows: usize, cols: usize, bytes: Vec<u8>) -> QMatrix {
    assert_eq!(
        bytes.len(),
        rows * cols / dtype.block_size() * dtype.type_size()
    );
    QMatrix {
        layout: vigil_kernels::Layout::Rows,
        dtype,
        rows,
        cols,
        data: WeightData::Owned(Arc::new(AlignedBytes::from_bytes(&bytes))),
    }
}

/// Random quants (Q8_0: any byte, -128 included) with f16 scales (and Q4_1 mins) of realistic
/// size; `fill` overrides quants.
fn weights(
    rng: &mut ChaCha8Rng,
    dtype: DType,
    rows: usize,
    cols: usize,
    fill: Option<u8>,
) -> QMatrix {
    let bs = dtype.type_size();
    let mut bytes = vec![0u8; rows * cols / dtype.block_size() * bs];
    rng.fill(&mut bytes[..]);
    // Where the f16 scale (and min) sit; the rest are quants and, for the k-quants, the
    // sub-block scales (and mins), which `fill` overrides too.
    let (scale_at, min_at, quants) = match dtype {
        DType::Q4_1 | DType::Q4K => (0, Some(2), 4..bs),
        DType::Q6K => (208, None, 0..208),
        _ => (0, None, 2..bs),
    };
    for b in bytes.chunks_exact_mut(bs) {
        if let Some(q) = fill {
            b[quants.clone()].fill(q);
        }
        let d = half::f16::from_f32(rng.random_range(0.001f32..0.02));
        b[scale_at..scale_at + 2].copy_from_slice(&d.to_le_bytes());
        if let Some(at) = min_at {
            let m = half::f16::from_f32(rng.random_range(-0.02f32..0.02));
            b[at..at + 2].copy_from_slice(&m.to_le_bytes());
        }
    }
    matrix(dtype, rows, cols, bytes)
}

fn check(pool: &ThreadPool, w: &QMatrix, x: &[f32], m: usize, what: &str) {
    let mut fast = vec![f32::NAN; m * w.rows];
    let mut slow = vec![f32::NAN; m * w.rows];
    matmul(pool, w, x, m, &mut fast);
    matmul_scalar(w, x, m, &mut slow);
    for k in 0..m * w.rows {
        assert_eq!(
            fast[k].to_bits(),
            slow[k].to_bits(),
            "{what}: {} m={m} rows={} cols={} out[{k}] (row {}, col {}): {} vs {}",
            w.dtype,
            w.rows,
            w.cols,
            k / w.rows,
            k % w.rows,
            fast[k],
            slow[k]
        );
    }
}

#[test]
fn random_shapes_match_scalar_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for dtype in GEMM_DTYPES {
        for &m in &[4usize, 5, 7, 8, 63, 64, 65, 133] {
            for pool in &pools {
                let rows = rng.random_range(1..70);
                let cols = match dtype.block_size() {
                    32 => 32 * rng.random_range(1..=20),
                    bs => bs * rng.random_range(1..=5),
                };
                let w = weights(&mut rng, dtype, rows, cols, None);
                let x: Vec<f32> = (0..m * cols)
                    .map(|_| rng.random_range(-3.0f32..3.0))
                    .collect();
                check(pool, &w, &x, m, "random");
            }
        }
    }
}

#[test]
fn model_shapes_match_scalar_bit_for_bit() {
    // SmolLM2-135M's down projection (48 blocks a row), Gemma 3 270M's (2048 → 640) and
    // attention output (1024 → 640), and a ragged row count split across both threads, with
    // batches that are not a multiple of the tile, one longer than a 128-row chunk.
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let pool = ThreadPool::new(2);
    for dtype in GEMM_DTYPES {
        let shapes: &[(usize, usize, usize)] = if dtype.block_size() == 32 {
            &[(576, 1536, 37), (203, 576, 70)]
        } else {
            &[(640, 2048, 37), (640, 1024, 140), (203, 768, 70)]
        };
        for &(rows, cols, m) in shapes {
            let w = weights(&mut rng, dtype, rows, cols, None);
            let mut x: Vec<f32> = (0..m * cols)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            // Zero blocks (scale 0) in one row.
            x[3 * cols..3 * cols + 64].fill(0.0);
            check(&pool, &w, &x, m, "model shape");
        }
    }
}

#[test]
fn extreme_block_dots_are_exact() {
    // All weight nibbles 15 against activations that quantize to ±127 (and a -127/127 mix):
    // each row's i16 partial sums reach 8 · 2 · 15 · 127 = 30480, the most they must hold.
    // Q8_0: all weights -128 (or ±127), whose pair sums reach 2 · 128 · 127 = 32512.
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let pool = ThreadPool::new(2);
    for dtype in GEMM_DTYPES {
        let fills: &[u8] = match dtype {
            DType::Q8_0 => &[0x80, 0x7F, 0x81],
            // Every scale and min 63 (or 15), quants 15 or 0 / 15.
            DType::Q4K => &[0xFF, 0x3F, 0xF0],
            // Scales -1, -128, 127; quants 31 (-32 + 63), and mixes.
            DType::Q6K => &[0xFF, 0x80, 0x7F],
            _ => &[0xFF, 0x0F, 0x00],
        };
        for &q in fills {
            // 17 activation rows: past every format's GEMM threshold, one row left over.
            let (rows, cols, m) = (16, 256, 17);
            let w = weights(&mut rng, dtype, rows, cols, Some(q));
            let x: Vec<f32> = (0..m * cols)
                .map(|k| match (k / cols) % 3 {
                    0 => 1.5,
                    1 => -2.0,
                    _ => {
                        if k % 2 == 0 {
                            4.0
                        } else {
                            -4.0
                        }
                    }
                })
                .collect();
            check(&pool, &w, &x, m, "extreme");
        }
    }
}

#[test]
fn rows_do_not_depend_on_batch_position() {
    // A row's outputs alone (decode kernel), in a 4-row tile, and in the 1-row remainder tile.
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let pool = ThreadPool::new(2);
    for dtype in GEMM_DTYPES {
        let (rows, cols) = (45, if dtype.block_size() == 32 { 320 } else { 512 });
        let w = weights(&mut rng, dtype, rows, cols, None);
        let row: Vec<f32> = (0..cols).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let mut alone = vec![0f32; rows];
        matmul(&pool, &w, &row, 1, &mut alone);
        for (m, at) in [
            (4usize, 2usize),
            (5, 4),
            (9, 8),
            (17, 16),
            (70, 65),
            (70, 3),
        ] {
            let mut x: Vec<f32> = (0..m * cols)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            x[at * cols..(at + 1) * cols].copy_from_slice(&row);
            let mut out = vec![0f32; m * rows];
            matmul(&pool, &w, &x, m, &mut out);
            let got: Vec<u32> = out[at * rows..(at + 1) * rows]
                .iter()
                .map(|v| v.to_bits())
                .collect();
            let want: Vec<u32> = alone.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{dtype}: row at {at} of {m} vs alone");
        }
    }
}
