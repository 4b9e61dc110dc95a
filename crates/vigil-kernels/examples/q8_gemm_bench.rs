//! Times Q8_0 matmuls of Qwen3-0.6B's projection shapes (hidden 1024, intermediate 3072) at a
//! given batch: `cargo run --release -p vigil-kernels --example q8_gemm_bench -- [m] [threads]
//! [reps]`. Random weights and activations; prints the best time and GFLOP/s per shape.

use std::sync::Arc;
use std::time::Instant;
use vigil_kernels::matmul::matmul;
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::storage::AlignedBytes;
use vigil_kernels::{DType, QMatrix, WeightData};

/// (rows, cols): attention output / q, MLP gate and up, MLP down.
const SHAPES: [(usize, usize); 3] = [(1024, 1024), (3072, 1024), (1024, 3072)];

/// A xorshift stream: enough randomness for timing, no extra dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn q8_0_matrix(rows: usize, cols: usize, seed: &mut u64) -> QMatrix {
    let mut bytes = vec![0u8; rows * cols / 32 * 34];
    for b in bytes.chunks_exact_mut(34) {
        let d = half::f16::from_f32(0.001 + (next(seed) % 1000) as f32 * 1e-5);
        b[0..2].copy_from_slice(&d.to_le_bytes());
        for q in &mut b[2..] {
            // -127..=127, as a quantizer produces.
            *q = ((next(seed) % 255) as i32 - 127) as i8 as u8;
        }
    }
    QMatrix {
        dtype: DType::Q8_0,
        rows,
        cols,
        data: WeightData::Owned(Arc::new(AlignedBytes::from_bytes(&bytes))),
    }
}

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (m, threads, reps) = (arg(1, 512), arg(2, 2), arg(3, 5));
    let pool = ThreadPool::new(threads);
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let x: Vec<f32> = (0..m * 3072)
        .map(|_| (next(&mut seed) % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    let mut out = vec![0f32; m * 3072];
    for (rows, cols) in SHAPES {
        let w = q8_0_matrix(rows, cols, &mut seed);
        let mut best = f64::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            matmul(&pool, &w, &x, m, &mut out);
            best = best.min(t.elapsed().as_secs_f64());
        }
        let flop = 2.0 * (m * rows * cols) as f64;
        println!(
            "q8_0 {rows}x{cols} m={m} threads={threads}: best {:.3} ms, {:.1} GFLOP/s (checksum {})",
            best * 1e3,
            flop / best / 1e9,
            out.iter().take(64).sum::<f32>()
        );
    }
}
