//! How close a decode step's matmuls (one activation row) come to the memory's read bandwidth
//! when the weights do not fit in cache: `cargo run --release -p vigil-kernels --example
//! gemv_bandwidth -- [format] [threads] [MiB] [passes] [qwen3|smollm2] [m]`
//! (`m` activation rows: 1, decode, by default).
//!
//! Fills `MiB` of Qwen3-0.6B-shaped (or SmolLM2-135M-shaped) matrices (q/o, gate/up, down,
//! round robin) in `format` (`bf16` default, `f16`, `f32`, `q8_0`, `q4_0`, `q4_1`, `q4_k`,
//! `q5_k`, `q6_k` (Qwen3 shapes only: 256-value blocks), and `q4_0x8`,
//! `q4_1x8`, `q4_kx8`, `q5_kx8` interleaved as loaded), then runs one activation row through every matrix
//! in turn, as a decode step does, and prints the weight bytes read per second (best pass)
//! beside a plain read of the same bytes, matrix by matrix (every thread summing its own slice,
//! `plain_read::sum_on`). The matrices
//! lie in one buffer in huge pages, as a loaded checkpoint's do.

use std::sync::Arc;
use std::time::Instant;
use vigil_kernels::matmul::matmul;
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::storage::{resident_copy, AlignedBytes};
use vigil_kernels::{DType, QMatrix, WeightData};

const QWEN3_SHAPES: [(usize, usize); 3] = [(1024, 1024), (3072, 1024), (1024, 3072)];
/// SmolLM2-135M's: q/o, gate/up, down.
const SMOLLM2_SHAPES: [(usize, usize); 3] = [(576, 576), (1536, 576), (576, 1536)];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let format = args.get(1).map_or("bf16", |s| s.as_str());
    // `q4_0x8`, `q4_1x8`: interleaved as the loader stores them (`quant::interleave`).
    let interleave = format.ends_with("x8");
    let dtype = match format.trim_end_matches("x8") {
        "f16" => DType::F16,
        "f32" => DType::F32,
        "q8_0" => DType::Q8_0,
        "q4_0" => DType::Q4_0,
        "q4_1" => DType::Q4_1,
        "q4_k" => DType::Q4K,
        "q5_k" => DType::Q5K,
        "q6_k" => DType::Q6K,
        _ => DType::BF16,
    };
    let threads: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let mib: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let passes: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(5);
    let shapes = match args.get(5).map(|s| s.as_str()) {
        Some("smollm2") => SMOLLM2_SHAPES,
        _ => QWEN3_SHAPES,
    };
    if shapes
        .iter()
        .any(|&(_, cols)| cols % dtype.block_size() != 0)
    {
        eprintln!(
            "{format}: these shapes' rows are not whole {}-value blocks",
            dtype.block_size()
        );
        std::process::exit(2);
    }
    // Activation rows: 1 for decode; more times the prefill GEMM on weights from memory.
    let m: usize = args.get(6).and_then(|s| s.parse().ok()).unwrap_or(1);
    let pool = ThreadPool::new(threads);

    let mut mats = Vec::new();
    let mut total = 0usize;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    while total < mib << 20 {
        let (rows, cols) = shapes[mats.len() % shapes.len()];
        let bytes = rows * cols / dtype.block_size() * dtype.type_size();
        let mut data = vec![0u8; bytes];
        for (k, b) in data.iter_mut().enumerate() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Small finite values in every float format; Q8_0 scales stay small too.
            *b = if k % 2 == 1 { 0x3c } else { seed as u8 };
        }
        total += bytes;
        let w = QMatrix::new(
            dtype,
            rows,
            cols,
            WeightData::Owned(Arc::new(AlignedBytes::from_bytes(&data))),
        );
        let x8 = interleave.then(|| vigil_kernels::quant::interleave::interleaved(&w));
        mats.push(x8.flatten().unwrap_or(w));
    }
    // Into one buffer in huge pages, as the loader places a checkpoint's weights
    // (`storage::resident_copy`): from 4 KiB pages the reads are slower and differently so.
    let mut offsets = Vec::new();
    let mut len = 0;
    for w in &mats {
        offsets.push(len);
        len = (len + w.data.bytes().len()).next_multiple_of(64);
    }
    let parts: Vec<(usize, &[u8])> = offsets
        .iter()
        .zip(&mats)
        .map(|(&at, w)| (at, w.data.bytes()))
        .collect();
    let map = Arc::new(resident_copy(len, &parts).expect("anonymous memory for the weights"));
    drop(parts);
    for (w, &offset) in mats.iter_mut().zip(&offsets) {
        let len = w.data.bytes().len();
        w.data = WeightData::Mapped {
            map: map.clone(),
            offset,
            len,
        };
    }
    let x: Vec<f32> = (0..3072 * m)
        .map(|k| ((k % 17) as f32 - 8.0) * 0.01)
        .collect();
    let mut out = vec![0f32; 3072 * m];
    let mut best = f64::MAX;
    for _ in 0..passes {
        let t = Instant::now();
        for w in &mats {
            matmul(&pool, w, &x[..m * w.cols], m, &mut out[..m * w.rows]);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    // The same bytes read plainly: each thread sums its share of every matrix.
    let mut read_best = f64::MAX;
    for _ in 0..passes {
        let t = Instant::now();
        for w in &mats {
            std::hint::black_box(vigil_kernels::plain_read::sum_on(&pool, &[w.data.bytes()]));
        }
        read_best = read_best.min(t.elapsed().as_secs_f64());
    }
    let gb = total as f64 / 1e9;
    if m > 1 {
        let flop: f64 = mats
            .iter()
            .map(|w| 2.0 * (m * w.rows * w.cols) as f64)
            .sum();
        println!("m={m}: {:.1} GFLOP/s", flop / best / 1e9);
    }
    println!(
        "{format} {} matrices, {:.0} MiB, threads={threads}: matmul {:.1} GB/s, plain read {:.1} GB/s ({:.0} %)",
        mats.len(),
        total as f64 / (1 << 20) as f64,
        gb / best,
        gb / read_best,
        100.0 * read_best / best
    );
}
