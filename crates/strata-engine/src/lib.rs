//! Loads a model with its tokenizer and runs generation.

// A request must never take the server down: failures here are errors, not panics.
#![warn(clippy::unwrap_used)]

mod bench;
mod bench_draft;
pub mod budget;
mod combine;
mod drift;
mod engine;
mod generate;
mod load;
mod media;
mod placed;
mod progress;

pub use bench::{DecodeBench, DecodeShape, PrefillBench};
pub use bench_draft::DraftBench;
pub use budget::KvBudget;
pub use drift::{verify_drift, DriftCycle, DriftReport};
pub use engine::{
    Adapter, Engine, EngineOptions, EngineStatus, GenerationRequest, Histogram, Metrics,
    RequestGuard, RequestTimings, TextStream, Update, Usage, WarmUp, WarmUpShape, FINISH_REASONS,
};
pub use generate::{GenerateParams, GenerateResult, Timings};
pub use load::{Device, LoadSettings, LoadedModel, Prompter, WeightDtype};
pub use media::{AudioFormat, DecodedImage, MediaEncoder, MediaKind, MediaRows};
pub use placed::{OnBackend, OnDevice, Placement, Runtime};
pub use strata_model::quantize::LOAD_QUANT_TYPES;
pub use strata_sched::DraftStats;

/// Why the engine could not load a model or serve a request.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model failed to load or to run.
    #[error(transparent)]
    Model(#[from] strata_model::ModelError),
    /// The model's configuration is unsupported or malformed.
    #[error(transparent)]
    Config(#[from] strata_config::ConfigError),
    /// The tokenizer or chat template failed.
    #[error(transparent)]
    Tokenizer(#[from] strata_tokenizer::TokenizerError),
    /// The KV pool refused an operation.
    #[error(transparent)]
    Kv(#[from] strata_kv::KvError),
    /// A backend operation failed.
    #[error(transparent)]
    Kernel(#[from] strata_kernels::KernelError),
    /// A GGUF file could not be read.
    #[error(transparent)]
    Gguf(#[from] strata_gguf::Error),
    /// The caller's input or settings cannot be served (a server answers 400).
    #[error("{0}")]
    Invalid(String),
    /// The caller named something the engine does not have (a server answers 404).
    #[error("{0}")]
    NotFound(String),
    /// The engine failed on its own account (a server answers 500).
    #[error("{0}")]
    Internal(String),
    /// The engine thread has ended; nothing more can run.
    #[error("the engine has stopped")]
    Stopped,
    /// The engine holds as many requests as it may (running plus waiting).
    #[error("the server is at capacity ({0} requests running or waiting): retry later")]
    QueueFull(usize),
}

/// A result whose error is an [`EngineError`].
pub type Result<T> = std::result::Result<T, EngineError>;
