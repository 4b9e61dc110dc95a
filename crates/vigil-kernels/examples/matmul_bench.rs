//! Times Q4_1 matmuls of one SmolLM2-135M decoder layer (q, k, v, o, gate, up, down) at a
//! given batch: `cargo run --release -p vigil-kernels --example matmul_bench -- [m] [threads]
//! [reps]`. Random weights and activations; prints GFLOP/s (2 · m · rows · cols per matmul).
//! Under `valgrind --tool=callgrind` use 1 thread and 1 rep for instruction counts.

use std::sync::Arc;
use std::time::Instant;
use vigil_kernels::matmul::matmul;
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::storage::AlignedBytes;
use vigil_kernels::{DType, QMatrix, WeightData};

/// SmolLM2-135M: hidden 576, 3 KV heads of 64, intermediate 1536.
const SHAPES: [(usize, usize); 7] = [
    (576, 576),
    (192, 576),
    (192, 576),
    (576, 576),
    (1536, 576),
    (1536, 576),
    (576, 1536),
];

/// A xorshift stream: enough randomness for timing, no extra dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

fn q4_1_matrix(rows: usize, cols: usize, seed: &mut u64) -> QMatrix {
    let nblocks = rows * cols / 32;
    let mut bytes = vec![0u8; nblocks * 20];
    for b in bytes.chunks_exact_mut(20) {
        let d = half::f16::from_f32(0.001 + (next(seed) % 1000) as f32 * 1e-5);
        let m = half::f16::from_f32(-0.01 + (next(seed) % 1000) as f32 * 2e-5);
        b[0..2].copy_from_slice(&d.to_le_bytes());
        b[2..4].copy_from_slice(&m.to_le_bytes());
        for q in &mut b[4..] {
            *q = next(seed) as u8;
        }
    }
    QMatrix {
        dtype: DType::Q4_1,
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
    let ws: Vec<QMatrix> = SHAPES
        .iter()
        .map(|&(r, c)| q4_1_matrix(r, c, &mut seed))
        .collect();
    let x: Vec<f32> = (0..m * 1536)
        .map(|_| (next(&mut seed) % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    let mut out = vec![0f32; m * 1536];
    let flop: f64 = SHAPES.iter().map(|&(r, c)| 2.0 * (m * r * c) as f64).sum();
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        for w in &ws {
            matmul(&pool, w, &x, m, &mut out);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "m={m} threads={threads}: best {:.3} ms per layer, {:.1} GFLOP/s (checksum {})",
        best * 1e3,
        flop / best / 1e9,
        out.iter().take(64).sum::<f32>()
    );
}
