//! How fast this CPU issues `vdpbf16ps` against the f32 FMA, both on 512-bit registers with 24
//! independent accumulators (throughput, not latency): `cargo run --release -p vigil-kernels
//! --example bf16_dot_rate`. One `vdpbf16ps` does 32 multiply-adds, one FMA 16, so BF16 dot
//! products pay off (`VIGIL_BF16_DOTS=1`) only where the first rate is above half the second.

#[cfg(target_arch = "x86_64")]
mod rate {
    use std::arch::x86_64::*;
    use std::time::Instant;

    const ACC: usize = 24;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn dots(n: usize) -> f32 {
        let mut a = [_mm512_setzero_ps(); ACC];
        let x = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi16(0x3f80));
        let y = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi16(0x3f00));
        for _ in 0..n {
            for acc in a.iter_mut() {
                *acc = _mm512_dpbf16_ps(*acc, x, y);
            }
        }
        a.iter().map(|&v| _mm512_reduce_add_ps(v)).sum()
    }

    #[target_feature(enable = "avx512f,fma")]
    unsafe fn fmas(n: usize) -> f32 {
        let mut a = [_mm512_setzero_ps(); ACC];
        let (x, y) = (_mm512_set1_ps(1.0), _mm512_set1_ps(0.5));
        for _ in 0..n {
            for acc in a.iter_mut() {
                *acc = _mm512_fmadd_ps(x, y, *acc);
            }
        }
        a.iter().map(|&v| _mm512_reduce_add_ps(v)).sum()
    }

    fn best(f: impl Fn() -> f32, n: usize) -> f64 {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            std::hint::black_box(f());
            best = best.min(t.elapsed().as_secs_f64());
        }
        (ACC * n) as f64 / best / 1e9
    }

    pub fn main() {
        if !vigil_kernels::cpu::avx512_bf16() {
            println!("this CPU lacks AVX-512 with AVX512_BF16");
            return;
        }
        let n = 10_000_000;
        // SAFETY: the CPU has AVX-512 F/BW/VL and AVX512_BF16 (checked above).
        let d = best(|| unsafe { dots(n) }, n);
        // SAFETY: as above (AVX-512 F; FMA comes with the avx512 level).
        let f = best(|| unsafe { fmas(n) }, n);
        println!(
            "one thread: vdpbf16ps {d:.2} G/s ({:.0} G multiply-adds/s), vfmadd231ps {f:.2} G/s \
             ({:.0} G multiply-adds/s): BF16 dots at {:.2}x the f32 FMA's multiply-adds",
            32.0 * d,
            16.0 * f,
            2.0 * d / f
        );
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    rate::main();
}
