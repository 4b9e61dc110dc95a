//! The float-weight matmul (F32, F16, BF16 × f32) against its numerics contract, bit for bit:
//! per (activation row, weight row) pair one 8-lane FMA accumulator over the column chunks of
//! 8 in order, the lanes summed by `hsum8`'s tree, then the `cols % 8` tail added in order.
//! The contract is emulated here in scalar code (`f32::mul_add` is the fused multiply-add), so
//! the decode row tiles and the prefill GEMM (`quant::dot::avx2_float_gemm`, and its AVX-512
//! tiles `avx512_float_gemm`) are held to it on every level the CPU has (with
//! `VIGIL_BF16_DOTS=1`, BF16 weights at the avx512 level to `quant::dot::avx512_bf16`'s own
//! contract, which `bf16_dot_kernel_follows_its_contract` also holds the kernel to directly) (a level it lacks is
//! skipped with a "skipped: CPU lacks ..." line on stderr), at ragged shapes: activation rows around the GEMM's threshold (8), its tile (3 rows) and
//! its chunks (66 rows at 1003 columns, 33 at 3077), weight rows not a multiple of its 4-row
//! group or of the threads' 8-row split, columns not a multiple of 8 and spanning several
//! 512-column blocks. Each shape whose columns are whole chunks of 8 runs again on the matrix
//! interleaved 8 rows at a time, as the loader stores it (`quant::interleave`): the same bits.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use vigil_kernels::cpu::{self, Isa};
use vigil_kernels::matmul::matmul_isa;
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::quant::interleave::interleaved;
use vigil_kernels::storage::AlignedBytes;
use vigil_kernels::{DType, QMatrix, WeightData};

/// Random weights in -1..1 as `dtype`, and their exact f32 values.
fn weights(rng: &mut ChaCha8Rng, dtype: DType, rows: usize, cols: usize) -> (QMatrix, Vec<f32>) {
    let mut bytes = Vec::new();
    let mut vals = Vec::with_capacity(rows * cols);
    for _ in 0..rows * cols {
        let v = rng.random_range(-1.0f32..1.0);
        let v = match dtype {
            DType::F16 => {
                let h = half::f16::from_f32(v);
                bytes.extend_from_slice(&h.to_le_bytes());
                h.to_f32()
            }
            DType::BF16 => {
                let h = half::bf16::from_f32(v);
                bytes.extend_from_slice(&h.to_le_bytes());
                h.to_f32()
            }
            _ => {
                bytes.extend_from_slice(&v.to_le_bytes());
                v
            }
        };
        vals.push(v);
    }
    let w = QMatrix {
        layout: vigil_kernels::Layout::Rows,
        dtype,
        rows,
        cols,
        data: WeightData::Owned(Arc::new(AlignedBytes::from_bytes(&bytes))),
    };
    (w, vals)
}

/// One output by the contract of BF16 weights on `vdpbf16ps` (`quant::dot::avx512_bf16`): the
/// activations rounded to BF16, one 16-lane accumulator over zero-padded chunks of 32, lane `l`
/// adding column `2l + 1`'s product and then column `2l`'s as f32 fused multiply-adds
/// (denormal results flushed), lane `l` + lane `l + 8`, then `hsum8`'s tree.
fn contract_dot_bf16_dots(w: &[f32], x: &[f32]) -> f32 {
    let cols = w.len();
    let at = |v: &[f32], k: usize| if k < cols { v[k] } else { 0.0 };
    let xb: Vec<f32> = x
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_f32())
        .collect();
    let ftz = |v: f32| {
        if v.is_subnormal() {
            0.0f32.copysign(v)
        } else {
            v
        }
    };
    let mut acc = [0f32; 16];
    for c in (0..cols.next_multiple_of(32)).step_by(32) {
        for (l, a) in acc.iter_mut().enumerate() {
            let (odd, even) = (c + 2 * l + 1, c + 2 * l);
            *a = ftz(at(w, odd).mul_add(at(&xb, odd), *a));
            *a = ftz(at(w, even).mul_add(at(&xb, even), *a));
        }
    }
    let h8: [f32; 8] = std::array::from_fn(|l| acc[l] + acc[l + 8]);
    let h: [f32; 4] = std::array::from_fn(|l| h8[l] + h8[l + 4]);
    (h[0] + h[2]) + (h[1] + h[3])
}

