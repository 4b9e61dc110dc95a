//! Vigil's HTTP edge: OpenAI (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`,
//! `/v1/models`) and
//! Anthropic (`/v1/messages`) surfaces over one engine thread, with `/health`, Prometheus
//! `/metrics`, API keys, body limits and bounded admission.

pub mod anthropic;
pub mod cpu_jobs;
pub mod draft_model;
pub mod edge;
pub mod error;
pub mod extract;
pub mod generate;
pub mod generic_tools;
pub mod ids;
pub mod listener;
pub mod metrics;
pub mod metrics_vllm;
pub mod openai;
pub mod output;
pub mod prompt;
pub mod request_id;
pub mod responses;
pub mod routes;
pub mod session;
pub mod sse;
pub mod startup;
pub mod state;
pub mod structured;

pub use startup::{serve, EngineOptions};
pub use state::ServerConfig;
