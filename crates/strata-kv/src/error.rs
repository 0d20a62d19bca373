//! Everything the pool can refuse, as values: misuse through the public API never panics.

use crate::PoolKind;

/// Why a pool operation was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum KvError {
    /// Not enough free pages in one pool, even after evicting every unused cached prefix.
    /// Nothing was allocated.
    #[error("out of {pool} pages: need {needed}, {available} free after eviction")]
    OutOfPages {
        pool: PoolKind,
        needed: usize,
        available: usize,
    },
    #[error("unknown request id {0}")]
    UnknownRequest(u64),
    #[error("the pool cannot be rebuilt while {0} request(s) hold pages")]
    RequestsActive(usize),
    #[error("page size {0} is not a power of two between 1 and 65536")]
    InvalidPageSize(usize),
    #[error("window pool ratio {0} is outside (0, 1]")]
    InvalidWindowRatio(f64),
    #[error("a budget of {budget} bytes is below the smallest usable pool ({minimum} bytes)")]
    BudgetTooSmall { budget: u64, minimum: u64 },
    #[error("unknown KV cache dtype {0:?}; expected auto, bf16, f16, f32, fp8_per_token_head or int8_per_token_head")]
    UnknownKvCacheDtype(String),
    #[error("unknown model dtype {0:?}; expected bfloat16, float16 or float32")]
    UnknownModelDtype(String),
    #[error("unknown cache type {0:?}; expected radix or naive")]
    UnknownCacheType(String),
    #[error("the model has no layer that owns KV")]
    NoKvLayers,
    #[error("layer {layer} out of range: the model has {layers} layers")]
    UnknownLayer { layer: usize, layers: usize },
    #[error("{what}: {reason}")]
    InvalidArgument { what: &'static str, reason: String },
    #[error("position {position} has no window slot: it fell out of the sliding window")]
    WindowSlotReleased { position: usize },
    #[error("full slot {slot} is outside the pool ({slots} slots)")]
    SlotOutOfRange { slot: usize, slots: usize },
    #[error("storage could not hold the pool: {0}")]
    Storage(String),
}

impl KvError {
    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Self {
        KvError::InvalidArgument {
            what,
            reason: reason.into(),
        }
    }
}