/// One output by the contract.
fn contract_dot(w: &[f32], x: &[f32]) -> f32 {
    let n8 = w.len() / 8 * 8;
    let mut acc = [0f32; 8];
    for k in (0..n8).step_by(8) {
        for l in 0..8 {
            acc[l] = w[k + l].mul_add(x[k + l], acc[l]);
        }
    }
    // hsum8: high half onto low half, then lanes 2, 3 onto 0, 1, then lane 1 onto lane 0.
    let h: [f32; 4] = std::array::from_fn(|l| acc[l] + acc[l + 4]);
    let mut s = (h[0] + h[2]) + (h[1] + h[3]);
    for k in n8..w.len() {
        s += w[k] * x[k];
    }
    s
}

fn check(
    isa: Isa,
    pools: &[ThreadPool],
    rng: &mut ChaCha8Rng,
    dtype: DType,
    m: usize,
    rows: usize,
    cols: usize,
) {
    let (w, wv) = weights(rng, dtype, rows, cols);
    let x: Vec<f32> = (0..m * cols)
        .map(|_| rng.random_range(-2.0f32..2.0))
        .collect();
    // BF16 weights on `vdpbf16ps` where the level is avx512 and `VIGIL_BF16_DOTS=1` on a CPU
    // with AVX512_BF16.
    let dot = if dtype == DType::BF16 && isa == Isa::Avx512 && cpu::bf16_dots() {
        contract_dot_bf16_dots
    } else {
        contract_dot
    };
    let expected: Vec<u32> = (0..m * rows)
        .map(|k| {
            let (i, j) = (k / rows, k % rows);
            dot(&wv[j * cols..][..cols], &x[i * cols..][..cols]).to_bits()
        })
        .collect();
    // The same matrix interleaved 8 rows at a time, as the loader stores it (whole chunks of 8
    // columns only): the same bits.
    let x8 = interleaved(&w);
    for pool in pools {
        for w in std::iter::once(&w).chain(&x8) {
            let mut out = vec![f32::NAN; m * rows];
            matmul_isa(pool, isa, w, &x, m, &mut out);
            for (k, (&got, &want)) in out.iter().zip(&expected).enumerate() {
                assert_eq!(
                    got.to_bits(),
                    want,
                    "{} {dtype} {:?} m={m} rows={rows} cols={cols} threads={} out[{}][{}]: {} vs {}",
                    isa.name(),
                    w.layout,
                    pool.num_threads(),
                    k / rows,
                    k % rows,
                    got,
                    f32::from_bits(want)
                );
            }
        }
    }
}

/// The portable path reads an interleaved float matrix's rows back out of their groups: the
/// same bits as from the rows (its own summation order, which the contract does not bind).
#[test]
fn scalar_float_matmul_reads_interleaved_rows_as_rows() {
    let mut rng = ChaCha8Rng::seed_from_u64(37);
    let pool = ThreadPool::new(2);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (m, rows, cols) in [(1, 13, 1000), (3, 37, 64), (9, 8, 16), (1, 300, 256)] {
            let (w, _) = weights(&mut rng, dtype, rows, cols);
            let x8 = interleaved(&w).expect("whole chunks of 8 columns interleave");
            let x: Vec<f32> = (0..m * cols)
                .map(|_| rng.random_range(-2.0f32..2.0))
                .collect();
            let (mut a, mut b) = (vec![0f32; m * rows], vec![0f32; m * rows]);
            matmul_isa(&pool, Isa::Scalar, &w, &x, m, &mut a);
            matmul_isa(&pool, Isa::Scalar, &x8, &x, m, &mut b);
            let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "{dtype} m={m} rows={rows} cols={cols}");
        }
    }
}

