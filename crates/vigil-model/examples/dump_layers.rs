//! Run one prefill of a GGUF model and write every intermediate activation the forward pass
//! shows its probe, for a layer-by-layer comparison with llama.cpp's graph nodes
//! (scripts/dump_llamacpp_tensors.py, scripts/compare_layers.py).
//!
//! Usage: `cargo run --release -p vigil-model --example dump_layers -- MODEL.gguf IDS OUT_DIR`
//! where IDS is a comma-separated token list. Writes `OUT_DIR/<name>[-<layer>].f32`
//! (little-endian f32, `tokens × width` row-major).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use vigil_model::kv_cache::{KvCache, KvDtype};
use vigil_model::load::{load, LoadOptions};
use vigil_model::step_input::{SeqInput, StepInput};

type Dumps = Arc<Mutex<Vec<(String, Vec<f32>)>>>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model_path, ids, out_dir] = args.as_slice() else {
        return Err("usage: dump_layers MODEL.gguf ID,ID,... OUT_DIR".into());
    };
    let token_ids = ids
        .split(',')
        .map(|t| t.trim().parse::<u32>())
        .collect::<Result<Vec<_>, _>>()?;
    let out_dir = PathBuf::from(out_dir);
    std::fs::create_dir_all(&out_dir)?;

    let mut loaded = load(
        model_path.as_ref(),
        &LoadOptions {
            threads: Some(2),
            ..LoadOptions::default()
        },
    )?;
    let model = &mut loaded.model;
    let dumps: Dumps = Arc::default();
    let sink = Arc::clone(&dumps);
    model.probe = Some(Box::new(move |name, layer, data| {
        let file = match layer {
            Some(l) => format!("{name}-{l}"),
            None => name.to_string(),
        };
        if let Ok(mut d) = sink.lock() {
            d.push((file, data.to_vec()));
        }
    }));

    let n = token_ids.len();
    let block_size = 16;
    let blocks = n.div_ceil(block_size);
    let mut kv = KvCache::new(
        model.config.num_layers,
        model.config.kv_shape(),
        blocks,
        block_size,
        KvDtype::F16,
    );
    let input = StepInput {
        token_ids,
        positions: (0..n as u32).collect(),
        seqs: vec![SeqInput {
            query_len: n,
            context_len: n,
            block_table: (0..blocks as u32).collect(),
        }],
        slot_mapping: (0..n as u32).collect(),
        sample_rows: (0..n).collect(),
    };
    model.forward(&input, &mut kv);
    model.probe = None;

    let dumps = dumps.lock().map_err(|_| "probe sink poisoned")?;
    for (name, data) in dumps.iter() {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(out_dir.join(format!("{name}.f32")), bytes)?;
    }
    eprintln!("wrote {} tensors to {}", dumps.len(), out_dir.display());
    Ok(())
}
