//! Errors of model loading and forward passes.

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Config(#[from] strata_config::ConfigError),
    #[error(transparent)]
    Weights(#[from] strata_weights::WeightsError),
    #[error(transparent)]
    Kernel(#[from] strata_kernels::KernelError),
    #[error(transparent)]
    Kv(#[from] strata_kv::KvError),
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, ModelError>;
