//! The result file: one JSON document per `vigil bench run`, holding every setting and every raw
//! sample, so a report can be rebuilt (or recomputed differently) from it alone.

use crate::calibrate::CalibrationRecord;
use crate::hardware::Hardware;
use crate::live::LiveRecord;
use crate::stats::Summary;
use crate::workload::{Settings, Workload};
use crate::BenchError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub const SCHEMA: &str = "vigil-bench/1";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunFile {
    /// `vigil-bench/1`.
    pub schema: String,
    /// The harness version (the `vigil` crate version).
    pub tool_version: String,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix_s: u64,
    pub workload: Workload,
    /// False while the run is going (the file is rewritten after every point) and in the file
    /// of a run that stopped part-way; files from before this field read as complete.
    #[serde(default = "complete_by_default")]
    pub complete: bool,
    pub settings: Settings,
    pub hardware: Hardware,
    pub targets: Vec<TargetRun>,
}

fn complete_by_default() -> bool {
    true
}

/// One target's part of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetRun {
    /// The name given with `--target NAME=URL`.
    pub name: String,
    pub url: String,
    /// The model id from `/v1/models` (or `--model`), sent as `model` in every request.
    pub model: String,
    /// `owned_by` of the model in `/v1/models` (`vigil`; llama-cpp-python says `me`).
    pub owned_by: Option<String>,
    /// The HTTP `server` header of `/v1/models`, where the server sends one.
    pub server_header: Option<String>,
    /// The engine's context length where `/v1/models` states it (`max_model_len`).
    pub max_model_len: Option<u64>,
    /// Prompt calibration (every workload but live-stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationRecord>,
    /// live-stream: the stream, the session and the flash query as the target reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveRecord>,
    pub points: Vec<Point>,
}

/// One measured point: a prompt/output size, a concurrency level, a loop shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Point {
    /// Stable name within the workload, e.g. `in=128 out=128`, `c=8`, `P=2048 T=5`.
    pub label: String,
    /// The sizes that define the point (`prompt_tokens`, `max_tokens`, `concurrency`, …).
    pub params: BTreeMap<String, u64>,
    pub warmup_requests: u32,
    pub measured_requests: u32,
    /// Failed requests, warm-up included.
    pub failed: u32,
    /// A point with any failed request: reported as excluded, never charted or ranked.
    pub excluded: bool,
    /// The first few failure messages (a matrix cell that was not run: why).
    pub errors: Vec<String>,
    /// Wall time of the measured phase (first send to last byte).
    pub wall_s: f64,
    /// Aggregates over the measured phase: `output_tok_s` (all output tokens / wall) and
    /// `requests_per_s` (concurrent); matrix decode cells also `average_active` and
    /// `peak_active` (requests generating: on average, at the busiest moment),
    /// `completed_requests` and `output_tokens`; no percentiles.
    pub throughput: BTreeMap<String, f64>,
    /// Percentile summaries over measured samples: `ttft_ms`, `itl_ms`, `e2e_ms`,
    /// `output_tok_s` (per request), `prompt_tok_s` (prefill), `loop_ms` (agent loop).
    pub metrics: BTreeMap<String, Summary>,
    /// Every request, warm-up included (`warmup: true`).
    pub samples: Vec<Sample>,
    /// matrix: `valid`, `requests queued`, `over capacity`, `not run` or `failed`; a cell over
    /// capacity or not run has no samples and is never charted or ranked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// One request.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Sample {
    pub warmup: bool,
    /// Iteration within the point (agent loop: the loop; otherwise the request).
    pub iteration: u32,
    /// Turn within an agent loop (1-based).
    pub turn: Option<u32>,
    /// Send time from the start of the point's phase (warm-up or measured).
    pub start_ms: f64,
    /// Send → first token (first chunk with text, or the first choice when no text came).
    pub ttft_ms: Option<f64>,
    pub e2e_ms: f64,
    /// Ms per output token after the first: (last text chunk − first) / (tokens − 1).
    pub itl_ms: Option<f64>,
    pub requested_tokens: u32,
    pub prompt_tokens: Option<u32>,
    pub cached_tokens: Option<u32>,
    pub output_tokens: Option<u32>,
    pub text_chunks: u32,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    /// matrix decode: still streaming at the cell's deadline, so dropped; neither failed nor
    /// completed (the tokens it received before the deadline count toward total tok/s).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut: bool,
    /// live-stream: how late the query was sent after it fell due (one query in flight at a
    /// time, so a query due while the last one runs waits for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_ms: Option<f64>,
    /// live-stream: stream entries the query covered (replay: re-sent; session: pushed so far).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_entries: Option<u32>,
    /// live-stream cold query and replays: data tokens of the client's window the query
    /// covered (cold: the window when it was sent; replay: the window it re-sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_tokens: Option<u32>,
    /// live-stream flash query: answered from the flash cache, and that answer's `lag`
    /// (versions behind the session) and `stale`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale: Option<bool>,
    /// live-stream session queries: the `data_version` the answer was computed over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_version: Option<u64>,
}

impl RunFile {
    pub fn read(path: &Path) -> Result<RunFile, BenchError> {
        let text = std::fs::read_to_string(path).map_err(|e| BenchError::io(path, e))?;
        serde_json::from_str(&text).map_err(|source| BenchError::ResultFile {
            path: path.to_path_buf(),
            source,
        })
    }

    pub fn write(&self, path: &Path) -> Result<(), BenchError> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n").map_err(|e| BenchError::io(path, e))
    }

    /// Write through a temporary file and a rename, so a reader (or a run killed mid-write)
    /// never sees half a file.
    pub fn write_atomic(&self, path: &Path) -> Result<(), BenchError> {
        let tmp = path.with_extension("json.tmp");
        self.write(&tmp)?;
        std::fs::rename(&tmp, path).map_err(|e| BenchError::io(path, e))
    }
}
