//! Percentiles and the per-metric summary every result point carries.

use serde::{Deserialize, Serialize};

/// The `q`-th percentile (0–100) of `sorted` by linear interpolation between closest ranks
/// (numpy's default, and `scripts/bench_serve.py`'s), so figures agree with the Python tools.
/// `None` for an empty slice.
pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let pos = last as f64 * q.clamp(0.0, 100.0) / 100.0;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(last);
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64))
}

/// p50/p95/p99 with mean, min and max of one metric over a point's measured samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    pub min: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Summarizes the finite values; `None` when there are none (a metric a point cannot have,
    /// e.g. ms per output token with one output token).
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Summary> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let (&min, &max) = (v.first()?, v.last()?);
        Some(Summary {
            n: v.len(),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            min,
            p50: percentile(&v, 50.0)?,
            p95: percentile(&v, 95.0)?,
            p99: percentile(&v, 99.0)?,
            max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_match_hand_computed_values() {
        // 1..=10: position (n-1)·q = 9·0.5 = 4.5 → 5.5; 9·0.95 = 8.55 → 9.55; 9·0.99 = 8.91 → 9.91.
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert!(close(percentile(&v, 50.0).unwrap(), 5.5));
        assert!(close(percentile(&v, 95.0).unwrap(), 9.55));
        assert!(close(percentile(&v, 99.0).unwrap(), 9.91));
        assert!(close(percentile(&v, 0.0).unwrap(), 1.0));
        assert!(close(percentile(&v, 100.0).unwrap(), 10.0));
        // Uneven gaps: [10, 20, 40, 80]: 3·0.5 = 1.5 → 30; 3·0.95 = 2.85 → 40 + 0.85·40 = 74.
        let w = [10.0, 20.0, 40.0, 80.0];
        assert!(close(percentile(&w, 50.0).unwrap(), 30.0));
        assert!(close(percentile(&w, 95.0).unwrap(), 74.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert!(close(percentile(&[7.0], 99.0).unwrap(), 7.0));
    }

    #[test]
    fn summary_sorts_and_drops_non_finite_values() {
        let s = Summary::of([40.0, f64::NAN, 10.0, 80.0, f64::INFINITY, 20.0]).unwrap();
        assert_eq!(s.n, 4);
        assert!(close(s.min, 10.0) && close(s.max, 80.0));
        assert!(close(s.mean, 37.5));
        assert!(close(s.p50, 30.0) && close(s.p95, 74.0));
        assert!(s.p50 <= s.p95 && s.p95 <= s.p99 && s.p99 <= s.max);
        assert_eq!(Summary::of([f64::NAN]), None);
        assert_eq!(Summary::of(Vec::new()), None);
    }
}
