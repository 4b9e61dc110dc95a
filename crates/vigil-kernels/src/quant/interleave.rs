//! The load-time layout of Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K and float matrices for the
//! kernels (`Layout::Interleaved8`): groups of 8 rows.
//!
//! - Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K: block by block, each block holding the 8 rows' scales
//!   (and mins) side by side and their quants one dword of each row at a time (`BlockQ4_0x8`,
//!   `BlockQ4_1x8`, `BlockQ8_0x8`, `BlockQ4Kx8`, `BlockQ5Kx8`, whose packed 6-bit scales and
//!   fifth bits are interleaved a word at a time too). It is the lane order the 8-row kernels multiply in
//!   (`avx2_gemm::Packed`, `kgemm_pack`), so decode reads each block with plain loads instead
//!   of gathering 8 rows' scales and shuffling their nibbles (`avx2_q4_decode::tile_x8`,
//!   `avx2_q4k_decode`), and prefill packing is a copy.
//! - F32 / F16 / BF16 (columns a multiple of 8): 8 values of each of the 8 rows in turn, so
//!   the 8-row decode tile (`avx2_float`), which takes a chunk of 8 values from every row a
//!   step, reads one sequential run instead of 8 rows a row apart (`examples/gemv_bandwidth.rs`
//!   on the Xeon measured: BF16 29.0 -> 30.0 GB/s), and BF16 takes two rows a load
//!   (`avx2_float::tile_bf16_x8`: Qwen3-0.6B-shape decode 7-9 % faster again).
//!
//! Same bytes as the rows (the last group padded with zero rows), same values, same results
//! bit for bit: only the order moves.

use super::blocks::{
    BlockQ4K, BlockQ4Kx8, BlockQ4_0, BlockQ4_0x8, BlockQ4_1, BlockQ4_1x8, BlockQ5K, BlockQ5Kx8,
    BlockQ8_0, BlockQ8_0x8,
};
use crate::storage::{AlignedBytes, Layout, WeightData};
use crate::{DType, QMatrix};
use bytemuck::Pod;
use half::f16;
use std::sync::Arc;

/// A block format that has an interleaved form.
pub trait Interleave: Pod {
    /// Its block of 8 rows.
    type X8: Pod;
    /// Block `b` of 8 rows (`None`: a padding row of zeros).
    fn interleave(rows: [Option<&Self>; 8]) -> Self::X8;
    /// Row `k`'s block out of an interleaved one.
    fn row_of(x: &Self::X8, k: usize) -> Self;
}

/// `qs[h][4k..4k + 4]` = bytes `4h..4h + 4` of row `k` (`H` dwords a row).
fn interleave_qs<T: Pod + Default, const N: usize, const H: usize>(
    rows: [Option<&[T; N]>; 8],
) -> [[T; 32]; H] {
    let mut qs = [[T::default(); 32]; H];
    for (k, row) in rows.iter().enumerate() {
        if let Some(q) = row {
            for h in 0..H {
                qs[h][4 * k..4 * k + 4].copy_from_slice(&q[4 * h..4 * h + 4]);
            }
        }
    }
    qs
}

fn row_qs<T: Pod + Default, const N: usize, const H: usize>(qs: &[[T; 32]; H], k: usize) -> [T; N] {
    let mut q = [T::default(); N];
    for h in 0..H {
        q[4 * h..4 * h + 4].copy_from_slice(&qs[h][4 * k..4 * k + 4]);
    }
    q
}

impl Interleave for BlockQ4_0 {
    type X8 = BlockQ4_0x8;
    fn interleave(rows: [Option<&Self>; 8]) -> BlockQ4_0x8 {
        BlockQ4_0x8 {
            d: rows.map(|r| r.map_or(f16::ZERO, |r| r.d)),
            qs: interleave_qs(rows.map(|r| r.map(|r| &r.qs))),
        }
    }
    fn row_of(x: &BlockQ4_0x8, k: usize) -> Self {
        BlockQ4_0 {
            d: x.d[k],
            qs: row_qs(&x.qs, k),
        }
    }
}

impl Interleave for BlockQ4_1 {
    type X8 = BlockQ4_1x8;
    fn interleave(rows: [Option<&Self>; 8]) -> BlockQ4_1x8 {
        BlockQ4_1x8 {
            d: rows.map(|r| r.map_or(f16::ZERO, |r| r.d)),
            m: rows.map(|r| r.map_or(f16::ZERO, |r| r.m)),
            qs: interleave_qs(rows.map(|r| r.map(|r| &r.qs))),
        }
    }
    fn row_of(x: &BlockQ4_1x8, k: usize) -> Self {
        BlockQ4_1 {
            d: x.d[k],
            m: x.m[k],
            qs: row_qs(&x.qs, k),
        }
    }
}

impl Interleave for BlockQ8_0 {
    type X8 = BlockQ8_0x8;
    fn interleave(rows: [Option<&Self>; 8]) -> BlockQ8_0x8 {
        BlockQ8_0x8 {
            d: rows.map(|r| r.map_or(f16::ZERO, |r| r.d)),
            qs: interleave_qs(rows.map(|r| r.map(|r| &r.qs))),
        }
    }
    fn row_of(x: &BlockQ8_0x8, k: usize) -> Self {
        BlockQ8_0 {
            d: x.d[k],
            qs: row_qs(&x.qs, k),
        }
    }
}

