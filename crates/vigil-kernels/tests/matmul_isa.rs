//! Each SIMD level's kernels (`matmul_isa`: AVX2, AVX-VNNI, AVX-512 VNNI) against the scalar
//! path, bit for bit, for every quantized format: decode (1..3 activation rows, the row tiles)
//! and prefill (the repacked-weight GEMM kernels) on random ragged shapes (activation rows not
//! a multiple of the tile or the 64-row chunk, weight rows not a multiple of 8 or 16), 1 and
//! 2 threads, and the extreme quants the exact integer dots must hold.
//!
//! Q4_0, Q4_1, Q8_0, Q4_K and Q5_K run in both layouts, rows and the 8-row interleaved one the
//! loader makes.
//!
//! A level the CPU lacks is skipped with a "skipped: CPU lacks ..." line on stderr, so the
//! suite passes on machines with and without AVX-512 (run with `--nocapture` to see it).
//! Where the CPU has AMX, the AVX-512 level's Q8_0 GEMM runs its integer dots on AMX tiles
//! (`amx_gemm`) from 16 activation rows; `scripts/test.sh` runs this file again
//! with `VIGIL_AMX=0` so that the AVX-512 GEMM itself is checked there too. Each run says on
//! stderr which one it checked.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use vigil_kernels::cpu::{self, Isa};
use vigil_kernels::matmul::{matmul_group_isa, matmul_isa, matmul_scalar};
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::quant::interleave;
use vigil_kernels::storage::AlignedBytes;
use vigil_kernels::{DType, QMatrix, WeightData};

const QUANTIZED: [DType; 6] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
];

/// Random quant bytes (`fill` overrides them) with f16 scales and mins of realistic size.
fn weights(
    rng: &mut ChaCha8Rng,
    dtype: DType,
    rows: usize,
    cols: usize,
    fill: Option<u8>,
) -> QMatrix {
    let bs = dtype.type_size();
    let mut bytes = vec![0u8; rows * cols / dtype.block_size() * bs];
    match fill {
        Some(q) => bytes.fill(q),
        None => rng.fill(&mut bytes[..]),
    }
    for b in bytes.chunks_exact_mut(bs) {
        let d = half::f16::from_f32(rng.random_range(0.001f32..0.02)).to_le_bytes();
        let m = half::f16::from_f32(rng.random_range(-0.02f32..0.02)).to_le_bytes();
        match dtype {
            DType::Q6K => b[208..210].copy_from_slice(&d),
            DType::Q4_1 | DType::Q4K | DType::Q5K => {
                b[0..2].copy_from_slice(&d);
                b[2..4].copy_from_slice(&m);
            }
            _ => b[0..2].copy_from_slice(&d),
        }
    }
    QMatrix {
        layout: vigil_kernels::Layout::Rows,
        dtype,
        rows,
        cols,
        data: WeightData::Owned(Arc::new(AlignedBytes::from_bytes(&bytes))),
    }
}

