//! Runtime ISA detection. Kernels pick their path from `features()` once per call.
//!
//! Two environment variables, read once per process, narrow what `features()` reports:
//!
//! - `VIGIL_FORCE_SCALAR=1` pins every kernel to the portable path (used by tests and to
//!   debug); it wins over `VIGIL_MAX_ISA`.
//! - `VIGIL_MAX_ISA=scalar|avx2|avx_vnni|avx512` caps detection at that level, so one binary
//!   can compare the paths (benchmarks) or be pinned to one (debugging). A level the CPU lacks
//!   is not turned on; an unknown value is reported on stderr and ignored.
//!
//! The levels, each implying the ones before it: `avx2` (AVX2 + FMA + F16C), `avx_vnni` (the
//! VEX 256-bit `vpdpbusd`, e.g. Alder Lake, Zen 5), `avx512` (AVX-512 F/BW/VL + VNNI, which
//! also gives the 256-bit `vpdpbusd` in its EVEX encoding). Kernels take the first path their
//! `CpuFeatures` allow in the order avx512, avx_vnni, avx2, scalar; every quantized path gives
//! the same bits (see `quant::dot`).
//!
//! - `VIGIL_BF16_DOTS=1` multiplies BF16 weights with `vdpbf16ps` at the `avx512` level of a CPU
//!   with AVX512_BF16 ([`bf16_dots`]). Off by default: that path rounds the activations to BF16
//!   (numerics of its own, `quant::dot::avx512_bf16`), and on the Xeon (Emerald Rapids) this
//!   project measures on, `vdpbf16ps` issues at 1.7–1.8 G/s per core against the f32 FMA's
//!   5.4–6.7 (`examples/bf16_dot_rate.rs`), so its 32 multiply-adds per instruction give
//!   0.5–0.67× the FMA's, and the BF16 GEMM on it runs at about 200 GFLOP/s against the f32
//!   path's 270–280.
//! - `VIGIL_AMX=0` keeps the Q8_0 prefill GEMM off AMX ([`amx_int8`]) on a CPU that has it;
//!   it uses it by default at the `avx512` level. It changes only speed: the AMX GEMM gives
//!   the same bits as the AVX-512 one (`quant::dot::amx_gemm`).

use std::sync::OnceLock;

/// The instruction-set extensions the fast kernels care about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuFeatures {
    /// AVX2 + FMA + F16C, all three: the x86-64 fast path.
    pub avx2_fma_f16c: bool,
    /// AVX-VNNI (`vpdpbusd` on ymm, VEX encoding), with everything `avx2_fma_f16c` covers.
    pub avx_vnni: bool,
    /// AVX-512 F + BW + VL + VNNI, with everything `avx2_fma_f16c` covers.
    pub avx512_vnni: bool,
}

/// The kernel levels `VIGIL_MAX_ISA` names, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    Avx2,
    AvxVnni,
    Avx512,
}

impl Isa {
    /// The `VIGIL_MAX_ISA` spelling.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx_vnni",
            Isa::Avx512 => "avx512",
        }
    }

    fn parse(s: &str) -> Option<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512]
            .into_iter()
            .find(|isa| isa.name() == s)
    }
}

impl CpuFeatures {
    const NONE: CpuFeatures = CpuFeatures {
        avx2_fma_f16c: false,
        avx_vnni: false,
        avx512_vnni: false,
    };

    /// Whether the kernels of level `isa` may run.
    pub fn has(self, isa: Isa) -> bool {
        match isa {
            Isa::Scalar => true,
            Isa::Avx2 => self.avx2_fma_f16c,
            Isa::AvxVnni => self.avx_vnni,
            Isa::Avx512 => self.avx512_vnni,
        }
    }

    /// The highest level that may run: the one the kernels choose.
    pub fn best(self) -> Isa {
        [Isa::Avx512, Isa::AvxVnni, Isa::Avx2]
            .into_iter()
            .find(|&isa| self.has(isa))
            .unwrap_or(Isa::Scalar)
    }

    /// These features with every level above `max` turned off.
    pub fn capped(self, max: Isa) -> CpuFeatures {
        CpuFeatures {
            avx2_fma_f16c: self.avx2_fma_f16c && max >= Isa::Avx2,
            avx_vnni: self.avx_vnni && max >= Isa::AvxVnni,
            avx512_vnni: self.avx512_vnni && max >= Isa::Avx512,
        }
    }
}

