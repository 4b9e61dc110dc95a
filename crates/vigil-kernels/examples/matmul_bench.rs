//! matmul throughput on SmolLM2-135M shapes (Q4_1 layers, Q8_0 tied embedding/output) and
//! per-format prefill GFLOP/s.
//!
//! `cargo run --release -p vigil-kernels --example matmul_bench [threads] [filter]`

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use std::time::Instant;
use vigil_kernels::matmul::matmul;
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::storage::AlignedBytes;
use vigil_kernels::{DType, QMatrix, WeightData};

fn random_matrix(rng: &mut ChaCha8Rng, dtype: DType, rows: usize, cols: usize) -> QMatrix {
    let n = rows * dtype.bytes_for(cols).unwrap();
    let mut bytes = vec![0u8; n];
    rng.fill(&mut bytes[..]);
    let bs = dtype.type_size();
    if dtype.is_quantized() {
        let d = half::f16::from_f32(0.01).to_le_bytes();
        for b in bytes.chunks_exact_mut(bs) {
            let at = if dtype == DType::Q6K { 208 } else { 0 };
            b[at..at + 2].copy_from_slice(&d);
        }
    } else if dtype == DType::F32 {
        for c in bytes.chunks_exact_mut(4) {
            c.copy_from_slice(&rng.random_range(-1.0f32..1.0).to_le_bytes());
        }
    } else {
        for c in bytes.chunks_exact_mut(2) {
            c[1] &= 0x3f; // finite, moderate values for f16 and bf16
        }
    }
    QMatrix {
        dtype,
        rows,
        cols,
        data: WeightData::Owned(Arc::new(AlignedBytes::from_bytes(&bytes))),
    }
}

/// CPU time of all this process's threads (ns), from /proc (0 where unavailable).
fn cpu_ns() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Seconds per run of `f`: the median over `samples` samples of ≥ 30 ms each, of wall time,
/// or — with `VIGIL_BENCH_CPU=1`, for a busy machine — of CPU time divided by the thread
/// count (time the threads were actually running, spin-waits included).
fn time(samples: usize, mut f: impl FnMut()) -> f64 {
    let cpu = std::env::var("VIGIL_BENCH_CPU").is_ok_and(|v| v == "1");
    let threads = THREADS.load(std::sync::atomic::Ordering::Relaxed) as f64;
    f();
    let mut t: Vec<f64> = (0..samples)
        .map(|_| {
            let (s, c) = (Instant::now(), cpu_ns());
            let mut iters = 0u32;
            while iters == 0 || s.elapsed().as_secs_f64() < 0.03 {
                f();
                iters += 1;
            }
            let per = if cpu {
                (cpu_ns() - c) as f64 / 1e9 / threads
            } else {
                s.elapsed().as_secs_f64()
            };
            per / iters as f64
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[samples / 2]
}

static THREADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    let filter = args.get(2).cloned().unwrap_or_default();
    let pool = ThreadPool::new(threads);
    THREADS.store(threads, std::sync::atomic::Ordering::Relaxed);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    println!("threads: {threads}");

    if filter.is_empty() || filter == "bw" {
        // The ceiling decode can reach: plain reads of 256 MB split over the pool's threads.
        let buf: Vec<u64> = (0..32usize << 20).map(|i| i as u64).collect();
        let chunks = threads * 64;
        let t = time(5, || {
            let sums: Vec<std::sync::atomic::AtomicU64> =
                (0..chunks).map(|_| Default::default()).collect();
            pool.run(chunks, |c| {
                let part = &buf[c * buf.len() / chunks..(c + 1) * buf.len() / chunks];
                let s = part.chunks_exact(4).fold([0u64; 4], |a, v| {
                    [a[0] ^ v[0], a[1] ^ v[1], a[2] ^ v[2], a[3] ^ v[3]]
                });
                sums[c].store(
                    s[0] ^ s[1] ^ s[2] ^ s[3],
                    std::sync::atomic::Ordering::Relaxed,
                );
            });
            std::hint::black_box(&sums);
        });
        println!(
            "memory read bandwidth: {:.1} GB/s",
            (buf.len() * 8) as f64 / t / 1e9
        );
    }

    if "decode".contains(&filter) || filter.is_empty() {
        // One decode step of SmolLM2-135M: 30 layers of Q4_1 projections + Q8_0 output,
        // every matrix in its own memory (≈ 96 MB, more than the L3) as in the real model.
        let (h, kv, ff, vocab) = (576, 192, 1536, 49152);
        let layer_shapes = [(h, h), (kv, h), (kv, h), (h, h), (ff, h), (ff, h), (h, ff)];
        let mut mats: Vec<QMatrix> = Vec::new();
        for _ in 0..30 {
            for &(r, c) in &layer_shapes {
                mats.push(random_matrix(&mut rng, DType::Q4_1, r, c));
            }
        }
        let output = random_matrix(&mut rng, DType::Q8_0, vocab, h);
        let bytes: usize =
            mats.iter().map(|m| m.data.bytes().len()).sum::<usize>() + output.data.bytes().len();
        let x: Vec<f32> = (0..ff).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let mut out = vec![0f32; vocab];
        let t_layers = time(5, || {
            for w in &mats {
                matmul(&pool, w, &x[..w.cols], 1, &mut out[..w.rows]);
            }
        });
        let t_out = time(5, || matmul(&pool, &output, &x[..h], 1, &mut out));
        let t = t_layers + t_out;
        println!(
            "decode m=1: layers {:.2} ms ({:.1} GB/s), output Q8_0 {:.2} ms ({:.1} GB/s), \
             total {:.2} ms = {:.0} tok/s matmul-only, {:.1} GB/s over {:.0} MB",
            t_layers * 1e3,
            (bytes - output.data.bytes().len()) as f64 / t_layers / 1e9,
            t_out * 1e3,
            output.data.bytes().len() as f64 / t_out / 1e9,
            t * 1e3,
            1.0 / t,
            bytes as f64 / t / 1e9,
            bytes as f64 / 1e6
        );
    }

    let formats = [
        DType::Q4_1,
        DType::Q8_0,
        DType::Q6K,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4K,
        DType::Q5K,
    ];
    for dtype in formats {
        if !filter.is_empty() && !dtype.name().eq_ignore_ascii_case(&filter) && filter != "prefill"
        {
            continue;
        }
        // SmolLM2's FFN up projection: 1536 × 576 (cols a multiple of 256 for k-quants).
        let (rows, cols) = (1536, if dtype.block_size() == 256 { 768 } else { 576 });
        let w = random_matrix(&mut rng, dtype, rows, cols);
        let mut line = format!("{:5} {rows}x{cols}:", dtype.name());
        for m in [1usize, 16, 64, 256, 512] {
            let x: Vec<f32> = (0..m * cols)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            let mut out = vec![0f32; m * rows];
            let reps = 5;
            let t = time(reps, || matmul(&pool, &w, &x, m, &mut out));
            let gflops = 2.0 * (m * rows * cols) as f64 / t / 1e9;
            line += &format!("  m={m}: {gflops:6.1} GF/s");
        }
        println!("{line}");
    }
}
