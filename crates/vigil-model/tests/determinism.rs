//! The determinism contract: a sequence's logits are bit-identical whether it runs alone, in
//! prefill chunks of any size, or batched with other sequences in the same steps.

use std::path::Path;
use vigil_model::kv_cache::{KvCache, KvDtype};
use vigil_model::load::LoadOptions;
use vigil_model::loader::LoadQuantization;
use vigil_model::model::Model;
use vigil_model::step_input::{SeqInput, StepInput};

const BLOCK: usize = 4;

fn load(name: &str, quant: LoadQuantization, threads: usize) -> Model {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(name);
    let opts = LoadOptions {
        threads: Some(threads),
        quantize: quant,
        max_context: None,
    };
    vigil_model::load::load(&dir, &opts).unwrap().model
}

/// A sequence being fed in chunks: its tokens, how many are computed, and its blocks.
struct Feed {
    tokens: Vec<u32>,
    done: usize,
    blocks: Vec<u32>,
}

/// Run `seqs` to completion, each step taking the next chunk size of every unfinished sequence
/// from `chunks` (cycled); returns every sequence's logits at every position.
fn run(
    model: &mut Model,
    prompts: &[Vec<u32>],
    chunks: &[&[usize]],
    kv_dtype: KvDtype,
) -> Vec<Vec<f32>> {
    let vocab = model.config.vocab_size;
    let total_blocks: usize = prompts.iter().map(|p| p.len().div_ceil(BLOCK)).sum();
    let mut kv = KvCache::new(
        model.config.num_layers,
        model.config.kv_shape(),
        total_blocks,
        BLOCK,
        kv_dtype,
    );
    // Interleave block ids across sequences so layouts differ from the single-sequence run.
    let mut next = (0..total_blocks as u32).rev();
    let mut feeds: Vec<Feed> = prompts
        .iter()
        .map(|p| Feed {
            tokens: p.clone(),
            done: 0,
            blocks: (0..p.len().div_ceil(BLOCK))
                .map(|_| next.next().unwrap())
                .collect(),
        })
        .collect();
    let mut out: Vec<Vec<f32>> = prompts.iter().map(|p| vec![0.0; p.len() * vocab]).collect();
    let mut step = 0;
    while feeds.iter().any(|f| f.done < f.tokens.len()) {
        let mut input = StepInput::default();
        let mut owners = Vec::new();
        for (si, f) in feeds.iter_mut().enumerate() {
            if f.done == f.tokens.len() {
                continue;
            }
            let sizes = chunks[si % chunks.len()];
            let n = sizes[step % sizes.len()].min(f.tokens.len() - f.done);
            for p in f.done..f.done + n {
                input.token_ids.push(f.tokens[p]);
                input.positions.push(p as u32);
                input
                    .slot_mapping
                    .push(f.blocks[p / BLOCK] * BLOCK as u32 + (p % BLOCK) as u32);
                input.sample_rows.push(input.token_ids.len() - 1);
                owners.push((si, p));
            }
            input.seqs.push(SeqInput {
                query_len: n,
                context_len: f.done + n,
                block_table: f.blocks.clone(),
            });
            f.done += n;
        }
        let logits = model.forward(&input, &mut kv);
        for (row, &(si, p)) in owners.iter().enumerate() {
            out[si][p * vocab..(p + 1) * vocab]
                .copy_from_slice(&logits[row * vocab..(row + 1) * vocab]);
        }
        step += 1;
    }
    out
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        (0..23).map(|i| (i * 37 + 11) % 384).collect(),
        (0..9).map(|i| (i * 101 + 5) % 384).collect(),
        (0..17).map(|i| (i * 53 + 200) % 384).collect(),
    ]
}

fn assert_bit_identical(a: &[f32], b: &[f32], what: &str) {
    let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(same, "{what}: logits differ");
}

