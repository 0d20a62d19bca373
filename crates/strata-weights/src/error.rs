//! The one error type of the crate.

use strata_gguf::GgmlType;

/// Everything that can go wrong while reading weights. Messages name the file or tensor
/// involved so a failed load says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// A file could not be opened, read or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file's path.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The GGUF container could not be parsed.
    #[error(transparent)]
    Gguf(#[from] strata_gguf::Error),
    /// A malformed safetensors file (header, dtype, offsets).
    #[error("{path}: invalid safetensors file: {reason}")]
    Safetensors {
        /// The file's path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A malformed `model.safetensors.index.json`.
    #[error("{path}: invalid shard index: {reason}")]
    ShardIndex {
        /// The index file's path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A directory without a weight file; holds its path.
    #[error("{0}: no model.safetensors, model.safetensors.index.json or .gguf file found")]
    NoWeights(String),
    /// A tensor the model needs is absent.
    #[error("tensor {name:?} is missing (expected shape {expected:?})")]
    Missing {
        /// The tensor's name, as looked up.
        name: String,
        /// The shape the model needs, outermost first.
        expected: Vec<usize>,
    },
    /// A tensor whose shape is not the one the model needs.
    #[error("tensor {name:?} has shape {found:?}, expected {expected:?}")]
    Shape {
        /// The tensor's name.
        name: String,
        /// The shape the model needs, outermost first.
        expected: Vec<usize>,
        /// The shape in the file, outermost first.
        found: Vec<usize>,
    },
    /// A problem with one tensor: a row out of range, a non-finite value, or a decoding
    /// error named with the tensor.
    #[error("tensor {name:?}: {reason}")]
    Tensor {
        /// The tensor's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// An element type this operation has no path for.
    #[error("tensor type {0} is not supported here")]
    UnsupportedType(GgmlType),
    /// A buffer of the wrong size.
    #[error("{what}: got {found} bytes, expected {expected}")]
    Length {
        /// The buffer or operation.
        what: &'static str,
        /// Bytes it should have.
        expected: usize,
        /// Bytes it has.
        found: usize,
    },
    /// An architecture without a name table; holds the name given.
    #[error("unknown architecture {0:?} (known: gemma4, gemma3, llama, qwen3)")]
    UnknownArch(String),
}

/// `Result` with this crate's [`WeightsError`].
pub type Result<T> = std::result::Result<T, WeightsError>;

pub(crate) fn io_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> WeightsError + '_ {
    move |source| WeightsError::Io {
        path: path.display().to_string(),
        source,
    }
}