/// What the kernels may use: the CPU's features narrowed by `VIGIL_FORCE_SCALAR` and
/// `VIGIL_MAX_ISA`.
pub fn features() -> CpuFeatures {
    static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        if std::env::var("VIGIL_FORCE_SCALAR").is_ok_and(|v| v == "1") {
            return CpuFeatures::NONE;
        }
        let cpu = detected();
        match std::env::var("VIGIL_MAX_ISA") {
            Ok(v) => match Isa::parse(v.trim()) {
                Some(max) => cpu.capped(max),
                None => {
                    eprintln!(
                        "vigil: ignoring VIGIL_MAX_ISA={v:?} \
                         (expected scalar, avx2, avx_vnni or avx512)"
                    );
                    cpu
                }
            },
            Err(_) => cpu,
        }
    })
}

/// Whether the CPU has AVX512_BF16 (`vdpbf16ps`) beside the `avx512` level.
pub fn avx512_bf16() -> bool {
    static BF16: OnceLock<bool> = OnceLock::new();
    *BF16.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            detected().avx512_vnni && std::arch::is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Whether BF16 weights run on `quant::dot::avx512_bf16` wherever a call runs at `avx512`:
/// `VIGIL_BF16_DOTS=1` on a CPU with AVX512_BF16 (read once per process).
pub fn bf16_dots() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        avx512_bf16() && std::env::var("VIGIL_BF16_DOTS").is_ok_and(|v| v.trim() == "1")
    })
}

/// Whether the Q8_0 prefill GEMM runs its integer dots on AMX tiles
/// (`quant::dot::amx_gemm`): a call at the `avx512` level, on a CPU with AMX-TILE and
/// AMX-INT8 whose kernel grants this process the tile state, unless `VIGIL_AMX=0` (all read
/// once per process).
pub fn amx_int8() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        features().has(Isa::Avx512)
            && !std::env::var("VIGIL_AMX").is_ok_and(|v| v.trim() == "0")
            && amx_granted()
    })
}

/// AMX-TILE and AMX-INT8 (CPUID leaf 7: EDX bits 24, 25), and the tile data state granted by
/// the kernel (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, Linux 5.16 on; the
/// grant holds for every thread of the process).
fn amx_granted() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
        let (tile, int8) = (leaf7.edx >> 24 & 1 == 1, leaf7.edx >> 25 & 1 == 1);
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: asks for a permission; no memory is passed.
        tile && int8
            && unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                )
            } == 0
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        false
    }
}

/// What the CPU supports, ignoring the environment: for tests that run one path on purpose.
pub fn detected() -> CpuFeatures {
    static DETECTED: OnceLock<CpuFeatures> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

fn detect() -> CpuFeatures {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let avx2 = has!("avx2") && has!("fma") && has!("f16c");
        CpuFeatures {
            avx2_fma_f16c: avx2,
            avx_vnni: avx2 && has!("avxvnni"),
            avx512_vnni: avx2
                && has!("avx512f")
                && has!("avx512bw")
                && has!("avx512vl")
                && has!("avx512vnni"),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        CpuFeatures::NONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_isa_names_round_trip() {
        for isa in [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512] {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse("avx512vnni"), None);
    }

    #[test]
    fn capping_turns_off_the_levels_above() {
        let all = CpuFeatures {
            avx2_fma_f16c: true,
            avx_vnni: true,
            avx512_vnni: true,
        };
        assert_eq!(all.capped(Isa::Avx512), all);
        assert_eq!(all.capped(Isa::AvxVnni).best(), Isa::AvxVnni);
        assert_eq!(all.capped(Isa::Avx2).best(), Isa::Avx2);
        assert_eq!(all.capped(Isa::Scalar), CpuFeatures::NONE);
        // An AVX-512 CPU without AVX-VNNI (Ice Lake, Zen 4) capped at avx_vnni runs AVX2.
        let no_vex = CpuFeatures {
            avx_vnni: false,
            ..all
        };
        assert_eq!(no_vex.capped(Isa::AvxVnni).best(), Isa::Avx2);
        assert_eq!(no_vex.best(), Isa::Avx512);
    }
}
