//! Quantized block formats (GGML layouts) and the per-format trait that ties a weight block to
//! its dequantizer and to the activation block its dot product pairs with.
//!
//! - `blocks`: the `#[repr(C)]` structs, byte-compatible with GGUF tensor data.
//! - `dequant`: block → f32, bit-exact with the reference (`gguf` Python package / ggml).
//! - `interleave`: the 8-row layout Q4_0 / Q4_1 matrices take at load for the kernels.
//! - `packed_bf16`: BF16 matrices in 12 bits a value, losslessly, for decode.

pub mod blocks;
pub mod dequant;
pub mod dot;
pub mod interleave;
pub mod packed_bf16;
pub mod quantize;
pub mod widen;

pub use blocks::*;
