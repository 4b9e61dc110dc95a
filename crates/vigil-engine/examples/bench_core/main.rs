//! llama-bench's pp/tg figures for Vigil's engine: prefill tokens/s of random-token prompts and
//! decode tokens/s from an empty context, repeated, one JSON line per figure (median, min,
//! max). scripts/bench_decode_vs_llamabench.sh and scripts/bench_qwen3_shape.sh run it beside
//! llama-bench.
//!
//! MODEL is a GGUF file or a Hugging Face checkpoint directory (config.json, *.safetensors,
//! tokenizer.json), loaded as `vigil generate` loads it; `--quantize q8_0` converts the float
//! linear weights to Q8_0 at load. `--pp` lists the prefill lengths (default 512,2048).
//!
//! `--depth D` adds llama-bench's `-d`: decode tokens/s of 64 tokens after a D-token prompt
//! (`tg64@dD`), where attention over the held KV weighs on every step.
//!
//! `--tg N` sets the decode length (default 128; 0 skips it, for profiling prefill alone).
//! The decode follows a `--tg-prompt P`-token prompt: 1 by default, so that `tgN` decodes from
//! an empty context, as llama-bench's does (its tgN decodes N tokens from position 0); P = 128
//! gives the figure this tool printed before 2026-12-06, with each step attending to 128 more
//! keys.
//!
//! `--floor` adds `tg{N}-floor`: the decode again, with a plain read of the bytes a token's
//! matmuls read (every layer's matrices and the output projection, in place, split between the
//! kernel threads in one dispatch) timed after every decode step. A rep's share of that floor
//! is its reads' time over its steps' time: the two alternate token by token, so a host whose
//! memory bandwidth drifts from one minute to the next moves both alike.
//!
//! With it, `tg{N}-matmuls` replays a decode step's matmuls alone, in the step's groups and
//! order with nothing between them (`replay`), against the same plain read: the share of the
//! floor the matmul structure itself leaves, which the decode's share is bounded by; and
//! `tg{N}-read-by-job`, the plain read cut into the step's dispatches, one read a dispatch:
//! the share a decode could reach whose matmuls all read as fast as a plain read.
//!
//! `--breakdown` adds, after `pp{N}` and `tg{N}`, one line per part of a step (QKV
//! projections, attention, MLP, vocabulary projection, ...): its milliseconds per token, its
//! share of the step and, in decode, the rate its weights were read at (`breakdown`).
//!
//! The KV pool is mapped before the first test, as `vigil serve` maps its pool at start (and
//! llama.cpp clears its KV buffer when it makes a context), so no step pays for first touching
//! a page; `--no-kv-prefault` leaves the pages to be mapped as rows are first written.
//!
//! Usage: bench_core MODEL [--threads N] [--reps R] [--quantize q8_0] [--pp 512,2048] [--depth D]
//!        [--tg N] [--tg-prompt P] [--floor] [--breakdown] [--no-kv-prefault]

mod breakdown;
mod replay;

