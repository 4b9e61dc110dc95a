//! Errors of the benchmark harness; each names the target, file or value at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{url}: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url}: unexpected reply: {what}")]
    Reply { url: String, what: String },
    #[error("{url}: not ready after {waited_s} s ({last})")]
    NotReady {
        url: String,
        waited_s: u64,
        last: String,
    },
    #[error("calibration: {0}")]
    Calibration(String),
    #[error("invalid setting: {0}")]
    Setting(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a result file: {source}", path.display())]
    ResultFile {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("encoding the result file: {0}")]
    Encode(#[from] serde_json::Error),
}

impl BenchError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BenchError::Io {
            path: path.into(),
            source,
        }
    }
}
