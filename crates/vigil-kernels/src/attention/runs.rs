//! The order a query's softmax and value sum are computed in: keys in runs of `RUN_KEYS`
//! aligned to absolute positions, each run's own max, exponentials, sum and weighted values,
//! merged in run order (flash-decoding's split, with fixed boundaries).
//!
//! Fixed boundaries are what keep the determinism contract: a query's runs, and so its bits,
//! depend only on its position and window, never on the batch, the tile or the threads. That
//! lets a decode step give each thread whole runs of all KV heads (one pass over contiguous
//! cache blocks, one dispatch, `decode_runs`) while a prefill tile walks the same runs in turn
//! and gets the same bits.

/// Keys of one run. A multiple of every block size the engine uses (16, 32), so a run covers
/// whole cache blocks; short enough that a 2,048-token decode step makes 8 tasks for 2 threads,
/// long enough that the per-run overhead (accumulators stored, a merge) stays small.
pub const RUN_KEYS: usize = 256;

/// The runs of keys `first..last`: `[k·RUN_KEYS, (k+1)·RUN_KEYS) ∩ [first, last)`, in order.
pub fn runs(first: usize, last: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let start = first / RUN_KEYS * RUN_KEYS;
    (start..if first < last { last } else { start })
        .step_by(RUN_KEYS)
        .map(move |p0| p0.max(first)..(p0 + RUN_KEYS).min(last))
}

/// One query's merged runs so far: the running max `m`, the sum of `2^(s - m)` `l` (scores
/// in base-2 units, `AttnShape::score_scale`); its weighted values live in the caller's
/// output row.
#[derive(Debug, Clone, Copy)]
pub struct RunState {
    pub m: f32,
    pub l: f32,
    /// Whether any run was merged (the output row holds that run's values).
    pub started: bool,
}

impl Default for RunState {
    fn default() -> Self {
        RunState {
            m: f32::NEG_INFINITY,
            l: 0.0,
            started: false,
        }
    }
}

impl RunState {
    /// Merge a run with max `m_r`, sum `l_r` and weighted values `o_r` into `self` and its
    /// values `o`. The first run is taken as it is (callers may have summed it into `o`
    /// directly: then `o_r` is `None`).
    pub fn merge(&mut self, o: &mut [f32], m_r: f32, l_r: f32, o_r: Option<&[f32]>) {
        if !self.started {
            if let Some(o_r) = o_r {
                o.copy_from_slice(o_r);
            }
            *self = RunState {
                m: m_r,
                l: l_r,
                started: true,
            };
            return;
        }
        let o_r = o_r.expect("a later run's values come separately");
        let m = self.m.max(m_r);
        let (a, b) = ((self.m - m).exp2(), (m_r - m).exp2());
        self.l = self.l * a + l_r * b;
        for (x, &y) in o.iter_mut().zip(o_r) {
            *x = *x * a + y * b;
        }
        self.m = m;
    }

    /// The output: the merged values over the merged sum.
    pub fn finish(&self, o: &mut [f32]) {
        let inv = 1.0 / self.l;
        o.iter_mut().for_each(|x| *x *= inv);
    }
}

/// `x[i] = 2^(x[i] - max(x))` in place (scores in base-2 units, `AttnShape::score_scale`),
/// returning the max and the sum of the powers: the AVX2 path's (vector `exp2`, 8-lane sum)
/// when available, else a scalar loop. Public so tests can rebuild a query's output from the
/// per-key operations.
pub fn exp_run_dispatched(x: &mut [f32]) -> (f32, f32) {
    let cpu = crate::cpu::features();
    if cpu.has(crate::cpu::Isa::Avx512) {
        // SAFETY: the features were just checked.
        unsafe { super::simd::exp_run16(x) }
    } else if cpu.avx2_fma_f16c {
        // SAFETY: the features were just checked.
        unsafe { super::simd::exp_run(x) }
    } else {
        exp_run_scalar(x)
    }
}

