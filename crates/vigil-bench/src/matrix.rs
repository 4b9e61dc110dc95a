//! The matrix workload, the speed-test matrix: prefill speed at each context length, then for
//! each (context × concurrency) cell, N closed-loop streams of context-length prompts decoding
//! for a fixed time. A cell the target cannot hold (`max_model_len`, or its KV cache as Vigil's
//! `/health` reports it) is marked over capacity and not run; a cell after a failed one in its
//! row is not run; a cell whose N requests were never all generating at once is marked
//! requests queued (the server ran fewer at a time), or no token in time (none started).

use crate::calibrate::Composer;
use crate::exec::{self, to_sample, Ctx, Progress};
use crate::result::{Point, Sample};
use crate::run::completion_body;
use crate::workload::PlannedPoint;
use crate::BenchError;
use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// One point of the matrix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MatrixCell {
    /// `warmup` + `iterations` single requests of `context` prompt tokens and 1 output token.
    Prefill { context: u32 },
    /// Sustained decode at one (context, concurrency).
    Decode(DecodeShape),
}

/// `concurrency` closed-loop streams of `context`-token prompts asking `max_tokens` each, for
/// `duration_s` seconds; requests still streaming at the end are dropped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeShape {
    pub context: u32,
    pub concurrency: u32,
    pub duration_s: u32,
    pub max_tokens: u32,
}

/// What became of a matrix cell (`Point::status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CellStatus {
    Valid,
    RequestsQueued,
    NoTokens,
    OverCapacity,
    NotRun,
    Failed,
}

impl CellStatus {
    pub const ALL: [CellStatus; 6] = [
        CellStatus::Valid,
        CellStatus::RequestsQueued,
        CellStatus::NoTokens,
        CellStatus::OverCapacity,
        CellStatus::NotRun,
        CellStatus::Failed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CellStatus::Valid => "valid",
            CellStatus::RequestsQueued => "requests queued",
            CellStatus::NoTokens => "no token in time",
            CellStatus::OverCapacity => "over capacity",
            CellStatus::NotRun => "not run",
            CellStatus::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<CellStatus> {
        CellStatus::ALL.into_iter().find(|c| c.label() == s)
    }

    /// Nothing measured (not run, or no token arrived): nothing to show, chart or rank.
    pub fn skipped(self) -> bool {
        matches!(
            self,
            CellStatus::NoTokens | CellStatus::OverCapacity | CellStatus::NotRun
        )
    }

    /// What the status means, as the report's notes say it.
    pub fn meaning(self) -> &'static str {
        match self {
            CellStatus::Valid => "every request ran at once, none failed",
            CellStatus::RequestsQueued => {
                "the server never had all the requests generating at once, so some waited in a queue"
            }
            CellStatus::NoTokens => {
                "no request produced a token within the duration: they all waited behind prefill"
            }
            CellStatus::OverCapacity => {
                "not run: this many requests at this context exceed the server's KV cache, or \
                 the context and output exceed its max_model_len"
            }
            CellStatus::NotRun => "skipped because a lower concurrency at the same context failed",
            CellStatus::Failed => "some requests failed; the cell is excluded",
        }
    }
}

/// What the target can hold: `max_model_len` (from `/v1/models`) and its KV cache in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Capacity {
    pub max_model_len: Option<u64>,
    pub kv_tokens: Option<u64>,
}

impl Capacity {
    /// The KV cache in a `/health` body: Vigil's `kv_pages_total` × `kv_page_tokens`.
    pub fn kv_tokens_of(health: &Value) -> Option<u64> {
        let n = |k: &str| health.get(k).and_then(Value::as_u64).filter(|&n| n > 0);
        Some(n("kv_pages_total")? * n("kv_page_tokens")?)
    }

