//! Times the matmuls of one decoder layer at a given batch: `cargo run --release -p
//! vigil-kernels --example matmul_bench -- [m] [threads] [reps] [format]`.
//!
//! `format` picks the weights and the model whose shapes they take: `q4_1` (the default) and
//! `q4_0` time SmolLM2-135M's q, k, v, o, gate, up and down (`q4_1x8`, `q4_0x8`: interleaved
//! as the loader stores them); `q8_0` (`q8_0x8`), `bf16` (`bf16x8`; `bf16p` packed), `f16` and `f32`
//! time Qwen3-0.6B's distinct projection shapes; `q8_0_output` SmolLM2's Q8_0 output
//! projection (`q8_0_outputx8` interleaved); `q4_k`, `q5_k` (`q4_kx8`, `q5_kx8` interleaved) and
//! `q6_k` Gemma 3 270M's k-quant ones
//! (its Q4_K_M file's attention output and down projection). Random weights and activations; prints the
//! best time and GFLOP/s (2 · m · rows · cols) per shape and for the layer. Under `valgrind
//! --tool=callgrind` use 1 thread and 1 rep for instruction counts.

use std::sync::Arc;
use std::time::Instant;
use vigil_kernels::matmul::matmul;
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::storage::AlignedBytes;
use vigil_kernels::{DType, QMatrix, WeightData};

/// SmolLM2-135M (hidden 576, 3 KV heads of 64, intermediate 1536): (rows, cols) of q, k, v,
/// o, gate, up, down.
const SMOLLM2: [(usize, usize); 7] = [
    (576, 576),
    (192, 576),
    (192, 576),
    (576, 576),
    (1536, 576),
    (1536, 576),
    (576, 1536),
];

/// Qwen3-0.6B (hidden 1024, intermediate 3072): attention output / q, MLP gate and up, MLP down.
const QWEN3_0_6B: [(usize, usize); 3] = [(1024, 1024), (3072, 1024), (1024, 3072)];

/// SmolLM2-135M's output projection (vocabulary 49,152 × hidden 576): its Q8_0 token
/// embedding, tied.
const SMOLLM2_OUTPUT: [(usize, usize); 1] = [(49152, 576)];

/// Gemma 3 270M (hidden 640, 4 heads of 256, intermediate 2048): attention output and MLP
/// down, the projections its Q4_K_M file stores as Q4_K / Q6_K (the others' 640 columns are
/// not a whole number of 256-value super-blocks).
const GEMMA3_270M_K: [(usize, usize); 2] = [(640, 1024), (640, 2048)];

/// A xorshift stream: enough randomness for timing, no extra dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A value in [lo, lo + 1000 · step), as small random scales and weights.
fn uniform(seed: &mut u64, lo: f32, step: f32) -> f32 {
    lo + (next(seed) % 1000) as f32 * step
}

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// The bytes of one random block (quantized formats) or element (float formats).
fn random_element(dtype: DType, seed: &mut u64, out: &mut [u8]) {
    match dtype {
        DType::Q4_0 | DType::Q4_1 | DType::Q8_0 => {
            out[0..2].copy_from_slice(&f16_bytes(uniform(seed, 0.001, 1e-5)));
            let quants = if dtype == DType::Q4_1 {
                out[2..4].copy_from_slice(&f16_bytes(uniform(seed, -0.01, 2e-5)));
                &mut out[4..]
            } else {
                &mut out[2..]
            };
            for q in quants {
                *q = match dtype {
                    // -127..=127, as a quantizer produces.
                    DType::Q8_0 => ((next(seed) % 255) as i32 - 127) as i8 as u8,
                    _ => next(seed) as u8,
                };
            }
        }
        DType::Q4K | DType::Q5K | DType::Q6K => {
            // Random quants and sub-block scales (and mins), realistic super-block scales.
            for q in out.iter_mut() {
                *q = next(seed) as u8;
            }
            let d = f16_bytes(uniform(seed, 0.0001, 1e-6));
            if dtype == DType::Q6K {
                out[208..210].copy_from_slice(&d);
            } else {
                out[0..2].copy_from_slice(&d);
                out[2..4].copy_from_slice(&f16_bytes(uniform(seed, 0.0001, 1e-6)));
            }
        }
        DType::F32 => out.copy_from_slice(&uniform(seed, -0.05, 1e-4).to_le_bytes()),
        DType::F16 => out.copy_from_slice(&f16_bytes(uniform(seed, -0.05, 1e-4))),
        DType::BF16 => {
            out.copy_from_slice(&half::bf16::from_f32(uniform(seed, -0.05, 1e-4)).to_le_bytes())
        }
        other => unreachable!("no random {other:?} weights (checked in main)"),
    }
}

