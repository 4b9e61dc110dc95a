//! `vigil bench`: drives OpenAI-compatible HTTP servers (Vigil, llama.cpp's, vLLM, SGLang) with
//! fixed workloads (a live stream queried through sessions among them), writes one JSON result file per run with every raw sample, and turns result
//! files into a Markdown and HTML report. The `vigil` binary is the command line over this crate.

mod agent;
pub mod calibrate;
pub mod client;
mod error;
pub mod estimate;
mod exec;
pub mod hardware;
pub mod live;
mod matrix;
pub mod report;
pub mod result;
pub mod run;
pub mod stats;
mod traffic;
pub mod workload;

pub use error::BenchError;
pub use result::RunFile;
pub use run::{run, RunOptions, Target};
pub use workload::{Settings, Workload};
