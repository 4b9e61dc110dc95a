//! Resident KV memory of one long sequence, with the sliding-window layers' KV of slid-past
//! blocks given back (default) or kept (`--keep`): a prompt of TOKENS - 1 random token ids
//! decodes until the KV holds TOKENS positions (the next query is at TOKENS). Prints
//! one JSON line: the blocks held and released, the bytes they take by count (every held block
//! in the global layers, unreleased ones in the local layers), what `mincore` finds resident
//! in the KV tensors, and the process's anonymous RSS growth over the request.
//!
//! Usage: kv_window_memory MODEL [--tokens 8192] [--threads 2] [--keep]

use vigil_engine::engine::LlmEngine;
use vigil_engine::model_runner::ModelRunner;
use vigil_engine::sampling::SamplingParams;
use vigil_engine::scheduler::SchedulerConfig;
use vigil_engine::sequence::StopCriteria;
use vigil_model::kv_cache::{KvCache, KvDtype};
use vigil_model::load::{load, LoadOptions};

fn arg(args: &[String], name: &str) -> Option<String> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

/// `RssAnon` of this process in bytes (Linux), 0 where unknown.
fn rss_anon() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (status.lines())
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: kv_window_memory MODEL [--tokens 8192] [--threads 2] [--keep]")?;
    let tokens: usize = arg(&args, "--tokens").map_or(Ok(8192), |v| v.parse())?;
    let threads: usize = arg(&args, "--threads").map_or(Ok(2), |v| v.parse())?;
    let keep = args.iter().any(|a| a == "--keep");
    if tokens < 3 {
        return Err("--tokens must be at least 3".into());
    }
    let opts = LoadOptions {
        threads: Some(threads),
        ..LoadOptions::default()
    };
    let model = load(std::path::Path::new(path), &opts)?.model;
    let c = model.config.clone();
    let block_size = 16;
    let num_blocks = tokens.div_ceil(block_size) + 2;
    let kv = KvCache::new(
        c.num_layers,
        c.kv_shape(),
        num_blocks,
        block_size,
        KvDtype::F16,
    );
    let config = SchedulerConfig {
        max_batched_tokens: 512,
        ..SchedulerConfig::default()
    };
    let mut engine = LlmEngine::new(ModelRunner::new(model, kv), config);
    if !engine.set_local_kv_release(!keep) {
        return Err("the pool was in use".into());
    }
    let local_layers = (0..c.num_layers)
        .filter(|&l| c.layer_window(l).is_some())
        .count();
    let window = (0..c.num_layers).find_map(|l| c.layer_window(l));

    let mut state = 1234u64;
    let prompt: Vec<u32> = (0..tokens - 1)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (100 + (state >> 33) % (c.vocab_size as u64 - 100)) as u32
        })
        .collect();
    let stop = StopCriteria {
        max_tokens: 3,
        stop_token_ids: vec![],
        ignore_eos: true,
    };
    let rss_before = rss_anon();
    let start = std::time::Instant::now();
    let id = engine.add_request(prompt, SamplingParams::default(), stop);
    let computed = |e: &LlmEngine| e.seqs.get(&id).map_or(0, |s| s.num_computed_tokens);
    while computed(&engine) < tokens {
        if !engine.has_work() {
            return Err("the sequence ended early".into());
        }
        engine.step().map_err(|e| e.to_string())?;
    }
    let secs = start.elapsed().as_secs_f64();
    let rss_growth = rss_anon().saturating_sub(rss_before);
    let (held, released) = {
        let pool = engine.pool.borrow();
        (pool.num_used_blocks(), pool.num_local_released_blocks())
    };
    // Bytes one block takes in one layer: K and V, `block_size` rows of `kv_dim` f16s.
    let layer_block = block_size * c.kv_dim() * 2 * KvDtype::F16.size();
    let global_layers = c.num_layers - local_layers;
    let counted = layer_block * (held * global_layers + (held - released) * local_layers);
    let resident: Option<usize> = engine.runner.kv.resident_bytes().map(|v| v.iter().sum());
    engine.abort(id);
    println!(
        "{}",
        serde_json::json!({
            "tokens": tokens,
            "release": !keep,
            "layers": c.num_layers,
            "local_layers": local_layers,
            "window": window,
            "kv_dim": c.kv_dim(),
            "block_size": block_size,
            "layer_block_bytes": layer_block,
            "blocks_held": held,
            "blocks_released": released,
            "kv_bytes_counted": counted,
            "kv_bytes_resident": resident,
            "rss_anon_growth": rss_growth,
            "seconds": secs,
        })
    );
    Ok(())
}