    async fn read(ctx: &Ctx<'_>) -> Capacity {
        let health = ctx.client.get_json("/health").await.ok();
        Capacity {
            max_model_len: ctx.max_model_len,
            kv_tokens: health.and_then(|(h, _)| Capacity::kv_tokens_of(&h)),
        }
    }

    /// Why the target cannot hold `cell`, if it cannot: the prompt and output past
    /// `max_model_len`, or the prompts of all its requests at once past the KV cache.
    pub fn refuses(&self, cell: MatrixCell) -> Option<String> {
        let (context, concurrency, need) = match cell {
            MatrixCell::Prefill { context } => (context, 1, context + 1),
            MatrixCell::Decode(d) => (d.context, d.concurrency, d.context + d.max_tokens),
        };
        if let Some(len) = self.max_model_len.filter(|&len| u64::from(need) > len) {
            return Some(format!(
                "needs {need} tokens of context; the server's max_model_len is {len}"
            ));
        }
        let at_once = u64::from(context) * u64::from(concurrency);
        match self.kv_tokens {
            Some(kv) if at_once > kv => Some(format!(
                "{concurrency} × {context} prompt tokens at once exceed the server's KV cache of \
                 {kv} tokens"
            )),
            _ => None,
        }
    }
}

/// The decode cell of `context`'s row measured earlier with failed requests, if any.
fn failed_in_row(earlier: &[Point], context: u32) -> Option<&Point> {
    earlier.iter().find(|p| {
        p.params.get("context") == Some(&u64::from(context))
            && p.params.contains_key("duration_s")
            && p.failed > 0
    })
}

/// Measures one cell, or records why it was not run.
pub async fn run_cell(
    ctx: &Ctx<'_>,
    composer: &mut Composer,
    point: &PlannedPoint,
    cell: MatrixCell,
    earlier: &[Point],
    progress: &Progress,
) -> Result<Point, BenchError> {
    let skip = match (Capacity::read(ctx).await.refuses(cell), cell) {
        (Some(why), _) => Some((CellStatus::OverCapacity, why)),
        (None, MatrixCell::Decode(d)) => failed_in_row(earlier, d.context)
            .map(|p| (CellStatus::NotRun, format!("`{}` failed", p.label))),
        (None, MatrixCell::Prefill { .. }) => None,
    };
    if let Some((status, why)) = skip {
        eprintln!("{}: {} ({why})", progress.label(), status.label());
        return Ok(skipped(point, status, why));
    }
    let mut p = match cell {
        MatrixCell::Prefill { context } => {
            let (mut samples, wall, warm, measured) =
                exec::run_requests(ctx, composer, point, (context, 1, 1), progress).await?;
            exec::in_send_order(&mut samples);
            let mut p = exec::summarize(point, samples, wall, warm, measured);
            // One output token per request: no decode throughput to speak of.
            p.throughput.remove("output_tok_s");
            p
        }
        MatrixCell::Decode(d) => run_decode(ctx, composer, point, d, progress).await?,
    };
    let concurrency = match cell {
        MatrixCell::Decode(d) => d.concurrency,
        MatrixCell::Prefill { .. } => 0,
    };
    let peak = p.throughput.get("peak_active").map_or(0, |&v| v as u32);
    p.status = Some(classify(p.failed, peak, concurrency).label().to_string());
    progress.finish(&p);
    Ok(p)
}

/// A cell that was not run: no samples, no numbers, the reason in `errors`.
fn skipped(point: &PlannedPoint, status: CellStatus, why: String) -> Point {
    Point {
        label: point.label.clone(),
        params: point.params(),
        warmup_requests: 0,
        measured_requests: 0,
        failed: 0,
        excluded: false,
        errors: vec![why],
        wall_s: 0.0,
        throughput: BTreeMap::new(),
        metrics: BTreeMap::new(),
        samples: Vec::new(),
        status: Some(status.label().to_string()),
    }
}

