//! The one error type every op returns.

use crate::DType;

/// Why an op refused to run. Shape and dtype problems are caller bugs; `Device` is for a
/// backend whose device reported a failure (kept here so every backend shares one type).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum KernelError {
    /// Buffer lengths or dimensions that do not fit together.
    #[error("{op}: shape mismatch: {detail}")]
    Shape {
        /// The op that refused.
        op: &'static str,
        /// Which lengths disagreed, and their values.
        detail: String,
    },
    /// A buffer of a dtype the op does not take (in that argument, on this backend).
    #[error("{op}: dtype {dtype:?} not supported here")]
    DType {
        /// The op that refused.
        op: &'static str,
        /// The dtype it was given.
        dtype: DType,
    },
    /// An argument out of its range (a token id past the table, a zero dimension, a bad
    /// sampling setting, ...).
    #[error("{op}: invalid argument: {detail}")]
    Invalid {
        /// The op that refused.
        op: &'static str,
        /// Which argument, and why.
        detail: String,
    },
    /// The device (driver, compiler, BLAS library) reported a failure; the message is its own.
    #[error("device error: {0}")]
    Device(String),
}

/// `std::result::Result` with [`KernelError`].
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
