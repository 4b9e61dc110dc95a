//! Activation quantization against ggml's reference semantics: Q8_0 against the `gguf`
//! package's bit-exact port (fixture), Q8_1 / Q8_K against re-implementations of
//! `quantize_row_q8_1_ref` / `quantize_row_q8_K_ref` written here from the C, and the
//! dispatched (AVX2) quantizers against the portable ones.

use half::f16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use vigil_kernels::quant::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_1};
use vigil_kernels::quant::quantize::*;

/// C `roundf`: halves away from zero.
fn roundf(v: f32) -> f32 {
    let t = v.trunc();
    if (v - t).abs() >= 0.5 {
        t + v.signum()
    } else {
        t
    }
}

fn ref_q8_1(x: &[f32]) -> Vec<BlockQ8_1> {
    x.chunks_exact(32)
        .map(|b| {
            let amax = b
                .iter()
                .fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut qs = [0i8; 32];
            let mut sum = 0i32;
            for (q, v) in qs.iter_mut().zip(b) {
                *q = roundf(v * id) as i8;
                sum += *q as i32;
            }
            BlockQ8_1 {
                d: f16::from_f32(d),
                s: f16::from_f32(sum as f32 * d),
                qs,
            }
        })
        .collect()
}

fn ref_q8_k(x: &[f32]) -> Vec<BlockQ8K> {
    x.chunks_exact(256)
        .map(|b| {
            let (mut amax, mut max) = (0.0f32, 0.0f32);
            for &v in b {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            let mut out = BlockQ8K {
                d: 0.0,
                qs: [0; 256],
                bsums: [0; 16],
            };
            if amax == 0.0 {
                return out;
            }
            let iscale = -127.0f32 / max;
            for (q, &v) in out.qs.iter_mut().zip(b) {
                // nearest_int: round half to even.
                *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
            }
            for (s, q) in out.bsums.iter_mut().zip(out.qs.chunks_exact(16)) {
                *s = q.iter().map(|&v| v as i16).sum();
            }
            out.d = 1.0 / iscale;
            out
        })
        .collect()
}

/// Rows with exact halves after scaling (amax 127 → d = 1), zeros, tiny and negative maxima.
fn tricky_rows(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..n).map(|_| rng.random_range(-3.0f32..3.0)).collect();
    for (i, v) in [127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -126.5, 3.5]
        .into_iter()
        .enumerate()
    {
        x[i] = v;
    }
    x[32..64].fill(0.0);
    if n > 64 {
        x[64] = -10.0; // negative extreme
    }
    if n >= 512 {
        x[256..512].fill(0.0);
        x[300] = -1.0;
        x[301] = 1.0; // tie in magnitude: the first one wins
    }
    x
}

fn q8_0_bytes(b: &[BlockQ8_0]) -> Vec<u8> {
    bytemuck::cast_slice(b).to_vec()
}

#[test]
fn q8_0_matches_gguf_reference() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/matmul");
    let x: Vec<f32> = std::fs::read(format!("{dir}/quantize_q8_0.x.bin"))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let expected = std::fs::read(format!("{dir}/quantize_q8_0.blocks.bin")).unwrap();
    let mut got = vec![
        BlockQ8_0 {
            d: f16::ZERO,
            qs: [0; 32]
        };
        x.len() / 32
    ];
    quantize_row_q8_0(&x, &mut got);
    assert_eq!(q8_0_bytes(&got), expected, "dispatched");
    quantize_row_q8_0_scalar(&x, &mut got);
    assert_eq!(q8_0_bytes(&got), expected, "scalar");
}

#[test]
fn q8_1_matches_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for n in [64, 96, 1024] {
        let x = tricky_rows(&mut rng, n);
        let expected = ref_q8_1(&x);
        let mut got = vec![
            BlockQ8_1 {
                d: f16::ZERO,
                s: f16::ZERO,
                qs: [0; 32]
            };
            n / 32
        ];
        quantize_row_q8_1(&x, &mut got);
        assert_eq!(
            bytemuck::cast_slice::<_, u8>(&got),
            bytemuck::cast_slice::<_, u8>(&expected)
        );
        quantize_row_q8_1_scalar(&x, &mut got);
        assert_eq!(
            bytemuck::cast_slice::<_, u8>(&got),
            bytemuck::cast_slice::<_, u8>(&expected)
        );
    }
}

#[test]
fn q8_k_matches_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for n in [256, 512, 2048] {
        let x = tricky_rows(&mut rng, n);
        let expected = ref_q8_k(&x);
        let zero = BlockQ8K {
            d: 0.0,
            qs: [0; 256],
            bsums: [0; 16],
        };
        let mut got = vec![zero; n / 256];
        quantize_row_q8_k(&x, &mut got);
        assert_eq!(
            bytemuck::cast_slice::<_, u8>(&got),
            bytemuck::cast_slice::<_, u8>(&expected)
        );
        quantize_row_q8_k_scalar(&x, &mut got);
        assert_eq!(
            bytemuck::cast_slice::<_, u8>(&got),
            bytemuck::cast_slice::<_, u8>(&expected)
        );
    }
}

#[test]
fn dispatched_quantizers_match_portable_on_random_rows() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for round in 0..200 {
        let scale = 10f32.powi(rng.random_range(-4..4));
        let x: Vec<f32> = (0..512)
            .map(|_| rng.random_range(-1.0f32..1.0) * scale)
            .collect();
        let mut a = vec![
            BlockQ8_0 {
                d: f16::ZERO,
                qs: [0; 32]
            };
            16
        ];
        let mut b = a.clone();
        quantize_row_q8_0(&x, &mut a);
        quantize_row_q8_0_scalar(&x, &mut b);
        assert_eq!(q8_0_bytes(&a), q8_0_bytes(&b), "q8_0 round {round}");
        let zero = BlockQ8K {
            d: 0.0,
            qs: [0; 256],
            bsums: [0; 16],
        };
        let mut a = vec![zero; 2];
        let mut b = a.clone();
        quantize_row_q8_k(&x, &mut a);
        quantize_row_q8_k_scalar(&x, &mut b);
        assert_eq!(
            bytemuck::cast_slice::<_, u8>(&a),
            bytemuck::cast_slice::<_, u8>(&b),
            "q8_k round {round}"
        );
    }
}