/// A measured cell's status: any failure fails it; no request generating at any moment means
/// no token came in time; fewer than `concurrency` generating at the busiest moment means the
/// server queued some (prefill points: concurrency 0).
pub fn classify(failed: u32, peak_active: u32, concurrency: u32) -> CellStatus {
    if failed > 0 {
        CellStatus::Failed
    } else if concurrency > 0 && peak_active == 0 {
        CellStatus::NoTokens
    } else if peak_active < concurrency {
        CellStatus::RequestsQueued
    } else {
        CellStatus::Valid
    }
}

/// The decode cell: each stream's prompt is sent once untimed (1 token) so the server's
/// prompt cache holds it, as the speed-test matrix does; then each stream re-sends its own
/// prompt as its request ends, until the deadline, when the requests in flight are dropped.
async fn run_decode(
    ctx: &Ctx<'_>,
    composer: &mut Composer,
    point: &PlannedPoint,
    d: DecodeShape,
    progress: &Progress,
) -> Result<Point, BenchError> {
    let prompts = (0..d.concurrency)
        .map(|_| Ok(composer.compose(d.context, ctx.completion_base)?.text))
        .collect::<Result<Vec<String>, BenchError>>()?;
    let mut samples = warm_prompt_cache(ctx, &prompts, progress).await;
    let phase = format!("{} s of decode", d.duration_s);
    progress.phase(&phase, d.concurrency);
    let duration = Duration::from_secs(u64::from(d.duration_s));
    let t0 = Instant::now();
    let deadline = t0 + duration;
    let mut in_flight = FuturesUnordered::new();
    let send = |stream: usize, i: u32| {
        let body = completion_body(ctx.model, &prompts[stream], d.max_tokens, true);
        async move {
            // Pushed before the deadline but first polled after it: never sent, not a sample.
            if Instant::now() >= deadline {
                return (stream, i, None);
            }
            let sent = (ctx.client)
                .stream_until("/v1/completions", &body, deadline)
                .await;
            (stream, i, Some(sent))
        }
    };
    let mut sent = 0u32;
    for stream in 0..prompts.len() {
        in_flight.push(send(stream, sent));
        sent += 1;
    }
    while let Some((stream, i, outcome)) = in_flight.next().await {
        let Some((s, cut)) = outcome else {
            sent -= 1; // No request goes out after the deadline, so no later index repeats.
            continue;
        };
        let mut sample = to_sample(&s, t0, i, None, d.max_tokens, false);
        if cut {
            // Short of its tokens only because the time was up.
            sample.cut = true;
            sample.error = None;
        }
        samples.push(sample);
        if Instant::now() < deadline {
            in_flight.push(send(stream, sent));
            sent += 1;
        }
        let elapsed = t0.elapsed().as_secs() as u32;
        progress.tick(&phase, elapsed.min(d.duration_s), d.duration_s, t0);
    }
    exec::in_send_order(&mut samples);
    let duration_ms = duration.as_secs_f64() * 1e3;
    let spans = generating(&samples, duration_ms);
    let measured = samples.iter().filter(|s| !s.warmup);
    let completed = measured.clone().filter(|s| !s.cut && s.error.is_none());
    let completed = completed.count() as f64;
    let tokens: u32 = (measured.filter(|s| s.error.is_none()))
        .filter_map(|s| s.output_tokens)
        .sum();
    let warm = prompts.len() as u32;
    let mut p = exec::summarize(point, samples, duration.as_secs_f64(), warm, sent);
    let t = &mut p.throughput;
    t.insert("average_active".into(), average_active(&spans, duration_ms));
    t.insert("peak_active".into(), f64::from(peak_active(&spans)));
    t.insert("completed_requests".into(), completed);
    t.insert("output_tokens".into(), f64::from(tokens));
    Ok(p)
}

