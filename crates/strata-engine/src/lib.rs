//! Loads a model with its tokenizer and runs generation.

// A request must never take the server down: failures here are errors, not panics.
#![warn(clippy::unwrap_used)]

mod bench;
mod bench_draft;
pub mod budget;
mod engine;
mod generate;
mod load;
mod placed;

pub use bench::{DecodeBench, DecodeShape, PrefillBench};
pub use bench_draft::DraftBench;
pub use budget::KvBudget;
pub use engine::{
    Engine, EngineOptions, EngineStatus, GenerationRequest, Histogram, Metrics, RequestGuard,
    RequestTimings, TextStream, Update, Usage, WarmUp, WarmUpShape, FINISH_REASONS,
};
pub use generate::{GenerateParams, GenerateResult, Timings};
pub use load::{Device, LoadSettings, LoadedModel, Prompter, WeightDtype};
pub use placed::{OnBackend, OnDevice, Placement, Runtime};
pub use strata_sched::DraftStats;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] strata_model::ModelError),
    #[error(transparent)]
    Config(#[from] strata_config::ConfigError),
    #[error(transparent)]
    Tokenizer(#[from] strata_tokenizer::TokenizerError),
    #[error(transparent)]
    Kv(#[from] strata_kv::KvError),
    #[error(transparent)]
    Kernel(#[from] strata_kernels::KernelError),
    #[error(transparent)]
    Gguf(#[from] strata_gguf::Error),
    /// The caller's input or settings cannot be served (a server answers 400).
    #[error("{0}")]
    Invalid(String),
    /// The engine failed on its own account (a server answers 500).
    #[error("{0}")]
    Internal(String),
    /// The engine holds as many requests as it may (running plus waiting).
    /// The engine thread has ended; nothing more can run.
    #[error("the engine has stopped")]
    Stopped,
    #[error("the server is at capacity ({0} requests running or waiting): retry later")]
    QueueFull(usize),
}

pub type Result<T> = std::result::Result<T, EngineError>;
