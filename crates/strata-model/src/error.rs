//! Errors of model loading and forward passes.

/// Why a model could not be loaded or a forward pass failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The model's configuration is unsupported or malformed.
    #[error(transparent)]
    Config(#[from] strata_config::ConfigError),
    /// A weight is missing, of the wrong shape or unreadable.
    #[error(transparent)]
    Weights(#[from] strata_weights::WeightsError),
    /// A backend operation failed.
    #[error(transparent)]
    Kernel(#[from] strata_kernels::KernelError),
    /// The KV pool refused an operation.
    #[error(transparent)]
    Kv(#[from] strata_kv::KvError),
    /// Inputs or settings the model cannot work with; the message says which.
    #[error("{0}")]
    Invalid(String),
}

/// A result whose error is a [`ModelError`].
pub type Result<T> = std::result::Result<T, ModelError>;
