//! A plain read of memory as fast as this CPU reads: the floor the decode benchmarks divide by
//! (`mem_bandwidth`, `bench_core --floor`, `gemv_bandwidth`).
//!
//! A floor that reads slower than the kernels it judges flatters them. Summing 64-bit words in
//! one scalar chain, or without asking for lines ahead, read 22-24 GB/s on the Xeon where the
//! BF16 decode matmuls read the same memory at 29 GB/s; this read takes the widest loads the
//! CPU has, four independent sums, and a prefetch `AHEAD` bytes on for every line.

/// How far ahead of the line being summed a line is asked for. On the Xeon, 2 KiB read 33.9-35.3
/// GB/s on two threads against 31.1-32.2 at 512 bytes, 31.9-33.4 at 1 KiB and 34.2-35.1 at 4
/// KiB (AVX2 loads: 32.8-34.7 at 2 KiB); without a prefetch, 24.7.
const AHEAD: usize = 2048;

/// The wrapping sum of `bytes` taken as 64-bit words: the 64-byte-aligned middle as it lies, the
/// bytes before and after it in little-endian words padded with zeros. The same value whichever
/// path the CPU takes, so callers can keep it to stop the read being optimized away.
pub fn sum(bytes: &[u8]) -> u64 {
    let (head, words, tail) = bytemuck::pod_align_to::<u8, [u64; 8]>(bytes);
    let mut total = edge_sum(head).wrapping_add(edge_sum(tail));
    #[cfg(target_arch = "x86_64")]
    {
        let cpu = crate::cpu::features();
        if cpu.has(crate::cpu::Isa::Avx512) {
            // SAFETY: the features were just checked.
            return total.wrapping_add(unsafe { x86::sum_lines_avx512(words) });
        }
        if cpu.avx2_fma_f16c {
            // SAFETY: as above.
            return total.wrapping_add(unsafe { x86::sum_lines_avx2(words) });
        }
    }
    for line in words {
        for &w in line {
            total = total.wrapping_add(w);
        }
    }
    total
}

/// `parts` read in one dispatch of `pool`: each thread `sum`s its own contiguous share of their
/// bytes taken in order (long sequential runs, the most favourable read). Returns the threads'
/// sums combined, to keep the read from being optimized away.
pub fn sum_on(pool: &crate::pool::ThreadPool, parts: &[&[u8]]) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let n = pool.num_threads();
    let sums: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    pool.run(n, |i| {
        let (lo, hi) = (i * total / n, (i + 1) * total / n);
        let (mut s, mut at) = (0u64, 0);
        for p in parts {
            let (a, b) = (lo.max(at) - at, hi.min(at + p.len()).saturating_sub(at));
            at += p.len();
            if a < b {
                s = s.wrapping_add(sum(&p[a..b]));
            }
        }
        sums[i].store(s, Ordering::Relaxed);
    });
    sums.iter().fold(0, |a, s| a ^ s.load(Ordering::Relaxed))
}

/// The unaligned bytes at either end, as words padded with zeros.
fn edge_sum(bytes: &[u8]) -> u64 {
    bytes.chunks(8).fold(0u64, |a, c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        a.wrapping_add(u64::from_le_bytes(w))
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::AHEAD;
    use std::arch::x86_64::*;

    /// Four 64-byte lines an iteration into four sums, each line's successor `AHEAD` bytes on
    /// asked for first.
    #[target_feature(enable = "avx2,avx512f")]
    pub unsafe fn sum_lines_avx512(lines: &[[u64; 8]]) -> u64 {
        let mut acc = [_mm512_setzero_si512(); 4];
        let mut quads = lines.chunks_exact(4);
        for q in &mut quads {
            for (a, line) in acc.iter_mut().zip(q) {
                let p = line.as_ptr();
                // A prefetch never faults, even past the end.
                _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>().wrapping_add(AHEAD));
                *a = _mm512_add_epi64(*a, _mm512_loadu_si512(p.cast()));
            }
        }
        for (a, line) in acc.iter_mut().zip(quads.remainder()) {
            *a = _mm512_add_epi64(*a, _mm512_loadu_si512(line.as_ptr().cast()));
        }
        let s = _mm512_add_epi64(
            _mm512_add_epi64(acc[0], acc[1]),
            _mm512_add_epi64(acc[2], acc[3]),
        );
        _mm512_reduce_add_epi64(s) as u64
    }

    /// `sum_lines_avx512` in 256-bit halves: two loads a line.
    #[target_feature(enable = "avx2")]
    pub unsafe fn sum_lines_avx2(lines: &[[u64; 8]]) -> u64 {
        let mut acc = [_mm256_setzero_si256(); 4];
        let mut pairs = lines.chunks_exact(2);
        for q in &mut pairs {
            for (k, line) in q.iter().enumerate() {
                let p = line.as_ptr();
                _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>().wrapping_add(AHEAD));
                let (a, b) = (2 * k, 2 * k + 1);
                acc[a] = _mm256_add_epi64(acc[a], _mm256_loadu_si256(p.cast()));
                acc[b] = _mm256_add_epi64(acc[b], _mm256_loadu_si256(p.add(4).cast()));
            }
        }
        for line in pairs.remainder() {
            let p = line.as_ptr();
            acc[0] = _mm256_add_epi64(acc[0], _mm256_loadu_si256(p.cast()));
            acc[1] = _mm256_add_epi64(acc[1], _mm256_loadu_si256(p.add(4).cast()));
        }
        let s = _mm256_add_epi64(
            _mm256_add_epi64(acc[0], acc[1]),
            _mm256_add_epi64(acc[2], acc[3]),
        );
        let mut lanes = [0u64; 4];
        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), s);
        lanes.iter().fold(0u64, |a, &x| a.wrapping_add(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path this CPU has gives the words' plain wrapping sum, at any length and
    /// alignment (the AVX2 one too on an AVX-512 machine).
    #[test]
    fn sum_is_the_words_wrapping_sum() {
        let bytes: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in [0, 1, 7, 8, 63, 64, 65] {
            for len in [0, 1, 8, 63, 64, 200, 511, 512, 513, 1031, 4096] {
                let b = &bytes[start..start + len];
                let (h, lines, t) = bytemuck::pod_align_to::<u8, [u64; 8]>(b);
                let want = lines.iter().flatten().fold(0u64, |a, &x| a.wrapping_add(x));
                let edges = edge_sum(h).wrapping_add(edge_sum(t));
                assert_eq!(sum(b), edges.wrapping_add(want), "start {start}, len {len}");
                #[cfg(target_arch = "x86_64")]
                {
                    let cpu = crate::cpu::features();
                    if cpu.has(crate::cpu::Isa::Avx512) {
                        // SAFETY: the features were just checked.
                        assert_eq!(unsafe { x86::sum_lines_avx512(lines) }, want);
                    }
                    if cpu.avx2_fma_f16c {
                        // SAFETY: as above.
                        assert_eq!(unsafe { x86::sum_lines_avx2(lines) }, want);
                    }
                }
            }
        }
    }
}