/// Each prompt once with 1 output token, all at once and untimed: warm-up samples (a failed
/// one fails the cell like any other request).
async fn warm_prompt_cache(ctx: &Ctx<'_>, prompts: &[String], progress: &Progress) -> Vec<Sample> {
    progress.phase("prompt-cache warm-up", prompts.len() as u32);
    let t0 = Instant::now();
    let requests = prompts.iter().enumerate().map(|(i, prompt)| {
        let body = completion_body(ctx.model, prompt, 1, true);
        async move {
            let s = ctx.client.stream("/v1/completions", &body).await;
            to_sample(&s, t0, i as u32, None, 1, true)
        }
    });
    futures_util::future::join_all(requests).await
}

/// When each request was generating, in ms from the phase start: first token to last token
/// (or the deadline), clipped to the duration. Failed requests and requests that got no token
/// are left out.
pub fn generating(samples: &[Sample], duration_ms: f64) -> Vec<(f64, f64)> {
    (samples.iter())
        .filter(|s| !s.warmup && s.error.is_none())
        .filter_map(|s| {
            let from = s.start_ms + s.ttft_ms?;
            let to = (s.start_ms + s.e2e_ms).min(duration_ms);
            (from <= to).then_some((from, to))
        })
        .collect()
}

/// Requests generating, averaged over the duration: the summed spans over its length.
pub fn average_active(spans: &[(f64, f64)], duration_ms: f64) -> f64 {
    // Folded from +0.0: an empty `sum` of floats is -0.0.
    spans.iter().fold(0.0, |sum, (a, b)| sum + (b - a)) / duration_ms
}

