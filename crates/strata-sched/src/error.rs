//! Errors of the scheduler and of the model it drives.

use strata_kv::KvError;

/// Why the scheduler, or a model it drives, failed.
#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    /// A forward pass failed; every request in that batch finishes with an error.
    #[error(transparent)]
    Model(Box<dyn std::error::Error + Send + Sync>),
    /// The KV pool refused an operation.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// A scheduler setting that cannot work (zero budgets, say).
    #[error("invalid scheduler setting: {0}")]
    Config(String),
    /// Anything else a `StepModel` wants to report.
    #[error("{0}")]
    Other(String),
}
