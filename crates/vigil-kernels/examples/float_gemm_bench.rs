//! Times BF16 and F16 matmuls of Qwen3-0.6B's projection shapes (hidden 1024, intermediate
//! 3072) at a given batch: `cargo run --release -p vigil-kernels --example float_gemm_bench --
//! [m] [threads] [reps]`. Random weights and activations; prints the best wall time and
//! GFLOP/s per shape, and the best process CPU time (all threads): on a shared machine the CPU
//! time does not count the slices the OS gave to other processes.

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

/// A value in -0.1..0.1, the size of a trained projection weight.
fn weight(seed: &mut u64) -> f32 {
    ((next(seed) % 2001) as f32 - 1000.0) * 1e-4
}

fn float_matrix(dtype: DType, rows: usize, cols: usize, seed: &mut u64) -> QMatrix {
    let mut bytes = Vec::with_capacity(rows * cols * 2);
    for _ in 0..rows * cols {
        let v = weight(seed);
        match dtype {
            DType::F16 => bytes.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            _ => bytes.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
        }
    }
    QMatrix {
        dtype,
        rows,
        cols,
        data: WeightData::Owned(Arc::new(AlignedBytes::from_bytes(&bytes))),
    }
}

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// Seconds of CPU time this process has used, all threads (Linux `CLOCK_PROCESS_CPUTIME_ID`).
fn cpu_seconds() -> f64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { clock_gettime(2, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime failed");
    ts.sec as f64 + ts.nsec as f64 * 1e-9
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
    for (name, dtype) in [("bf16", DType::BF16), ("f16", DType::F16)] {
        for (rows, cols) in SHAPES {
            let w = float_matrix(dtype, rows, cols, &mut seed);
            let (mut best, mut best_cpu) = (f64::MAX, f64::MAX);
            for _ in 0..reps {
                let (t, c) = (Instant::now(), cpu_seconds());
                matmul(&pool, &w, &x, m, &mut out);
                best = best.min(t.elapsed().as_secs_f64());
                best_cpu = best_cpu.min(cpu_seconds() - c);
            }
            let flop = 2.0 * (m * rows * cols) as f64;
            println!(
                "{name} {rows}x{cols} m={m} threads={threads}: best {:.3} ms, {:.1} GFLOP/s, cpu {:.3} ms (checksum {})",
                best * 1e3,
                flop / best / 1e9,
                best_cpu * 1e3,
                out.iter().take(64).sum::<f32>()
            );
        }
    }
}
