//! The host sampler's error.

use std::fmt;

/// Settings or shapes the host sampler cannot work with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SamplingError {
    /// A setting out of its range (a negative temperature, `top_p` of 0).
    Invalid {
        /// The operation that refused it.
        op: &'static str,
        /// Which setting and why.
        detail: String,
    },
    /// Lengths that do not fit together (logits for fewer rows than asked).
    Shape {
        /// The operation that refused it.
        op: &'static str,
        /// Which lengths, and what they were.
        detail: String,
    },
}

impl fmt::Display for SamplingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SamplingError::Invalid { op, detail } => write!(f, "{op}: invalid argument: {detail}"),
            SamplingError::Shape { op, detail } => write!(f, "{op}: shape mismatch: {detail}"),
        }
    }
}

impl std::error::Error for SamplingError {}

pub(crate) type Result<T> = std::result::Result<T, SamplingError>;
