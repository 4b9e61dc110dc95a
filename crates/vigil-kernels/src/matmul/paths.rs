//! How each weight format reaches its kernels: the scalar dot on the portable path, and on
//! each SIMD level the row tiles that stream the weights in place (decode, below the format's
//! GEMM threshold) or the repacked-weight GEMM (prefill). `super::run` picks the format and
//! the thread split; these pick the kernel.

#[cfg(target_arch = "x86_64")]
use super::FLOAT_GEMM_MIN_ROWS;
use super::{
    Path, AMX_MIN_ROWS, GEMM_MIN_ROWS, K_X8_GEMM_MIN_ROWS, Q4K_BYTES_MIN_ROWS, Q4K_GEMM_MIN_ROWS,
    Q5K_BYTES_MIN_ROWS, Q5K_GEMM_MIN_ROWS, Q6K_GEMM_MIN_ROWS,
};
use crate::cpu::Isa;
use crate::pool::SyncPtr;
use crate::quant::blocks::*;
use crate::quant::dot::{scalar, Acts32};
use crate::quant::interleave::{self, Interleave};
use crate::DType;

/// Ties a 32-value weight format to its scalar dot and its SIMD kernels.
pub(super) trait Fmt32Path {
    type W: bytemuck::Pod;
    type A: bytemuck::Pod;
    fn scalar_dot(w: &[Self::W], a: &[Self::A]) -> f32;
    /// # Safety
    /// The CPU has `isa` (not `Scalar`); otherwise as `avx2::matmul_rows`.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn simd_rows(
        isa: Isa,
        w: &[Self::W],
        rows: usize,
        acts: &Acts32<Self::A>,
        r0: usize,
        r1: usize,
        out: *mut f32,
    );
}

/// `$fmt`: the format's marker type in `quant::dot::avx2`, which every kernel is generic
/// over. From `GEMM_MIN_ROWS` activation rows on, the repacked-weight GEMM kernel of the
/// level (`$amx`, Q8_0's, from `AMX_MIN_ROWS` where `cpu::amx_int8` allows); below that, the
/// row tiles.
macro_rules! fmt32 {
    ($name:ident, $w:ty, $a:ty, $dot:path, $fmt:ty $(, $amx:ident)?) => {
        pub(super) struct $name;
        impl Fmt32Path for $name {
            type W = $w;
            type A = $a;
            fn scalar_dot(w: &[$w], a: &[$a]) -> f32 {
                $dot(w, a)
            }
            #[cfg(target_arch = "x86_64")]
            unsafe fn simd_rows(
                isa: Isa,
                w: &[$w],
                rows: usize,
                acts: &Acts32<$a>,
                r0: usize,
                r1: usize,
                out: *mut f32,
            ) {
                use crate::quant::dot::{avx2, avx2_gemm, avx512_gemm, vnni, vnni_gemm};
                if acts.m < GEMM_MIN_ROWS {
                    return match isa {
                        Isa::Avx512 => vnni::rows32_avx512vl::<$fmt>(w, rows, acts, r0, r1, out),
                        Isa::AvxVnni => vnni::rows32_avx_vnni::<$fmt>(w, rows, acts, r0, r1, out),
                        _ => avx2::matmul_rows::<$fmt>(w, rows, acts, r0, r1, out),
                    };
                }
                // Q8_0 (`$amx`: `amx_gemm`) takes AMX where the CPU has it.
                $(if isa == Isa::Avx512 && acts.m >= AMX_MIN_ROWS && crate::cpu::amx_int8() {
                    use crate::quant::dot::$amx;
                    return $amx::matmul_rows::<$fmt>(w, rows, acts, r0, r1, out);
                })?
                match isa {
                    Isa::Avx512 => avx512_gemm::matmul_rows::<$fmt>(w, rows, acts, r0, r1, out),
                    Isa::AvxVnni => {
                        vnni_gemm::matmul_rows_avx_vnni::<$fmt>(w, rows, acts, r0, r1, out)
                    }
                    _ => avx2_gemm::matmul_rows::<$fmt>(w, rows, acts, r0, r1, out),
                }
            }
        }
    };
}

fmt32!(
    Q4_0Fmt,
    BlockQ4_0,
    BlockQ8_0,
    scalar::dot_q4_0_q8_0,
    crate::quant::dot::avx2::Q4_0
);
fmt32!(
    Q4_1Fmt,
    BlockQ4_1,
    BlockQ8_1,
    scalar::dot_q4_1_q8_1,
    crate::quant::dot::avx2::Q4_1
);
fmt32!(
    Q8_0Fmt,
    BlockQ8_0,
    BlockQ8_0,
    scalar::dot_q8_0_q8_0,
    crate::quant::dot::avx2::Q8_0,
    amx_gemm
);

