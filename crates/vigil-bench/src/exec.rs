//! Measuring one point: warm-up then measured requests (closed loop at the point's
//! concurrency) or agent loops, turned into samples and percentile summaries.

use crate::agent::{agent_loops, LoopShape};
use crate::calibrate::Composer;
use crate::client::{Client, Streamed};
use crate::matrix::MatrixCell;
use crate::result::{Point, Sample};
use crate::run::completion_body;
use crate::stats::Summary;
use crate::traffic::{self, EngineCounters, TrafficShape};
use crate::workload::{PlannedPoint, Settings, Shape};
use crate::BenchError;
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Instant;

/// Failure messages kept per point (the count is always exact).
const ERRORS_KEPT: usize = 5;

pub struct Ctx<'a> {
    pub client: &'a Client,
    pub model: &'a str,
    pub settings: &'a Settings,
    pub completion_base: u32,
    pub chat_base: Option<u32>,
    /// The target's context length where `/v1/models` states it.
    pub max_model_len: Option<u64>,
}

/// The progress line on stderr: rewritten in place on a terminal, one line per phase otherwise.
pub struct Progress {
    label: String,
    tty: bool,
}

impl Progress {
    pub fn new(label: String) -> Progress {
        Progress {
            label,
            tty: std::io::stderr().is_terminal(),
        }
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn phase(&self, phase: &str, total: u32) {
        if !self.tty {
            eprintln!("{}: {phase} ({total} requests)", self.label);
        }
    }

    pub fn tick(&self, phase: &str, done: u32, total: u32, t0: Instant) {
        if self.tty && done > 0 {
            let eta = t0.elapsed().as_secs_f64() / f64::from(done) * f64::from(total - done);
            eprint!(
                "\r\x1b[2K{}: {phase} {done}/{total}, ETA {eta:.0} s",
                self.label
            );
        }
    }

    pub fn finish(&self, point: &Point) {
        let p50 = |k: &str| point.metrics.get(k).map_or(f64::NAN, |s| s.p50);
        let verdict = match (point.excluded, &point.status) {
            (true, _) => format!("EXCLUDED ({} failed)", point.failed),
            (false, Some(status)) => status.clone(),
            (false, None) => "ok".to_string(),
        };
        let output = (point.throughput.get("output_tok_s"))
            .map_or(String::new(), |v| format!(", {v:.1} output tok/s"));
        eprintln!(
            "{}{}: {verdict}; TTFT p50 {:.1} ms, e2e p50 {:.1} ms{output}",
            if self.tty { "\r\x1b[2K" } else { "" },
            self.label,
            p50("ttft_ms"),
            p50("e2e_ms"),
        );
    }
}

/// Measures one point; `earlier`: the points already measured on this target (a matrix cell
/// is not run after a failed one in its row).
pub async fn run_point(
    ctx: &Ctx<'_>,
    composer: &mut Composer,
    point: &PlannedPoint,
    earlier: &[Point],
    progress: &Progress,
) -> Result<Point, BenchError> {
    let (mut samples, wall_s, warmup_requests, measured_requests) = match point.shape {
        Shape::Requests {
            prompt_tokens,
            max_tokens,
            concurrency,
        } => {
            let requests = (prompt_tokens, max_tokens, concurrency);
            run_requests(ctx, composer, point, requests, progress).await?
        }
        Shape::AgentLoop {
            prefix_tokens,
            turns,
            turn_tokens,
            tools,
            held,
        } => {
            let chat_base = ctx.chat_base.ok_or_else(|| {
                BenchError::Calibration("agent loop without chat calibration".into())
            })?;
            let mut prefixes = Vec::new();
            for _ in 0..ctx.settings.warmup + ctx.settings.iterations {
                prefixes.push(composer.compose(prefix_tokens, chat_base)?.text);
            }
            let measured = prefixes.split_off(ctx.settings.warmup as usize);
            let shape = LoopShape {
                turns,
                turn_tokens,
                tools,
                held,
            };
            let loops = |prefixes, warmup| agent_loops(ctx, prefixes, shape, warmup, progress);
            let (mut samples, _) = loops(prefixes, true).await;
            let (m, wall) = loops(measured, false).await;
            samples.extend(m);
            let per_loop = turns;
            (
                samples,
                wall,
                ctx.settings.warmup * per_loop,
                ctx.settings.iterations * per_loop,
            )
        }
        Shape::Traffic(shape) => {
            return run_traffic(ctx, composer, point, shape, progress).await;
        }
        Shape::Matrix(cell) => {
            return crate::matrix::run_cell(ctx, composer, point, cell, earlier, progress).await;
        }
        Shape::LiveStream { .. } => {
            return Err(BenchError::Setting(
                "live-stream points run on a stream (crate::live), not one by one".into(),
            ))
        }
    };
    in_send_order(&mut samples);
    let point = summarize(point, samples, wall_s, warmup_requests, measured_requests);
    progress.finish(&point);
    Ok(point)
}

/// Warm-up first, then in send order.
pub fn in_send_order(samples: &mut [Sample]) {
    samples.sort_by(|a, b| {
        b.warmup
            .cmp(&a.warmup)
            .then(a.start_ms.total_cmp(&b.start_ms))
    });
}

/// `warmup` then the point's measured requests of `(prompt tokens, max tokens, concurrency)`
/// on the completions endpoint, closed loop: the samples, the measured wall time, and the
/// warm-up and measured request counts.
pub async fn run_requests(
    ctx: &Ctx<'_>,
    composer: &mut Composer,
    point: &PlannedPoint,
    (prompt_tokens, max_tokens, concurrency): (u32, u32, u32),
    progress: &Progress,
) -> Result<(Vec<Sample>, f64, u32, u32), BenchError> {
    let warm_n = ctx.settings.warmup;
    let measured_n = point.measured_requests(ctx.settings);
    let mut bodies = Vec::new();
    for _ in 0..warm_n + measured_n {
        let p = composer.compose(prompt_tokens, ctx.completion_base)?;
        bodies.push(completion_body(ctx.model, &p.text, max_tokens, true));
    }
    let measured_bodies = bodies.split_off(warm_n as usize);
    let run = |bodies, warmup| {
        closed_loop(
            ctx.client,
            bodies,
            max_tokens,
            concurrency,
            warmup,
            progress,
        )
    };
    let (mut samples, _) = run(bodies, true).await;
    let (measured, wall) = run(measured_bodies, false).await;
    samples.extend(measured);
    Ok((samples, wall, warm_n, measured_n))
}

/// A sustained or burst point: `warmup` workflows at once, untimed, then the measured phase
/// with the engine's counters read around it.
async fn run_traffic(
    ctx: &Ctx<'_>,
    composer: &mut Composer,
    point: &PlannedPoint,
    shape: TrafficShape,
    progress: &Progress,
) -> Result<Point, BenchError> {
    let chat_base = ctx
        .chat_base
        .ok_or_else(|| BenchError::Calibration("workflows without chat calibration".into()))?;
    let mut samples = Vec::new();
    let mut warm_n = 0;
    if ctx.settings.warmup > 0 {
        let warm = TrafficShape {
            workflows: ctx.settings.warmup,
            window_s: 0,
            ..shape
        };
        let w = traffic::run_phase(ctx, composer, chat_base, warm, true, progress).await?;
        warm_n = w.samples.len() as u32;
        samples.extend(w.samples);
    }
    let before = EngineCounters::read(ctx.client).await;
    let m = traffic::run_phase(ctx, composer, chat_base, shape, false, progress).await?;
    let after = EngineCounters::read(ctx.client).await;
    // Every admitted workflow was to send all its turns: the ones a failure cut short count.
    let expected = m.admitted * shape.turns;
    samples.extend(m.samples);
    in_send_order(&mut samples);
    let mut p = summarize(point, samples, m.wall_s, warm_n, expected);
    let t = &mut p.throughput;
    t.insert("workflows_admitted".into(), f64::from(m.admitted));
    t.insert("workflows_finished".into(), f64::from(m.finished));
    if let (Some(b), Some(a)) = (before, after) {
        EngineCounters::between(b, a, t);
    }
    progress.finish(&p);
    Ok(p)
}

/// `concurrency` workers each send the next body as soon as their last request ended.
async fn closed_loop(
    client: &Client,
    bodies: Vec<Value>,
    requested: u32,
    concurrency: u32,
    warmup: bool,
    progress: &Progress,
) -> (Vec<Sample>, f64) {
    let total = bodies.len() as u32;
    let phase = if warmup { "warm-up" } else { "measured" };
    progress.phase(phase, total);
    let queue = Mutex::new(bodies.into_iter().enumerate().collect::<VecDeque<_>>());
    let samples = Mutex::new(Vec::new());
    let t0 = Instant::now();
    let (queue, samples_ref) = (&queue, &samples);
    let worker = || async move {
        loop {
            let next = queue.lock().map(|mut q| q.pop_front()).ok().flatten();
            let Some((i, body)) = next else { break };
            let s = client.stream("/v1/completions", &body).await;
            let sample = to_sample(&s, t0, i as u32, None, requested, warmup);
            if let Ok(mut v) = samples_ref.lock() {
                v.push(sample);
                progress.tick(phase, v.len() as u32, total, t0);
            }
        }
    };
    let workers = (0..concurrency.min(total).max(1)).map(|_| worker());
    futures_util::future::join_all(workers).await;
    let wall = t0.elapsed().as_secs_f64();
    (samples.into_inner().unwrap_or_default(), wall)
}

fn ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1e3
}

