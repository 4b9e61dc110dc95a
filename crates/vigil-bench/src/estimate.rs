//! How long a run should take: an estimate stated before anything is measured (from the plan
//! and an assumed speed), then corrected after every point by the speed actually seen.

use crate::matrix::MatrixCell;
use crate::workload::{LiveMode, PlannedPoint, Settings, Shape, Workload};
use std::path::Path;
use std::time::Instant;

/// Assumed prefill speed of one stream, tokens/s (SmolLM2-135M on 2 cores does 500–800).
const PREFILL_TOKENS_S: f64 = 400.0;
/// Assumed decode speed of one stream, tokens/s (SmolLM2-135M on 2 cores: 100–200 alone).
const DECODE_TOKENS_S: f64 = 60.0;

/// Seconds of one request of `prompt` tokens in and `output` out, alone.
fn request_s(prompt: u32, output: u32) -> f64 {
    f64::from(prompt) / PREFILL_TOKENS_S + f64::from(output) / DECODE_TOKENS_S
}

/// Estimated seconds of one point on one target.
pub fn point_s(p: &PlannedPoint, s: &Settings) -> f64 {
    let requests = f64::from(s.warmup + p.measured_requests(s));
    match p.shape {
        Shape::Requests {
            prompt_tokens,
            max_tokens,
            concurrency,
        } => {
            // Batched streams share each step: throughput grows about as the square root.
            requests * request_s(prompt_tokens, max_tokens) / f64::from(concurrency).sqrt()
        }
        Shape::AgentLoop {
            prefix_tokens,
            turns,
            turn_tokens,
            ..
        } => {
            let first = request_s(prefix_tokens, turn_tokens);
            requests * (first + f64::from(turns.saturating_sub(1)) * request_s(64, turn_tokens))
        }
        Shape::LiveStream { mode, stream } => {
            let window_fill = f64::from(stream.window_tokens / stream.entry_tokens.max(1))
                * f64::from(stream.period_ms)
                / 1000.0;
            let cadence = requests * f64::from(stream.period_ms) / 1000.0;
            let each = match mode {
                LiveMode::Flash => 0.0,
                LiveMode::Cold => request_s(64, stream.answer_tokens),
                LiveMode::Replay | LiveMode::ReplayUncached => {
                    request_s(stream.window_tokens, stream.answer_tokens)
                }
            };
            let fill = if mode == LiveMode::Flash {
                window_fill
            } else {
                0.0
            };
            fill + cadence.max(requests * each)
        }
        Shape::Traffic(t) => {
            let work = f64::from(t.workflows)
                * (request_s(t.prefix_tokens, t.turn_tokens)
                    + f64::from(t.turns.saturating_sub(1)) * request_s(64, t.turn_tokens))
                / f64::from(t.workflows).sqrt();
            f64::from(t.window_s).max(work)
        }
        Shape::Matrix(MatrixCell::Prefill { context }) => requests * request_s(context, 1),
        Shape::Matrix(MatrixCell::Decode(d)) => f64::from(d.duration_s),
    }
}

/// The running estimate of a run's remaining time.
pub struct Eta {
    /// Estimated seconds of each point, in run order, repeated for every target.
    plan: Vec<f64>,
    done: usize,
    started: Instant,
}

impl Eta {
    pub fn new(points: &[PlannedPoint], s: &Settings, targets: usize) -> Eta {
        let one: Vec<f64> = points.iter().map(|p| point_s(p, s)).collect();
        Eta {
            plan: one
                .iter()
                .copied()
                .cycle()
                .take(one.len() * targets)
                .collect(),
            done: 0,
            started: Instant::now(),
        }
    }

    /// The line printed before the run starts.
    pub fn announce(&self, workload: Workload, path: &Path) -> String {
        let total: f64 = self.plan.iter().sum();
        format!(
            "{workload}: {} points; expected about {} (assuming {PREFILL_TOKENS_S:.0} prompt and {DECODE_TOKENS_S:.0} generated tokens/s per stream; corrected as points finish); results go to {} after every point",
            self.plan.len(),
            duration(total),
            path.display()
        )
    }

    pub fn point_done(&mut self, n: usize) {
        self.done = (self.done + n).min(self.plan.len());
    }

    /// After a point: how long so far and how long is left at the speed seen so far.
    pub fn progress(&self, target: &str) -> Option<String> {
        let planned_done: f64 = self.plan[..self.done].iter().sum();
        let left: f64 = self.plan[self.done..].iter().sum();
        let elapsed = self.started.elapsed().as_secs_f64();
        if self.done == self.plan.len() || planned_done <= 0.0 {
            return None;
        }
        let scale = elapsed / planned_done;
        Some(format!(
            "[{target}] {}/{} points in {}; about {} left",
            self.done,
            self.plan.len(),
            duration(elapsed),
            duration(left * scale)
        ))
    }
}

fn duration(s: f64) -> String {
    if s < 90.0 {
        format!("{:.0} s", s.max(1.0))
    } else if s < 5400.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::plan;

    #[test]
    fn estimates_grow_with_the_work() {
        let s = Settings::default();
        let single = plan(Workload::Single, &s).unwrap();
        let mut more = s.clone();
        more.iterations *= 2;
        let doubled = plan(Workload::Single, &more).unwrap();
        let total =
            |ps: &[PlannedPoint], s: &Settings| ps.iter().map(|p| point_s(p, s)).sum::<f64>();
        assert!(total(&single, &s) > 0.0);
        assert!(total(&doubled, &more) > 1.5 * total(&single, &s));
        let eta = Eta::new(&single, &s, 2);
        assert_eq!(eta.plan.len(), 2 * single.len());
        assert!(eta
            .announce(Workload::Single, Path::new("r.json"))
            .contains("expected about"));
    }
}
