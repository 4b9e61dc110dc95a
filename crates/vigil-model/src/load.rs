//! Opening a model path: a `.gguf` file or an HF directory becomes a runnable `Model`, its
//! `Tokenizer` and its chat template, through one weight-building path (`loader`).

use crate::chat_template::ChatTemplate;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::loader::{build_weights, LoadQuantization};
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use std::path::Path;
use std::sync::Arc;
use vigil_kernels::pool::ThreadPool;
use vigil_kernels::storage::keep_mapped;

#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Worker threads; default all cores.
    pub threads: Option<usize>,
    pub quantize: LoadQuantization,
    pub max_context: Option<usize>,
}

pub struct LoadedModel {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    /// The model's own context limit.
    pub max_position_embeddings: usize,
}

pub fn parse_quantize(s: Option<&str>) -> Result<LoadQuantization> {
    match s {
        None | Some("none") => Ok(LoadQuantization::AsStored),
        Some("q8_0") | Some("Q8_0") => Ok(LoadQuantization::Q8_0),
        Some(other) => Err(ModelError::unsupported(
            "--quantize",
            format!("'{other}' (supported: q8_0)"),
        )),
    }
}

pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The model's configuration alone, without loading weights or the tokenizer (cheap: a
/// `config.json` or the GGUF header), e.g. to size the KV cache before loading.
pub fn read_config(path: &Path) -> Result<ModelConfig> {
    if path.is_dir() {
        crate::hf::load_hf_config(path)
    } else {
        crate::source_gguf::gguf_config(&crate::gguf::GgufFile::open(path)?)
    }
}

pub fn load(path: &Path, opts: &LoadOptions) -> Result<LoadedModel> {
    let pool = Arc::new(ThreadPool::new(
        opts.threads.unwrap_or_else(default_threads),
    ));
    let (config, mut weights, tokenizer) = if path.is_dir() {
        let config = crate::hf::load_hf_config(path)?;
        let store = crate::safetensors_store::SafetensorsStore::open(path)?;
        let source = crate::source_hf::HfSource {
            store: &store,
            dir: path,
            arch: config.arch,
        };
        let weights = build_weights(&config, &source, opts.quantize, &pool)?;
        (config, weights, Tokenizer::from_hf_dir(path)?)
    } else {
        let file = crate::gguf::GgufFile::open(path)?;
        let config = crate::source_gguf::gguf_config(&file)?;
        let weights = build_weights(
            &config,
            &crate::source_gguf::GgufSource { file: &file },
            opts.quantize,
            &pool,
        )?;
        let tokenizer = Tokenizer::from_gguf_vocab(&crate::source_gguf::gguf_vocab(&file)?)?;
        (config, weights, tokenizer)
    };
    // Every matrix is read every token: from one resident copy (converted ones move there
    // too), unless `VIGIL_MMAP=1` keeps them where they are.
    if !keep_mapped() {
        weights
            .make_resident(&pool)
            .map_err(|source| ModelError::Io {
                path: path.to_path_buf(),
                source,
            })?;
    }
    let chat_template = match tokenizer.chat_template() {
        Some(src) => Some(ChatTemplate::new(
            src,
            tokenizer.bos_token(),
            tokenizer.eos_token(),
        )?),
        None => None,
    };
    let max_position_embeddings = config.max_position_embeddings;
    check_vocab(&config, &tokenizer, path)?;
    Ok(LoadedModel {
        model: Model::new(config, weights, pool),
        tokenizer,
        chat_template,
        max_position_embeddings,
    })
}

fn check_vocab(config: &ModelConfig, tokenizer: &Tokenizer, path: &Path) -> Result<()> {
    if tokenizer.vocab_size() > config.vocab_size {
        return Err(ModelError::format(
            path,
            format!(
                "tokenizer has {} tokens but the model's vocabulary is {}",
                tokenizer.vocab_size(),
                config.vocab_size
            ),
        ));
    }
    Ok(())
}
