//! Dequantization is bit-exact with the Python `gguf` package (`gguf.quants.dequantize`) on
//! random blocks of every supported type. Fixtures: `scripts/make_dequant_fixtures.py`.

use vigil_kernels::quant::dequant::{dequantize, dequantize_row, DequantError};
use vigil_kernels::{DType, QMatrix, WeightData};

const ALL: [(&str, DType); 10] = [
    ("f32", DType::F32),
    ("f16", DType::F16),
    ("bf16", DType::BF16),
    ("q4_0", DType::Q4_0),
    ("q4_1", DType::Q4_1),
    ("q8_0", DType::Q8_0),
    ("q4_k", DType::Q4K),
    ("q5_k", DType::Q5K),
    ("q6_k", DType::Q6K),
    ("q5_0", DType::Q5_0),
];

fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../../tests/fixtures/dequant/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// (input bytes, expected f32 bit patterns)
fn load(name: &str) -> (Vec<u8>, Vec<u32>) {
    let input = fixture(&format!("random_{name}.in.bin"));
    let expected = fixture(&format!("random_{name}.out.bin"))
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (input, expected)
}

fn assert_bits_eq(what: &str, got: &[f32], expected: &[u32]) {
    assert_eq!(got.len(), expected.len(), "{what}: length");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!(
            g.to_bits(),
            *e,
            "{what}: value {i} is {g} but the reference is {}",
            f32::from_bits(*e)
        );
    }
}

#[test]
fn every_type_matches_the_reference_bit_for_bit() {
    for (name, dtype) in ALL {
        let (input, expected) = load(name);
        assert!(!expected.is_empty());
        let mut out = vec![f32::NAN; expected.len()];
        dequantize(dtype, &input, &mut out).unwrap();
        assert_bits_eq(name, &out, &expected);
    }
}

#[test]
fn unaligned_bytes_dequantize_the_same() {
    for (name, dtype) in ALL {
        let (input, expected) = load(name);
        // Shift the data by one byte so no block is aligned for an in-place view.
        let mut shifted = vec![0u8; input.len() + 1];
        shifted[1..].copy_from_slice(&input);
        let mut out = vec![f32::NAN; expected.len()];
        dequantize(dtype, &shifted[1..], &mut out).unwrap();
        assert_bits_eq(&format!("{name} (unaligned)"), &out, &expected);
    }
}

#[test]
fn rows_of_a_matrix_dequantize_to_their_slice_of_the_reference() {
    for (name, dtype) in ALL {
        let (input, expected) = load(name);
        let cols = dtype.block_size() * 4;
        let rows = expected.len() / cols;
        let row_bytes = dtype.bytes_for(cols).unwrap();
        let m = QMatrix {
            layout: vigil_kernels::Layout::Rows,
            dtype,
            rows,
            cols,
            data: WeightData::Owned(std::sync::Arc::new(
                vigil_kernels::storage::AlignedBytes::from_bytes(&input[..rows * row_bytes]),
            )),
        };
        let mut out = vec![0.0; cols];
        for r in [0, rows / 2, rows - 1] {
            dequantize_row(&m, r, &mut out);
            assert_bits_eq(
                &format!("{name} row {r}"),
                &out,
                &expected[r * cols..(r + 1) * cols],
            );
        }
    }
}

#[test]
fn length_mismatches_are_errors() {
    let mut out = vec![0.0; 32];
    assert_eq!(
        dequantize(DType::Q4_0, &[0u8; 17], &mut out),
        Err(DequantError::PartialBlock {
            dtype: DType::Q4_0,
            bytes: 17
        })
    );
    assert_eq!(
        dequantize(DType::Q4_0, &[0u8; 36], &mut out),
        Err(DequantError::OutputLength {
            dtype: DType::Q4_0,
            expected: 64,
            got: 32
        })
    );
    assert!(dequantize(DType::F32, &[0u8; 6], &mut out).is_err());
    assert_eq!(dequantize(DType::Q6K, &[], &mut []), Ok(()));
}
