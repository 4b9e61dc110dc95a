//! Runtime ISA detection. Kernels pick their path from `features()` once per call;
//! `VIGIL_FORCE_SCALAR=1` pins every kernel to the portable path (used by tests and to debug).

use std::sync::OnceLock;

/// The instruction-set extensions the fast kernels care about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuFeatures {
    /// AVX2 + FMA + F16C, all three: the x86-64 fast path.
    pub avx2_fma_f16c: bool,
}

pub fn features() -> CpuFeatures {
    static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
    *FEATURES.get_or_init(detect)
}

fn detect() -> CpuFeatures {
    if std::env::var("VIGIL_FORCE_SCALAR").is_ok_and(|v| v == "1") {
        return CpuFeatures {
            avx2_fma_f16c: false,
        };
    }
    #[cfg(target_arch = "x86_64")]
    {
        CpuFeatures {
            avx2_fma_f16c: std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c"),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        CpuFeatures {
            avx2_fma_f16c: false,
        }
    }
}
