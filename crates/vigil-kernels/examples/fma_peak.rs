//! This CPU's f32 FMA peak, the ceiling of the float GEMMs: 256 bits (`avx2_float_gemm`) and,
//! where the CPU has AVX-512F, 512 bits (`avx512_float_gemm`; a CPU may clock lower while it
//! runs them). 12 independent accumulators (enough to cover the FMA's latency on two pipes),
//! on 1 thread and on `THREADS` threads at once (default 2), in GFLOP/s (a 256-bit FMA is 16
//! flops, a 512-bit one 32).
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

    #[target_feature(enable = "avx512f")]
    unsafe fn fmas512(n: usize) -> f32 {
        let mut a: [__m512; ACC] = std::array::from_fn(|i| _mm512_set1_ps(i as f32));
        let (x, y) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
        for _ in 0..n {
            for acc in a.iter_mut() {
                *acc = _mm512_fmadd_ps(*acc, x, y);
            }
        }
        let s = a
            .iter()
            .fold(_mm512_setzero_ps(), |s, &v| _mm512_add_ps(s, v));
        _mm512_reduce_add_ps(s)
    }

    /// GFLOP/s of one thread's run at `bits` (256 or 512).
    fn one(bits: usize) -> f64 {
        let t = Instant::now();
        // The count goes through `black_box` after the clock is read, so the (pure) loop
        // cannot be hoisted above it.
        let n = std::hint::black_box(ITERS);
        // SAFETY: `main` checked AVX2 and FMA, and AVX-512F before asking for 512 bits.
        let r = unsafe {
            if bits == 512 {
                fmas512(n)
            } else {
                fmas(n)
            }
        };
        std::hint::black_box(r);
        (ITERS * ACC * bits / 16) as f64 / t.elapsed().as_secs_f64() / 1e9
    }

    /// Best single-thread and summed all-thread GFLOP/s at `bits`.
    fn peak(bits: usize, threads: usize) -> (f64, f64) {
        let single = (0..3).map(|_| one(bits)).fold(0.0, f64::max);
        let all: f64 = std::thread::scope(|s| {
            let h: Vec<_> = (0..threads).map(|_| s.spawn(move || one(bits))).collect();
            h.into_iter().map(|h| h.join().expect("thread")).sum()
        });
        (single, all)
    }

    pub fn main() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("fma_peak: this CPU has no AVX2+FMA");
            std::process::exit(1);
        }
        let threads: usize = std::env::args()
            .nth(1)
            .map_or(2, |v| v.parse().expect("THREADS: a number"));
        let (single, all) = peak(256, threads);
        let wide = if is_x86_feature_detected!("avx512f") {
            let (single, all) = peak(512, threads);
            format!(", \"fma512_gflops_1_thread\": {single:.1}, \"fma512_gflops_all_threads\": {all:.1}")
        } else {
            String::new()
        };
        println!(
            "{{\"fma256_gflops_1_thread\": {single:.1}, \"threads\": {threads}, \"fma256_gflops_all_threads\": {all:.1}{wide}}}"
        );
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    peak::main();
}
