//! matmul for every weight format: against the `gguf` reference (fixtures from
//! `scripts/gen_matmul_fixtures.py`), AVX2 path against the scalar path, and the determinism
//! contract (an output element does not depend on the batch, its other rows, or the threads).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use vigil_kernels::matmul::{matmul, matmul_scalar};
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::storage::AlignedBytes;
use vigil_kernels::{DType, QMatrix, WeightData};

const ALL: [DType; 9] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::F32,
    DType::F16,
    DType::BF16,
];

fn matrix(dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> QMatrix {
    assert_eq!(bytes.len(), rows * dtype.bytes_for(cols).unwrap());
    QMatrix {
        layout: vigil_kernels::Layout::Rows,
        dtype,
        rows,
        cols,
        data: WeightData::Owned(Arc::new(AlignedBytes::from_bytes(bytes))),
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// Random weights: random quant bytes with sane f16 scales patched in.
fn random_matrix(rng: &mut ChaCha8Rng, dtype: DType, rows: usize, cols: usize) -> QMatrix {
    let n_blocks = rows * cols / dtype.block_size();
    let bs = dtype.type_size();
    let mut bytes = vec![0u8; n_blocks * bs];
    match dtype {
        DType::F32 => {
            for c in bytes.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.random_range(-1.0f32..1.0).to_le_bytes());
            }
        }
        DType::F16 => {
            for c in bytes.chunks_exact_mut(2) {
                c.copy_from_slice(&f16_bytes(rng.random_range(-1.0f32..1.0)));
            }
        }
        DType::BF16 => {
            for c in bytes.chunks_exact_mut(2) {
                let v = half::bf16::from_f32(rng.random_range(-1.0f32..1.0));
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        _ => {
            rng.fill(&mut bytes[..]);
            for b in bytes.chunks_exact_mut(bs) {
                let d = f16_bytes(rng.random_range(0.001f32..0.02));
                let m = f16_bytes(rng.random_range(-0.02f32..0.02));
                match dtype {
                    DType::Q6K => b[208..210].copy_from_slice(&d),
                    DType::Q4_1 | DType::Q4K | DType::Q5K => {
                        b[0..2].copy_from_slice(&d);
                        b[2..4].copy_from_slice(&m);
                    }
                    _ => b[0..2].copy_from_slice(&d),
                }
            }
        }
    }
    matrix(dtype, rows, cols, &bytes)
}

fn random_x(rng: &mut ChaCha8Rng, m: usize, cols: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..m * cols)
        .map(|_| rng.random_range(-2.0f32..2.0))
        .collect();
    // An all-zero first block in the last row exercises the d = 0 paths.
    if m > 1 {
        let last = (m - 1) * cols;
        x[last..last + 32.min(cols)].fill(0.0);
    }
    x
}

fn run_pool(pool: &ThreadPool, w: &QMatrix, x: &[f32], m: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; m * w.rows];
    matmul(pool, w, x, m, &mut out);
    out
}

fn run_scalar(w: &QMatrix, x: &[f32], m: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; m * w.rows];
    matmul_scalar(w, x, m, &mut out);
    out
}

/// Σ |w| |x| per output, from the scalar f32 path on absolute values (float formats only).
fn abs_scale(w: &QMatrix, x: &[f32], m: usize) -> Vec<f32> {
    let bytes: Vec<u8> = match w.dtype {
        DType::F32 => w
            .data
            .bytes()
            .chunks_exact(4)
            .flat_map(|c| [c[0], c[1], c[2], c[3] & 0x7f])
            .collect(),
        _ => w
            .data
            .bytes()
            .chunks_exact(2)
            .flat_map(|c| [c[0], c[1] & 0x7f])
            .collect(),
    };
    let wa = matrix(w.dtype, w.rows, w.cols, &bytes);
    let xa: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    run_scalar(&wa, &xa, m)
}

fn cols_for(dtype: DType, rng: &mut ChaCha8Rng) -> usize {
    let bs = dtype.block_size().max(8);
    // Float formats also get widths that are not a multiple of 8.
    let extra = if dtype.is_quantized() {
        0
    } else {
        rng.random_range(0..8)
    };
    bs * rng.random_range(1..=4) + extra
}

