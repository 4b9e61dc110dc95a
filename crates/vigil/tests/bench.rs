//! `vigil bench` end to end: a real `vigil serve` on the tiny Qwen3 checkpoint, every workload
//! run briefly through the CLI (live-stream through the session API), the result files checked for schema and sane numbers, then
//! `vigil bench report` checked for one table per workload and well-formed charts.

use serde_json::Value;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const VIGIL: &str = env!("CARGO_BIN_EXE_vigil");

/// Kills the server when the test ends, however it ends.
struct Server {
    child: Child,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local address").port()
}

/// The tiny Qwen3 checkpoint with its context raised to 2048 (its own 128 tokens cannot hold
/// the workloads' prompts; RoPE has no hard limit, and the weights are random anyway).
fn long_context_copy(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny/qwen3");
    let dst = dir.join("tiny-qwen3-2k");
    std::fs::create_dir_all(&dst).expect("create the model copy");
    for entry in std::fs::read_dir(&src).expect("read the fixture") {
        let path = entry.expect("fixture entry").path();
        std::fs::copy(&path, dst.join(path.file_name().expect("file name"))).expect("copy");
    }
    let config_path = dst.join("config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).expect("read config"))
            .expect("config is JSON");
    config["max_position_embeddings"] = 2048.into();
    std::fs::write(&config_path, config.to_string()).expect("write config");
    dst
}

fn start_server(dir: &Path) -> (Server, String) {
    let model = long_context_copy(dir);
    let port = free_port();
    let log = dir.join("serve.log");
    let log_file = std::fs::File::create(&log).expect("create server log");
    let child = Command::new(VIGIL)
        .args(["serve", "--model"])
        .arg(&model)
        .args(["--kv-memory", "64MiB", "--threads", "1"])
        .args(["--port", &port.to_string()])
        .arg("--state-dir")
        .arg(dir.join("state"))
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .expect("spawn vigil serve");
    (Server { child, log }, format!("http://127.0.0.1:{port}"))
}

/// Runs `vigil bench run`; returns the parsed result file.
fn bench(server: &Server, url: &str, out: &Path, workload: &str, sizes: &[&str]) -> Value {
    let output = Command::new(VIGIL)
        .args(["bench", "run", "--workload", workload])
        .arg(format!("--target=vigil={url}"))
        .arg("--out")
        .arg(out)
        .args([
            "--warmup",
            "1",
            "--iterations",
            "2",
            "--startup-timeout",
            "120",
        ])
        .args(sizes)
        .output()
        .expect("run vigil bench");
    assert!(
        output.status.success(),
        "vigil bench run --workload {workload} failed:\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        std::fs::read_to_string(&server.log).unwrap_or_default()
    );
    let path = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let text = std::fs::read_to_string(&path).expect("read the result file");
    serde_json::from_str(&text).expect("result file is JSON")
}

fn num(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number (NaN is written as null): {v}"))
}

/// Each loop's samples, in send order: the first prompt is the calibrated prefix, the
/// conversation grows each turn, and later turns reuse the earlier ones: through the prefix
/// cache (whole blocks), or the held session (all of the last prompt and more: its reply is
/// kept too). Loops may interleave (sustained, burst): they are told apart by iteration.
fn check_growing_conversation(point: &Value, prefix: f64) {
    let held = point["params"]["session"] == 1;
    let mut last_prompt: std::collections::HashMap<(bool, u64), f64> = Default::default();
    for s in point["samples"].as_array().into_iter().flatten() {
        let key = (
            s["warmup"] == true,
            num(&s["iteration"], "iteration") as u64,
        );
        let prompt = num(&s["prompt_tokens"], "prompt");
        if num(&s["turn"], "turn") > 1.0 {
            let last = last_prompt[&key];
            assert!(prompt > last, "{s}");
            let cached = num(&s["cached_tokens"], "cached");
            let reused = if held { last } else { last - 16.0 };
            assert!(cached >= reused, "{s}");
        } else {
            assert!((prompt - prefix).abs() <= 0.02 * prefix + 1.0, "{s}");
        }
        last_prompt.insert(key, prompt);
    }
}

/// Checks what every result file must hold; returns the target's points.
fn check_file(file: &Value, workload: &str, labels: &[&str]) -> Vec<Value> {
    assert_eq!(file["schema"], "vigil-bench/1");
    assert_eq!(file["workload"], workload);
    assert!(num(&file["hardware"]["cores"], "cores") >= 1.0);
    assert!(file["hardware"]["cpu_model"].is_string());
    assert_eq!(num(&file["settings"]["iterations"], "iterations"), 2.0);
    assert_eq!(file["settings"]["ignore_eos"], true);
    let targets = file["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 1);
    let t = &targets[0];
    assert_eq!(t["name"], "vigil");
    assert_eq!(t["owned_by"], "vigil");
    // The engine's name and version, from its `server` header.
    let server = t["server_header"].as_str().unwrap_or_default();
    assert!(server.starts_with("vigil/0."), "{server}");
    assert!(!t["model"].as_str().unwrap_or_default().is_empty());
    // Prompts are priced with the server's own tokenizer route (or a local tokenizer), not
    // by generating.
    let method = t["calibration"]["count_method"]
        .as_str()
        .unwrap_or_default();
    assert!(
        matches!(method, "/tokenize" | "local tokenizer"),
        "{method}"
    );
    let check = &t["calibration"]["check"];
    let (target, counted) = (
        num(&check["target"], "target"),
        num(&check["counted"], "counted"),
    );
    assert!(
        (counted - target).abs() <= 0.02 * target,
        "calibration check {check}"
    );
    let points = t["points"].as_array().expect("points").clone();
    let got: Vec<&str> = points.iter().filter_map(|p| p["label"].as_str()).collect();
    assert_eq!(got, labels);
    for p in &points {
        let label = &p["label"];
        assert_eq!(p["excluded"], false, "{label}: {}", p["errors"]);
        assert_eq!(p["failed"], 0);
        let samples = p["samples"].as_array().expect("samples");
        let warm = num(&p["warmup_requests"], "warmup_requests") as usize;
        let measured = num(&p["measured_requests"], "measured_requests") as usize;
        assert_eq!(samples.len(), warm + measured, "{label}");
        assert_eq!(samples.iter().filter(|s| s["warmup"] == true).count(), warm);
        for s in samples {
            assert!(s["error"].is_null(), "{label}: {s}");
            assert_eq!(s["output_tokens"], s["requested_tokens"], "{label}: {s}");
            let (ttft, e2e) = (num(&s["ttft_ms"], "ttft_ms"), num(&s["e2e_ms"], "e2e_ms"));
            assert!(ttft > 0.0 && ttft <= e2e, "{label}: {s}");
        }
        check_summaries(p, &["ttft_ms", "e2e_ms", "output_tok_s"]);
        for v in p["throughput"].as_object().expect("throughput").values() {
            assert!(num(v, "throughput") > 0.0);
        }
    }
    points
}

/// The point has each of `keys` among its summaries, and every summary is numbers in order.
fn check_summaries(p: &Value, keys: &[&str]) {
    let label = &p["label"];
    let metrics = p["metrics"].as_object().expect("metrics");
    for key in keys {
        assert!(metrics.contains_key(*key), "{label} lacks {key}");
    }
    for (key, m) in metrics {
        let q = |k: &str| num(&m[k], &format!("{label} {key}.{k}"));
        assert!(
            q("min") <= q("p50") && q("p50") <= q("p95"),
            "{label} {key}: {m}"
        );
        assert!(
            q("p95") <= q("p99") && q("p99") <= q("max"),
            "{label} {key}: {m}"
        );
    }
}

/// GET `path` from the server as JSON (plain HTTP/1.1 over a socket).
fn get_json(url: &str, path: &str) -> Value {
    use std::io::{Read, Write};
    let addr = url.trim_start_matches("http://");
    let mut sock = std::net::TcpStream::connect(addr).expect("connect to the server");
    write!(
        sock,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut reply = String::new();
    sock.read_to_string(&mut reply).expect("read the reply");
    let (_, body) = reply.split_once("\r\n\r\n").expect("a body");
    serde_json::from_str(body).expect("a JSON body")
}

/// The matrix file: contexts 64, 256 and 2048 (over max_model_len with any output) × 1, 2 and
/// 4096 requests (over the KV cache from 64 tokens up), 2 s of 16-token requests per cell.
fn check_matrix(file: &Value, url: &str) {
    assert_eq!(file["schema"], "vigil-bench/1");
    assert_eq!(file["workload"], "matrix");
    let health = get_json(url, "/health");
    let kv = num(&health["kv_pages_total"], "pages") * num(&health["kv_page_tokens"], "page");
    assert!(
        (256.0 * 2.0..64.0 * 4096.0).contains(&kv),
        "KV cache of {kv} tokens"
    );
    let t = &file["targets"][0];
    assert_eq!(num(&t["max_model_len"], "max_model_len"), 2048.0);
    // Nothing over max_model_len is calibrated (or sent).
    assert_eq!(num(&t["calibration"]["check"]["target"], "check"), 256.0);
    let points = t["points"].as_array().expect("points");
    let got: Vec<(&str, &str)> = (points.iter())
        .map(|p| {
            (
                p["label"].as_str().unwrap_or("?"),
                p["status"].as_str().unwrap_or("?"),
            )
        })
        .collect();
    let (ok, over) = ("valid", "over capacity");
    assert_eq!(
        got,
        [
            ("prefill ctx=64", ok),
            ("prefill ctx=256", ok),
            ("prefill ctx=2048", over),
            ("ctx=64 c=1", ok),
            ("ctx=64 c=2", ok),
            ("ctx=64 c=4096", over),
            ("ctx=256 c=1", ok),
            ("ctx=256 c=2", ok),
            ("ctx=256 c=4096", over),
            ("ctx=2048 c=1", over),
            ("ctx=2048 c=2", over),
            ("ctx=2048 c=4096", over),
        ]
    );
    for p in points {
        let label = &p["label"];
        let samples = p["samples"].as_array().expect("samples");
        if p["status"] == over {
            // Never sent: no samples, no numbers, the reason instead.
            assert!(
                samples.is_empty() && p["metrics"] == serde_json::json!({}),
                "{p}"
            );
            assert_eq!(p["throughput"], serde_json::json!({}), "{label}");
            let why = p["errors"][0].as_str().unwrap_or_default();
            let reason = if param(p, "context") == 2048.0 {
                "max_model_len is 2048".to_string()
            } else {
                format!("KV cache of {kv} tokens")
            };
            assert!(why.contains(&reason), "{label}: {why}");
            continue;
        }
        assert_eq!(p["excluded"], false, "{label}: {}", p["errors"]);
        assert_eq!(p["failed"], 0, "{label}");
        assert!(samples.iter().all(|s| s["error"].is_null()), "{label}");
        let tp = &p["throughput"];
        if p["params"].get("duration_s").is_none() {
            check_summaries(p, &["prompt_tok_s", "ttft_ms"]);
            assert!(tp.get("output_tok_s").is_none(), "{label}: {tp}");
            assert_eq!(samples.len(), 3, "{label}");
            for s in samples {
                let prompt = num(&s["prompt_tokens"], "prompt");
                let ctx = param(p, "context");
                assert!((prompt - ctx).abs() <= 0.02 * ctx + 1.0, "{label}: {s}");
                assert_eq!(num(&s["output_tokens"], "output"), 1.0, "{label}: {s}");
            }
            continue;
        }
        check_summaries(p, &["ttft_ms", "itl_ms", "generation_tok_s", "e2e_ms"]);
        let n = param(p, "concurrency");
        assert_eq!(param(p, "duration_s"), 2.0);
        // Each stream's prompt went once, untimed and 1 token long, to warm the prompt cache;
        // then every measured request re-sent one of those prompts and found it cached.
        let (warm, samples): (Vec<&Value>, Vec<&Value>) =
            samples.iter().partition(|s| s["warmup"] == true);
        assert_eq!(num(&p["warmup_requests"], "warm-up") as usize, warm.len());
        assert_eq!(warm.len() as f64, n, "{label}");
        for s in &warm {
            assert_eq!(num(&s["output_tokens"], "output"), 1.0, "{label}: {s}");
        }
        assert_eq!(
            num(&p["measured_requests"], "measured") as usize,
            samples.len()
        );
        for s in samples.iter().filter(|s| s["cut"] != true) {
            let (prompt, cached) = (num(&s["prompt_tokens"], "prompt"), &s["cached_tokens"]);
            // Vigil caches whole 16-token blocks and recomputes at least the last token.
            assert!(num(cached, "cached") >= prompt - 16.0, "{label}: {s}");
        }
        // All the streams ran at once; on average fewer (each prefill and reply in between).
        assert_eq!(num(&tp["peak_active"], "peak"), n, "{label}: {tp}");
        let active = num(&tp["average_active"], "average active");
        assert!(active > 0.0 && active <= n, "{label}: {tp}");
        // Requests in flight at the deadline were cut: at most one per stream, none failed.
        let cut: Vec<&Value> = samples
            .iter()
            .copied()
            .filter(|s| s["cut"] == true)
            .collect();
        assert!(cut.len() as f64 <= n, "{label}");
        let completed = samples.len() - cut.len();
        assert_eq!(
            num(&tp["completed_requests"], "completed"),
            completed as f64
        );
        assert!(completed >= 2, "{label}: {completed} completed in 2 s");
        let mut tokens = 0.0;
        for s in samples {
            assert!(num(&s["start_ms"], "start") < 2000.0, "{label}: {s}");
            let out = s["output_tokens"].as_f64().unwrap_or(0.0);
            if s["cut"] != true {
                assert_eq!(out, 16.0, "{label}: {s}");
            }
            tokens += out;
        }
        assert_eq!(num(&tp["output_tokens"], "output tokens"), tokens);
        let total = num(&tp["output_tok_s"], "total tok/s");
        assert!((total - tokens / 2.0).abs() < 1e-9, "{label}: {tp}");
    }
}

/// The live-stream file: the stream, the session and the three phases.
fn check_live(file: &Value) {
    assert_eq!(file["schema"], "vigil-bench/1");
    assert_eq!(file["workload"], "live-stream");
    let s = &file["settings"];
    assert_eq!(num(&s["entry_tokens"], "entry_tokens"), 24.0);
    assert_eq!(num(&s["replay_iterations"], "replay_iterations"), 3.0);
    let t = &file["targets"][0];
    assert!(
        t.get("calibration").is_none(),
        "live-stream composes no prompts"
    );
    let live = &t["live"];
    assert_eq!(live["sessions"], true);
    assert_eq!(live["count_method"], "/v1/messages/count_tokens");
    assert!(
        live["errors"].as_array().is_some_and(Vec::is_empty),
        "{live}"
    );
    assert_eq!(num(&live["push_errors"], "push_errors"), 0.0);
    assert_eq!(num(&live["stream_stalls"], "stream_stalls"), 0.0);
    // Entries are sized on the server's tokenizer to within a field (a few tokens) of 24.
    let tokens = &live["entry_tokens"];
    assert!(
        (num(&tokens["mean"], "mean") - 24.0).abs() <= 2.0,
        "{tokens}"
    );
    assert!(num(&tokens["max"], "max") <= 32.0, "{tokens}");
    assert!(live["example_entry"]
        .as_str()
        .is_some_and(|e| e.starts_with("t=")));
    // The client's window is exactly what the session holds, counted the same way.
    let w = &live["window_check"];
    assert_eq!(w["same_entries"], true, "{w}");
    assert_eq!(w["client_tokens"], w["server_tokens"], "{w}");
    // The fill stops at the first eviction, which leaves at most `evict_to` (half the 160-token
    // window) and more than that less one entry.
    let held = num(&w["client_tokens"], "window tokens");
    assert!(held > 80.0 - 32.0 && held <= 80.0, "{w}");
    assert!(num(&live["fill_entries"], "fill") > num(&w["client_entries"], "entries"));
    assert!(live["flash_ready_ms"].is_number());
    assert!(num(&live["flash_query"]["evaluations"], "evaluations") >= 1.0);
    // The stream kept flowing: the window slid, and the session recomputed it.
    let end = &live["session_end"];
    assert!(num(&end["window_recomputes"], "recomputes") >= 1.0, "{end}");
    assert!(num(&end["evicted"], "evicted") >= 1.0, "{end}");
    assert!(num(&live["entries"], "entries") > num(&live["fill_entries"], "fill"));

    let points = t["points"].as_array().expect("points");
    let labels: Vec<&str> = points.iter().filter_map(|p| p["label"].as_str()).collect();
    assert_eq!(
        labels,
        [
            "flash query",
            "cold query",
            "stateless replay",
            "stateless replay, uncached"
        ]
    );
    for p in points {
        let label = &p["label"];
        assert_eq!(p["excluded"], false, "{label}: {}", p["errors"]);
        assert_eq!(num(&p["params"]["window_tokens"], "window"), 160.0);
        let samples = p["samples"].as_array().expect("samples");
        let measured = num(&p["measured_requests"], "measured") as usize;
        assert_eq!(samples.len(), 1 + measured, "{label}");
        for s in samples {
            assert!(s["error"].is_null(), "{label}: {s}");
            assert!(num(&s["e2e_ms"], "e2e") > 0.0);
            assert!(num(&s["late_ms"], "late") >= 0.0);
        }
    }
    let (flash, cold, replay, uncached) = (&points[0], &points[1], &points[2], &points[3]);
    // Registered and answered before the phase: every query is served from the flash cache.
    assert_eq!(num(&flash["throughput"]["flash_hit_rate"], "hit rate"), 1.0);
    assert!(flash["throughput"]["mean_lag"].is_number());
    for s in flash["samples"].as_array().into_iter().flatten() {
        assert_eq!(s["flash"], true, "{s}");
        assert!(s["lag"].is_number() && s["data_version"].is_number(), "{s}");
        assert!(s["ttft_ms"].is_null(), "a flash answer is not streamed");
    }
    assert!(flash["metrics"].get("ttft_ms").is_none());
    for p in [cold, replay, uncached] {
        for s in p["samples"].as_array().into_iter().flatten() {
            assert_eq!(num(&s["output_tokens"], "output"), 8.0, "{s}");
            let (ttft, e2e) = (num(&s["ttft_ms"], "ttft"), num(&s["e2e_ms"], "e2e"));
            assert!(ttft > 0.0 && ttft <= e2e, "{s}");
        }
    }
    assert_eq!(num(&replay["measured_requests"], "replays"), 3.0);
    assert_eq!(num(&uncached["measured_requests"], "replays"), 3.0);
    let samples = |p: &Value| p["samples"].as_array().cloned().unwrap_or_default();
    for s in samples(uncached).iter().filter(|s| s["warmup"] == false) {
        // Nothing of an uncached replay is in the prefix cache (the template's opening is
        // shorter than a block).
        assert_eq!(num(&s["cached_tokens"], "cached"), 0.0, "{s}");
    }
    // The replays re-send the windows the cold queries covered, in order (cycling: 3 cold
    // windows with the warm-up, 4 replays), so both compare at the same held sizes.
    assert_eq!(
        live["replayed"],
        format!(
            "cold-query windows of {}",
            t["name"].as_str().unwrap_or("?")
        )
    );
    let held = |p: &Value| -> Vec<f64> {
        samples(p)
            .iter()
            .map(|s| num(&s["held_tokens"], "held tokens"))
            .collect()
    };
    let cold_held = held(cold);
    assert!(
        cold_held.iter().all(|&h| h > 80.0 - 32.0 && h <= 160.0),
        "{cold_held:?}"
    );
    for p in [replay, uncached] {
        let want: Vec<f64> = (0..cold_held.len() + 1)
            .map(|j| cold_held[j % cold_held.len()])
            .collect();
        assert_eq!(held(p), want, "{}", p["label"]);
    }
    for s in replay["samples"].as_array().into_iter().flatten() {
        // At least what the window keeps after an eviction (more than 80 − 32 tokens of
        // ~24-token entries), re-sent whole with the question, system prompt and template.
        assert!(num(&s["window_entries"], "window entries") >= 2.0, "{s}");
        assert!(
            num(&s["prompt_tokens"], "prompt") > 80.0 - 32.0 + 24.0,
            "{s}"
        );
    }
}

fn param(p: &Value, k: &str) -> f64 {
    num(&p["params"][k], k)
}

/// Start and end tags balance (the HTML is written as XHTML); returns the count of `<svg>`.
fn check_balanced(html: &str) -> usize {
    let mut stack: Vec<String> = Vec::new();
    let mut svgs = 0;
    let mut rest = html;
    while let Some(open) = rest.find('<') {
        let close = rest[open..].find('>').expect("unclosed tag") + open;
        let tag = &rest[open + 1..close];
        rest = &rest[close + 1..];
        if tag.starts_with('!') {
            continue;
        }
        let name: String = tag
            .trim_start_matches('/')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        if let Some(stripped) = tag.strip_prefix('/') {
            let top = stack.pop().unwrap_or_default();
            assert_eq!(top, stripped.trim(), "mismatched </{stripped}>");
        } else if !tag.ends_with('/') {
            if name == "svg" {
                svgs += 1;
            }
            stack.push(name);
        }
    }
    assert!(stack.is_empty(), "unclosed tags: {stack:?}");
    svgs
}

#[test]
fn bench_every_workload_then_report() {
    let dir = std::env::temp_dir().join(format!("vigil-bench-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let results = dir.join("results");
    let (server, url) = start_server(&dir);
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny/qwen3/tokenizer.json")
        .display()
        .to_string();

    let single = bench(
        &server,
        &url,
        &results,
        "single",
        &["--prompt-tokens=32,64", "--output-tokens=8,16"],
    );
    let points = check_file(
        &single,
        "single",
        &["in=32 out=8", "in=32 out=16", "in=64 out=8", "in=64 out=16"],
    );
    for p in &points {
        assert_eq!(num(&p["measured_requests"], "measured"), 2.0);
        for s in p["samples"].as_array().into_iter().flatten() {
            // The composed prompt is what the server counted, within calibration's 2%.
            let target = param(p, "prompt_tokens");
            assert!(
                (num(&s["prompt_tokens"], "prompt_tokens") - target).abs() <= 0.02 * target + 1.0
            );
            assert_eq!(
                num(&s["requested_tokens"], "requested"),
                param(p, "max_tokens")
            );
        }
    }

    let conc = bench(
        &server,
        &url,
        &results,
        "concurrent",
        &[
            "--concurrency=1,3",
            "--concurrent-prompt-tokens=32",
            "--concurrent-output-tokens=8",
        ],
    );
    let points = check_file(&conc, "concurrent", &["c=1", "c=3"]);
    // Closed loop: at least two requests per stream.
    assert_eq!(num(&points[1]["measured_requests"], "measured"), 6.0);
    assert!(points[1]["throughput"]["requests_per_s"].is_number());

    let prefill = bench(
        &server,
        &url,
        &results,
        "prefill",
        &[
            "--prefill-prompt-tokens=64,256",
            &format!("--tokenizer={tokenizer}"),
        ],
    );
    // Priced with the local tokenizer given on the command line, checked by the server.
    assert_eq!(
        prefill["targets"][0]["calibration"]["count_method"],
        "local tokenizer"
    );
    for p in check_file(&prefill, "prefill", &["in=64", "in=256"]) {
        assert!(num(&p["metrics"]["prompt_tok_s"]["p50"], "prompt_tok_s") > 0.0);
        assert_eq!(param(&p, "max_tokens"), 1.0);
    }

    let agent = bench(
        &server,
        &url,
        &results,
        "agent-loop",
        &["--prefix-tokens=64", "--turns=1,3", "--turn-tokens=12"],
    );
    let points = check_file(
        &agent,
        "agent-loop",
        &[
            "P=64 T=1",
            "P=64 T=1 session",
            "P=64 T=3",
            "P=64 T=3 session",
        ],
    );
    for three in &points[2..] {
        assert_eq!(num(&three["measured_requests"], "measured"), 6.0);
        assert_eq!(num(&three["metrics"]["loop_ms"]["n"], "loops"), 2.0);
        check_growing_conversation(three, 64.0);
    }
    assert_eq!(param(&points[3], "session"), 1.0);
    assert_eq!(param(&points[2], "session"), 0.0);

    let tools = bench(
        &server,
        &url,
        &results,
        "tool-loop",
        &["--prefix-tokens=1280", "--turns=2", "--tool-turn-tokens=12"],
    );
    let points = check_file(&tools, "tool-loop", &["P=1280 T=2", "P=1280 T=2 session"]);
    for p in &points {
        assert_eq!(param(p, "tools"), 1.0);
        assert_eq!(param(p, "turn_tokens"), 12.0);
        check_growing_conversation(p, 1280.0);
    }
    // The tool definitions are inside the calibrated first prompt.
    let base = num(
        &tools["targets"][0]["calibration"]["chat_base_tokens"],
        "chat base",
    );
    let agent_base = num(
        &agent["targets"][0]["calibration"]["chat_base_tokens"],
        "chat base",
    );
    assert!(base > agent_base + 100.0, "{base} vs {agent_base}");

    let workflow = [
        "--workflow-prefix-tokens=64",
        "--workflow-turns=2",
        "--workflow-turn-tokens=8",
    ];
    let sustained = bench(
        &server,
        &url,
        &results,
        "sustained",
        &[
            &workflow[..],
            &["--sustained-workflows=3", "--window-seconds=2"],
        ]
        .concat(),
    );
    let burst = bench(
        &server,
        &url,
        &results,
        "burst",
        &[&workflow[..], &["--burst-workflows=4"]].concat(),
    );
    for (file, workload, label) in [
        (&sustained, "sustained", "in-flight=3 window=2s"),
        (&burst, "burst", "burst=4"),
    ] {
        let p = &check_file(file, workload, &[label])[0];
        let t = &p["throughput"];
        let admitted = num(&t["workflows_admitted"], "admitted");
        assert_eq!(num(&t["workflows_finished"], "finished"), admitted, "{t}");
        assert_eq!(num(&p["measured_requests"], "measured"), 2.0 * admitted);
        if workload == "burst" {
            assert_eq!(admitted, 4.0);
        } else {
            // Closed loop over a 2 s window: more than the three first admitted.
            assert!(admitted > 3.0, "{t}");
        }
        let share = num(&t["prefill_share"], "prefill share");
        assert!(share > 0.0 && share < 1.0, "{t}");
        assert!(num(&t["prefill_tokens_per_step"], "prefill tokens per step") >= 1.0);
        assert!(num(&p["metrics"]["generation_tok_s"]["p50"], "generation speed") > 0.0);
        check_growing_conversation(p, 64.0);
    }

    let live = bench(
        &server,
        &url,
        &results,
        "live-stream",
        &[
            "--entry-tokens=24",
            "--period-ms=200",
            "--window-tokens=160",
            "--answer-tokens=8",
            "--replay-iterations=3",
            "--cold-iterations=2",
        ],
    );
    check_live(&live);

    let matrix = bench(
        &server,
        &url,
        &results,
        "matrix",
        &[
            "--matrix-contexts=64,256,2048",
            "--matrix-concurrency=1,2,4096",
            "--matrix-duration-seconds=2",
            "--matrix-max-output=16",
        ],
    );
    check_matrix(&matrix, &url);

    let files: Vec<PathBuf> = std::fs::read_dir(&results)
        .expect("results dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    assert_eq!(files.len(), 9);
    let report = dir.join("report");
    let out = Command::new(VIGIL)
        .args(["bench", "report"])
        .args(&files)
        .arg("--out")
        .arg(&report)
        .output()
        .expect("run vigil bench report");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = std::fs::read_to_string(report.join("report.md")).expect("report.md");
    assert_eq!(md.matches("\n| point | metric |").count(), 9, "{md}");
    for w in [
        "single",
        "concurrent",
        "prefill",
        "agent-loop",
        "tool-loop",
        "live-stream",
        "sustained",
        "burst",
        "matrix",
    ] {
        assert_eq!(md.matches(&format!("\n## {w}\n")).count(), 1, "{w}");
    }
    // One engine: every row's value is its best.
    assert!(md.contains(" ★<br><sub>p95 "));
    // live-stream: the replay divided by the session's flash and cold answers.
    assert_eq!(
        md.matches("| stateless replay, e2e p50 | ÷ vigil flash (")
            .count(),
        1,
        "{md}"
    );
    assert!(
        md.contains("| vigil ") && md.contains("Stream: entries of about 24 tokens every 200 ms")
    );
    assert!(md.contains("flash 2, cold 2, replay 3."), "{md}");
    // matrix: the grid, cells over capacity named as such, never given a value.
    assert!(md.contains("\n| context | 1 | 2 | 4096 |\n"), "{md}");
    assert!(
        md.contains("\n| 2048 | over capacity | over capacity | over capacity |\n"),
        "{md}"
    );
    let row_64 = md
        .lines()
        .find(|l| l.starts_with("| 64 | "))
        .expect("the 64-token row");
    assert!(
        row_64.ends_with("| over capacity |") && row_64.matches(" ms TTFT").count() == 2,
        "{row_64}"
    );
    assert!(md.contains("- over capacity: not run:"), "{md}");
    let html = std::fs::read_to_string(report.join("report.html")).expect("report.html");
    // Charts: 4 metrics (single) + 5 (concurrent) + 2 (prefill) + 4 (agent loop) + 4 (tool
    // loop) + 5 (live) + 7 (sustained) + 7 (burst) + 5 (matrix).
    assert_eq!(check_balanced(&html), 43);
    // Cells not run are in no table row or chart, only in the grid as what they are.
    assert!(!html.contains("ctx=2048") && !html.contains("c=4096"));
    assert_eq!(html.matches("<td>over capacity</td>").count(), 5);
    assert!(html.matches("<rect").count() >= 20);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