/// The scalar path of a block-quantized matmul: `out[i * rows + j] = dot(row j, activation row
/// i)` for `j in r0..r1` and every activation row of `acts` (`nb` blocks each), row `j`'s blocks
/// at `(j - first) * nb` of `w`.
#[allow(clippy::too_many_arguments)]
fn scalar_rows<W, A>(
    dot: impl Fn(&[W], &[A]) -> f32,
    w: &[W],
    first: usize,
    acts: &[A],
    nb: usize,
    rows: usize,
    (r0, r1): (usize, usize),
    out: SyncPtr<f32>,
) {
    for (i, a) in acts.chunks_exact(nb).enumerate() {
        for j in r0..r1 {
            let v = dot(&w[(j - first) * nb..(j - first + 1) * nb], a);
            // SAFETY: this thread owns columns r0..r1; the index is < m * rows.
            unsafe { *out.0.add(i * rows + j) = v };
        }
    }
}

/// `scalar_rows` over a matrix interleaved at load (`w`: its groups of 8 rows, `r0` a multiple
/// of 8): each group taken back to rows (`interleave::group_rows`).
fn scalar_groups<B: Interleave, A>(
    dot: impl Fn(&[B], &[A]) -> f32,
    w: &[B::X8],
    acts: &[A],
    nb: usize,
    rows: usize,
    (r0, r1): (usize, usize),
    out: SyncPtr<f32>,
) {
    for j0 in (r0..r1).step_by(8) {
        let group = interleave::group_rows::<B>(w, nb, j0 / 8);
        let span = (j0, (j0 + 8).min(r1));
        scalar_rows(&dot, &group, j0, acts, nb, rows, span, out);
    }
}

pub(super) fn rows_32<F: Fmt32Path>(
    path: Path,
    w: &[F::W],
    rows: usize,
    acts: &Acts32<F::A>,
    r0: usize,
    r1: usize,
    out: SyncPtr<f32>,
) {
    let nb = acts.nb;
    match path {
        Path::Scalar => scalar_rows(
            F::scalar_dot,
            w,
            0,
            &acts.blocks[..acts.m * nb],
            nb,
            rows,
            (r0, r1),
            out,
        ),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a SIMD path is chosen only when the CPU has its features; shapes were
        // checked in `matmul_on`; this thread owns columns r0..r1.
        isa => unsafe { F::simd_rows(isa, w, rows, acts, r0, r1, out.0) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no SIMD kernels on this architecture"),
    }
}

/// A 32-value integer format's interleaved form (`quant::interleave`) and its kernels.
pub(super) trait Fmt32x8: Fmt32Path<W: Interleave> {
    /// # Safety
    /// The CPU has `isa` (not `Scalar`); `r0` a multiple of 8; otherwise as
    /// `avx2_q4_decode::matmul_rows_x8`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn simd_rows_x8(
        isa: Isa,
        w: &[<Self::W as Interleave>::X8],
        rows: usize,
        acts: &Acts32<Self::A>,
        r0: usize,
        r1: usize,
        out: *mut f32,
    );
}

/// `$fmt` as in `fmt32!`. Decode (below `GEMM_MIN_ROWS`) reads the groups in place with the
/// format's group tiles (`avx2_q4_decode::GroupTiles`: Q4_0 / Q4_1 there, Q8_0 in
/// `avx2_q8_decode`); prefill runs the level's GEMM, whose packing from them is loads (`X8`:
/// `avx2_gemm::Group8`, `avx2_gemm_q8::Q8Group`).
macro_rules! fmt32x8 {
    ($name:ident, $fmt:ty $(, $amx:ident)?) => {
        impl Fmt32x8 for $name {
            #[cfg(target_arch = "x86_64")]
            unsafe fn simd_rows_x8(
                isa: Isa,
                w: &[<Self::W as Interleave>::X8],
                rows: usize,
                acts: &Acts32<Self::A>,
                r0: usize,
                r1: usize,
                out: *mut f32,
            ) {
                use crate::quant::dot::avx2_gemm::{self, X8};
                use crate::quant::dot::{avx2_q4_decode, avx512_gemm, vnni, vnni_gemm};
                if acts.m < GEMM_MIN_ROWS {
                    return match isa {
                        Isa::Avx512 => vnni::rows_x8_avx512vl::<$fmt>(w, rows, acts, r0, r1, out),
                        Isa::AvxVnni => vnni::rows_x8_avx_vnni::<$fmt>(w, rows, acts, r0, r1, out),
                        _ => avx2_q4_decode::matmul_rows_x8::<$fmt>(w, rows, acts, r0, r1, out),
                    };
                }
                $(if isa == Isa::Avx512 && acts.m >= AMX_MIN_ROWS && crate::cpu::amx_int8() {
                    use crate::quant::dot::$amx;
                    return $amx::matmul_rows::<X8<$fmt>>(w, rows, acts, r0, r1, out);
                })?
                match isa {
                    Isa::Avx512 => avx512_gemm::matmul_rows::<X8<$fmt>>(w, rows, acts, r0, r1, out),
                    Isa::AvxVnni => {
                        vnni_gemm::matmul_rows_avx_vnni::<X8<$fmt>>(w, rows, acts, r0, r1, out)
                    }
                    _ => avx2_gemm::matmul_rows::<X8<$fmt>>(w, rows, acts, r0, r1, out),
                }
            }
        }
    };
}