impl Interleave for BlockQ5K {
    type X8 = BlockQ5Kx8;
    fn interleave(rows: [Option<&Self>; 8]) -> BlockQ5Kx8 {
        BlockQ5Kx8 {
            d: rows.map(|r| r.map_or(f16::ZERO, |r| r.d)),
            dmin: rows.map(|r| r.map_or(f16::ZERO, |r| r.dmin)),
            scales: interleave_qs(rows.map(|r| r.map(|r| &r.scales))),
            qh: interleave_qs(rows.map(|r| r.map(|r| &r.qh))),
            qs: interleave_qs(rows.map(|r| r.map(|r| &r.qs))),
        }
    }
    fn row_of(x: &BlockQ5Kx8, k: usize) -> Self {
        BlockQ5K {
            d: x.d[k],
            dmin: x.dmin[k],
            scales: row_qs(&x.scales, k),
            qh: row_qs(&x.qh, k),
            qs: row_qs(&x.qs, k),
        }
    }
}

impl Interleave for BlockQ4K {
    type X8 = BlockQ4Kx8;
    fn interleave(rows: [Option<&Self>; 8]) -> BlockQ4Kx8 {
        BlockQ4Kx8 {
            d: rows.map(|r| r.map_or(f16::ZERO, |r| r.d)),
            dmin: rows.map(|r| r.map_or(f16::ZERO, |r| r.dmin)),
            scales: interleave_qs(rows.map(|r| r.map(|r| &r.scales))),
            qs: interleave_qs(rows.map(|r| r.map(|r| &r.qs))),
        }
    }
    fn row_of(x: &BlockQ4Kx8, k: usize) -> Self {
        BlockQ4K {
            d: x.d[k],
            dmin: x.dmin[k],
            scales: row_qs(&x.scales, k),
            qs: row_qs(&x.qs, k),
        }
    }
}

/// Group `g`'s 8 rows (`nb` blocks each, row after row) out of an interleaved matrix.
pub fn group_rows<B: Interleave>(x8: &[B::X8], nb: usize, g: usize) -> Vec<B> {
    let group = &x8[g * nb..(g + 1) * nb];
    (0..8)
        .flat_map(|k| group.iter().map(move |x| B::row_of(x, k)))
        .collect()
}

/// Whether `m` has an interleaved form: Q4_0, Q4_1, Q8_0, Q4_K and Q5_K stored as rows, and F32, F16 and
/// BF16 ones whose rows are whole chunks of 8 values. BF16 keeps its rows when the process
/// multiplies it with `vdpbf16ps` (`cpu::bf16_dots`), whose kernel reads rows.
pub fn can_interleave(m: &QMatrix) -> bool {
    let format = match m.dtype {
        DType::Q4_0 | DType::Q4_1 | DType::Q8_0 | DType::Q4K | DType::Q5K => true,
        DType::BF16 if crate::cpu::bf16_dots() => false,
        DType::F32 | DType::F16 | DType::BF16 => m.cols.is_multiple_of(FLOAT_CHUNK),
        _ => false,
    };
    format && m.layout == Layout::Rows
}

/// Values of one row a float group holds side by side with the other 7 rows'.
pub const FLOAT_CHUNK: usize = 8;

/// A float matrix's rows (`rows × row_bytes`, `chunk` bytes a chunk of 8 values) interleaved
/// into `out` (`rows.div_ceil(8) * 8 * row_bytes` bytes): chunk `s` of row `8g + k` at
/// `((g * chunks + s) * 8 + k) * chunk` bytes, padding rows zero.
fn interleave_float(bytes: &[u8], rows: usize, row_bytes: usize, chunk: usize, out: &mut [u8]) {
    let chunks = row_bytes / chunk;
    // The last group holds the padding rows: zero it whole, its real rows are written below.
    if !rows.is_multiple_of(8) {
        out[rows / 8 * 8 * row_bytes..].fill(0);
    }
    for r in 0..rows {
        let (g, k) = (r / 8, r % 8);
        for s in 0..chunks {
            let at = ((g * chunks + s) * 8 + k) * chunk;
            out[at..at + chunk].copy_from_slice(&bytes[r * row_bytes + s * chunk..][..chunk]);
        }
    }
}

/// Row `r` back out of `interleave_float`'s layout.
pub(crate) fn float_row(bytes: &[u8], r: usize, row_bytes: usize, chunk: usize) -> Vec<u8> {
    let chunks = row_bytes / chunk;
    let (g, k) = (r / 8, r % 8);
    (0..chunks)
        .flat_map(|s| {
            let at = ((g * chunks + s) * 8 + k) * chunk;
            bytes[at..at + chunk].iter().copied()
        })
        .collect()
}

