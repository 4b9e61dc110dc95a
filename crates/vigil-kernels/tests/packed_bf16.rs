//! BF16 matrices packed into 12 bits a value (`quant::packed_bf16`) against the same matrices
//! interleaved as the loader otherwise stores them (`quant::interleave`): every row comes back
//! byte for byte, and every matmul gives the same bits on every level the CPU has (a level it
//! lacks is skipped with a "skipped: CPU lacks ..." line on stderr): one activation row (the
//! packed decode tiles), a few (groups unpacked once), and past the GEMM's threshold (blocks of
//! rows unpacked a slab at a time), at rows that leave a padded group, across thread splits.
//! The weights are spread wide enough that some high bytes miss the table, so the exception
//! path runs in every kernel.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use vigil_kernels::cpu::{self, Isa};
use vigil_kernels::matmul::matmul_isa;
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::quant::interleave::{interleaved, row_bytes};
use vigil_kernels::quant::packed_bf16::{packed, PackPlan, PackedBf16};
use vigil_kernels::storage::AlignedBytes;
use vigil_kernels::{DType, Layout, QMatrix, WeightData};

fn matrix(dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> QMatrix {
    QMatrix {
        layout: Layout::Rows,
        dtype,
        rows,
        cols,
        data: WeightData::Owned(Arc::new(AlignedBytes::from_bytes(bytes))),
    }
}

/// Normal-looking BF16 weights (scale 0.02) with one in `rare` far smaller or far larger,
/// and some exact zeros: the table's 15 high bytes miss the rare ones.
fn weights(rng: &mut ChaCha8Rng, rows: usize, cols: usize, rare: u32) -> QMatrix {
    let mut bytes = Vec::with_capacity(2 * rows * cols);
    for _ in 0..rows * cols {
        let u: f32 = (0..4).map(|_| rng.random_range(-1.0f32..1.0)).sum();
        let mut v = u * 0.02;
        match rng.random_range(0..rare) {
            0 => v *= 1e-6,
            1 => v *= 300.0,
            2 => v = 0.0,
            _ => {}
        }
        bytes.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes());
    }
    matrix(DType::BF16, rows, cols, &bytes)
}

#[test]
fn packing_is_lossless_and_lists_the_exceptions() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for (rows, cols) in [(37, 64), (9, 512), (3, 1024), (64, 160)] {
        let w = weights(&mut rng, rows, cols, 1500);
        let p = packed(&w).expect("a packable matrix");
        assert_eq!(p.layout, Layout::PackedBf16);
        let view = PackedBf16::new(p.data.bytes(), rows, cols);
        assert!(
            !view.exceptions.is_empty(),
            "{rows} × {cols}: no exception to test"
        );
        // A quarter fewer bytes, give or take the header, the index and the exceptions.
        let plain = rows.div_ceil(8) * 8 * cols * 2;
        let extra = 128 + 4 * (rows.div_ceil(8) + 1) + 8 * view.exceptions.len();
        assert!(p.data.bytes().len() <= plain / 4 * 3 + extra);
        for r in 0..rows {
            assert_eq!(row_bytes(&p, r), w.row(r), "{rows} × {cols} row {r}");
        }
        // Written in place over whatever the buffer held (the load writes into the resident
        // copy): every byte is set, the header's, the index's and its padding's too.
        let plan = PackPlan::new(&w).expect("a packable matrix");
        let mut dirty = vec![0xA5u8; plan.len(&w)];
        plan.pack_into(&w, &mut dirty);
        assert!(dirty == p.data.bytes(), "{rows} × {cols}: written in place");
    }
}

#[test]
fn matrices_that_do_not_fit_stay_unpacked() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    // Columns not a multiple of 16.
    assert!(packed(&weights(&mut rng, 8, 24, 1000)).is_none());
    // High bytes spread evenly: most values would be exceptions.
    let bytes: Vec<u8> = (0..2 * 16 * 64).map(|_| rng.random()).collect();
    assert!(packed(&matrix(DType::BF16, 16, 64, &bytes)).is_none());
    // Not BF16.
    let f16 = matrix(DType::F16, 8, 16, &[0u8; 256]);
    assert!(packed(&f16).is_none());
}

/// `matmul_isa` on `isa` of the packed matrix against the interleaved one, bit for bit.
/// Returns the packed matrix's exception count.
fn same_bits(
    isa: Isa,
    pools: &[ThreadPool],
    rng: &mut ChaCha8Rng,
    m: usize,
    rows: usize,
    cols: usize,
) -> usize {
    let w = weights(rng, rows, cols, 1500);
    let p = packed(&w).expect("a packable matrix");
    let x8 = interleaved(&w).expect("an interleavable matrix");
    let x: Vec<f32> = (0..m * cols)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    for pool in pools {
        let (mut a, mut b) = (vec![0f32; m * rows], vec![0f32; m * rows]);
        matmul_isa(pool, isa, &p, &x, m, &mut a);
        matmul_isa(pool, isa, &x8, &x, m, &mut b);
        let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "{} m={m} rows={rows} cols={cols}", isa.name());
    }
    PackedBf16::new(p.data.bytes(), rows, cols).exceptions.len()
}

fn level_gives_the_same_bits(isa: Isa, seed: u64) {
    if !cpu::detected().has(isa) {
        eprintln!("skipped: CPU lacks {}", isa.name());
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    // Decode (1), a few rows (2-7), the GEMM from 8 on, several of its chunks.
    for m in [1, 2, 3, 4, 5, 7, 8, 9, 13, 65] {
        let mut exceptions = 0;
        for (rows, cols) in [(13, 1024), (37, 48), (8, 16), (21, 3072)] {
            exceptions += same_bits(isa, &pools, &mut rng, m, rows, cols);
        }
        assert!(exceptions > 0, "m={m}: no exception to test");
    }
}

#[test]
fn scalar_packed_matmul_gives_the_same_bits() {
    level_gives_the_same_bits(Isa::Scalar, 40);
}

#[test]
fn avx2_packed_matmul_gives_the_same_bits() {
    level_gives_the_same_bits(Isa::Avx2, 41);
}

#[test]
fn avx512_packed_matmul_gives_the_same_bits() {
    level_gives_the_same_bits(Isa::Avx512, 42);
}

/// Past the GEMM's threshold a thread unpacks its rows a slab of 2 MiB at a time: 300,000 rows
/// of 16 columns take three slabs a task on one thread.
#[test]
fn gemm_slabs_give_the_same_bits() {
    let mut rng = ChaCha8Rng::seed_from_u64(43);
    let pools = [ThreadPool::new(1)];
    for isa in [Isa::Avx2, Isa::Avx512] {
        if !cpu::detected().has(isa) {
            eprintln!("skipped: CPU lacks {}", isa.name());
            continue;
        }
        same_bits(isa, &pools, &mut rng, 9, 300_000, 16);
    }
}