fmt32x8!(Q4_0Fmt, crate::quant::dot::avx2::Q4_0);
fmt32x8!(Q4_1Fmt, crate::quant::dot::avx2::Q4_1);
fmt32x8!(Q8_0Fmt, crate::quant::dot::avx2::Q8_0, amx_gemm);

/// `rows_32` for an interleaved matrix: `w` its groups (`r0` a multiple of 8). The scalar
/// path takes each group back to rows and runs the row-major dot.
pub(super) fn rows_x8<F: Fmt32x8>(
    path: Path,
    w: &[<F::W as Interleave>::X8],
    rows: usize,
    acts: &Acts32<F::A>,
    r0: usize,
    r1: usize,
    out: SyncPtr<f32>,
) {
    let nb = acts.nb;
    match path {
        Path::Scalar => scalar_groups::<F::W, _>(
            F::scalar_dot,
            w,
            &acts.blocks[..acts.m * nb],
            nb,
            rows,
            (r0, r1),
            out,
        ),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `rows_32`; `split_rows` gives 8-aligned ranges.
        isa => unsafe { F::simd_rows_x8(isa, w, rows, acts, r0, r1, out.0) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no SIMD kernels on this architecture"),
    }
}

/// Ties a k-quant weight format to its scalar dot and its SIMD kernels.
pub(super) trait FmtKPath {
    type W: bytemuck::Pod;
    fn scalar_dot(w: &[Self::W], a: &[BlockQ8K]) -> f32;
    /// # Safety
    /// The CPU has `isa` (not `Scalar`); otherwise as `avx2_k_decode::matmul_rows`.
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn simd_rows(
        isa: Isa,
        w: &[Self::W],
        rows: usize,
        acts: &[BlockQ8K],
        m: usize,
        r0: usize,
        r1: usize,
        out: *mut f32,
    );
}

/// `$avx`: the format's marker type in `quant::dot::avx2_k`, whose decode tile
/// (`avx2_k_decode`) takes fewer than `$min` activation rows (`Q4K_GEMM_MIN_ROWS`,
/// `Q5K_GEMM_MIN_ROWS`, `Q6K_GEMM_MIN_ROWS`). `$zmm`, `$ymm`: its repacked-weight GEMM kernels
/// in `avx512_kgemm` (16 rows) and `avx2_kgemm` (8 rows, generic over the integer dot), from
/// `$min` rows on; from `$bmin` rows (`Q4K_BYTES_MIN_ROWS`, `Q5K_BYTES_MIN_ROWS`) the AVX-512 one
/// is `$zmmb`, which packs the quants as bytes.
macro_rules! fmtk {
    ($name:ident, $w:ty, $dot:path, $avx:ty, $zmm:ty, $zmmb:ty, $ymm:ident, $min:expr, $bmin:expr) => {
        pub(super) struct $name;
        impl FmtKPath for $name {
            type W = $w;
            fn scalar_dot(w: &[$w], a: &[BlockQ8K]) -> f32 {
                $dot(w, a)
            }
            #[cfg(target_arch = "x86_64")]
            unsafe fn simd_rows(
                isa: Isa,
                w: &[$w],
                rows: usize,
                acts: &[BlockQ8K],
                m: usize,
                r0: usize,
                r1: usize,
                out: *mut f32,
            ) {
                use crate::quant::dot::{avx2, avx2_k_decode, avx2_kgemm, avx512_kgemm, vnni};
                if m < $min {
                    return match isa {
                        Isa::Avx512 => {
                            vnni::rows_k_decode_avx512vl::<$avx>(w, rows, acts, m, r0, r1, out)
                        }
                        Isa::AvxVnni => {
                            vnni::rows_k_decode_avx_vnni::<$avx>(w, rows, acts, m, r0, r1, out)
                        }
                        _ => avx2_k_decode::matmul_rows::<$avx>(w, rows, acts, m, r0, r1, out),
                    };
                }
                let acts = Acts32 {
                    blocks: acts,
                    d: &[],
                    s: &[],
                    neg8_ysum: &[],
                    m,
                    nb: acts.len() / m,
                };
                match isa {
                    Isa::Avx512 if m >= $bmin => {
                        avx512_kgemm::matmul_rows::<$zmmb>(w, rows, &acts, r0, r1, out)
                    }
                    Isa::Avx512 => avx512_kgemm::matmul_rows::<$zmm>(w, rows, &acts, r0, r1, out),
                    Isa::AvxVnni => avx2_kgemm::matmul_rows_avx_vnni::<
                        avx2_kgemm::$ymm<vnni::AvxVnni>,
                    >(w, rows, &acts, r0, r1, out),
                    _ => avx2_kgemm::matmul_rows::<avx2_kgemm::$ymm<avx2::Avx2>>(
                        w, rows, &acts, r0, r1, out,
                    ),
                }
            }
        }
    };
}

fmtk!(
    Q4KFmt,
    BlockQ4K,
    scalar::dot_q4k_q8k,
    crate::quant::dot::avx2_k::Q4K,
    crate::quant::dot::avx512_kgemm::Q4K16,
    crate::quant::dot::avx512_kgemm::Q4K16B,
    Q4K8,
    Q4K_GEMM_MIN_ROWS,
    Q4K_BYTES_MIN_ROWS
);
fmtk!(
    Q5KFmt,
    BlockQ5K,
    scalar::dot_q5k_q8k,
    crate::quant::dot::avx2_k::Q5K,
    crate::quant::dot::avx512_kgemm::Q5K16,
    crate::quant::dot::avx512_kgemm::Q5K16B,
    Q5K8,
    Q5K_GEMM_MIN_ROWS,
    Q5K_BYTES_MIN_ROWS
);
fmtk!(
    Q6KFmt,
    BlockQ6K,
    scalar::dot_q6k_q8k,
    crate::quant::dot::avx2_k::Q6K,
    crate::quant::dot::avx512_kgemm::Q6K16,
    crate::quant::dot::avx512_kgemm::Q6K16,
    Q6K8,
    Q6K_GEMM_MIN_ROWS,
    usize::MAX
);

#[allow(clippy::too_many_arguments)]
pub(super) fn rows_k<F: FmtKPath>(
    path: Path,
    w: &[F::W],
    rows: usize,
    acts: &[BlockQ8K],
    m: usize,
    r0: usize,
    r1: usize,
    out: SyncPtr<f32>,
) {
    let nb = acts.len() / m;
    match path {
        Path::Scalar => scalar_rows(F::scalar_dot, w, 0, acts, nb, rows, (r0, r1), out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `rows_32`.
        isa => unsafe { F::simd_rows(isa, w, rows, acts, m, r0, r1, out.0) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no SIMD kernels on this architecture"),
    }
}

/// `rows_k` for a Q4_K or Q5_K matrix interleaved at load (`w`: its groups of 8 rows; `r0` a
/// multiple of 8, of 16 for the AVX-512 GEMM): below `K_X8_GEMM_MIN_ROWS` activation rows the
/// interleaved decode tile (`avx2_q4k_decode`), from it the level's k-quant GEMM, packing from
/// the groups (from `$bmin` rows, on AVX-512, as bytes). The scalar path takes each group back
/// to rows and runs the row-major dot.
macro_rules! rows_kx8 {
    ($name:ident, $x8:ty, $row:ty, $dot:path, $tile:ident, $zmm:ident, $zmmb:ident, $ymm:ident, $bmin:expr) => {
        #[allow(clippy::too_many_arguments)]
        pub(super) fn $name(
            path: Path,
            w: &[$x8],
            rows: usize,
            acts: &[BlockQ8K],
            m: usize,
            r0: usize,
            r1: usize,
            out: SyncPtr<f32>,
        ) {
            let nb = acts.len() / m;
            match path {
                Path::Scalar => scalar_groups::<$row, _>($dot, w, acts, nb, rows, (r0, r1), out),
                #[cfg(target_arch = "x86_64")]
                // SAFETY: as in `rows_32`; `split_rows` gives aligned ranges.
                isa => unsafe {
                    use crate::quant::dot::avx2_kgemm::{self, $ymm};
                    use crate::quant::dot::avx2_q4k_decode::$tile;
                    use crate::quant::dot::avx512_kgemm::{self, $zmm, $zmmb};
                    use crate::quant::dot::{avx2, avx2_q4_decode, vnni};
                    let acts = Acts32 {
                        blocks: acts,
                        d: &[],
                        s: &[],
                        neg8_ysum: &[],
                        m,
                        nb,
                    };
                    let out = out.0;
                    if m >= K_X8_GEMM_MIN_ROWS {
                        match isa {
                            Isa::Avx512 if m >= $bmin => {
                                avx512_kgemm::matmul_rows::<$zmmb>(w, rows, &acts, r0, r1, out)
                            }
                            Isa::Avx512 => {
                                avx512_kgemm::matmul_rows::<$zmm>(w, rows, &acts, r0, r1, out)
                            }
                            Isa::AvxVnni => {
                                avx2_kgemm::matmul_rows_avx_vnni::<$ymm<vnni::AvxVnni>>(
                                    w, rows, &acts, r0, r1, out,
                                )
                            }
                            _ => avx2_kgemm::matmul_rows::<$ymm<avx2::Avx2>>(
                                w, rows, &acts, r0, r1, out,
                            ),
                        }
                    } else {
                        match isa {
                            Isa::Avx512 => {
                                vnni::rows_x8_avx512vl::<$tile>(w, rows, &acts, r0, r1, out)
                            }
                            Isa::AvxVnni => {
                                vnni::rows_x8_avx_vnni::<$tile>(w, rows, &acts, r0, r1, out)
                            }
                            _ => {
                                avx2_q4_decode::matmul_rows_x8::<$tile>(w, rows, &acts, r0, r1, out)
                            }
                        }
                    }
                },
                #[cfg(not(target_arch = "x86_64"))]
                _ => unreachable!("no SIMD kernels on this architecture"),
            }
        }
    };
}

rows_kx8!(
    rows_q4k_x8,
    BlockQ4Kx8,
    BlockQ4K,
    scalar::dot_q4k_q8k,
    Q4KX8,
    Q4K16X8,
    Q4K16X8B,
    Q4K8X8,
    Q4K_BYTES_MIN_ROWS
);
rows_kx8!(
    rows_q5k_x8,
    BlockQ5Kx8,
    BlockQ5K,
    scalar::dot_q5k_q8k,
    Q5KX8,
    Q5K16X8,
    Q5K16X8B,
    Q5K8X8,
    Q5K_BYTES_MIN_ROWS
);

#[allow(clippy::too_many_arguments)]
pub(super) fn rows_float(
    path: Path,
    dtype: DType,
    w: &[u8],
    x8: bool,
    rows: usize,
    cols: usize,
    x: &[f32],
    m: usize,
    r0: usize,
    r1: usize,
    out: SyncPtr<f32>,
) {
    let row_bytes = cols * dtype.type_size();
    match path {
        Path::Scalar => {
            let dot = match dtype {
                DType::F16 => scalar::dot_f16,
                DType::BF16 => scalar::dot_bf16,
                _ => scalar::dot_f32,
            };
            let chunk = interleave::FLOAT_CHUNK * dtype.type_size();
            for j in r0..r1 {
                // A row taken back out of its group once when interleaved (`quant::interleave`).
                let row: std::borrow::Cow<[u8]> = if x8 {
                    interleave::float_row(w, j, row_bytes, chunk).into()
                } else {
                    w[j * row_bytes..(j + 1) * row_bytes].into()
                };
                for i in 0..m {
                    let v = dot(&row, &x[i * cols..(i + 1) * cols]);
                    // SAFETY: this thread owns columns r0..r1; the index is < m * rows.
                    unsafe { *out.0.add(i * rows + j) = v };
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `rows_32`; every SIMD level has AVX2.
        _ => unsafe {
            use crate::quant::dot::avx2_float::{matmul_rows, FloatRows, BF16, F16, F32};
            let w = FloatRows { w, cols, x8 };
            if m >= FLOAT_GEMM_MIN_ROWS {
                use crate::quant::dot::avx2_float_gemm::{matmul_rows as gemm, Avx2};
                use crate::quant::dot::avx512_float_gemm::Avx512;
                // The AVX-512 tiles or the AVX2 ones: the same numerics, bit for bit.
                return match (path, dtype) {
                    (Isa::Avx512, DType::F16) => gemm::<Avx512, F16>(w, rows, x, m, r0, r1, out.0),
                    (Isa::Avx512, DType::BF16) => {
                        gemm::<Avx512, BF16>(w, rows, x, m, r0, r1, out.0)
                    }
                    (Isa::Avx512, _) => gemm::<Avx512, F32>(w, rows, x, m, r0, r1, out.0),
                    (_, DType::F16) => gemm::<Avx2, F16>(w, rows, x, m, r0, r1, out.0),
                    (_, DType::BF16) => gemm::<Avx2, BF16>(w, rows, x, m, r0, r1, out.0),
                    _ => gemm::<Avx2, F32>(w, rows, x, m, r0, r1, out.0),
                };
            }
            // AVX-512 has a BF16 decode tile of its own (`avx512_float`).
            match (path, dtype) {
                (_, DType::F16) => matmul_rows::<F16, false>(w, rows, x, m, r0, r1, out.0),
                (Isa::Avx512, DType::BF16) => {
                    matmul_rows::<BF16, true>(w, rows, x, m, r0, r1, out.0)
                }
                (_, DType::BF16) => matmul_rows::<BF16, false>(w, rows, x, m, r0, r1, out.0),
                _ => matmul_rows::<F32, false>(w, rows, x, m, r0, r1, out.0),
            }
        },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no SIMD kernels on this architecture"),
    }
}

/// Bytes of a packed matrix's rows the GEMM unpacks at a time (`rows_packed_bf16`).
const UNPACKED_SLAB_BYTES: usize = 2 << 20;

thread_local! {
    /// The unpacked rows, kept from call to call (a fresh buffer each call paid for its pages).
    static UNPACKED: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `rows_float` for BF16 packed by `quant::packed_bf16`: the same values, the same bits. One
/// activation row takes the packed decode tile; more run `rows_float` on rows unpacked into a
/// buffer: a group at a time for a few rows (decode, from L1), a slab the size of L2 for the
/// GEMM, which is bound by its FMAs (unpacking inside it, again for each chunk of activation
/// rows, cost it 4-7 %).
#[allow(clippy::too_many_arguments)]
pub(super) fn rows_packed_bf16(
    path: Path,
    w: crate::quant::packed_bf16::PackedBf16,
    rows: usize,
    x: &[f32],
    m: usize,
    r0: usize,
    r1: usize,
    out: SyncPtr<f32>,
) {
    let cols = w.cols;
    match path {
        Path::Scalar => {
            for j in r0..r1 {
                let row = w.row(j);
                for i in 0..m {
                    let v = scalar::dot_bf16(&row, &x[i * cols..(i + 1) * cols]);
                    // SAFETY: this thread owns columns r0..r1; the index is < m * rows.
                    unsafe { *out.0.add(i * rows + j) = v };
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `rows_float`; `r0` is a multiple of 8 (`ROW_ALIGN`).
        _ => unsafe {
            use crate::quant::dot::avx2_float::{gemv_packed, unpack_group};
            if m == 1 {
                return match path {
                    Isa::Avx512 => gemv_packed::<true>(&w, rows, x, r0, r1, out.0),
                    _ => gemv_packed::<false>(&w, rows, x, r0, r1, out.0),
                };
            }
            let group = 16 * cols;
            let slab = if m >= FLOAT_GEMM_MIN_ROWS {
                (UNPACKED_SLAB_BYTES / group).max(1) * 8
            } else {
                8
            };
            let mut buf = UNPACKED.take();
            let need = group * slab.min((r1 - r0).next_multiple_of(8)) / 8;
            buf.resize(buf.len().max(need), 0);
            for s0 in (r0..r1).step_by(slab) {
                let s1 = (s0 + slab).min(r1);
                for g in s0 / 8..s1.div_ceil(8) {
                    unpack_group(&w, g, buf.as_mut_ptr().add((g - s0 / 8) * group));
                }
                // The slab's rows past r1 never reach `out`.
                let o = SyncPtr(out.0.add(s0));
                rows_float(
                    path,
                    DType::BF16,
                    &buf,
                    true,
                    rows,
                    cols,
                    x,
                    m,
                    0,
                    s1 - s0,
                    o,
                );
            }
            UNPACKED.set(buf);
        },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("no SIMD kernels on this architecture"),
    }
}
