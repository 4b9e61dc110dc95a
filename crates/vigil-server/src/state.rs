//! What every handler shares: the engine handle, the tokenizer and chat template, the model's
//! identity and limits, the server's own counters, and its configuration.

use crate::metrics::ServerMetrics;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use vigil_engine::engine_thread::EngineHandle;
use vigil_model::chat_template::ChatTemplate;
use vigil_model::tokenizer::Tokenizer;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
    pub max_body_bytes: usize,
    /// Requests waiting beyond the running ones; past it new requests get 503.
    pub max_queue: usize,
    pub max_seqs: usize,
    /// Sessions idle this long are deleted.
    pub session_ttl: std::time::Duration,
    /// Live sessions at most; creating one more is a 409.
    pub max_sessions: usize,
    /// Open connections served at once, the header/idle deadline, and the shutdown deadline.
    pub conn: crate::listener::ConnLimits,
    /// Bytes of queued session data the server holds across every session.
    pub max_pending_bytes_total: usize,
    /// Browser origins allowed to call the API (CORS); others are refused.
    pub allowed_origins: crate::edge::AllowedOrigins,
    /// Where sessions are journaled (`--state-dir`); `None`: in memory only (`--no-persist`).
    pub state_dir: Option<std::path::PathBuf>,
    /// How long a stored response is kept (`--response-ttl`; zero: none is), and how many at
    /// most (`--max-stored-responses`).
    pub response_ttl: std::time::Duration,
    pub max_stored_responses: usize,
    /// Bytes of disk idle sessions' KV may take under the state directory (`--kv-disk`;
    /// 0: off).
    pub kv_disk_bytes: u64,
}

pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<Arc<ChatTemplate>>,
    pub model_id: String,
    /// Longest prompt + completion admitted (model context, --ctx and the KV pool).
    pub max_model_len: usize,
    pub created: u64,
    pub started: Instant,
    pub ready: AtomicBool,
    pub config: ServerConfig,
    pub metrics: Arc<ServerMetrics>,
    pub tool_format: Option<vigil_model::tool_parser::ToolCallFormat>,
    /// The chat template has no tool-call format of its own: tools and calls are rewritten
    /// into plain turns in the Hermes syntax (`generic_tools.rs`), and `tool_format` is Hermes.
    pub generic_tools: bool,
    pub supports_thinking: bool,
    /// A draft model was given (`--speculative draft:PATH`): requests may ask for `draft`.
    pub draft_model: bool,
    /// The grammar tables of structured outputs, built on first use (`structured.rs`).
    pub grammars: std::sync::OnceLock<Result<Arc<vigil_engine::grammar::Grammars>, String>>,
    pub sessions: crate::session::SessionRegistry,
    /// Stored responses (`/v1/responses`), continued by `previous_response_id`.
    pub responses: crate::responses::store::ResponseStore,
    pub cpu_jobs: crate::cpu_jobs::CpuJobs,
    /// Ends every open stream at the shutdown deadline.
    pub closing: crate::sse::Closing,
}

pub type SharedState = Arc<AppState>;

impl AppState {
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}
