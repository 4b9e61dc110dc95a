//! Block → f32 dequantization for every supported format, bit-exact with the reference
//! (`gguf.quants.dequantize` of the Python `gguf` package, itself a port of ggml's
//! `dequantize_row_*`).
//!
//! Bit-exactness depends on the order of f32 operations, which follows the reference exactly:
//! scales are combined first (`d * sc`, `dmin * m`) and each value is then one multiply and at
//! most one add/subtract — never fused (Rust does not contract `a * b + c` into an FMA).

use super::blocks::*;
use crate::{DType, QMatrix};
use half::{bf16, f16};

impl GgmlType for BlockQ4_0 {
    const BLOCK_SIZE: usize = QK;

    fn to_float(blocks: &[Self], out: &mut [f32]) {
        assert_eq!(out.len(), blocks.len() * Self::BLOCK_SIZE);
        for (block, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
            let d = block.d.to_f32();
            for (j, &q) in block.qs.iter().enumerate() {
                y[j] = d * ((q & 0x0F) as i32 - 8) as f32;
                y[j + QK / 2] = d * ((q >> 4) as i32 - 8) as f32;
            }
        }
    }
}

impl GgmlType for BlockQ4_1 {
    const BLOCK_SIZE: usize = QK;

    fn to_float(blocks: &[Self], out: &mut [f32]) {
        assert_eq!(out.len(), blocks.len() * Self::BLOCK_SIZE);
        for (block, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
            let d = block.d.to_f32();
            let m = block.m.to_f32();
            for (j, &q) in block.qs.iter().enumerate() {
                y[j] = d * (q & 0x0F) as f32 + m;
                y[j + QK / 2] = d * (q >> 4) as f32 + m;
            }
        }
    }
}

impl BlockQ5_0 {
    /// The 32 signed values `q - 16` (in -16..=15), in order.
    pub fn values(&self) -> [i8; QK] {
        let qh = u32::from_le_bytes(self.qh);
        let mut v = [0i8; QK];
        for (j, &q) in self.qs.iter().enumerate() {
            let lo = (q & 0x0F) | ((((qh >> j) << 4) & 0x10) as u8);
            let hi = (q >> 4) | (((qh >> (j + 12)) & 0x10) as u8);
            v[j] = lo as i8 - 16;
            v[j + QK / 2] = hi as i8 - 16;
        }
        v
    }
}

impl GgmlType for BlockQ5_0 {
    const BLOCK_SIZE: usize = QK;

    fn to_float(blocks: &[Self], out: &mut [f32]) {
        assert_eq!(out.len(), blocks.len() * Self::BLOCK_SIZE);
        for (block, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
            let d = block.d.to_f32();
            for (y, q) in y.iter_mut().zip(block.values()) {
                *y = d * q as f32;
            }
        }
    }
}

impl GgmlType for BlockQ8_0 {
    const BLOCK_SIZE: usize = QK;

    fn to_float(blocks: &[Self], out: &mut [f32]) {
        assert_eq!(out.len(), blocks.len() * Self::BLOCK_SIZE);
        for (block, y) in blocks.iter().zip(out.chunks_exact_mut(QK)) {
            let d = block.d.to_f32();
            for (y, &q) in y.iter_mut().zip(block.qs.iter()) {
                *y = q as f32 * d;
            }
        }
    }
}

/// The `j`-th (0..8) 6-bit scale and min of a Q4_K / Q5_K super-block (ggml's
/// `get_scale_min_k4`): the low 6 bits of bytes 0..8 hold sub-blocks 0..4, and sub-blocks
/// 4..8 combine a nibble of bytes 8..12 with the top two bits of bytes 0..8.
#[inline]
fn scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

impl GgmlType for BlockQ4K {
    const BLOCK_SIZE: usize = QK_K;

    fn to_float(blocks: &[Self], out: &mut [f32]) {
        assert_eq!(out.len(), blocks.len() * Self::BLOCK_SIZE);
        for (block, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = block.d.to_f32();
            let dmin = block.dmin.to_f32();
            // Each 32 bytes of `qs` hold two sub-blocks: low nibbles, then high nibbles.
            for (j, (qs, y)) in block
                .qs
                .chunks_exact(32)
                .zip(y.chunks_exact_mut(64))
                .enumerate()
            {
                let (sc1, m1) = scale_min_k4(2 * j, &block.scales);
                let (sc2, m2) = scale_min_k4(2 * j + 1, &block.scales);
                let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
                let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
                for (l, &q) in qs.iter().enumerate() {
                    y[l] = d1 * (q & 0x0F) as f32 - min1;
                    y[l + 32] = d2 * (q >> 4) as f32 - min2;
                }
            }
        }
    }
}

impl GgmlType for BlockQ5K {
    const BLOCK_SIZE: usize = QK_K;

    fn to_float(blocks: &[Self], out: &mut [f32]) {
        assert_eq!(out.len(), blocks.len() * Self::BLOCK_SIZE);
        for (block, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = block.d.to_f32();
            let dmin = block.dmin.to_f32();
            // As Q4_K; sub-block `i`'s fifth bits are bit `i` of each byte of `qh`.
            for (j, (qs, y)) in block
                .qs
                .chunks_exact(32)
                .zip(y.chunks_exact_mut(64))
                .enumerate()
            {
                let (sc1, m1) = scale_min_k4(2 * j, &block.scales);
                let (sc2, m2) = scale_min_k4(2 * j + 1, &block.scales);
                let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
                let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
                let (bit1, bit2) = (2 * j, 2 * j + 1);
                for (l, (&q, &h)) in qs.iter().zip(block.qh.iter()).enumerate() {
                    let q1 = (q & 0x0F) | (((h >> bit1) & 1) << 4);
                    let q2 = (q >> 4) | (((h >> bit2) & 1) << 4);
                    y[l] = d1 * q1 as f32 - min1;
                    y[l + 32] = d2 * q2 as f32 - min2;
                }
            }
        }
    }
}