use std::time::{Duration, Instant};
use vigil_engine::engine::LlmEngine;
use vigil_engine::model_runner::ModelRunner;
use vigil_engine::sampling::SamplingParams;
use vigil_engine::scheduler::SchedulerConfig;
use vigil_engine::sequence::StopCriteria;
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::QMatrix;
use vigil_model::kv_cache::{KvCache, KvDtype};
use vigil_model::load::{load, parse_quantize, LoadOptions};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model_path = args.get(1).ok_or(
        "usage: bench_core MODEL [--threads N] [--reps R] [--quantize q8_0] [--pp 512,2048] [--depth D] [--tg N] [--tg-prompt P] [--floor] [--breakdown] [--no-kv-prefault]",
    )?;
    let depth: Option<usize> = arg(&args, "--depth").map(|v| v.parse()).transpose()?;
    let tg: usize = arg(&args, "--tg").map_or(Ok(128), |v| v.parse())?;
    if tg == 1 {
        return Err("--tg must be 0 (no decode figure) or at least 2".into());
    }
    let floor = args.iter().any(|a| a == "--floor");
    let split = args.iter().any(|a| a == "--breakdown");
    let kv_prefault = !args.iter().any(|a| a == "--no-kv-prefault");
    if floor && tg < 3 {
        return Err("--floor needs --tg of at least 3 (a read between two decode steps)".into());
    }
    let tg_prompt: usize = arg(&args, "--tg-prompt").map_or(Ok(1), |v| v.parse())?;
    if tg_prompt == 0 {
        return Err("--tg-prompt must be at least 1 (the engine decodes after a prompt)".into());
    }
    let threads: usize = arg(&args, "--threads").map_or(Ok(2), |v| v.parse())?;
    let reps: usize = arg(&args, "--reps").map_or(Ok(5), |v| v.parse())?;
    let quantize = parse_quantize(arg(&args, "--quantize").as_deref())?;
    let prefill_lens = arg(&args, "--pp")
        .unwrap_or_else(|| "512,2048".into())
        .split(',')
        .map(|n| n.trim().parse::<usize>())
        .collect::<Result<Vec<_>, _>>()?;
    if prefill_lens.contains(&0) {
        return Err("--pp lengths must be positive".into());
    }
    // The longest sequence a test runs: a prefill, the decode's prompt plus `tg`, or the
    // depth plus its 64 decoded tokens.
    let ctx = 256
        + prefill_lens
            .iter()
            .copied()
            .chain(depth.map(|d| d + 64))
            .chain([tg_prompt + tg])
            .max()
            .unwrap_or(0);
    let loaded = load(
        std::path::Path::new(model_path),
        &LoadOptions {
            threads: Some(threads),
            quantize,
            max_context: None,
        },
    )?;
    let mut model = loaded.model;
    // The probe is installed only with `--breakdown`: the plain figures run without it.
    let recorder = split.then(|| {
        let (rec, probe) = breakdown::recorder(model.config.hidden_size);
        model.probe = Some(probe);
        (rec, breakdown::PartBytes::of(&model.weights))
    });
    // Views of the same bytes the model reads (the matrices share their buffers).
    let reads: Vec<QMatrix> = model
        .weights
        .decode_matrices()
        .into_iter()
        .cloned()
        .collect();
    let mut replay = floor.then(|| replay::Replay::new(replay::decode_jobs(&model.weights)));
    let pool = model.pool().clone();
    let vocab = model.config.vocab_size as u64;
    let block_size = 16;
    // At least 2 MiB a K or V tensor, as in the server (whose pool, `--kv-memory`, is 2 GiB
    // by default): a tensor smaller than a huge page gets 4 KiB pages (`KvBuf`), and a
    // decode step then spends ~10 % more on attention after 2,048 tokens.
    let (kv_heads, head_dim) = model.config.kv_shape();
    let block_bytes = block_size * kv_heads * head_dim * 2; // f16
    let kv = KvCache::new(
        model.config.num_layers,
        (kv_heads, head_dim),
        (ctx / block_size + 2).max((2usize << 20).div_ceil(block_bytes)),
        block_size,
        KvDtype::F16,
    );
    if kv_prefault {
        let t = Instant::now();
        let bytes = kv.prefault(&model.config.window_layers());
        eprintln!(
            "KV cache: {:.1} MiB mapped at start in {:.2} s",
            bytes as f64 / (1 << 20) as f64,
            t.elapsed().as_secs_f64()
        );
    }
    let config = SchedulerConfig {
        max_batched_tokens: 512,
        enable_prefix_cache: false,
        ..SchedulerConfig::default()
    };
    let mut engine = LlmEngine::new(ModelRunner::new(model, kv), config);
    // Random token ids from a fixed LCG, skipping the low ids where special tokens live.
    let mut state = 1234u64;
    let mut random_prompt = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (100 + (state >> 33) % (vocab - 100)) as u32
            })
            .collect()
    };
    // (prefill tok/s, decode tok/s, with `read`: the decode steps' and the reads' seconds).
    let mut run = |prompt: Vec<u32>, gen: usize, read: bool| -> (f64, f64, Duration, Duration) {
        let n = prompt.len();
        if let Some((rec, _)) = &recorder {
            breakdown::new_request(rec);
        }
        let stop = StopCriteria {
            max_tokens: gen,
            stop_token_ids: vec![],
            ignore_eos: true,
        };
        let id = engine.add_request(prompt, SamplingParams::default(), stop);
        let start = Instant::now();
        let mut first = None;
        let (mut stepping, mut reading) = (Duration::ZERO, Duration::ZERO);
        while engine.has_work() {
            let t = Instant::now();
            let out = engine.step().expect("KV pool sized for the benchmark");
            if first.is_some() {
                stepping += t.elapsed();
            }
            if !out.is_empty() && first.is_none() {
                first = Some(Instant::now());
            } else if read && first.is_some() && engine.has_work() {
                let t = Instant::now();
                std::hint::black_box(plain_read(&pool, &reads));
                reading += t.elapsed();
            }
        }
        let end = Instant::now();
        engine.take_finished(id);
        let first = first.unwrap_or(end);
        (
            n as f64 / (first - start).as_secs_f64(),
            (gen - 1) as f64 / (end - first - reading).as_secs_f64().max(1e-9),
            stepping,
            reading,
        )
    };
    run(random_prompt(64), 4, false); // warm-up
    let report = |name: &str, mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        println!(
            "{{\"engine\": \"vigil\", \"test\": \"{name}\", \"threads\": {threads}, \"reps\": {reps}, \"tokens_per_s_median\": {:.2}, \"tokens_per_s_min\": {:.2}, \"tokens_per_s_max\": {:.2}}}",
            v[v.len() / 2],
            v[0],
            v[v.len() - 1]
        );
    };
    for n in prefill_lens {
        if let Some((rec, _)) = &recorder {
            breakdown::start(rec);
        }
        let v: Vec<f64> = (0..reps)
            .map(|_| run(random_prompt(n), 1, false).0)
            .collect();
        report(&format!("pp{n}"), v);
        if let Some((rec, parts)) = &recorder {
            breakdown::report(rec, &format!("pp{n}"), false, parts);
        }
    }
    if tg > 0 {
        if let Some((rec, _)) = &recorder {
            breakdown::start(rec);
        }
        let v: Vec<f64> = (0..reps)
            .map(|_| run(random_prompt(tg_prompt), tg, false).1)
            .collect();
        report(&format!("tg{tg}"), v);
        if let Some((rec, parts)) = &recorder {
            breakdown::report(rec, &format!("tg{tg}"), true, parts);
        }
    }
    if let Some(d) = depth {
        let v: Vec<f64> = (0..reps)
            .map(|_| run(random_prompt(d), 64, false).1)
            .collect();
        report(&format!("tg64@d{d}"), v);
    }
    if floor && tg > 0 {
        let bytes: usize = reads.iter().map(|m| m.data.bytes().len()).sum();
        let (mut share, mut rate, mut gb_s) = (vec![], vec![], vec![]);
        for _ in 0..reps {
            let (_, tok_s, stepping, reading) = run(random_prompt(tg_prompt), tg, true);
            // Every step after the first token was followed by one read but the last.
            let reads_done = (tg - 2) as f64;
            let per_step = stepping.as_secs_f64() / (tg - 1) as f64;
            share.push(100.0 * reading.as_secs_f64() / reads_done / per_step);
            rate.push(tok_s);
            gb_s.push(bytes as f64 * reads_done / reading.as_secs_f64() / 1e9);
        }
        let med = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v[0], v[v.len() - 1])
        };
        let (s, r, g) = (med(share), med(rate), med(gb_s));
        println!(
            "{{\"engine\": \"vigil\", \"test\": \"tg{tg}-floor\", \"threads\": {threads}, \"reps\": {reps}, \"read_bytes_per_token\": {bytes}, \"floor_share_pct_median\": {:.1}, \"floor_share_pct_min\": {:.1}, \"floor_share_pct_max\": {:.1}, \"tokens_per_s_median\": {:.2}, \"tokens_per_s_min\": {:.2}, \"tokens_per_s_max\": {:.2}, \"read_gb_s_median\": {:.2}, \"read_gb_s_min\": {:.2}, \"read_gb_s_max\": {:.2}}}",
            s.0, s.1, s.2, r.0, r.1, r.2, g.0, g.1, g.2
        );
        if let Some(replay) = replay.as_mut() {
            let steps = tg - 1;
            // Each replayed step, then the same bytes read by job, each against a plain read.
            let (mut share, mut rate, mut by_job) = (vec![], vec![], vec![]);
            for _ in 0..reps {
                let [mut stepping, mut reading, mut job_reading] = [Duration::ZERO; 3];
                for _ in 0..steps {
                    let t = Instant::now();
                    replay.step(&pool);
                    stepping += t.elapsed();
                    let t = Instant::now();
                    std::hint::black_box(plain_read(&pool, &reads));
                    reading += t.elapsed();
                    let t = Instant::now();
                    for job in replay.jobs() {
                        std::hint::black_box(plain_read(&pool, job.matrices()));
                    }
                    job_reading += t.elapsed();
                }
                share.push(100.0 * reading.as_secs_f64() / stepping.as_secs_f64());
                rate.push(steps as f64 / stepping.as_secs_f64());
                by_job.push(100.0 * reading.as_secs_f64() / job_reading.as_secs_f64());
            }
            let (s, r, j) = (med(share), med(rate), med(by_job));
            println!(
                "{{\"engine\": \"vigil\", \"test\": \"tg{tg}-matmuls\", \"threads\": {threads}, \"reps\": {reps}, \"floor_share_pct_median\": {:.1}, \"floor_share_pct_min\": {:.1}, \"floor_share_pct_max\": {:.1}, \"steps_per_s_median\": {:.2}, \"steps_per_s_min\": {:.2}, \"steps_per_s_max\": {:.2}}}",
                s.0, s.1, s.2, r.0, r.1, r.2
            );
            println!(
                "{{\"engine\": \"vigil\", \"test\": \"tg{tg}-read-by-job\", \"threads\": {threads}, \"reps\": {reps}, \"floor_share_pct_median\": {:.1}, \"floor_share_pct_min\": {:.1}, \"floor_share_pct_max\": {:.1}}}",
                j.0, j.1, j.2
            );
        }
    }
    Ok(())
}

/// The bytes a decode token's matmuls read, read plainly in one dispatch
/// (`plain_read::sum_on`): as fast as this host reads memory right now.
fn plain_read(pool: &ThreadPool, mats: &[QMatrix]) -> u64 {
    let parts: Vec<&[u8]> = mats.iter().map(|m| m.data.bytes()).collect();
    vigil_kernels::plain_read::sum_on(pool, &parts)
}
