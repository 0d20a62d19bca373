//! Everything the pool can refuse, as values: misuse through the public API never panics.

use crate::PoolKind;

/// Why a pool operation was refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum KvError {
    /// Not enough free pages in one pool, even after evicting every unused cached prefix.
    /// Nothing was allocated.
    #[error("out of {pool} pages: need {needed}, {available} free after eviction")]
    OutOfPages {
        /// The pool that ran out.
        pool: PoolKind,
        /// Pages the operation needs.
        needed: usize,
        /// Pages free after evicting every unused cached prefix.
        available: usize,
    },
    /// No live request has this id.
    #[error("unknown request id {0}")]
    UnknownRequest(u64),
    /// `rebuild` while requests hold pages; holds how many do.
    #[error("the pool cannot be rebuilt while {0} request(s) hold pages")]
    RequestsActive(usize),
    /// A page size that is not a power of two up to 65,536 tokens.
    #[error("page size {0} is not a power of two between 1 and 65536")]
    InvalidPageSize(usize),
    /// A window pool ratio outside (0, 1].
    #[error("window pool ratio {0} is outside (0, 1]")]
    InvalidWindowRatio(f64),
    /// The KV budget cannot pay for the smallest usable pool.
    #[error("a budget of {budget} bytes is below the smallest usable pool ({minimum} bytes)")]
    BudgetTooSmall {
        /// The budget given, in bytes.
        budget: u64,
        /// Bytes of the smallest usable pool (one full page and one window page).
        minimum: u64,
    },
    /// A `--kv-cache-dtype` spelling no format has.
    #[error("unknown KV cache dtype {0:?}; expected auto, bf16, f16, f32, fp8_per_token_head or int8_per_token_head")]
    UnknownKvCacheDtype(String),
    /// A checkpoint dtype other than bfloat16, float16 or float32.
    #[error("unknown model dtype {0:?}; expected bfloat16, float16 or float32")]
    UnknownModelDtype(String),
    /// A `--cache-type` other than `radix` or `naive`.
    #[error("unknown cache type {0:?}; expected radix or naive")]
    UnknownCacheType(String),
    /// The model has no KV-owning layer, so there is nothing to lay out.
    #[error("the model has no layer that owns KV")]
    NoKvLayers,
    /// A layer index past the model's last layer.
    #[error("layer {layer} out of range: the model has {layers} layers")]
    UnknownLayer {
        /// The index asked for.
        layer: usize,
        /// Layers the model has.
        layers: usize,
    },
    /// An argument the operation cannot use (wrong length, unknown slab, a request in the
    /// wrong state).
    #[error("{what}: {reason}")]
    InvalidArgument {
        /// The operation or argument refused.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A sliding layer asked for a slot whose window page was already given back.
    #[error("position {position} has no window slot: it fell out of the sliding window")]
    WindowSlotReleased {
        /// The full-pool slot asked for.
        position: usize,
    },
    /// A slot past the end of the pool or slab, or on a page no request holds.
    #[error("full slot {slot} is outside the pool ({slots} slots)")]
    SlotOutOfRange {
        /// The slot asked for.
        slot: usize,
        /// Slots in the pool or slab.
        slots: usize,
    },
    /// The storage cannot hold the plan (a slab size that overflows).
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
