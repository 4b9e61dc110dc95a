//! The real model against llama.cpp: SmolLM2-135M-Instruct Q4_1, references made by
//! scripts/make_llamacpp_refs.py (tests/fixtures/smollm2/llamacpp_refs.json).
//! - teacher-forced over 5 × 64 positions: where top-1 differs, llama.cpp's top-1 is in
//!   Vigil's top 3 and llama.cpp's own top-2 margin is within its noise (`NEAR_TIE`), and top-1
//!   agrees at ≥ 96% of positions;
//! - greedy 32-token continuations through the engine: where one diverges from llama.cpp's,
//!   llama.cpp's own margin at that step is a near tie.
//!
//! Why not bit-for-bit: both engines quantize activations to 8 bits, each with its own
//! rounding, and llama.cpp is not consistent with itself across batch shapes or attention
//! kernels: fed one token per step, or with flash attention on, it agrees with these (one
//! batch, flash attention off) references at 311/320 positions, and with flash attention on
//! its greedy continuation matches 1 of 5 (`scripts/llamacpp_self_agreement.py`). At a near
//! tie, that noise, not the model, picks the token. Measured with this test (`--nocapture`):
//! 313/320, |Δlogit| on llama.cpp's top-5 median 0.10–0.16 (docs/testing.md).
//!
//! Needs `VIGIL_TEST_GGUF`; skipped with a message when unset.

use std::path::{Path, PathBuf};
use vigil_engine::engine::LlmEngine;
use vigil_engine::model_runner::ModelRunner;
use vigil_engine::sampling::SamplingParams;
use vigil_engine::scheduler::SchedulerConfig;
use vigil_engine::sequence::StopCriteria;
use vigil_model::kv_cache::{KvCache, KvDtype};
use vigil_model::load::{load, LoadOptions, LoadedModel};
use vigil_model::step_input::{SeqInput, StepInput};

struct Case {
    name: String,
    prompt_text: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    greedy_margins: Vec<f32>,
    sequence_ids: Vec<u32>,
    top_ids: Vec<Vec<u32>>,
    top_logits: Vec<Vec<f32>>,
}

/// A top-1/top-2 logit margin below this is inside llama.cpp's own batch-shape noise.
const NEAR_TIE: f32 = 0.5;

/// The real SmolLM2 file: a test that needs it fails without it rather than passing unseen.
fn gguf_path() -> Option<PathBuf> {
    let p = std::env::var_os("VIGIL_TEST_GGUF").map(PathBuf::from);
    assert!(
        p.is_some(),
        "VIGIL_TEST_GGUF is not set: eval \"$(scripts/fetch_test_assets.sh)\" first"
    );
    p
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn cases() -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/smollm2/llamacpp_refs.json");
    let refs: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    refs["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            prompt_text: c["prompt_text"].as_str().unwrap().to_string(),
            prompt_ids: ids(&c["prompt_ids"]),
            greedy_ids: ids(&c["greedy_ids"]),
            greedy_margins: c["greedy_margins"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect(),
            sequence_ids: ids(&c["sequence_ids"]),
            top_ids: c["positions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| ids(&p["ids"]))
                .collect(),
            top_logits: c["positions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    p["logits"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap() as f32)
                        .collect()
                })
                .collect(),
        })
        .collect()
}

fn load_smollm2(path: &Path) -> LoadedModel {
    load(
        path,
        &LoadOptions {
            threads: Some(2),
            ..LoadOptions::default()
        },
    )
    .unwrap()
}

fn top_n(row: &[f32], n: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    idx.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    idx.truncate(n);
    idx
}

#[test]
fn quantized_matrices_load_interleaved_for_the_kernels() {
    use vigil_kernels::cpu::{self, Isa};
    use vigil_kernels::Layout;
    let Some(path) = gguf_path() else { return };
    let weights = load_smollm2(&path).model.weights;
    let simd = cpu::features().best() != Isa::Scalar;
    let want = if simd {
        Layout::Interleaved8
    } else {
        Layout::Rows
    };
    for (i, l) in weights.layers.iter().enumerate() {
        for (name, m) in [("wq", &l.wq), ("wk", &l.wk), ("wv", &l.wv), ("wo", &l.wo)] {
            assert_eq!(m.dtype, vigil_kernels::DType::Q4_1, "layer {i} {name}");
            assert_eq!(m.layout, want, "layer {i} {name}");
        }
    }
    // The tied Q8_0 embedding is the output projection too: interleaved once, shared by both
    // (a lookup takes its rows back out of the groups, bit for bit as the checkpoint's rows).
    assert_eq!(weights.output.dtype, vigil_kernels::DType::Q8_0);
    assert_eq!(weights.output.layout, want);
    assert_eq!(weights.token_embd.layout, want);
    assert_eq!(
        weights.token_embd.data.bytes().as_ptr(),
        weights.output.data.bytes().as_ptr(),
        "one copy for the tied pair"
    );
}