fn random_matrix(dtype: DType, rows: usize, cols: usize, seed: &mut u64) -> QMatrix {
    let (block, bytes) = (dtype.block_size(), dtype.type_size());
    let mut data = vec![0u8; rows * cols / block * bytes];
    for element in data.chunks_exact_mut(bytes) {
        random_element(dtype, seed, element);
    }
    QMatrix {
        layout: vigil_kernels::Layout::Rows,
        dtype,
        rows,
        cols,
        data: WeightData::Owned(Arc::new(AlignedBytes::from_bytes(&data))),
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
    let format = std::env::args().nth(4).unwrap_or_else(|| "q4_1".into());
    // `q4_0x8`, `q4_1x8`, `q8_0x8`, `q8_0_outputx8`: interleaved as the loader stores them
    // (`quant::interleave`).
    let interleave = format.ends_with("x8");
    // `bf16p`: BF16 packed into 12 bits a value, as the loader stores it (`quant::packed_bf16`).
    let pack = format == "bf16p";
    let (dtype, shapes): (DType, &[(usize, usize)]) = match format.trim_end_matches(['x', '8', 'p'])
    {
        "q4_1" => (DType::Q4_1, &SMOLLM2),
        "q4_0" => (DType::Q4_0, &SMOLLM2),
        "q8_0" => (DType::Q8_0, &QWEN3_0_6B),
        "q8_0_output" => (DType::Q8_0, &SMOLLM2_OUTPUT),
        "bf16" => (DType::BF16, &QWEN3_0_6B),
        "f16" => (DType::F16, &QWEN3_0_6B),
        "f32" => (DType::F32, &QWEN3_0_6B),
        "q4_k" => (DType::Q4K, &GEMMA3_270M_K),
        "q5_k" => (DType::Q5K, &GEMMA3_270M_K),
        "q6_k" => (DType::Q6K, &GEMMA3_270M_K),
        other => {
            eprintln!(
                "format {other:?}: expected q4_1, q4_0, q8_0, q8_0_output (x8: interleaved), q4_k, q5_k, q6_k, bf16 (bf16p: packed), f16 or f32"
            );
            std::process::exit(2);
        }
    };
    let pool = ThreadPool::new(threads);
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let widest = shapes.iter().map(|&(r, c)| r.max(c)).max().unwrap_or(0);
    let x: Vec<f32> = (0..m * widest)
        .map(|_| uniform(&mut seed, -1.0, 2e-3))
        .collect();
    let mut out = vec![0f32; m * widest];
    let (mut layer_s, mut layer_flop) = (0.0, 0.0);
    for &(rows, cols) in shapes {
        let mut w = random_matrix(dtype, rows, cols, &mut seed);
        if interleave {
            w = vigil_kernels::quant::interleave::interleaved(&w).unwrap_or(w);
        }
        if pack {
            w = vigil_kernels::quant::packed_bf16::packed(&w).expect("packable BF16 weights");
        }
        let mut best = f64::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            matmul(&pool, &w, &x, m, &mut out);
            best = best.min(t.elapsed().as_secs_f64());
        }
        let flop = 2.0 * (m * rows * cols) as f64;
        (layer_s, layer_flop) = (layer_s + best, layer_flop + flop);
        println!(
            "{format} {rows}x{cols} m={m} threads={threads}: best {:.3} ms, {:.1} GFLOP/s (checksum {})",
            best * 1e3,
            flop / best / 1e9,
            out.iter().take(64).sum::<f32>()
        );
    }
    println!(
        "{format} m={m} threads={threads}: best {:.3} ms per layer, {:.1} GFLOP/s",
        layer_s * 1e3,
        layer_flop / layer_s / 1e9
    );
}