/// The length of `m`'s interleaved form (`can_interleave`), or `None`: its rows padded to a
/// multiple of 8, the same bytes a row.
pub fn interleaved_len(m: &QMatrix) -> Option<usize> {
    can_interleave(m).then(|| m.rows.div_ceil(8) * 8 * m.row_bytes())
}

/// `m` interleaved (`can_interleave`) into `out`, `interleaved_len(m)` bytes: written where it
/// will be read (the resident copy, `ModelWeights::make_resident`), never staged on the heap.
pub fn interleave_into(m: &QMatrix, out: &mut [u8]) {
    assert!(
        can_interleave(m),
        "interleave_into: {:?} has no interleaved form",
        m.dtype
    );
    assert_eq!(
        Some(out.len()),
        interleaved_len(m),
        "interleave_into: output length"
    );
    let nb = m.cols / m.dtype.block_size();
    let bytes = &m.data.bytes()[..m.rows * m.row_bytes()];
    if m.dtype.is_float() {
        let chunk = FLOAT_CHUNK * m.dtype.type_size();
        return interleave_float(bytes, m.rows, m.row_bytes(), chunk, out);
    }
    fn go<B: Interleave>(bytes: &[u8], rows: usize, nb: usize, out: &mut [u8]) {
        let (size, size8) = (std::mem::size_of::<B>(), std::mem::size_of::<B::X8>());
        assert_eq!(size8, 8 * size, "an interleaved block is 8 blocks' bytes");
        // The bytes may be unaligned for `B` (a view into a file): read each block out.
        let block = |r: usize, b: usize| -> B {
            bytemuck::pod_read_unaligned(&bytes[(r * nb + b) * size..][..size])
        };
        for (g, j0) in (0..rows).step_by(8).enumerate() {
            for b in 0..nb {
                let held: [Option<B>; 8] =
                    std::array::from_fn(|k| (j0 + k < rows).then(|| block(j0 + k, b)));
                let x8 = B::interleave(std::array::from_fn(|k| held[k].as_ref()));
                out[(g * nb + b) * size8..][..size8].copy_from_slice(bytemuck::bytes_of(&x8));
            }
        }
    }
    match m.dtype {
        DType::Q4_0 => go::<BlockQ4_0>(bytes, m.rows, nb, out),
        DType::Q4_1 => go::<BlockQ4_1>(bytes, m.rows, nb, out),
        DType::Q4K => go::<BlockQ4K>(bytes, m.rows, nb, out),
        DType::Q5K => go::<BlockQ5K>(bytes, m.rows, nb, out),
        _ => go::<BlockQ8_0>(bytes, m.rows, nb, out),
    }
}

/// The interleaved bytes of `m` (`can_interleave`) in a new buffer, or `None`.
pub fn interleaved_bytes(m: &QMatrix) -> Option<Vec<u8>> {
    let mut out = vec![0u8; interleaved_len(m)?];
    interleave_into(m, &mut out);
    Some(out)
}

/// `m` interleaved into an owned buffer (`can_interleave`), or `None`.
pub fn interleaved(m: &QMatrix) -> Option<QMatrix> {
    let bytes = interleaved_bytes(m)?;
    Some(QMatrix {
        dtype: m.dtype,
        rows: m.rows,
        cols: m.cols,
        data: WeightData::Owned(Arc::new(AlignedBytes::from_bytes(&bytes))),
        layout: Layout::Interleaved8,
    })
}

/// Row `r` of `m` as row-major bytes, in any layout.
pub fn row_bytes(m: &QMatrix, r: usize) -> Vec<u8> {
    match m.layout {
        Layout::Rows => m.row(r).to_vec(),
        Layout::PackedBf16 => {
            super::packed_bf16::PackedBf16::new(m.data.bytes(), m.rows, m.cols).row(r)
        }
        Layout::Interleaved8 => {
            let nb = m.cols / m.dtype.block_size();
            fn go<B: Interleave>(bytes: &[u8], nb: usize, r: usize) -> Vec<u8> {
                let size = std::mem::size_of::<B::X8>();
                let group = &bytes[r / 8 * nb * size..(r / 8 + 1) * nb * size];
                let row: Vec<B> = group
                    .chunks_exact(size)
                    .map(|x| B::row_of(&bytemuck::pod_read_unaligned(x), r % 8))
                    .collect();
                bytemuck::cast_slice(&row).to_vec()
            }
            match m.dtype {
                DType::F32 | DType::F16 | DType::BF16 => {
                    let chunk = FLOAT_CHUNK * m.dtype.type_size();
                    float_row(m.data.bytes(), r, m.row_bytes(), chunk)
                }
                DType::Q4_0 => go::<BlockQ4_0>(m.data.bytes(), nb, r),
                DType::Q4_1 => go::<BlockQ4_1>(m.data.bytes(), nb, r),
                DType::Q8_0 => go::<BlockQ8_0>(m.data.bytes(), nb, r),
                DType::Q4K => go::<BlockQ4K>(m.data.bytes(), nb, r),
                DType::Q5K => go::<BlockQ5K>(m.data.bytes(), nb, r),
                other => unreachable!("{other} is never interleaved"),
            }
        }
    }
}
