//! GGML block layouts. Each struct is byte-compatible with GGUF tensor data (checked by the
//! size asserts), so a tensor's bytes are viewed as `&[Block…]` without copying.

use bytemuck::{Pod, Zeroable};
use half::f16;

/// Values per block of the 32-wide formats.
pub const QK: usize = 32;
/// Values per super-block of the k-quant formats.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in a Q4_K / Q5_K super-block.
pub const K_SCALE_SIZE: usize = 12;

/// 32 values: `x = d * (q - 8)`, `q` 4-bit.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// 32 values: `x = d * q + m`, `q` 4-bit.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

/// Block `b` of 8 consecutive Q4_0 rows, interleaved at load (`quant::interleave`): the 8
/// rows' scales side by side, then their nibbles 4 bytes per row: `qs[h][4k..4k + 4]` is
/// bytes `4h..4h + 4` of row `k`'s `qs`. One 256-bit load is then one dword of every row,
/// the form the 8-row kernels multiply (`avx2_gemm`), and the scales are one load.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_0x8 {
    pub d: [f16; 8],
    pub qs: [[u8; 32]; 4],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0x8>() == 8 * 18);

/// `BlockQ4_0x8` for Q4_1: the scales, then the mins, then the interleaved nibbles.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_1x8 {
    pub d: [f16; 8],
    pub m: [f16; 8],
    pub qs: [[u8; 32]; 4],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1x8>() == 8 * 20);

/// Block `b` of 8 Q8_0 rows interleaved at load (`quant::interleave`): the 8 scales side by
/// side, then `qs[h][4k..4k + 4]` = bytes `4h..4h + 4` of row `k`'s `qs` (the order
/// `avx2_gemm_q8::Packed` multiplies in).
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0x8 {
    pub d: [f16; 8],
    pub qs: [[i8; 32]; 8],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0x8>() == 8 * 34);

/// 32 values: `x = d * (q - 16)`, `q` 5-bit: the low nibbles in `qs` (values `j` and
/// `j + 16` share byte `j`, as Q4_0), the fifth bits in `qh` (bit `j` for value `j`).
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// 32 values: `x = d * q`, `q` 8-bit signed.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// Activation block paired with Q4_1: like Q8_0 plus `s = d * sum(qs)`.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

/// 256 values in 8 sub-blocks of 32: `x = d * sc * q - dmin * m`, 6-bit `sc`/`m`, 4-bit `q`.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// Block `b` of 8 Q4_K rows interleaved at load (`quant::interleave`): the 8 rows' `d` and
/// `dmin` side by side, then their packed scale bytes and their nibbles 4 bytes per row:
/// `scales[i][4k..4k + 4]` is bytes `4i..4i + 4` of row `k`'s `scales` (ggml's three words,
/// which its `kmask` steps unpack word by word, so 8 rows unpack in one register), and
/// `qs[h][4k..4k + 4]` bytes `4h..4h + 4` of its `qs`. One 256-bit load of `qs` is one dword
/// of every row: the order `avx2_kgemm` multiplies in, and the 8-row decode tile's
/// (`avx2_q4k_decode`).
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4Kx8 {
    pub d: [f16; 8],
    pub dmin: [f16; 8],
    pub scales: [[u8; 32]; 3],
    pub qs: [[u8; 32]; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ4Kx8>() == 8 * 144);

/// 8 rows' `BlockQ5K` interleaved as `BlockQ4Kx8` is, with `qh[h]` holding bytes `4h..4h + 4`
/// of each row's `qh` (bit `j` of each: the fifth bit of value `4h..4h + 4` of sub-block `j`).
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5Kx8 {
    pub d: [f16; 8],
    pub dmin: [f16; 8],
    pub scales: [[u8; 32]; 3],
    pub qh: [[u8; 32]; 8],
    pub qs: [[u8; 32]; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ5Kx8>() == 8 * 176);

/// Q4_K plus a fifth bit per value in `qh`.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

/// 256 values in 16 sub-blocks of 16: `x = d * sc * (q - 32)`, 8-bit `sc`, 6-bit `q`.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

/// Activation block paired with the k-quants: f32 scale, 8-bit values, sums of each 16.
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

/// One GGML block format: its values per block and its dequantizer.
pub trait GgmlType: Pod {
    const BLOCK_SIZE: usize;
    /// Dequantize `blocks` into `out` (`out.len() == blocks.len() * BLOCK_SIZE`).
    fn to_float(blocks: &[Self], out: &mut [f32]);
}
