//! `vigil generate`: one prompt (or an interactive chat) through the engine, streaming text as
//! it is produced, with prefill and decode speed on stderr at the end.

use anyhow::{Context, Result};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;
use vigil_engine::sampling::SamplingParams;
use vigil_engine::sequence::StopCriteria;
use vigil_model::load::{LoadOptions, LoadedModel};
use vigil_model::model::Model;
use vigil_model::tokenizer::IncrementalDetokenizer;

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// A `.gguf` file or an HF model directory (config.json, *.safetensors, tokenizer.json).
    /// Default: SmolLM2-135M-Instruct Q4_1, pulled on first use. Hub ids are not supported yet.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The prompt. With --chat it is sent as a user message through the chat template.
    #[arg(long, short)]
    prompt: Option<String>,
    /// Chat mode: render through the model's chat template; without --prompt, read turns from stdin.
    #[arg(long)]
    chat: bool,
    /// System message for --chat.
    #[arg(long)]
    system: Option<String>,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling: keep the smallest set of tokens whose probability reaches P.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the K most likely tokens; 0 keeps all.
    #[arg(long, default_value_t = 0)]
    top_k: u32,
    /// Drop tokens less likely than P times the most likely one; 0 keeps all.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Divide the logits of tokens already in the prompt or output by R (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// OpenAI-style presence penalty over generated tokens (0 = off).
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    /// OpenAI-style frequency penalty over generated tokens (0 = off).
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Seed for sampling, so a run can be repeated (default: random).
    #[arg(long)]
    seed: Option<u64>,
    /// Worker threads (default: all cores).
    #[arg(long, value_parser = crate::at_least_one)]
    threads: Option<usize>,
    /// Context length (default: the model's, capped at 4096).
    #[arg(long)]
    ctx: Option<usize>,
    /// Quantize float weights at load (`q8_0`).
    #[arg(long)]
    quantize: Option<String>,
    /// Keep generating past end-of-sequence tokens (benchmarks).
    #[arg(long)]
    ignore_eos: bool,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    let model_path = crate::pull::model_or_default(args.model.as_deref())?;
    let opts = LoadOptions {
        threads: args.threads,
        quantize: vigil_model::load::parse_quantize(args.quantize.as_deref())?,
        max_context: args.ctx,
    };
    let loaded = vigil_model::load::load(&model_path, &opts)
        .with_context(|| format!("loading {}", model_path.display()))?;
    let LoadedModel {
        model,
        tokenizer,
        chat_template,
        max_position_embeddings,
    } = loaded;
    let mut engine = new_engine(model, args.ctx.unwrap_or(max_position_embeddings.min(4096)));
    let params = SamplingParams {
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: args.seed,
        ..SamplingParams::default()
    };
    params.validate().map_err(|e| anyhow::anyhow!("{e}"))?;

    let tokenizer = &tokenizer;
    let mut messages: Vec<serde_json::Value> = Vec::new();
    if let Some(sys) = &args.system {
        messages.push(serde_json::json!({"role": "system", "content": sys}));
    }
    let one_shot = args.prompt.is_some() || !args.chat;
    let stdin = std::io::stdin();
    loop {
        let user_text = match &args.prompt {
            Some(p) => p.clone(),
            None if args.chat => {
                eprint!("> ");
                let mut line = String::new();
                if stdin.lock().read_line(&mut line)? == 0 {
                    break;
                }
                line.trim_end().to_string()
            }
            None => anyhow::bail!("give --prompt TEXT, or --chat to read turns from stdin"),
        };
        let prompt_ids = if args.chat {
            messages.push(serde_json::json!({"role": "user", "content": user_text}));
            let template = chat_template
                .as_ref()
                .context("this model has no chat template; use --prompt without --chat")?;
            let text = template.render(
                &serde_json::Value::Array(messages.clone()),
                None,
                true,
                &serde_json::Map::new(),
            )?;
            tokenizer.encode(&text, false)?
        } else {
            tokenizer.encode(&user_text, true)?
        };
        let stop = StopCriteria {
            max_tokens: args.max_tokens,
            stop_token_ids: tokenizer.eos_token_ids().to_vec(),
            ignore_eos: args.ignore_eos,
        };
        let reply = generate_one(&mut engine, tokenizer, prompt_ids, params.clone(), stop)?;
        if args.chat {
            messages.push(serde_json::json!({"role": "assistant", "content": reply}));
        }
        if one_shot {
            break;
        }
    }
    Ok(())
}

/// An engine whose KV pool holds one sequence of `ctx` tokens.
fn new_engine(model: Model, ctx: usize) -> vigil_engine::engine::LlmEngine {
    let block_size = 16;
    let num_blocks = ctx.div_ceil(block_size) + 1;
    let kv = vigil_model::kv_cache::KvCache::new(
        model.config.num_layers,
        model.config.kv_shape(),
        num_blocks,
        block_size,
        vigil_model::kv_cache::KvDtype::F16,
    );
    let runner = vigil_engine::model_runner::ModelRunner::new(model, kv);
    vigil_engine::engine::LlmEngine::new(
        runner,
        vigil_engine::scheduler::SchedulerConfig::default(),
    )
}

fn generate_one(
    engine: &mut vigil_engine::engine::LlmEngine,
    tokenizer: &vigil_model::tokenizer::Tokenizer,
    prompt_ids: Vec<u32>,
    params: SamplingParams,
    stop: StopCriteria,
) -> Result<String> {
    let num_prompt = prompt_ids.len();
    let mut detok =
        IncrementalDetokenizer::new(tokenizer, &prompt_ids[num_prompt.saturating_sub(4)..], true);
    let id = engine.add_request(prompt_ids, params, stop);
    let start = Instant::now();
    let mut first_token_at = None;
    let mut num_generated = 0usize;
    let mut text = String::new();
    let mut out = std::io::stdout().lock();
    while engine.has_work() {
        for o in engine.step()? {
            if o.seq_id != id {
                continue;
            }
            first_token_at.get_or_insert_with(Instant::now);
            num_generated += 1;
            let is_eos = o.finished == Some(vigil_engine::sequence::FinishReason::Stop);
            if !is_eos {
                let piece = detok.push(o.token)?;
                out.write_all(piece.as_bytes())?;
                out.flush()?;
                text.push_str(&piece);
            }
        }
    }
    let tail = detok.flush();
    out.write_all(tail.as_bytes())?;
    writeln!(out)?;
    text.push_str(&tail);
    engine.take_finished(id);
    let end = Instant::now();
    let first = first_token_at.unwrap_or(end);
    let prefill_s = (first - start).as_secs_f64();
    let decode_s = (end - first).as_secs_f64();
    eprintln!(
        "vigil: prompt {num_prompt} tokens in {:.3} s ({:.1} tok/s); generated {num_generated} tokens, decode {:.1} tok/s",
        prefill_s,
        num_prompt as f64 / prefill_s.max(1e-9),
        num_generated.saturating_sub(1) as f64 / decode_s.max(1e-9)
    );
    Ok(text)
}