#[test]
fn matches_gguf_reference() {
    const ROWS: usize = 5;
    const COLS: usize = 512;
    const M: usize = 3;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/matmul");
    let read = |name: &str| std::fs::read(format!("{dir}/{name}")).unwrap();
    let f64s = |b: Vec<u8>| -> Vec<f64> {
        b.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let pool = ThreadPool::new(2);
    for (name, dtype) in [
        ("q4_0", DType::Q4_0),
        ("q4_1", DType::Q4_1),
        ("q8_0", DType::Q8_0),
        ("q4_k", DType::Q4K),
        ("q5_k", DType::Q5K),
        ("q6_k", DType::Q6K),
        ("f32", DType::F32),
        ("f16", DType::F16),
        ("bf16", DType::BF16),
    ] {
        let w = matrix(dtype, ROWS, COLS, &read(&format!("{name}.w.bin")));
        let x: Vec<f32> = read(&format!("{name}.x.bin"))
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let expected = f64s(read(&format!("{name}.expected.bin")));
        let scale = f64s(read(&format!("{name}.scale.bin")));
        // Q4_1 pairs with Q8_1, whose block sum `s` is stored as f16 (relative error 2^-11).
        let rel = if dtype == DType::Q4_1 { 1e-3 } else { 2e-5 };
        for (path, got) in [
            ("scalar", run_scalar(&w, &x, M)),
            ("dispatched", run_pool(&pool, &w, &x, M)),
        ] {
            for k in 0..M * ROWS {
                let err = (got[k] as f64 - expected[k]).abs();
                assert!(
                    err <= rel * scale[k] + 1e-6,
                    "{name} {path} out[{k}] = {} expected {} (scale {})",
                    got[k],
                    expected[k],
                    scale[k]
                );
            }
        }
    }
}

#[test]
fn dispatched_path_matches_scalar_path() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let pool = ThreadPool::new(2);
    for dtype in ALL {
        for &m in &[1usize, 3, 4, 17, 69] {
            for _ in 0..3 {
                let rows = rng.random_range(1..40);
                let cols = cols_for(dtype, &mut rng);
                let w = random_matrix(&mut rng, dtype, rows, cols);
                let x = random_x(&mut rng, m, cols);
                let fast = run_pool(&pool, &w, &x, m);
                let slow = run_scalar(&w, &x, m);
                if dtype.is_quantized() {
                    // Exact integer block dots and identical float folds: bit-identical.
                    for k in 0..m * rows {
                        assert_eq!(
                            fast[k].to_bits(),
                            slow[k].to_bits(),
                            "{dtype} m={m} rows={rows} cols={cols} out[{k}]: {} vs {}",
                            fast[k],
                            slow[k]
                        );
                    }
                } else {
                    let scale = abs_scale(&w, &x, m);
                    for k in 0..m * rows {
                        let err = (fast[k] - slow[k]).abs();
                        assert!(
                            err <= 1e-5 * scale[k] + 1e-7,
                            "{dtype} m={m} rows={rows} cols={cols} out[{k}]: {} vs {}",
                            fast[k],
                            slow[k]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn output_rows_do_not_depend_on_batch_or_threads() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let pool1 = ThreadPool::new(1);
    let pool2 = ThreadPool::new(2);
    const M: usize = 37;
    for dtype in ALL {
        // 45 rows: not a multiple of any tile width, and enough work to use both threads.
        let rows = 45;
        let cols = dtype.block_size().max(32) * 8 + if dtype.is_quantized() { 0 } else { 5 };
        let w = random_matrix(&mut rng, dtype, rows, cols);
        let x = random_x(&mut rng, M, cols);
        let batch = run_pool(&pool2, &w, &x, M);
        assert_eq!(
            bits(&batch),
            bits(&run_pool(&pool1, &w, &x, M)),
            "{dtype}: 1 vs 2 threads"
        );
        for i in 0..M {
            let row = &x[i * cols..(i + 1) * cols];
            let single = run_pool(&pool2, &w, row, 1);
            assert_eq!(
                bits(&single),
                bits(&batch[i * rows..(i + 1) * rows]),
                "{dtype}: row {i} alone vs in a batch of {M}"
            );
        }
        // The same row placed among other rows, at an offset that changes its tile position.
        let i = 5;
        let mut other = random_x(&mut rng, 6, cols);
        other[2 * cols..3 * cols].copy_from_slice(&x[i * cols..(i + 1) * cols]);
        let mixed = run_pool(&pool2, &w, &other, 6);
        assert_eq!(
            bits(&mixed[2 * rows..3 * rows]),
            bits(&batch[i * rows..(i + 1) * rows]),
            "{dtype}: row {i} among different rows"
        );
    }
}

#[test]
fn decode_shapes_split_across_threads() {
    // Large enough that both threads take part; rows not a multiple of 8.
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let pool = ThreadPool::new(2);
    for dtype in [DType::Q4_1, DType::Q8_0, DType::Q6K, DType::F16] {
        let (rows, cols) = (203, 512);
        let w = random_matrix(&mut rng, dtype, rows, cols);
        let x = random_x(&mut rng, 1, cols);
        let fast = run_pool(&pool, &w, &x, 1);
        let slow = run_scalar(&w, &x, 1);
        let scale = abs_scale_or_zero(&w, &x);
        for k in 0..rows {
            let err = (fast[k] - slow[k]).abs();
            assert!(
                err <= 1e-5 * scale[k],
                "{dtype} out[{k}] {} vs {}",
                fast[k],
                slow[k]
            );
        }
    }
}

fn abs_scale_or_zero(w: &QMatrix, x: &[f32]) -> Vec<f32> {
    if w.dtype.is_quantized() {
        vec![0.0; w.rows]
    } else {
        abs_scale(w, x, 1)
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}