impl GgmlType for BlockQ6K {
    const BLOCK_SIZE: usize = QK_K;

    fn to_float(blocks: &[Self], out: &mut [f32]) {
        assert_eq!(out.len(), blocks.len() * Self::BLOCK_SIZE);
        for (block, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
            let d = block.d.to_f32();
            // Two halves of 128 values, each from 64 bytes of `ql`, 32 of `qh`, 8 scales.
            for (half, y) in y.chunks_exact_mut(128).enumerate() {
                let ql = &block.ql[64 * half..64 * half + 64];
                let qh = &block.qh[32 * half..32 * half + 32];
                let sc = &block.scales[8 * half..8 * half + 8];
                for l in 0..32 {
                    let is = l / 16;
                    let h = qh[l];
                    let q1 = ((ql[l] & 0x0F) | ((h & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i32 - 32;
                    y[l] = d * sc[is] as f32 * q1 as f32;
                    y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
                    y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
                    y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
                }
            }
        }
    }
}

/// Why a byte buffer could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DequantError {
    /// The bytes are not a whole number of `dtype` blocks.
    PartialBlock { dtype: DType, bytes: usize },
    /// `out` does not have room for exactly the values the bytes encode.
    OutputLength {
        dtype: DType,
        expected: usize,
        got: usize,
    },
}

impl std::fmt::Display for DequantError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DequantError::PartialBlock { dtype, bytes } => write!(
                f,
                "{bytes} bytes is not a whole number of {dtype} blocks of {} bytes",
                dtype.type_size()
            ),
            DequantError::OutputLength {
                dtype,
                expected,
                got,
            } => write!(
                f,
                "{dtype} data holds {expected} values but the output has room for {got}"
            ),
        }
    }
}

impl std::error::Error for DequantError {}

/// Dequantize `bytes` of `dtype` into `out`, which must hold exactly the values they encode.
/// `bytes` need not be aligned.
pub fn dequantize(dtype: DType, bytes: &[u8], out: &mut [f32]) -> Result<(), DequantError> {
    let n_blocks = bytes.len() / dtype.type_size();
    if n_blocks * dtype.type_size() != bytes.len() {
        return Err(DequantError::PartialBlock {
            dtype,
            bytes: bytes.len(),
        });
    }
    let expected = n_blocks * dtype.block_size();
    if out.len() != expected {
        return Err(DequantError::OutputLength {
            dtype,
            expected,
            got: out.len(),
        });
    }
    match dtype {
        DType::F32 => {
            for (y, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::F16 => {
            for (y, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *y = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        DType::BF16 => {
            for (y, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *y = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        DType::Q4_0 => blocks_to_float::<BlockQ4_0>(bytes, out),
        DType::Q4_1 => blocks_to_float::<BlockQ4_1>(bytes, out),
        DType::Q5_0 => blocks_to_float::<BlockQ5_0>(bytes, out),
        DType::Q8_0 => blocks_to_float::<BlockQ8_0>(bytes, out),
        DType::Q4K => blocks_to_float::<BlockQ4K>(bytes, out),
        DType::Q5K => blocks_to_float::<BlockQ5K>(bytes, out),
        DType::Q6K => blocks_to_float::<BlockQ6K>(bytes, out),
    }
    Ok(())
}

/// Dequantize `bytes` of `dtype` into a new vector.
pub fn dequantize_to_vec(dtype: DType, bytes: &[u8]) -> Result<Vec<f32>, DequantError> {
    let n = bytes.len() / dtype.type_size() * dtype.block_size();
    let mut out = vec![0.0; n];
    dequantize(dtype, bytes, &mut out)?;
    Ok(out)
}

/// Dequantize row `row` of `m` into `out` (`out.len() == m.cols`).
///
/// Panics when `row` is out of range or `out` has the wrong length: both are caller bugs, as
/// a `QMatrix` is validated when it is built.
pub fn dequantize_row(m: &QMatrix, row: usize, out: &mut [f32]) {
    assert!(row < m.rows, "row {row} out of range ({} rows)", m.rows);
    assert_eq!(out.len(), m.cols, "output length must equal the row length");
    let result = match m.layout {
        crate::Layout::Rows => dequantize(m.dtype, m.row(row), out),
        crate::Layout::Interleaved8 | crate::Layout::PackedBf16 => {
            dequantize(m.dtype, &super::interleave::row_bytes(m, row), out)
        }
    };
    if let Err(e) = result {
        panic!("dequantize_row: {e}");
    }
}

/// View `bytes` as blocks in place when aligned; otherwise copy one block at a time.
fn blocks_to_float<T: GgmlType>(bytes: &[u8], out: &mut [f32]) {
    match bytemuck::try_cast_slice::<u8, T>(bytes) {
        Ok(blocks) => T::to_float(blocks, out),
        Err(_) => {
            let size = std::mem::size_of::<T>();
            for (b, y) in bytes
                .chunks_exact(size)
                .zip(out.chunks_exact_mut(T::BLOCK_SIZE))
            {
                let block: T = bytemuck::pod_read_unaligned(b);
                T::to_float(std::slice::from_ref(&block), y);
            }
        }
    }
}
