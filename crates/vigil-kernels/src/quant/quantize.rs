//! TEMPORARY stand-in (replaced by the kernels work).
use super::BlockQ8_0;
pub fn quantize_row_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    for (b, xs) in out.iter_mut().zip(x.chunks_exact(32)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = half::f16::from_f32(d);
        for (q, v) in b.qs.iter_mut().zip(xs) {
            *q = (v * id).round() as i8;
        }
    }
}
