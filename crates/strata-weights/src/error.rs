//! The one error type of the crate.

use strata_gguf::GgmlType;

/// Everything that can go wrong while reading weights. Messages name the file or tensor
/// involved so a failed load says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Gguf(#[from] strata_gguf::Error),
    #[error("{path}: invalid safetensors file: {reason}")]
    Safetensors { path: String, reason: String },
    #[error("{path}: invalid shard index: {reason}")]
    ShardIndex { path: String, reason: String },
    #[error("{0}: no model.safetensors, model.safetensors.index.json or .gguf file found")]
    NoWeights(String),
    #[error("tensor {name:?} is missing (expected shape {expected:?})")]
    Missing { name: String, expected: Vec<usize> },
    #[error("tensor {name:?} has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor {name:?}: {reason}")]
    Tensor { name: String, reason: String },
    #[error("tensor type {0} is not supported here")]
    UnsupportedType(GgmlType),
    #[error("{what}: got {found} bytes, expected {expected}")]
    Length {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("unknown architecture {0:?} (known: gemma4, gemma3, llama, qwen3)")]
    UnknownArch(String),
}

pub type Result<T> = std::result::Result<T, WeightsError>;

pub(crate) fn io_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> WeightsError + '_ {
    move |source| WeightsError::Io {
        path: path.display().to_string(),
        source,
    }
}