/// Every shape on level `isa`, or a "skipped" line if the CPU lacks it.
fn level_follows_the_contract(isa: Isa, seed: u64) {
    if !cpu::detected().has(isa) {
        eprintln!("skipped: CPU lacks {}", isa.name());
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        // Around the GEMM's threshold (8) and both tile heights (3 and 6), and several chunks.
        for m in [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 64, 65, 130, 200] {
            for (rows, cols) in [(13, 1003), (37, 1000), (8, 16)] {
                check(isa, &pools, &mut rng, dtype, m, rows, cols);
            }
        }
        // Narrower than one chunk of 8, and wider than several column blocks.
        for m in [4, 5] {
            check(isa, &pools, &mut rng, dtype, m, 6, 5);
        }
        for m in [3, 8, 65, 130] {
            check(isa, &pools, &mut rng, dtype, m, 21, 3077);
        }
        // Whole chunks of 32 with no tail, and a tail of 31.
        for m in [1, 2, 3, 4, 9] {
            check(isa, &pools, &mut rng, dtype, m, 17, 64);
            check(isa, &pools, &mut rng, dtype, m, 17, 95);
        }
    }
}

#[test]
fn avx2_float_matmul_follows_the_contract_at_ragged_shapes() {
    level_follows_the_contract(Isa::Avx2, 29);
}

#[test]
fn avx512_float_matmul_follows_the_contract_at_ragged_shapes() {
    level_follows_the_contract(Isa::Avx512, 31);
}

/// The opt-in `vdpbf16ps` kernel on its own (whatever `VIGIL_BF16_DOTS` says), against its
/// contract: ragged shapes, decode and prefill tiles, tails of 0 to 31 columns, row ranges split
/// as threads split them.
#[test]
fn bf16_dot_kernel_follows_its_contract() {
    #[cfg(target_arch = "x86_64")]
    {
        use vigil_kernels::quant::dot::avx512_bf16::{matmul_rows, round_row};
        if !cpu::avx512_bf16() {
            eprintln!("skipped: CPU lacks avx512_bf16");
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(37);
        for (m, rows, cols) in [
            (1, 13, 1003),
            (2, 37, 1000),
            (3, 8, 16),
            (4, 21, 95),
            (7, 9, 64),
            (65, 19, 3077),
            (130, 40, 1024),
        ] {
            let (w, wv) = weights(&mut rng, DType::BF16, rows, cols);
            let x: Vec<f32> = (0..m * cols)
                .map(|_| rng.random_range(-2.0f32..2.0))
                .collect();
            let cols32 = cols.next_multiple_of(32);
            let mut xb = vec![0u16; m * cols32];
            for (xr, row) in x.chunks_exact(cols).zip(xb.chunks_exact_mut(cols32)) {
                // SAFETY: the CPU has AVX512_BF16 (checked above); `row` is padded to 32.
                unsafe { round_row(xr, row) };
            }
            let mut out = vec![f32::NAN; m * rows];
            let bytes = w.data.bytes();
            // Two ranges, split where threads would (multiples of 8 rows).
            let split = (rows / 2).next_multiple_of(8).min(rows);
            for (r0, r1) in [(0, split), (split, rows)] {
                if r0 < r1 {
                    // SAFETY: as above; `out` holds m × rows and the ranges are disjoint.
                    unsafe { matmul_rows(bytes, rows, cols, &xb, m, r0, r1, out.as_mut_ptr()) };
                }
            }
            for (k, &got) in out.iter().enumerate() {
                let (i, j) = (k / rows, k % rows);
                let want = contract_dot_bf16_dots(&wv[j * cols..][..cols], &x[i * cols..][..cols]);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "bf16 dots m={m} rows={rows} cols={cols} out[{i}][{j}]: {got} vs {want}"
                );
            }
        }
    }
}
