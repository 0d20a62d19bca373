//! The paged KV pool.
//!
//! Layers that own K/V get one slab each, grouped by attention type into a full-attention
//! pool and a sliding-window pool; KV-shared layers (Gemma-4 E2B/E4B) get no slab and read
//! their source's. The crate splits into:
//!
//! - layout and pricing ([`KvLayout`], [`PagePlan`]): pure functions of the model
//!   configuration and the KV format;
//! - page bookkeeping: free lists per pool, page tables per request, the full -> window
//!   page mapping;
//! - storage ([`KvStorage`]): where the bytes live, host memory ([`HostStorage`]) or a
//!   device;
//! - the radix prefix cache, correct for sliding-window layers;
//! - [`KvPool`], the facade the scheduler and the model call.

mod allocator;
mod cache_type;
mod dtype;
mod error;
pub mod fp8;
mod layout;
mod plan;
mod pool;
pub mod quant;
mod radix;
mod storage;
mod window_map;

pub use allocator::NO_PAGE;
pub use cache_type::CacheType;
pub use dtype::{KvCacheDtype, KvFormat, ModelDtype};
pub use error::KvError;
pub use layout::{
    slab_bytes_per_token, KvGroupLayout, KvLayout, LayerKv, PoolKind, SlabId, SlabLayout,
};
pub use plan::{PagePlan, DEFAULT_WINDOW_RATIO};
pub use pool::{KvPool, KvStatus, KvWrite, PoolStatus, RequestId};
pub use storage::{HostSlab, HostSlabMut, HostStorage, KvStorage, NullStorage};
