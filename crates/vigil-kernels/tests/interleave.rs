//! The 8-row interleaved layout (`quant::interleave`) keeps every row: each row read back
//! (`row_bytes`, `dequantize_row`) is the row-major one, byte for byte, for row counts that
//! leave the last group partial (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, and F32, F16, BF16 of whole chunks of
//! 8 columns); other formats and shapes have no interleaved form.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use vigil_kernels::quant::dequant::dequantize_row;
use vigil_kernels::quant::interleave::{interleave_into, interleaved, interleaved_len, row_bytes};
use vigil_kernels::storage::AlignedBytes;
use vigil_kernels::{DType, Layout, QMatrix, WeightData};

fn random(rng: &mut ChaCha8Rng, dtype: DType, rows: usize, cols: usize) -> QMatrix {
    let mut bytes = vec![0u8; rows * cols / dtype.block_size() * dtype.type_size()];
    rng.fill(&mut bytes[..]);
    // Finite f16 scales (and Q4_1 mins) and float values: exponent bits below all-ones.
    for b in bytes.chunks_exact_mut(dtype.type_size()) {
        let top = b.len() - 1;
        b[if dtype.is_float() { top } else { 1 }] &= 0x3B;
        if matches!(dtype, DType::Q4_1 | DType::Q4K | DType::Q5K) {
            b[3] &= 0x3B;
        }
    }
    QMatrix::new(
        dtype,
        rows,
        cols,
        WeightData::Owned(Arc::new(AlignedBytes::from_bytes(&bytes))),
    )
}

#[test]
fn every_row_reads_back_unchanged() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for dtype in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4K,
        DType::Q5K,
        DType::F32,
        DType::F16,
        DType::BF16,
    ] {
        for rows in [1, 7, 8, 9, 16, 43] {
            let unit = match dtype {
                DType::Q4K | DType::Q5K => 256,
                _ if dtype.is_float() => 8,
                _ => 32,
            };
            let cols = unit * rng.random_range(1..12);
            let w = random(&mut rng, dtype, rows, cols);
            if dtype == DType::BF16 && vigil_kernels::cpu::bf16_dots() {
                // `vdpbf16ps` reads rows: BF16 keeps them in such a process.
                assert!(
                    interleaved(&w).is_none(),
                    "BF16 interleaved beside BF16 dots"
                );
                continue;
            }
            let x8 = interleaved(&w).expect("these formats interleave");
            assert_eq!(x8.layout, Layout::Interleaved8);
            assert_eq!(
                x8.data.bytes().len(),
                rows.div_ceil(8) * 8 * w.row_bytes(),
                "{dtype} {rows} rows: whole groups, the last padded"
            );
            // Written in place over whatever the buffer held (the load writes into the
            // resident copy): every byte is set, the padding rows' too.
            let mut dirty = vec![0xA5u8; interleaved_len(&w).expect("these formats interleave")];
            interleave_into(&w, &mut dirty);
            assert!(
                dirty == x8.data.bytes(),
                "{dtype} {rows} rows: written in place"
            );
            let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                assert_eq!(row_bytes(&x8, r), w.row(r), "{dtype} row {r} of {rows}");
                dequantize_row(&w, r, &mut a);
                dequantize_row(&x8, r, &mut b);
                let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same, "{dtype} row {r} of {rows}: dequantized differently");
            }
        }
    }
}

#[test]
fn only_q4_q5k_q8_and_whole_chunk_float_row_major_matrices_interleave() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    for dtype in [DType::Q5_0, DType::Q6K] {
        let w = random(&mut rng, dtype, 8, 256);
        assert!(interleaved(&w).is_none(), "{dtype} has no interleaved form");
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let w = random(&mut rng, dtype, 8, 100);
        assert!(
            interleaved(&w).is_none(),
            "{dtype}: 100 columns is not whole chunks of 8"
        );
    }
    let x8 = interleaved(&random(&mut rng, DType::Q4_0, 8, 64)).unwrap();
    assert!(interleaved(&x8).is_none(), "already interleaved");
}