fn check_model(name: &str, quant: LoadQuantization) {
    for kv in [KvDtype::F32, KvDtype::F16] {
        let mut model = load(name, quant, 2);
        let p = prompts();
        let alone: Vec<Vec<f32>> = p
            .iter()
            .map(|q| run(&mut model, std::slice::from_ref(q), &[&[usize::MAX]], kv).remove(0))
            .collect();
        for chunking in [&[1usize][..], &[3], &[5, 2, 7], &[16]] {
            let chunked = run(&mut model, &p[..1], &[chunking], kv);
            assert_bit_identical(
                &alone[0],
                &chunked[0],
                &format!("{name} chunks {chunking:?}"),
            );
        }
        let batched = run(&mut model, &p, &[&[4, 1], &[1], &[6, 3, 2]], kv);
        for (i, b) in batched.iter().enumerate() {
            assert_bit_identical(&alone[i], b, &format!("{name} batched seq {i}"));
        }
        let mut one_thread = load(name, quant, 1);
        let single = run(&mut one_thread, &p[..1], &[&[usize::MAX]], kv);
        assert_bit_identical(&alone[0], &single[0], &format!("{name} 1 vs 2 threads"));
    }
}

#[test]
fn llama_logits_do_not_depend_on_batching_or_chunking() {
    check_model("llama", LoadQuantization::AsStored);
}

#[test]
fn qwen3_moe_logits_do_not_depend_on_batching_or_chunking() {
    check_model("qwen3_moe", LoadQuantization::AsStored);
}

#[test]
fn q8_0_logits_do_not_depend_on_batching_or_chunking() {
    check_model("qwen3", LoadQuantization::Q8_0);
}

/// The weights made resident at load (packed or interleaved in place, a matrix a pool task,
/// `ModelWeights::make_resident`; with `--quantize q8_0` quantized a chunk of rows a pool task
/// first) are the same bytes in the same layouts whatever the number of load threads.
#[test]
fn resident_weights_do_not_depend_on_the_load_threads() {
    use vigil_kernels::QMatrix;
    use vigil_model::weights::FeedForward;
    let same = |a: &QMatrix, b: &QMatrix, what: &str| {
        assert_eq!(a.layout, b.layout, "{what}: layout");
        assert!(a.data.bytes() == b.data.bytes(), "{what}: bytes differ");
    };
    use LoadQuantization::{AsStored, Q8_0};
    let cases = [
        ("llama_bf16", AsStored),
        ("qwen3_bf16", AsStored),
        ("llama", AsStored),
        ("gemma3", AsStored),
        ("qwen3_bf16", Q8_0),
        ("llama", Q8_0),
    ];
    for (name, quant) in cases {
        let (one, three) = (load(name, quant, 1), load(name, quant, 3));
        let (a, b) = (&one.weights, &three.weights);
        if quant == Q8_0 {
            assert_eq!(
                a.layers[0].wq.dtype,
                vigil_kernels::DType::Q8_0,
                "{name}: quantized"
            );
        }
        let name = format!("{name} {quant:?}");
        same(&a.token_embd, &b.token_embd, &format!("{name} embedding"));
        same(&a.output, &b.output, &format!("{name} output"));
        for (i, (la, lb)) in a.layers.iter().zip(&b.layers).enumerate() {
            for (x, y, m) in [
                (&la.wq, &lb.wq, "q"),
                (&la.wk, &lb.wk, "k"),
                (&la.wv, &lb.wv, "v"),
                (&la.wo, &lb.wo, "o"),
            ] {
                same(x, y, &format!("{name} layer {i} {m}"));
            }
            let (FeedForward::Dense(fa), FeedForward::Dense(fb)) = (&la.ffn, &lb.ffn) else {
                panic!("{name}: a dense model");
            };
            for (x, y, m) in [
                (&fa.gate, &fb.gate, "gate"),
                (&fa.up, &fb.up, "up"),
                (&fa.down, &fb.down, "down"),
            ] {
                same(x, y, &format!("{name} layer {i} {m}"));
            }
        }
    }
}
