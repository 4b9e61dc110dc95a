//! llama-bench's pp/tg figures for Vigil's engine: prefill tokens/s of random-token prompts and
//! decode tokens/s after a 128-token prompt, repeated, one JSON line per figure (median, min,
//! max). The counterpart of scripts/bench_llamacpp.py; scripts/bench_core.sh and
//! scripts/bench_qwen3_shape.sh run both.
//!
//! MODEL is a GGUF file or a Hugging Face checkpoint directory (config.json, *.safetensors,
//! tokenizer.json), loaded as `vigil generate` loads it; `--quantize q8_0` converts the float
//! linear weights to Q8_0 at load. `--pp` lists the prefill lengths (default 512,2048).
//!
//! `--depth D` adds llama-bench's `-d`: decode tokens/s of 64 tokens after a D-token prompt
//! (`tg64@dD`), where attention over the held KV weighs on every step.
//!
//! `--tg N` sets the decode length after the 128-token prompt (default 128; 0 skips it, for
//! profiling prefill alone).
//!
//! Usage: bench_core MODEL [--threads N] [--reps R] [--quantize q8_0] [--pp 512,2048] [--depth D]
//!        [--tg N]

use std::time::Instant;
use vigil_engine::engine::LlmEngine;
use vigil_engine::model_runner::ModelRunner;
use vigil_engine::sampling::SamplingParams;
use vigil_engine::scheduler::SchedulerConfig;
use vigil_engine::sequence::StopCriteria;
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
        "usage: bench_core MODEL [--threads N] [--reps R] [--quantize q8_0] [--pp 512,2048] [--depth D]",
    )?;
    let depth: Option<usize> = arg(&args, "--depth").map(|v| v.parse()).transpose()?;
    let tg: usize = arg(&args, "--tg").map_or(Ok(128), |v| v.parse())?;
    if tg == 1 {
        return Err("--tg must be 0 (no decode figure) or at least 2".into());
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
    // The longest sequence a test runs: a prefill, the 128-token prompt plus `tg`, or the
    // depth plus its 64 decoded tokens.
    let ctx = 256
        + prefill_lens
            .iter()
            .copied()
            .chain(depth.map(|d| d + 64))
            .chain([128 + tg])
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
    let model = loaded.model;
    let vocab = model.config.vocab_size as u64;
    let block_size = 16;
    // At least 2 MiB a K or V tensor, as in the server (whose pool, `--kv-memory`, is 2 GiB
    // by default): a tensor smaller than a huge page gets 4 KiB pages (`KvBuf`), and a
    // decode step then spends ~10 % more on attention after 2,048 tokens. Memory is taken
    // as rows are written, so the spare blocks cost nothing until used.
    let (kv_heads, head_dim) = model.config.kv_shape();
    let block_bytes = block_size * kv_heads * head_dim * 2; // f16
    let kv = KvCache::new(
        model.config.num_layers,
        (kv_heads, head_dim),
        (ctx / block_size + 2).max((2usize << 20).div_ceil(block_bytes)),
        block_size,
        KvDtype::F16,
    );
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
    let mut run = |prompt: Vec<u32>, gen: usize| -> (f64, f64) {
        let n = prompt.len();
        let stop = StopCriteria {
            max_tokens: gen,
            stop_token_ids: vec![],
            ignore_eos: true,
        };
        let id = engine.add_request(prompt, SamplingParams::default(), stop);
        let start = Instant::now();
        let mut first = None;
        while engine.has_work() {
            if !engine
                .step()
                .expect("KV pool sized for the benchmark")
                .is_empty()
                && first.is_none()
            {
                first = Some(Instant::now());
            }
        }
        let end = Instant::now();
        engine.take_finished(id);
        let first = first.unwrap_or(end);
        (
            n as f64 / (first - start).as_secs_f64(),
            (gen - 1) as f64 / (end - first).as_secs_f64().max(1e-9),
        )
    };
    run(random_prompt(64), 4); // warm-up
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
        let v: Vec<f64> = (0..reps).map(|_| run(random_prompt(n), 1).0).collect();
        report(&format!("pp{n}"), v);
    }
    if tg > 0 {
        let v: Vec<f64> = (0..reps).map(|_| run(random_prompt(128), tg).1).collect();
        report(&format!("tg{tg}"), v);
    }
    if let Some(d) = depth {
        let v: Vec<f64> = (0..reps).map(|_| run(random_prompt(d), 64).1).collect();
        report(&format!("tg64@d{d}"), v);
    }
    Ok(())
}