/// Level `isa` against the scalar path on `w`, and for Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K also on `w` interleaved
/// as the loader stores it (`quant::interleave`), on that level and on the scalar path.
fn check(pool: &ThreadPool, isa: Isa, w: &QMatrix, x: &[f32], m: usize, what: &str) {
    let mut slow = vec![f32::NAN; m * w.rows];
    matmul_scalar(w, x, m, &mut slow);
    let x8 = interleave::interleaved(w);
    let mut runs: Vec<(&str, Vec<f32>)> = Vec::new();
    let mut fast = vec![f32::NAN; m * w.rows];
    matmul_isa(pool, isa, w, x, m, &mut fast);
    runs.push(("rows", fast));
    if let Some(x8) = &x8 {
        let mut fast = vec![f32::NAN; m * w.rows];
        matmul_isa(pool, isa, x8, x, m, &mut fast);
        runs.push(("interleaved", fast));
        let mut scalar = vec![f32::NAN; m * w.rows];
        matmul_scalar(x8, x, m, &mut scalar);
        runs.push(("interleaved, scalar path", scalar));
    }
    for (layout, fast) in &runs {
        for k in 0..m * w.rows {
            assert_eq!(
                fast[k].to_bits(),
                slow[k].to_bits(),
                "{} {what} ({layout}): {} m={m} rows={} cols={} out[{k}] (row {}, col {}): {} vs {}",
                isa.name(),
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
}

/// Random shapes and the extreme quants for every quantized format on level `isa`, or a
/// "skipped" line if the CPU lacks it.
fn level_matches_scalar(isa: Isa, seed: u64) {
    if !cpu::detected().has(isa) {
        eprintln!("skipped: CPU lacks {}", isa.name());
        return;
    }
    if isa == Isa::Avx512 {
        eprintln!(
            "avx512: the Q8_0 GEMM from 16 rows runs {}",
            if cpu::amx_int8() {
                "on AMX tiles (amx_gemm)"
            } else {
                "on AVX-512 VNNI (avx512_gemm; no AMX, or VIGIL_AMX=0)"
            }
        );
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for dtype in QUANTIZED {
        let bs = dtype.block_size();
        for &m in &[1usize, 2, 3, 4, 5, 7, 9, 63, 64, 65, 133] {
            for pool in &pools {
                let rows = rng.random_range(1..90);
                let cols = bs * rng.random_range(1..=if bs == 32 { 24 } else { 4 });
                let w = weights(&mut rng, dtype, rows, cols, None);
                let mut x: Vec<f32> = (0..m * cols)
                    .map(|_| rng.random_range(-3.0f32..3.0))
                    .collect();
                // An all-zero block (scale 0) in the last row.
                x[(m - 1) * cols..(m - 1) * cols + 32].fill(0.0);
                check(pool, isa, &w, &x, m, "random");
            }
        }
        // All nibbles 15 / 0, Q8_0 weights all -128 / 127 / -127, against activations that
        // quantize to ±127 (one row alternating): the largest integer dots.
        // 9 rows: the Q6_K row tiles; 17: every format's GEMM; 1: the decode tiles.
        for (&q, m) in [0xFFu8, 0x00, 0x80, 0x7F, 0x81]
            .iter()
            .zip([9, 17, 9, 17, 17])
            .flat_map(|(q, m)| [(q, m), (q, 1)])
        {
            let (rows, cols) = (40, 2 * 256);
            let w = weights(&mut rng, dtype, rows, cols, Some(q));
            let x: Vec<f32> = (0..m * cols)
                .map(|k| match (k / cols) % 3 {
                    0 => 1.5,
                    1 => -2.0,
                    _ if k % 2 == 0 => 4.0,
                    _ => -4.0,
                })
                .collect();
            check(&pools[1], isa, &w, &x, m, "extreme");
        }
    }
}

#[test]
fn avx2_matches_scalar_bit_for_bit() {
    level_matches_scalar(Isa::Avx2, 31);
}

#[test]
fn avx_vnni_matches_scalar_bit_for_bit() {
    level_matches_scalar(Isa::AvxVnni, 32);
}

#[test]
fn avx512_matches_scalar_bit_for_bit() {
    level_matches_scalar(Isa::Avx512, 33);
}

#[test]
fn model_shapes_split_across_threads() {
    // SmolLM2-135M's projections (576 ↔ 1536) and Gemma 3 270M's k-quant ones, a row count
    // that is a multiple of 8 but not of 16 (the 16-row groups' thread split), and a prompt
    // longer than one 128-row chunk.
    let mut rng = ChaCha8Rng::seed_from_u64(34);
    let pool = ThreadPool::new(2);
    for isa in [Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
        if !cpu::detected().has(isa) {
            eprintln!("skipped: CPU lacks {}", isa.name());
            continue;
        }
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q8_0,
            DType::Q4K,
            DType::Q6K,
        ] {
            let shapes: &[(usize, usize, usize)] = if dtype.block_size() == 32 {
                &[(1536, 576, 70), (576, 1536, 37), (200, 576, 130)]
            } else {
                // Gemma 3 270M's down projection and attention output.
                &[(640, 2048, 70), (640, 1024, 37), (200, 512, 130)]
            };
            for &(rows, cols, m) in shapes {
                let w = weights(&mut rng, dtype, rows, cols, None);
                let x: Vec<f32> = (0..m * cols)
                    .map(|_| rng.random_range(-1.0f32..1.0))
                    .collect();
                check(&pool, isa, &w, &x, m, "model shape");
            }
        }
    }
}

#[test]
fn a_group_gives_the_bits_of_one_call_per_matrix() {
    // A layer's Q, K and V (or gate and up) share their input: one quantization and one
    // dispatch over every matrix's rows must give each matrix exactly its own call's outputs,
    // with row counts that split unevenly between the matrices and the threads. Mixed formats
    // fall back to one call per matrix.
    let mut rng = ChaCha8Rng::seed_from_u64(35);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for isa in [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
        if !cpu::detected().has(isa) {
            eprintln!("skipped: CPU lacks {}", isa.name());
            continue;
        }
        let mixed = [DType::Q4_0, DType::Q8_0, DType::Q4_0];
        let groups = QUANTIZED.iter().map(|&d| [d; 3]).chain([mixed]);
        for dtypes in groups {
            let bs = dtypes[0].block_size();
            for &m in &[1usize, 3, 4, 37, 130] {
                for pool in &pools {
                    let cols = bs * rng.random_range(1..=if bs == 32 { 20 } else { 3 });
                    let mut ws: Vec<QMatrix> = (dtypes.iter())
                        .map(|&d| {
                            let rows = rng.random_range(1..70);
                            weights(&mut rng, d, rows, cols, None)
                        })
                        .collect();
                    // Q4_0 / Q4_1: the middle matrix as the loader interleaves it, so the
                    // group mixes layouts.
                    if let Some(x8) = interleave::interleaved(&ws[1]) {
                        ws[1] = x8;
                    }
                    let x: Vec<f32> = (0..m * cols)
                        .map(|_| rng.random_range(-3.0f32..3.0))
                        .collect();
                    let mut grouped: Vec<Vec<f32>> =
                        ws.iter().map(|w| vec![f32::NAN; m * w.rows]).collect();
                    let refs: Vec<&QMatrix> = ws.iter().collect();
                    let mut outs: Vec<&mut [f32]> =
                        grouped.iter_mut().map(|v| v.as_mut_slice()).collect();
                    matmul_group_isa(pool, isa, &refs, &x, m, &mut outs);
                    for (w, got) in ws.iter().zip(&grouped) {
                        let mut want = vec![f32::NAN; m * w.rows];
                        matmul_isa(pool, isa, w, &x, m, &mut want);
                        let same = got
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{} {:?} m={m} rows={} cols={cols}: grouped differs",
                            isa.name(),
                            dtypes,
                            w.rows
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn max_isa_caps_features() {
    let cpu = cpu::detected();
    for max in [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
        let capped = cpu.capped(max);
        assert!(capped.best() <= max);
        assert!(capped.best() <= cpu.best());
        if cpu.has(max) {
            assert_eq!(capped.best(), max);
        }
    }
    assert_eq!(
        cpu.capped(Isa::Scalar),
        cpu.capped(Isa::Scalar).capped(Isa::Avx512)
    );
}
