//! Numeric kernels behind Vigil's model: quantized block formats, matmul for every weight
//! format, paged attention, norms and activations, and the persistent worker pool.
//!
//! Every kernel has a portable scalar path; the AVX2+FMA+F16C path (and, for the quantized
//! matmuls, the AVX-VNNI and AVX-512 VNNI paths) is chosen at runtime (`cpu::features()`,
//! which `VIGIL_FORCE_SCALAR` and `VIGIL_MAX_ISA` can narrow) and tested against the scalar
//! one.

pub mod attention;
pub mod cpu;
pub mod dtype;
pub mod matmul;
pub mod ops;
pub mod plain_read;
pub mod pool;
pub mod quant;
pub mod storage;
#[cfg(target_arch = "x86_64")]
mod unroll;
mod vector_math;

pub use dtype::DType;
pub use storage::{Layout, QMatrix, WeightData};
