//! This CPU's 256-bit f32 FMA peak, the ceiling of the AVX2 float GEMM (`avx2_float_gemm`):
//! 12 independent accumulators (enough to cover the FMA's latency on two pipes), on 1 thread
//! and on `THREADS` threads at once (default 2), in GFLOP/s (an FMA is 16 flops).
//! `cargo run --release -p vigil-kernels --example fma_peak [THREADS]`

#[cfg(target_arch = "x86_64")]
mod peak {
    use std::arch::x86_64::*;
    use std::time::Instant;

    const ACC: usize = 12;
    const ITERS: usize = 200_000_000;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn fmas(n: usize) -> f32 {
        let mut a: [__m256; ACC] = std::array::from_fn(|i| _mm256_set1_ps(i as f32));
        let (x, y) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
        for _ in 0..n {
            for acc in a.iter_mut() {
                *acc = _mm256_fmadd_ps(*acc, x, y);
            }
        }
        let mut out = [0f32; 8];
        let s = a
            .iter()
            .fold(_mm256_setzero_ps(), |s, &v| _mm256_add_ps(s, v));
        _mm256_storeu_ps(out.as_mut_ptr(), s);
        out.iter().sum()
    }

    /// GFLOP/s of one thread's run.
    fn one() -> f64 {
        let t = Instant::now();
        // The count goes through `black_box` after the clock is read, so the (pure) loop
        // cannot be hoisted above it.
        let n = std::hint::black_box(ITERS);
        // SAFETY: `main` checked AVX2 and FMA.
        let r = unsafe { fmas(n) };
        std::hint::black_box(r);
        (ITERS * ACC * 16) as f64 / t.elapsed().as_secs_f64() / 1e9
    }

    pub fn main() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("fma_peak: this CPU has no AVX2+FMA");
            std::process::exit(1);
        }
        let threads: usize = std::env::args()
            .nth(1)
            .map_or(2, |v| v.parse().expect("THREADS: a number"));
        let single = (0..3).map(|_| one()).fold(0.0, f64::max);
        let all: f64 = std::thread::scope(|s| {
            let h: Vec<_> = (0..threads).map(|_| s.spawn(one)).collect();
            h.into_iter().map(|h| h.join().expect("thread")).sum()
        });
        println!(
            "{{\"fma256_gflops_1_thread\": {single:.1}, \"threads\": {threads}, \"fma256_gflops_all_threads\": {all:.1}}}"
        );
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    peak::main();
}
