//! The one error type every op returns.

use crate::DType;

/// Why an op refused to run. Shape and dtype problems are caller bugs; `Device` is for a
/// backend whose device reported a failure (kept here so every backend shares one type).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum KernelError {
    #[error("{op}: shape mismatch: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("{op}: dtype {dtype:?} not supported here")]
    DType { op: &'static str, dtype: DType },
    #[error("{op}: invalid argument: {detail}")]
    Invalid { op: &'static str, detail: String },
    #[error("device error: {0}")]
    Device(String),
}

pub type Result<T> = std::result::Result<T, KernelError>;

impl From<strata_types::SamplingError> for KernelError {
    fn from(e: strata_types::SamplingError) -> Self {
        use strata_types::SamplingError as S;
        match e {
            S::Invalid { op, detail } => KernelError::Invalid { op, detail },
            S::Shape { op, detail } => KernelError::Shape { op, detail },
        }
    }
}

/// `Err(Shape)` unless `cond`; keeps the length checks at the top of each op short.
pub(crate) fn ensure(cond: bool, op: &'static str, detail: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(KernelError::Shape {
            op,
            detail: detail(),
        })
    }
}
