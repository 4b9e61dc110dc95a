//! Portable reference dot products, written straight from the block layouts. These define the
//! results the AVX2 kernels must reproduce (bit for bit for the quantized formats).

// Index loops mirror the block layouts and the tile shapes.
#![allow(clippy::needless_range_loop)]

use super::{acc_k, acc_q4_1, acc_q6k, acc_q8, k_min_sum, scales_mins_k4};
use crate::quant::blocks::*;
use half::{bf16, f16};

pub fn dot_q4_0_q8_0(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let mut sumi = 0i32;
        for l in 0..QK / 2 {
            let lo = (x.qs[l] & 0xF) as i32 - 8;
            let hi = (x.qs[l] >> 4) as i32 - 8;
            sumi += lo * y.qs[l] as i32 + hi * y.qs[l + QK / 2] as i32;
        }
        sum = acc_q8(sum, sumi, x.d.to_f32(), y.d.to_f32());
    }
    sum
}

pub fn dot_q4_1_q8_1(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let mut sumi = 0i32;
        for l in 0..QK / 2 {
            let lo = (x.qs[l] & 0xF) as i32;
            let hi = (x.qs[l] >> 4) as i32;
            sumi += lo * y.qs[l] as i32 + hi * y.qs[l + QK / 2] as i32;
        }
        sum = acc_q4_1(
            sum,
            sumi,
            x.d.to_f32(),
            y.d.to_f32(),
            x.m.to_f32(),
            y.s.to_f32(),
        );
    }
    sum
}

pub fn dot_q8_0_q8_0(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let sumi: i32 =
            x.qs.iter()
                .zip(&y.qs)
                .map(|(&p, &q)| p as i32 * q as i32)
                .sum();
        sum = acc_q8(sum, sumi, x.d.to_f32(), y.d.to_f32());
    }
    sum
}

pub fn dot_q4k_q8k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let (sc, mn) = scales_mins_k4(&x.scales);
        let mut sumi = 0i32;
        for j in 0..8 {
            let qs = &x.qs[32 * (j / 2)..32 * (j / 2) + 32];
            let shift = 4 * (j % 2);
            let sub: i32 = (0..32)
                .map(|l| ((qs[l] >> shift) & 0xF) as i32 * y.qs[32 * j + l] as i32)
                .sum();
            sumi += sc[j] as i32 * sub;
        }
        let summ = k_min_sum(&mn, &y.bsums);
        sum = acc_k(sum, sumi, summ, x.d.to_f32(), x.dmin.to_f32(), y.d);
    }
    sum
}

pub fn dot_q5k_q8k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let (sc, mn) = scales_mins_k4(&x.scales);
        let mut sumi = 0i32;
        for j in 0..8 {
            let qs = &x.qs[32 * (j / 2)..32 * (j / 2) + 32];
            let shift = 4 * (j % 2);
            let sub: i32 = (0..32)
                .map(|l| {
                    let q = ((qs[l] >> shift) & 0xF) | (((x.qh[l] >> j) & 1) << 4);
                    q as i32 * y.qs[32 * j + l] as i32
                })
                .sum();
            sumi += sc[j] as i32 * sub;
        }
        let summ = k_min_sum(&mn, &y.bsums);
        sum = acc_k(sum, sumi, summ, x.d.to_f32(), x.dmin.to_f32(), y.d);
    }
    sum
}

/// The 256 6-bit quants of a Q6_K super-block in value order, offset by -32.
pub fn q6k_values(x: &BlockQ6K) -> [i8; QK_K] {
    let mut v = [0i8; QK_K];
    for n in 0..2 {
        let ql = &x.ql[64 * n..64 * n + 64];
        let qh = &x.qh[32 * n..32 * n + 32];
        let out = &mut v[128 * n..128 * n + 128];
        for l in 0..32 {
            out[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
            out[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            out[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            out[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    v
}

pub fn dot_q6k_q8k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let q = q6k_values(x);
        let mut sumi = 0i32;
        for s in 0..QK_K / 16 {
            let sub: i32 = (16 * s..16 * s + 16)
                .map(|n| q[n] as i32 * y.qs[n] as i32)
                .sum();
            sumi += x.scales[s] as i32 * sub;
        }
        sum = acc_q6k(sum, sumi, x.d.to_f32(), y.d);
    }
    sum
}

/// F32 weights (little-endian bytes, any alignment) × f32 activations, summed in order.
pub fn dot_f32(w: &[u8], x: &[f32]) -> f32 {
    w.chunks_exact(4).zip(x).fold(0.0f32, |s, (b, &v)| {
        s + f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * v
    })
}

pub fn dot_f16(w: &[u8], x: &[f32]) -> f32 {
    w.chunks_exact(2).zip(x).fold(0.0f32, |s, (b, &v)| {
        s + f16::from_le_bytes([b[0], b[1]]).to_f32() * v
    })
}

pub fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    w.chunks_exact(2).zip(x).fold(0.0f32, |s, (b, &v)| {
        s + bf16::from_le_bytes([b[0], b[1]]).to_f32() * v
    })
}
