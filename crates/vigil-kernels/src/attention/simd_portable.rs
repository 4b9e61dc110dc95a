//! Non-x86 builds never take the SIMD path (`cpu::features()` says no); these keep it compiling.

#![allow(clippy::needless_range_loop)]
use half::f16;
pub unsafe fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y.to_f32()).sum()
}
pub unsafe fn axpy_f16(out: &mut [f32], w: f32, v: &[f16]) {
    out.iter_mut()
        .zip(v)
        .for_each(|(o, y)| *o += w * y.to_f32())
}
pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
pub unsafe fn axpy_f32(out: &mut [f32], w: f32, v: &[f32]) {
    out.iter_mut().zip(v).for_each(|(o, y)| *o += w * y)
}
pub unsafe fn softmax(x: &mut [f32]) {
    crate::ops::softmax_inplace(x)
}
pub unsafe fn exp_run16(x: &mut [f32]) -> (f32, f32) {
    exp_run(x)
}
pub unsafe fn exp_run(x: &mut [f32]) -> (f32, f32) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp2();
        sum += *v;
    }
    (max, sum)
}
pub unsafe fn scores_t<E: crate::attention::KvElem>(
    q: &[*const f32],
    keys: &[(*const E, usize)],
    stride: usize,
    d: usize,
    scale: f32,
    out: &[*mut f32],
    wide: bool,
) {
    let lanes = if wide { 16 } else { 8 };
    for (&qi, &oi) in q.iter().zip(out) {
        for &(k, pos) in keys {
            for l in 0..lanes {
                let mut acc = 0f32;
                for c in 0..d {
                    acc = (*qi.add(c)).mul_add((*k.add(c * stride + l)).to_f32(), acc);
                }
                *oi.add(pos + l) = acc * scale;
            }
        }
    }
}
pub unsafe fn weighted_sums<E: crate::attention::KvElem>(
    out: &[*mut f32],
    w: &[*const f32],
    n: &[usize],
    v: &[E],
    rows: &[usize],
    d: usize,
    _wide: bool,
) {
    for i in 0..out.len() {
        for j in 0..n[i] {
            let wj = *w[i].add(j);
            for c in 0..d {
                *out[i].add(c) += wj * v[rows[j] + c].to_f32();
            }
        }
    }
}