pub(super) fn exp_run_scalar(x: &mut [f32]) -> (f32, f32) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp2();
        sum += *v;
    }
    (max, sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_aligned_and_cover_the_keys() {
        let r: Vec<_> = runs(0, 600).collect();
        assert_eq!(r, vec![0..256, 256..512, 512..600]);
        let r: Vec<_> = runs(300, 513).collect();
        assert_eq!(r, vec![300..512, 512..513]);
        assert_eq!(runs(5, 5).count(), 0);
        assert_eq!(runs(0, 1).collect::<Vec<_>>(), vec![0..1]);
    }

    /// The AVX-512 run (`exp2_16`) gives the AVX2 run's bits: values, max and sum, at every
    /// length around its 16- and 8-lane steps.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp_run16_equals_exp_run() {
        use crate::cpu::{features, Isa};
        if !features().has(Isa::Avx512) {
            eprintln!("skipped: CPU lacks avx512");
            return;
        }
        for n in (0..70).chain([255, 256, 257, 263, 512]) {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1009) as f32 - 504.0) * 0.037 + (i % 3) as f32 * 1e-3)
                .collect();
            let (mut a, mut b) = (x.clone(), x);
            // SAFETY: AVX-512 F (and so AVX2, FMA, F16C) checked above.
            let (ra, rb) = unsafe {
                (
                    super::super::simd::exp_run(&mut a),
                    super::super::simd::exp_run16(&mut b),
                )
            };
            assert_eq!(ra.0.to_bits(), rb.0.to_bits(), "max, n = {n}");
            assert_eq!(ra.1.to_bits(), rb.1.to_bits(), "sum, n = {n}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "values, n = {n}");
        }
    }

    /// The vector runs take the exact max (whichever lane and chain holds it) and give the
    /// scalar run's powers and sum to rounding, at lengths around their 8-, 16-, 32- and
    /// 64-element steps.
    #[test]
    fn exp_run_takes_the_exact_max() {
        for n in (1..140).chain([255, 256, 257, 263, 512]) {
            for peak in [0, n / 3, n - 1] {
                let mut x: Vec<f32> = (0..n)
                    .map(|i| ((i * 7919 % 1009) as f32 - 900.0) * 0.011)
                    .collect();
                x[peak] = 7.25;
                let mut want = x.clone();
                let (m0, l0) = exp_run_scalar(&mut want);
                let (m, l) = exp_run_dispatched(&mut x);
                assert_eq!(m.to_bits(), m0.to_bits(), "max, n = {n}, peak at {peak}");
                assert!((l - l0).abs() <= 1e-5 * l0, "sum, n = {n}: {l} vs {l0}");
                for (a, b) in x.iter().zip(&want) {
                    assert!((a - b).abs() <= 1e-6, "n = {n}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn merged_runs_equal_one_softmax() {
        // Two runs merged give the softmax-weighted sum over all keys (to rounding); the
        // runs take scores in base 2, the reference the same scores in natural units.
        let s: Vec<f32> = (0..40)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.7)
            .collect();
        let s2: Vec<f32> = s.iter().map(|x| x * std::f32::consts::LOG2_E).collect();
        let v: Vec<f32> = (0..40).map(|i| (i as f32 * 0.3).sin()).collect();
        let (mut st, mut o) = (RunState::default(), [0f32]);
        for r in [0..13usize, 13..40] {
            let mut e = s2[r.clone()].to_vec();
            let (m, l) = exp_run_scalar(&mut e);
            let o_r = [e.iter().zip(&v[r]).map(|(w, x)| w * x).sum::<f32>()];
            let first = !st.started;
            st.merge(&mut o, m, l, Some(&o_r));
            assert!(first || st.l > 0.0);
        }
        st.finish(&mut o);
        let m = s
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, |a, b| a.max(b as f64));
        let w: Vec<f64> = s.iter().map(|&x| (x as f64 - m).exp()).collect();
        let want =
            w.iter().zip(&v).map(|(w, &x)| w * x as f64).sum::<f64>() / w.iter().sum::<f64>();
        assert!((o[0] as f64 - want).abs() < 1e-5, "{} vs {want}", o[0]);
    }
}