#[test]
fn tokenization_matches_llamacpp() {
    let Some(path) = gguf_path() else { return };
    let loaded = load_smollm2(&path);
    for c in cases() {
        assert_eq!(
            loaded.tokenizer.encode(&c.prompt_text, false).unwrap(),
            c.prompt_ids,
            "{}",
            c.name
        );
    }
}

#[test]
fn teacher_forced_top1_agrees_with_llamacpp() {
    let Some(path) = gguf_path() else { return };
    let LoadedModel { mut model, .. } = load_smollm2(&path);
    let vocab = model.config.vocab_size;
    let (mut agree, mut total) = (0, 0);
    for c in cases() {
        let n = c.sequence_ids.len();
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
            token_ids: c.sequence_ids.clone(),
            positions: (0..n as u32).collect(),
            seqs: vec![SeqInput {
                query_len: n,
                context_len: n,
                block_table: (0..blocks as u32).collect(),
            }],
            slot_mapping: (0..n as u32).collect(),
            sample_rows: (0..n).collect(),
        };
        let logits = model.forward(&input, &mut kv).to_vec();
        let mut diffs = Vec::new();
        for (i, reference) in c.top_ids.iter().enumerate() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            for (k, &id) in reference.iter().enumerate() {
                diffs.push((row[id as usize] - c.top_logits[i][k]).abs());
            }
            let ours = top_n(row, 3);
            total += 1;
            if ours[0] == reference[0] {
                agree += 1;
            } else {
                eprintln!(
                    "{} position {i}: ours {ours:?}, llama.cpp top-5 {reference:?}",
                    c.name
                );
                assert!(
                    ours.contains(&reference[0]),
                    "{} position {i}: llama.cpp's top-1 {} not in our top 3 {ours:?}",
                    c.name,
                    reference[0]
                );
                let margin = c.top_logits[i][0] - c.top_logits[i][1];
                assert!(
                    margin < NEAR_TIE,
                    "{} position {i}: top-1 differs where llama.cpp's margin is {margin}",
                    c.name
                );
            }
        }
        diffs.sort_by(f32::total_cmp);
        eprintln!(
            "{}: |Δlogit| on llama.cpp's top-5: median {:.3}, p90 {:.3}, max {:.3}",
            c.name,
            diffs[diffs.len() / 2],
            diffs[diffs.len() * 9 / 10],
            diffs[diffs.len() - 1]
        );
    }
    let rate = agree as f64 / total as f64;
    eprintln!("top-1 agreement: {agree}/{total} = {:.2}%", rate * 100.0);
    assert!(rate >= 0.96, "top-1 agreement {agree}/{total} below 96%");
}

#[test]
fn greedy_continuations_match_llamacpp() {
    let Some(path) = gguf_path() else { return };
    let LoadedModel { model, .. } = load_smollm2(&path);
    let kv = KvCache::new(
        model.config.num_layers,
        model.config.kv_shape(),
        64,
        16,
        KvDtype::F16,
    );
    let mut engine = LlmEngine::new(ModelRunner::new(model, kv), SchedulerConfig::default());
    let mut identical = 0;
    let all = cases();
    for c in &all {
        let stop = StopCriteria {
            max_tokens: c.greedy_ids.len(),
            stop_token_ids: vec![],
            ignore_eos: true,
        };
        let id = engine.add_request(c.prompt_ids.clone(), SamplingParams::default(), stop);
        while engine.has_work() {
            engine.step().unwrap();
        }
        let seq = engine.take_finished(id).unwrap();
        let ours = seq.output_ids().to_vec();
        assert_eq!(ours.len(), c.greedy_ids.len());
        match ours.iter().zip(&c.greedy_ids).position(|(a, b)| a != b) {
            None => identical += 1,
            Some(step) => {
                let margin = c.greedy_margins[step];
                eprintln!(
                    "{}: diverges at step {step} (llama.cpp margin {margin:.3})",
                    c.name
                );
                assert!(
                    margin < NEAR_TIE,
                    "{}: greedy diverges at step {step} where llama.cpp's margin is {margin}",
                    c.name
                );
            }
        }
        engine.check_invariants().unwrap();
    }
    eprintln!(
        "identical 32-token greedy continuations: {identical}/{}",
        all.len()
    );
}
