//! The sustained and burst workloads: multi-turn workflows (short agent loops, the
//! conversation re-sent each turn) kept at a target number in flight for a time window, a new
//! one admitted as each finishes (sustained), or all dropped at once (burst). Besides the
//! request metrics, the target's `/metrics` is read before and after the measured phase; where
//! it is Vigil's, that gives the share of engine time spent in prefill steps and the mean
//! prompt tokens per prefill step.

use crate::agent::{one_loop, LoopShape};
use crate::calibrate::Composer;
use crate::client::Client;
use crate::exec::{Ctx, Progress};
use crate::result::Sample;
use crate::BenchError;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How a traffic point admits its workflows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrafficShape {
    /// Workflows in flight (sustained), or dropped at once (burst).
    pub workflows: u32,
    /// Admission window in seconds; 0 for a burst.
    pub window_s: u32,
    pub prefix_tokens: u32,
    pub turns: u32,
    pub turn_tokens: u32,
}

/// What a traffic phase did besides its samples.
pub struct TrafficOutcome {
    pub samples: Vec<Sample>,
    pub wall_s: f64,
    pub admitted: u32,
    pub finished: u32,
}

/// Runs one phase: workflows admitted while the window is open (sustained) or all at once
/// (burst), each a loop of `turns` turns; returns when every admitted workflow has ended.
pub async fn run_phase(
    ctx: &Ctx<'_>,
    composer: &mut Composer,
    chat_base: u32,
    shape: TrafficShape,
    warmup: bool,
    progress: &Progress,
) -> Result<TrafficOutcome, BenchError> {
    let phase = if warmup { "warm-up" } else { "measured" };
    progress.phase(phase, shape.workflows);
    let loop_shape = LoopShape {
        turns: shape.turns,
        turn_tokens: shape.turn_tokens,
        tools: false,
        held: false,
    };
    let window = Duration::from_secs(u64::from(shape.window_s));
    let t0 = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    let (mut admitted, mut finished) = (0u32, 0u32);
    let mut samples = Vec::new();
    loop {
        let open = if shape.window_s == 0 || warmup {
            admitted < shape.workflows
        } else {
            t0.elapsed() < window
        };
        if open && (in_flight.len() as u32) < shape.workflows {
            let prefix = composer.compose(shape.prefix_tokens, chat_base)?.text;
            in_flight.push(one_loop(ctx, admitted, prefix, loop_shape, t0, warmup));
            admitted += 1;
            continue;
        }
        let Some(done) = in_flight.next().await else {
            break;
        };
        if done.len() as u32 == shape.turns && done.iter().all(|s| s.error.is_none()) {
            finished += 1;
        }
        samples.extend(done);
        progress.tick(phase, finished, admitted.max(shape.workflows), t0);
    }
    Ok(TrafficOutcome {
        samples,
        wall_s: t0.elapsed().as_secs_f64(),
        admitted,
        finished,
    })
}

/// Vigil's engine counters, read from `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineCounters {
    pub prefill_step_s: f64,
    pub decode_step_s: f64,
    pub prefill_steps: f64,
    pub prefill_tokens: f64,
}

impl EngineCounters {
    /// The counters in a Prometheus text page; `None` when it lacks Vigil's step metrics.
    pub fn parse(page: &str) -> Option<EngineCounters> {
        let value = |name: &str| {
            page.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        Some(EngineCounters {
            prefill_step_s: value(r#"vigil_step_duration_seconds_sum{kind="prefill"}"#)?,
            decode_step_s: value(r#"vigil_step_duration_seconds_sum{kind="decode"}"#)?,
            prefill_steps: value(r#"vigil_step_duration_seconds_count{kind="prefill"}"#)?,
            prefill_tokens: value("vigil_prefill_tokens_total")?,
        })
    }

    pub async fn read(client: &Client) -> Option<EngineCounters> {
        EngineCounters::parse(&client.get_text("/metrics").await.ok()?)
    }

    /// `prefill_share` (of engine step time) and `prefill_tokens_per_step` between two reads.
    pub fn between(before: EngineCounters, after: EngineCounters, out: &mut BTreeMap<String, f64>) {
        let prefill = after.prefill_step_s - before.prefill_step_s;
        let busy = prefill + after.decode_step_s - before.decode_step_s;
        let steps = after.prefill_steps - before.prefill_steps;
        if busy > 0.0 {
            out.insert("prefill_share".into(), prefill / busy);
        }
        if steps > 0.0 {
            out.insert(
                "prefill_tokens_per_step".into(),
                (after.prefill_tokens - before.prefill_tokens) / steps,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# TYPE vigil_prefill_tokens_total counter
vigil_prefill_tokens_total 1500
vigil_step_duration_seconds_bucket{kind="prefill",le="0.01"} 3
vigil_step_duration_seconds_sum{kind="prefill"} 2.5
vigil_step_duration_seconds_count{kind="prefill"} 10
vigil_step_duration_seconds_sum{kind="decode"} 7.5
vigil_step_duration_seconds_count{kind="decode"} 300
"#;

    #[test]
    fn engine_counters_come_from_vigil_metrics_only() {
        let c = EngineCounters::parse(PAGE).unwrap();
        assert_eq!(c.prefill_tokens, 1500.0);
        assert_eq!(c.prefill_steps, 10.0);
        assert!(EngineCounters::parse("vllm:num_requests_running 3\n").is_none());
        let later = EngineCounters {
            prefill_step_s: 4.5,
            decode_step_s: 13.5,
            prefill_steps: 14.0,
            prefill_tokens: 2300.0,
        };
        let mut out = BTreeMap::new();
        EngineCounters::between(c, later, &mut out);
        assert!((out["prefill_share"] - 0.25).abs() < 1e-12);
        assert!((out["prefill_tokens_per_step"] - 200.0).abs() < 1e-12);
    }
}