pub fn to_sample(
    s: &Streamed,
    t0: Instant,
    iteration: u32,
    turn: Option<u32>,
    requested: u32,
    warmup: bool,
) -> Sample {
    let usage = s.usage.unwrap_or_default();
    // Without usage, a `length` finish means exactly max_tokens; else count text chunks (an
    // undercount where chunks carry several tokens, so the request reads as short).
    let output_tokens = usage
        .completion_tokens
        .or(match s.finish_reason.as_deref() {
            Some("length") => Some(requested),
            _ if s.text_chunks > 0 => Some(s.text_chunks),
            _ => None,
        });
    let first = s.first_text.or(s.first_choice);
    let error = s.error.clone().or_else(|| match output_tokens {
        _ if first.is_none() => Some("no tokens in the stream".to_string()),
        Some(n) if n == requested => None,
        n => Some(format!(
            "generated {} of {requested} tokens (finish_reason {:?})",
            n.map_or("?".to_string(), |n| n.to_string()),
            s.finish_reason
        )),
    });
    let itl_ms = match (s.first_text, s.last_text, output_tokens) {
        (Some(a), Some(b), Some(n)) if n > 1 && b > a => Some(ms(a, b) / f64::from(n - 1)),
        _ => None,
    };
    Sample {
        warmup,
        iteration,
        turn,
        start_ms: ms(t0, s.start),
        ttft_ms: first.map(|f| ms(s.start, f)),
        e2e_ms: ms(s.start, s.end),
        itl_ms,
        requested_tokens: requested,
        prompt_tokens: usage.prompt_tokens,
        cached_tokens: usage.cached_tokens,
        output_tokens,
        text_chunks: s.text_chunks,
        finish_reason: s.finish_reason.clone(),
        error,
        ..Sample::default()
    }
}

