//! Everything that turns files on disk into a runnable model: checkpoint formats (GGUF,
//! safetensors), configs, the decoder forward pass over a flat batch, tokenizers and chat
//! templates. The model never sees sequences or schedulers: it is a pure function of
//! (weights, `StepInput`, the KV pages it may read and write).

pub mod chat_template;
pub mod config;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod safetensors_store;
pub mod tokenizer;

pub use config::{Arch, ModelConfig};
pub use error::ModelError;
pub mod kv_buf;
pub mod kv_cache;
pub mod load;
pub mod loader;
pub mod model;
pub mod reasoning;
pub mod source_gguf;
pub mod source_hf;
pub mod step_input;
pub mod tool_parser;
pub mod weights;
