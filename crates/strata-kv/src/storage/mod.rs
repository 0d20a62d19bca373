//! Where the slab bytes live. The pool's bookkeeping never reads or writes them; it only asks
//! the storage to size its buffers for a layout and a page plan.

mod host;
mod null;

pub use host::{HostSlab, HostSlabMut, HostStorage};
pub use null::NullStorage;

use crate::{KvError, KvLayout, PagePlan};

/// Buffers for every slab of a layout. Host memory is [`HostStorage`]; a device backend
/// implements this trait over its own allocations and hands the pool the result.
///
/// Per slab, the buffers hold `slots` token rows of `num_kv_heads * head_dim` elements for K
/// and for V (slot-major, then head, then element) and, for 8-bit formats, one f32 scale
/// per (slot, head) for K and for V. `slots` is the slab's pool's pages times the page size.
pub trait KvStorage {
    /// Sizes every slab for `plan`, discarding previous contents. On error the storage must
    /// keep its previous buffers so the pool stays usable.
    fn reserve(&mut self, layout: &KvLayout, plan: &PagePlan) -> Result<(), KvError>;

    /// Bytes currently held for values and scales.
    fn bytes_reserved(&self) -> u64;
}