/// Percentiles over the measured, successful samples; counts over all of them. A request cut
/// by a deadline (matrix) is neither: its first-token time and token gaps count, and the
/// tokens it received count toward `output_tok_s`, but it is not a completed request.
pub fn summarize(
    planned: &PlannedPoint,
    samples: Vec<Sample>,
    wall_s: f64,
    warmup_requests: u32,
    measured_requests: u32,
) -> Point {
    let failed: Vec<&Sample> = samples.iter().filter(|s| s.error.is_some()).collect();
    let errors = failed
        .iter()
        .take(ERRORS_KEPT)
        .filter_map(|s| s.error.clone())
        .collect();
    // Requests an agent loop never sent (after a failed turn) are failures too.
    let missing = (warmup_requests + measured_requests).saturating_sub(samples.len() as u32);
    let failed_n = failed.len() as u32 + missing;
    let timed: Vec<&Sample> = samples
        .iter()
        .filter(|s| !s.warmup && s.error.is_none())
        .collect();
    let ok: Vec<&Sample> = timed.iter().copied().filter(|s| !s.cut).collect();
    let mut metrics = BTreeMap::new();
    let mut put = |name: &str, values: Vec<f64>| {
        if let Some(s) = Summary::of(values) {
            metrics.insert(name.to_string(), s);
        }
    };
    put("ttft_ms", timed.iter().filter_map(|s| s.ttft_ms).collect());
    put("itl_ms", timed.iter().filter_map(|s| s.itl_ms).collect());
    put("e2e_ms", ok.iter().map(|s| s.e2e_ms).collect());
    let out_tokens = |s: &Sample| f64::from(s.output_tokens.unwrap_or(0));
    put(
        "output_tok_s",
        ok.iter()
            .map(|s| out_tokens(s) / (s.e2e_ms / 1e3))
            .collect(),
    );
    let mut throughput = BTreeMap::new();
    match planned.shape {
        Shape::Requests {
            max_tokens: 1,
            prompt_tokens: asked,
            ..
        }
        | Shape::Matrix(MatrixCell::Prefill { context: asked }) => put(
            "prompt_tok_s",
            // Where the server reports no usage (llama-cpp-python's streams), the prompt's
            // calibrated length: composed to exactly that many of the target's own tokens.
            ok.iter()
                .filter_map(|s| {
                    Some(f64::from(s.prompt_tokens.unwrap_or(asked)) / (s.ttft_ms? / 1e3))
                })
                .collect(),
        ),
        Shape::Requests { .. } => {}
        Shape::LiveStream { .. } => crate::live::aggregates(&ok, &mut throughput),
        Shape::Traffic(_) | Shape::Matrix(MatrixCell::Decode(_)) => put(
            "generation_tok_s",
            ok.iter()
                .filter_map(|s| {
                    let decode_s = (s.e2e_ms - s.ttft_ms?) / 1e3;
                    let n = s.output_tokens?.checked_sub(1)?;
                    (decode_s > 0.0 && n > 0).then(|| f64::from(n) / decode_s)
                })
                .collect(),
        ),
        Shape::AgentLoop { turns, .. } => {
            put(
                "ttft_first_turn_ms",
                ok.iter()
                    .filter(|s| s.turn == Some(1))
                    .filter_map(|s| s.ttft_ms)
                    .collect(),
            );
            put(
                "ttft_later_turns_ms",
                ok.iter()
                    .filter(|s| s.turn > Some(1))
                    .filter_map(|s| s.ttft_ms)
                    .collect(),
            );
            // A loop's time: first send to last byte, over loops whose every turn succeeded.
            let mut loops: BTreeMap<u32, Vec<&Sample>> = BTreeMap::new();
            for s in &ok {
                loops.entry(s.iteration).or_default().push(s);
            }
            put(
                "loop_ms",
                loops
                    .values()
                    .filter(|v| v.len() as u32 == turns)
                    .map(|v| {
                        let start = v.iter().map(|s| s.start_ms).fold(f64::INFINITY, f64::min);
                        let end = v.iter().map(|s| s.start_ms + s.e2e_ms).fold(0.0, f64::max);
                        end - start
                    })
                    .collect(),
            );
        }
    }
    if wall_s > 0.0 {
        let total: f64 = timed.iter().map(|s| out_tokens(s)).sum();
        throughput.insert("output_tok_s".to_string(), total / wall_s);
        throughput.insert("requests_per_s".to_string(), ok.len() as f64 / wall_s);
    }
    Point {
        label: planned.label.clone(),
        params: planned.params(),
        warmup_requests,
        measured_requests,
        failed: failed_n,
        excluded: failed_n > 0,
        errors,
        wall_s,
        throughput,
        metrics,
        samples,
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Usage;
    use std::time::Duration;

    fn streamed(tokens: u32, ttft_ms: u64, itl_ms: u64) -> Streamed {
        let start = Instant::now();
        let first = start + Duration::from_millis(ttft_ms);
        let last = first + Duration::from_millis(itl_ms * u64::from(tokens - 1));
        Streamed {
            start,
            first_text: Some(first),
            first_choice: Some(first),
            last_text: Some(last),
            end: last + Duration::from_millis(1),
            text_chunks: tokens,
            text: "x".repeat(tokens as usize),
            tool_text: String::new(),
            usage: Some(Usage {
                prompt_tokens: Some(100),
                completion_tokens: Some(tokens),
                cached_tokens: None,
            }),
            finish_reason: Some("length".into()),
            error: None,
        }
    }

    fn planned(concurrency: u32) -> PlannedPoint {
        PlannedPoint {
            label: "p".into(),
            shape: Shape::Requests {
                prompt_tokens: 100,
                max_tokens: 5,
                concurrency,
            },
        }
    }

    #[test]
    fn samples_time_the_first_token_and_the_gaps() {
        let s = streamed(5, 40, 10);
        let x = to_sample(&s, s.start, 0, None, 5, false);
        assert!((x.ttft_ms.unwrap() - 40.0).abs() < 1e-6);
        assert!((x.itl_ms.unwrap() - 10.0).abs() < 1e-6);
        assert!((x.e2e_ms - 81.0).abs() < 1e-6);
        assert_eq!(x.error, None);
        // Fewer tokens than asked is a failure, never a short sample.
        let short = to_sample(&streamed(3, 40, 10), s.start, 0, None, 5, false);
        assert!(short.error.unwrap().contains("generated 3 of 5"));
    }

    #[test]
    fn a_failure_excludes_the_point_and_warmup_is_not_measured() {
        let t0 = Instant::now();
        let mut samples = vec![to_sample(&streamed(5, 900, 10), t0, 0, None, 5, true)];
        for ttft in [10, 20, 30] {
            samples.push(to_sample(&streamed(5, ttft, 10), t0, 0, None, 5, false));
        }
        let p = summarize(&planned(1), samples.clone(), 1.0, 1, 3);
        assert!(!p.excluded);
        let ttft = p.metrics["ttft_ms"];
        assert_eq!(ttft.n, 3);
        assert!((ttft.p50 - 20.0).abs() < 1e-6 && ttft.max < 100.0);
        assert!((p.throughput["output_tok_s"] - 15.0).abs() < 1e-9);
        samples.push(to_sample(&streamed(2, 10, 10), t0, 0, None, 5, false));
        let p = summarize(&planned(1), samples, 1.0, 1, 4);
        assert!(p.excluded);
        assert_eq!(p.failed, 1);
        assert_eq!(p.metrics["ttft_ms"].n, 3);
    }
}
