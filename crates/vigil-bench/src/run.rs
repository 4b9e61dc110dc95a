//! `vigil bench run`: for each target, find the model, calibrate prompts on the target's own
//! tokenizer, measure every point of the workload, and write one result file for the run.

use crate::calibrate::{
    pseudo_words, CalibrationCheck, CalibrationRecord, Composer, SplitMix64, HEADER, POOL_SIZE,
};
use crate::client::{Client, Usage};
use crate::exec::{self, Progress};
use crate::hardware::Hardware;
use crate::live::entries::CountMethod;
use crate::matrix::MatrixCell;
use crate::result::{Point, RunFile, TargetRun, SCHEMA};
use crate::workload::{plan, PlannedPoint, Settings, Shape, Workload};
use crate::BenchError;
use futures_util::{stream, StreamExt, TryStreamExt};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `NAME=URL` from the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub name: String,
    pub url: String,
}

impl FromStr for Target {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('=') {
            Some((name, url)) if !name.is_empty() && url.starts_with("http") => Ok(Target {
                name: name.to_string(),
                url: url.trim_end_matches('/').to_string(),
            }),
            _ => Err(BenchError::Setting(format!(
                "--target `{s}`: expected NAME=URL, e.g. vigil=http://127.0.0.1:8080"
            ))),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub workload: Workload,
    pub settings: Settings,
    pub out_dir: PathBuf,
    /// The `model` field to send (default: the first id of the target's `/v1/models`).
    pub model: Option<String>,
    /// How long to wait for a target to answer `/v1/models` (it may still be loading).
    pub startup_timeout_s: u64,
    pub tool_version: String,
    /// A local `tokenizer.json` to price prompts with instead of the target's own count.
    pub tokenizer: Option<PathBuf>,
}

/// A target that answered before anything was measured.
struct Ready {
    target: Target,
    client: Client,
    model: String,
    owned_by: Option<String>,
    server_header: Option<String>,
    max_model_len: Option<u64>,
}

/// Runs the workload against every target in turn; returns the result file's path. Every
/// target is checked first (it answers, it has a model, the points fit its context), so a
/// target that is down fails the run before minutes are spent on the others; the file is
/// rewritten after every point, so a run that stops part-way keeps what it measured.
pub async fn run(opts: &RunOptions, targets: &[Target]) -> Result<PathBuf, BenchError> {
    if targets.is_empty() {
        return Err(BenchError::Setting(
            "give at least one --target NAME=URL".into(),
        ));
    }
    let points = plan(opts.workload, &opts.settings)?;
    let tokenizer = match &opts.tokenizer {
        Some(path) => Some(
            tokenizers::Tokenizer::from_file(path)
                .map_err(|e| BenchError::Setting(format!("--tokenizer {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let mut ready = Vec::new();
    for target in targets {
        ready.push(check_target(opts, target, &points).await?);
    }
    let started_unix_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    std::fs::create_dir_all(&opts.out_dir).map_err(|e| BenchError::io(&opts.out_dir, e))?;
    let path = free_path(
        &opts.out_dir,
        &format!("{}-{started_unix_s}", opts.workload),
    );
    let mut file = RunFile {
        schema: SCHEMA.to_string(),
        tool_version: opts.tool_version.clone(),
        started_unix_s,
        workload: opts.workload,
        complete: false,
        settings: opts.settings.clone(),
        hardware: Hardware::detect(),
        targets: Vec::new(),
    };
    let mut eta = crate::estimate::Eta::new(&points, &opts.settings, ready.len());
    eprintln!("{}", eta.announce(opts.workload, &path));
    let cold_windows = crate::live::ColdWindows::default();
    for r in &ready {
        let run = TargetRun {
            name: r.target.name.clone(),
            url: r.target.url.clone(),
            model: r.model.clone(),
            owned_by: r.owned_by.clone(),
            server_header: r.server_header.clone(),
            max_model_len: r.max_model_len,
            calibration: None,
            live: None,
            points: Vec::new(),
        };
        file.targets.push(run);
        if opts.workload == Workload::LiveStream {
            let ctx = crate::live::LiveCtx {
                client: &r.client,
                model: &r.model,
                settings: &opts.settings,
                name: &r.target.name,
                cold_windows: &cold_windows,
            };
            let (record, measured) = crate::live::run_target(&ctx, &points).await?;
            if let Some(run) = file.targets.last_mut() {
                run.live = Some(record);
                run.points = measured;
            }
            eta.point_done(points.len());
            file.write_atomic(&path)?;
            continue;
        }
        let mut on_point = |calibration: &CalibrationRecord, measured: &[Point]| {
            if let Some(run) = file.targets.last_mut() {
                run.calibration = Some(calibration.clone());
                run.points = measured.to_vec();
            }
            eta.point_done(1);
            if let Some(line) = eta.progress(&r.target.name) {
                eprintln!("{line}");
            }
            file.write_atomic(&path)
        };
        measure_points(opts, r, &points, tokenizer.as_ref(), &mut on_point).await?;
    }
    file.complete = true;
    file.write_atomic(&path)?;
    Ok(path)
}

/// Wait for `target` to answer, find its model, and check that every point fits it.
async fn check_target(
    opts: &RunOptions,
    target: &Target,
    points: &[PlannedPoint],
) -> Result<Ready, BenchError> {
    let timeout = Duration::from_secs(opts.settings.request_timeout_s);
    let client = Client::new(&target.url, timeout)?;
    wait_ready(&client, opts.startup_timeout_s)
        .await
        .map_err(|e| BenchError::Setting(format!("target `{}`: {e}", target.name)))?;
    let (models, server_header) = client.get_json("/v1/models").await?;
    let first = models.pointer("/data/0");
    let model = match (
        &opts.model,
        first.and_then(|m| m.get("id")).and_then(Value::as_str),
    ) {
        (Some(m), _) => m.clone(),
        (None, Some(id)) => id.to_string(),
        (None, None) => {
            return Err(BenchError::Reply {
                url: format!("{}/v1/models", target.url),
                what: "no model id in `data`; pass --model".into(),
            })
        }
    };
    let max_model_len = first
        .and_then(|m| m.get("max_model_len"))
        .and_then(Value::as_u64);
    if let Some(len) = max_model_len {
        let refused = |p: &&PlannedPoint| !p.marks_over_capacity() && !fits(p, Some(len));
        if let Some(p) = points.iter().find(refused) {
            return Err(BenchError::Setting(format!(
                "{}: point `{}` needs {} tokens of context; the server has {len}",
                target.name,
                p.label,
                p.context_need()
            )));
        }
    }
    Ok(Ready {
        target: target.clone(),
        client,
        model,
        owned_by: first
            .and_then(|m| m.get("owned_by"))
            .and_then(Value::as_str)
            .map(str::to_string),
        server_header,
        max_model_len,
    })
}

/// Called after each measured point with the calibration and every point so far.
type OnPoint<'a> = dyn FnMut(&CalibrationRecord, &[Point]) -> Result<(), BenchError> + 'a;

/// Calibrates prompts on the target, then measures the points one by one.
async fn measure_points(
    opts: &RunOptions,
    ready: &Ready,
    points: &[PlannedPoint],
    tokenizer: Option<&tokenizers::Tokenizer>,
    on_point: &mut OnPoint<'_>,
) -> Result<(), BenchError> {
    let (client, model, max_model_len) = (&ready.client, ready.model.as_str(), ready.max_model_len);
    let target_name = &ready.target.name;
    // Matrix cells too long for the target are marked, never sent: not calibrated for either.
    let fitting = points.iter().filter(|p| fits(p, max_model_len));
    let longest = fitting.map(longest_prompt).max().unwrap_or(0);
    let pricer = match tokenizer {
        Some(t) => Pricer::Local(t),
        None => Pricer::Remote(prompt_counter(client, model).await?),
    };
    let (mut composer, calibration) = calibrate(
        client,
        model,
        opts.workload,
        longest,
        opts.settings.seed,
        pricer,
    )
    .await?;
    // Loops held in a session run only where the target serves sessions.
    let sessions = serves_sessions(client).await;
    let points: Vec<&PlannedPoint> = (points.iter())
        .filter(|p| sessions || !p.needs_sessions())
        .collect();
    let mut measured = Vec::new();
    for (i, point) in points.iter().enumerate() {
        let progress = Progress::new(format!(
            "[{target_name}] {} {} ({}/{})",
            opts.workload,
            point.label,
            i + 1,
            points.len()
        ));
        let ctx = exec::Ctx {
            client,
            model,
            settings: &opts.settings,
            completion_base: calibration.completion_base_tokens,
            chat_base: calibration.chat_base_tokens,
            max_model_len,
        };
        let p = exec::run_point(&ctx, &mut composer, point, &measured, &progress).await?;
        measured.push(p);
        on_point(&calibration, &measured)?;
    }
    Ok(())
}

/// Whether the target answers `GET /v1/sessions` (Vigil, LayerScale).
async fn serves_sessions(client: &Client) -> bool {
    client.get_json("/v1/sessions").await.is_ok()
}

/// Whether the point's prompt and output fit the target's context (unknown: assumed to).
fn fits(p: &PlannedPoint, max_model_len: Option<u64>) -> bool {
    max_model_len.is_none_or(|len| u64::from(p.context_need()) <= len)
}

fn longest_prompt(p: &PlannedPoint) -> u32 {
    match p.shape {
        Shape::Requests { prompt_tokens, .. } => prompt_tokens,
        Shape::AgentLoop { prefix_tokens, .. } => prefix_tokens,
        Shape::Traffic(t) => t.prefix_tokens,
        Shape::LiveStream { stream, .. } => stream.window_tokens,
        Shape::Matrix(MatrixCell::Prefill { context }) => context,
        Shape::Matrix(MatrixCell::Decode(d)) => d.context,
    }
}

fn free_path(dir: &Path, stem: &str) -> PathBuf {
    let mut path = dir.join(format!("{stem}.json"));
    let mut n = 1;
    while path.exists() {
        n += 1;
        path = dir.join(format!("{stem}-{n}.json"));
    }
    path
}

/// Ready when `/health` answers 200 (Vigil: 503 while loading, though `/v1/models` already
/// answers), or, on servers without `/health`, when `/v1/models` does.
async fn wait_ready(client: &Client, timeout_s: u64) -> Result<(), BenchError> {
    let t0 = Instant::now();
    let mut said = false;
    loop {
        let probe = match client.get_json("/health").await {
            Err(BenchError::Status { status: 404, .. }) => client.get_json("/v1/models").await,
            other => other,
        };
        match probe {
            // A success with a body that is not JSON is ready too: vLLM's `/health` is an
            // empty 200.
            Ok(_) | Err(BenchError::Reply { .. }) => return Ok(()),
            Err(e) if t0.elapsed().as_secs() >= timeout_s => {
                return Err(BenchError::NotReady {
                    url: client.base().to_string(),
                    waited_s: t0.elapsed().as_secs(),
                    last: e.to_string(),
                })
            }
            Err(e) => {
                if !said {
                    // A target that is down is found here, before anything is measured.
                    eprintln!(
                        "waiting for {} to answer (up to {timeout_s} s, --startup-timeout): {e}",
                        client.base()
                    );
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(250)).await
            }
        }
    }
}

/// A request body every engine reads the same way: greedy, exactly `max_tokens` generated.
pub fn request_body(model: &str, max_tokens: u32, stream: bool) -> Value {
    let mut body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        // `ignore_eos`: vLLM, SGLang, llama.cpp's server, Vigil. `min_tokens`: what
        // llama-cpp-python honours (EOS banned until then).
        "ignore_eos": true,
        "min_tokens": max_tokens,
    });
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

pub fn completion_body(model: &str, prompt: &str, max_tokens: u32, stream: bool) -> Value {
    let mut body = request_body(model, max_tokens, stream);
    body["prompt"] = json!(prompt);
    body
}

pub fn chat_body(model: &str, messages: &[Value], max_tokens: u32, stream: bool) -> Value {
    let mut body = request_body(model, max_tokens, stream);
    body["messages"] = json!(messages);
    body
}

async fn count(client: &Client, path: &str, body: &Value) -> Result<u32, BenchError> {
    let reply = client.post_json(path, body).await?;
    Usage::from_json(reply.get("usage").unwrap_or(&Value::Null))
        .prompt_tokens
        .ok_or_else(|| BenchError::Reply {
            url: format!("{}{path}", client.base()),
            what: "no usage.prompt_tokens".into(),
        })
}

/// How prompts are priced: the target's own count, or a tokenizer given on the command line.
#[derive(Clone, Copy)]
enum Pricer<'a> {
    Remote(CountMethod),
    Local(&'a tokenizers::Tokenizer),
}

impl Pricer<'_> {
    async fn count(self, client: &Client, model: &str, text: &str) -> Result<u32, BenchError> {
        match self {
            Pricer::Remote(m) => m.count(client, model, text).await,
            Pricer::Local(t) => t
                .encode(text, true)
                .map(|e| e.len() as u32)
                .map_err(|e| BenchError::Calibration(format!("local tokenizer: {e}"))),
        }
    }

    fn name(self) -> String {
        match self {
            Pricer::Remote(m) => m.path().to_string(),
            Pricer::Local(_) => "local tokenizer".to_string(),
        }
    }
}

/// The first of `CountMethod::FOR_PROMPTS` the target answers.
async fn prompt_counter(client: &Client, model: &str) -> Result<CountMethod, BenchError> {
    let mut last = None;
    for method in CountMethod::FOR_PROMPTS {
        match method.count(client, model, HEADER).await {
            Ok(_) => return Ok(method),
            Err(e @ (BenchError::Status { .. } | BenchError::Reply { .. })) => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| BenchError::Calibration("no way to count tokens".into())))
}

async fn count_chat(
    client: &Client,
    model: &str,
    content: &str,
    tools: bool,
) -> Result<u32, BenchError> {
    let messages = [json!({"role": "user", "content": content})];
    let mut body = chat_body(model, &messages, 1, false);
    if tools {
        body["tools"] = crate::agent::tool_definitions();
    }
    count(client, "/v1/chat/completions", &body).await
}

/// Prices the pool on the target (four probes in flight), then checks one composed prompt of
/// the workload's longest length on the workload's endpoint.
async fn calibrate(
    client: &Client,
    model: &str,
    workload: Workload,
    longest: u32,
    seed: u64,
    method: Pricer<'_>,
) -> Result<(Composer, CalibrationRecord), BenchError> {
    let t0 = Instant::now();
    let pool = pseudo_words(&mut SplitMix64::new(seed), POOL_SIZE);
    let base = method.count(client, model, HEADER).await?;
    let priced: Vec<(String, u32)> = stream::iter(pool)
        .map(|w| async move {
            let n = method
                .count(client, model, &format!("{HEADER} {w}"))
                .await?;
            Ok::<_, BenchError>((w, n.saturating_sub(base)))
        })
        .buffered(4)
        .try_collect()
        .await?;
    let (lo, hi) = priced
        .iter()
        .fold((u32::MAX, 0), |(lo, hi), (_, c)| (lo.min(*c), hi.max(*c)));
    // Each workload draws its own prompts: workloads run back to back against one server
    // must not find each other's prompts in its prefix cache.
    let salt = workload
        .name()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let mut composer = Composer::new(priced, seed ^ salt)?;
    let tools = workload == Workload::ToolLoop;
    let chat_base = match workload.is_chat() {
        true => Some(count_chat(client, model, HEADER, tools).await?),
        false => None,
    };
    // The check prompt is composed like a timed one but never timed: its opening is spent.
    let check = match chat_base {
        Some(cb) => {
            let p = composer.compose(longest, cb)?;
            CalibrationCheck {
                endpoint: "/v1/chat/completions".into(),
                target: longest,
                predicted: p.predicted,
                counted: count_chat(client, model, &p.text, tools).await?,
            }
        }
        None => {
            let p = composer.compose(longest, base)?;
            CalibrationCheck {
                endpoint: "/v1/completions".into(),
                target: longest,
                predicted: p.predicted,
                // The check goes through the endpoint the workload uses, whatever priced it.
                counted: CountMethod::Completions
                    .count(client, model, &p.text)
                    .await?,
            }
        }
    };
    check.verify()?;
    eprintln!(
        "calibrated {POOL_SIZE} words on {} ({}) in {:.1} s; {}-token check prompt counted {}",
        client.base(),
        method.name(),
        t0.elapsed().as_secs_f64(),
        check.target,
        check.counted
    );
    let record = CalibrationRecord {
        pool_words: POOL_SIZE,
        completion_base_tokens: base,
        chat_base_tokens: chat_base,
        word_cost_min: lo,
        word_cost_max: hi,
        count_method: Some(method.name()),
        check,
    };
    Ok((composer, record))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_as_name_equals_url() {
        let t: Target = "vigil=http://127.0.0.1:8080/".parse().unwrap();
        assert_eq!(t.name, "vigil");
        assert_eq!(t.url, "http://127.0.0.1:8080");
        assert!("http://x".parse::<Target>().is_err());
        assert!("=http://x".parse::<Target>().is_err());
    }

    #[test]
    fn bodies_pin_the_output_length() {
        let b = completion_body("m", "Words: a", 64, true);
        assert_eq!(b["max_tokens"], 64);
        assert_eq!(b["min_tokens"], 64);
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["temperature"], 0);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert!(completion_body("m", "x", 1, false)
            .get("stream_options")
            .is_none());
    }
}
