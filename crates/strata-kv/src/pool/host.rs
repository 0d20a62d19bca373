//! Host accessors for the CPU model: write and read one token's K/V by layer and full slot.

use super::KvPool;
use crate::{HostSlab, HostStorage, KvError, KvStorage, LayerKv, PoolKind};

/// What a write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvWrite {
    /// The K/V was written to the layer's slab.
    Stored,
    /// The layer is KV-shared: its source wrote the K/V in the same forward.
    SkippedSharedLayer,
}

impl<S: KvStorage> KvPool<S> {
    /// The slot that `layer` uses in its pool's slabs for `full_slot`: the slot itself for
    /// full attention, its window slot for sliding layers.
    pub fn storage_slot(&self, layer: &LayerKv, full_slot: u32) -> Result<usize, KvError> {
        let slots = self.plan.slots(PoolKind::Full);
        let page = full_slot as usize / self.plan.page_size;
        if full_slot as usize >= slots || self.pools.full.is_free(page as u32) {
            return Err(KvError::SlotOutOfRange {
                slot: full_slot as usize,
                slots,
            });
        }
        match layer.pool {
            PoolKind::Full => Ok(full_slot as usize),
            PoolKind::Window => {
                self.window_slot(full_slot)
                    .map(|s| s as usize)
                    .ok_or(KvError::WindowSlotReleased {
                        position: full_slot as usize,
                    })
            }
        }
    }
}

impl KvPool<HostStorage> {
    /// Quantizes and stores one token's K and V (`num_kv_heads * head_dim` values each) for
    /// `layer` at `full_slot`. A KV-shared layer stores nothing.
    pub fn write_kv(
        &mut self,
        layer: usize,
        full_slot: u32,
        k: &[f32],
        v: &[f32],
    ) -> Result<KvWrite, KvError> {
        let map = *self.layout.layer(layer)?;
        if map.shared {
            return Ok(KvWrite::SkippedSharedLayer);
        }
        let slot = self.storage_slot(&map, full_slot)?;
        self.storage.write_token(map.slab, slot, k, v)?;
        Ok(KvWrite::Stored)
    }

    /// Reads one token's K and V for `layer` at `full_slot`, dequantized to f32. A KV-shared
    /// layer reads its source's slab (and scales).
    pub fn read_kv(
        &self,
        layer: usize,
        full_slot: u32,
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<(), KvError> {
        let map = *self.layout.layer(layer)?;
        let slot = self.storage_slot(&map, full_slot)?;
        self.storage.read_token(map.slab, slot, k, v)
    }

    /// The raw slab `layer` reads (its source's, for a shared layer), for fast kernels.
    /// Slots of sliding layers are window slots (see `full_to_window_mapping`).
    pub fn layer_slab(&self, layer: usize) -> Result<HostSlab<'_>, KvError> {
        let map = self.layout.layer(layer)?;
        self.storage
            .slab(map.slab)
            .ok_or_else(|| KvError::invalid("layer", format!("no slab for layer {layer}")))
    }
}
