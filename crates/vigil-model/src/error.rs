//! Errors of loading and running a model. Every variant names the file and the problem so a
//! user can act on it; nothing in this crate panics on bad input.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not a valid instance of its format (truncated, corrupted, inconsistent).
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },
    /// Valid file, but something Vigil does not support (architecture, tensor type, …).
    #[error("{path}: unsupported: {msg}")]
    Unsupported { path: PathBuf, msg: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
}

impl ModelError {
    pub fn format(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        ModelError::Format {
            path: path.into(),
            msg: msg.into(),
        }
    }

    pub fn unsupported(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        ModelError::Unsupported {
            path: path.into(),
            msg: msg.into(),
        }
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