/// The most requests generating at one moment.
pub fn peak_active(spans: &[(f64, f64)]) -> u32 {
    let mut edges: Vec<(f64, i32)> = (spans.iter())
        .flat_map(|&(a, b)| [(a, 1), (b, -1)])
        .collect();
    // At equal times starts come first: a request starting as another ends overlaps it.
    edges.sort_by(|x, y| x.0.total_cmp(&y.0).then(y.1.cmp(&x.1)));
    let (mut now, mut peak) = (0, 0);
    for (_, step) in edges {
        now += step;
        peak = peak.max(now);
    }
    peak as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Shape;

    fn decode(context: u32, concurrency: u32) -> MatrixCell {
        MatrixCell::Decode(DecodeShape {
            context,
            concurrency,
            duration_s: 30,
            max_tokens: 512,
        })
    }

    #[test]
    fn capacity_refuses_what_the_server_cannot_hold() {
        let health = serde_json::json!({"kv_pages_total": 1000, "kv_page_tokens": 16});
        let kv = Capacity::kv_tokens_of(&health);
        assert_eq!(kv, Some(16_000));
        assert_eq!(
            Capacity::kv_tokens_of(&serde_json::json!({"status": "ok"})),
            None
        );
        let zero = serde_json::json!({"kv_pages_total": 0, "kv_page_tokens": 16});
        assert_eq!(Capacity::kv_tokens_of(&zero), None);
        let c = Capacity {
            max_model_len: Some(8192),
            kv_tokens: kv,
        };
        assert_eq!(c.refuses(decode(4000, 4)), None);
        let why = c.refuses(decode(4096, 4)).unwrap();
        assert!(why.contains("4 × 4096") && why.contains("16000"), "{why}");
        // Prompt and output must fit the context, whatever the KV cache.
        let why = c.refuses(decode(8000, 1)).unwrap();
        assert!(why.contains("8512") && why.contains("8192"), "{why}");
        assert_eq!(c.refuses(MatrixCell::Prefill { context: 8191 }), None);
        assert!(c.refuses(MatrixCell::Prefill { context: 8192 }).is_some());
        // A server that reports neither refuses nothing.
        assert_eq!(Capacity::default().refuses(decode(1 << 20, 128)), None);
    }

    fn point(label: &str, context: u64, failed: u32) -> Point {
        let planned = PlannedPoint {
            label: label.into(),
            shape: Shape::Matrix(decode(context as u32, 1)),
        };
        let mut p = skipped(&planned, CellStatus::Valid, String::new());
        p.failed = failed;
        p
    }

    #[test]
    fn a_failure_skips_the_rest_of_its_row_only() {
        let earlier = [
            point("ctx=64 c=1", 64, 0),
            point("ctx=64 c=2", 64, 3),
            point("ctx=256 c=1", 256, 0),
        ];
        assert_eq!(failed_in_row(&earlier, 64).unwrap().label, "ctx=64 c=2");
        assert!(failed_in_row(&earlier, 256).is_none());
        // A failed prefill point does not skip decode cells.
        let mut prefill = point("prefill ctx=256", 256, 1);
        prefill.params.remove("duration_s");
        assert!(failed_in_row(&[prefill], 256).is_none());
    }

    #[test]
    fn statuses_read_failures_and_queueing() {
        assert_eq!(classify(0, 4, 4), CellStatus::Valid);
        assert_eq!(classify(0, 1, 4), CellStatus::RequestsQueued);
        assert_eq!(classify(0, 0, 4), CellStatus::NoTokens);
        assert_eq!(classify(1, 0, 4), CellStatus::Failed);
        assert_eq!(classify(2, 4, 4), CellStatus::Failed);
        assert_eq!(classify(0, 0, 0), CellStatus::Valid);
        for s in CellStatus::ALL {
            assert_eq!(CellStatus::parse(s.label()), Some(s));
        }
        assert!(CellStatus::OverCapacity.skipped() && CellStatus::NotRun.skipped());
        assert!(CellStatus::NoTokens.skipped());
        assert!(!CellStatus::RequestsQueued.skipped());
    }

    fn sample(start_ms: f64, ttft_ms: Option<f64>, e2e_ms: f64, error: bool) -> Sample {
        let mut s = to_sample(
            &crate::client::Streamed::failed(String::new()),
            Instant::now(),
            0,
            None,
            1,
            false,
        );
        s.start_ms = start_ms;
        s.ttft_ms = ttft_ms;
        s.e2e_ms = e2e_ms;
        s.error = error.then(|| "boom".to_string());
        s
    }

    #[test]
    fn active_requests_count_from_first_token_to_last_or_deadline() {
        // One at a time (a server that queues): each request waits for the one before.
        let serial = [
            sample(0.0, Some(100.0), 1000.0, false),
            sample(0.0, Some(1100.0), 2000.0, false),
            sample(1000.0, Some(1100.0), 2000.0, false),
        ];
        let spans = generating(&serial, 10_000.0);
        assert_eq!(spans, [(100.0, 1000.0), (1100.0, 2000.0), (2100.0, 3000.0)]);
        assert_eq!(peak_active(&spans), 1);
        assert!((average_active(&spans, 10_000.0) - 0.27).abs() < 1e-12);
        // Two at once, the second cut by the 1500 ms deadline; a failure and a request that
        // never got a token are not generating.
        let both = [
            sample(0.0, Some(100.0), 1000.0, false),
            sample(0.0, Some(200.0), 1600.0, false),
            sample(0.0, Some(50.0), 900.0, true),
            sample(1400.0, None, 100.0, false),
        ];
        let spans = generating(&both, 1500.0);
        assert_eq!(spans, [(100.0, 1000.0), (200.0, 1500.0)]);
        assert_eq!(peak_active(&spans), 2);
        assert!((average_active(&spans, 1500.0) - 2200.0 / 1500.0).abs() < 1e-12);
        // Touching spans overlap; disjoint ones do not.
        assert_eq!(peak_active(&[(0.0, 5.0), (5.0, 9.0)]), 2);
        assert_eq!(peak_active(&[(0.0, 5.0), (6.0, 9.0)]), 1);
        assert_eq!(peak_active(&[]), 0);
        assert!(average_active(&[], 1000.0).is_sign_positive());
    }
}
