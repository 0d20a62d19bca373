//! KV slabs in a backend's memory, and the forward pass's view of them.
//!
//! `PagedStorage<B>` is the pool's storage (`strata_kv::KvStorage`): one backend slab per
//! KV-owning layer, sized for the page plan. At the start of each step the pool's page
//! tables are flattened into slot lists, once per attention group (full and window pools
//! address different slots): the store slots of the batch's tokens and, per sequence, the
//! slots of the keys it can see. Every layer of the group reuses them, so a step uploads
//! its tables once, not once per layer.

use std::collections::HashMap;

use strata_kernels::{AttentionParams, Backend, KvSlabShape, PagedSeq};
use strata_kv::{KvError, KvLayout, KvPool, KvStorage, PagePlan, PoolKind};

use crate::batch::{ForwardBatch, ForwardOutput};
use crate::decode_graph::DecodeGraph;
use crate::error::{ModelError, Result};
use crate::forward::Prepared;
use crate::kv_cache::KvCache;
use crate::model::Model;

/// One attention group's tables for the current step.
pub(crate) struct GroupTables<B: Backend> {
    pub(crate) store: B::Index,
    pub(crate) batch: B::PagedBatch,
}

/// Slabs in `B`'s memory.
pub struct PagedStorage<B: Backend> {
    backend: B,
    slabs: Vec<B::KvSlab>,
    bytes: u64,
    /// What the slabs are sized for, to restore them when a new plan does not fit.
    pub(crate) current: Option<(KvLayout, PagePlan)>,
    pub(crate) full: Option<GroupTables<B>>,
    pub(crate) window: Option<GroupTables<B>>,
    /// Captured decode steps by batch-size bucket (they address these slabs).
    pub(crate) graphs: HashMap<usize, DecodeGraph<B>>,
    pub(crate) graphs_enabled: bool,
}

impl<B: Backend> PagedStorage<B> {
    pub fn new(backend: B) -> Self {
        Self {
            backend,
            slabs: Vec::new(),
            bytes: 0,
            current: None,
            full: None,
            window: None,
            graphs: HashMap::new(),
            // STRATA_CUDA_GRAPHS=0 runs decode op by op (for comparisons and debugging).
            graphs_enabled: std::env::var("STRATA_CUDA_GRAPHS").map_or(true, |v| v != "0"),
        }
    }

    /// Turns decode graphs on or off (on by default where the backend has them).
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs_enabled = on;
        if !on {
            self.graphs.clear();
        }
    }

    /// Decode graphs captured so far (one per batch-size bucket).
    pub fn graph_count(&self) -> usize {
        self.graphs.len()
    }

    /// The slab of slab id `i`, for checks.
    pub fn slab(&self, i: usize) -> Option<&B::KvSlab> {
        self.slabs.get(i)
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }
}

impl<B: Backend> PagedStorage<B> {
    fn allocate(&mut self, layout: &KvLayout, plan: &PagePlan) -> std::result::Result<(), KvError> {
        let mut bytes = 0;
        for s in layout.slabs() {
            let shape = KvSlabShape {
                format: s.format,
                num_kv_heads: s.num_kv_heads,
                head_dim: s.head_dim,
                // One slot past the plan's: the row padded graph batches write and read.
                slots: plan.slots(s.pool) + 1,
            };
            bytes += shape.bytes();
            let slab = self.backend.kv_slab(shape).map_err(|e| {
                KvError::Storage(format!(
                    "cannot allocate the {} slab of layer {} ({} bytes): {e}",
                    s.pool,
                    s.layer,
                    shape.bytes()
                ))
            })?;
            self.slabs.push(slab);
        }
        self.bytes = bytes;
        Ok(())
    }
}

impl<B: Backend> KvStorage for PagedStorage<B> {
    /// Frees the old slabs before allocating the new ones (a GPU rarely holds two pools at
    /// once); if the new plan does not fit, the old plan's slabs are allocated again, so
    /// the pool stays usable as the trait asks.
    fn reserve(&mut self, layout: &KvLayout, plan: &PagePlan) -> std::result::Result<(), KvError> {
        self.slabs.clear();
        self.bytes = 0;
        self.full = None;
        self.window = None;
        self.graphs.clear();
        match self.allocate(layout, plan) {
            Ok(()) => {
                self.current = Some((layout.clone(), *plan));
                Ok(())
            }
            Err(e) => {
                self.slabs.clear();
                if let Some((l, p)) = self.current.take() {
                    if self.allocate(&l, &p).is_ok() {
                        self.current = Some((l, p));
                    } else {
                        self.slabs.clear();
                    }
                }
                Err(e)
            }
        }
    }

    fn bytes_reserved(&self) -> u64 {
        self.bytes
    }
}

/// One group's tables on the host: store slots for every token, and per sequence its
/// queries and visible-key slots.
pub(crate) struct HostTables {
    pub(crate) store: Vec<u32>,
    pub(crate) seqs: Vec<PagedSeq>,
    pub(crate) slots: Vec<u32>,
}

/// Flattens the pool's page tables for `batch` in one group (`kind`, sliding `window`).
pub(crate) fn host_tables<B: Backend>(
    pool: &KvPool<PagedStorage<B>>,
    kind: PoolKind,
    window: Option<usize>,
    batch: &ForwardBatch,
) -> Result<HostTables> {
    let slot = |req, pos: usize| -> Result<u32> {
        let full = pool.slot(req, pos)?;
        Ok(match kind {
            PoolKind::Full => full,
            PoolKind::Window => pool
                .window_slot(full)
                .ok_or(KvError::WindowSlotReleased { position: pos })?,
        })
    };
    let mut t = HostTables {
        store: Vec::new(),
        seqs: Vec::with_capacity(batch.seqs.len()),
        slots: Vec::new(),
    };
    let mut q_offset = 0;
    for s in &batch.seqs {
        let end = s.start + s.tokens.len();
        for pos in s.start..end {
            t.store.push(slot(s.request, pos)?);
        }
        let k_start = window.map_or(0, |w| s.start.saturating_sub(w - 1));
        t.seqs.push(PagedSeq {
            q_offset,
            q_len: s.tokens.len(),
            q_start: s.start,
            k_start,
            slot_offset: t.slots.len(),
        });
        for pos in k_start..end {
            t.slots.push(slot(s.request, pos)?);
        }
        q_offset += s.tokens.len();
    }
    Ok(t)
}

fn group_tables<B: Backend>(
    pool: &KvPool<PagedStorage<B>>,
    b: &B,
    kind: PoolKind,
    window: Option<usize>,
    batch: &ForwardBatch,
) -> Result<GroupTables<B>> {
    let t = host_tables(pool, kind, window, batch)?;
    Ok(GroupTables {
        store: b.upload_index(&t.store)?,
        batch: b.paged_batch(&t.seqs, &t.slots)?,
    })
}

impl<B: Backend> KvCache<B> for KvPool<PagedStorage<B>> {
    #[allow(private_interfaces)]
    fn replay_decode(
        &mut self,
        model: &Model<B>,
        batch: &ForwardBatch,
        prep: &Prepared,
    ) -> Result<Option<ForwardOutput>> {
        crate::decode_graph::replay(self, model, batch, prep)
    }

    fn begin_step(&mut self, b: &B, batch: &ForwardBatch) -> Result<()> {
        let groups: Vec<_> = self
            .layout()
            .groups()
            .iter()
            .map(|g| (g.pool, g.window))
            .collect();
        let (mut full, mut window) = (None, None);
        for (kind, w) in groups {
            let t = group_tables(self, b, kind, w, batch)?;
            match kind {
                PoolKind::Full => full = Some(t),
                PoolKind::Window => window = Some(t),
            }
        }
        let st = self.storage_mut();
        st.full = full;
        st.window = window;
        Ok(())
    }

    fn store(
        &mut self,
        b: &B,
        layer: usize,
        _batch: &ForwardBatch,
        k: &B::Buffer,
        v: &B::Buffer,
    ) -> Result<()> {
        let map = *self.layout().layer(layer)?;
        if map.shared {
            return Ok(());
        }
        let st = self.storage_mut();
        let tables = match map.pool {
            PoolKind::Full => st.full.as_ref(),
            PoolKind::Window => st.window.as_ref(),
        }
        .ok_or_else(|| ModelError::Invalid("store before begin_step".into()))?;
        let slab = st
            .slabs
            .get_mut(map.slab.0)
            .ok_or_else(|| ModelError::Invalid(format!("no slab for layer {layer}")))?;
        b.kv_store(slab, k, v, &tables.store)?;
        Ok(())
    }

    fn attend(
        &mut self,
        b: &B,
        layer: usize,
        _batch: &ForwardBatch,
        q: &B::Buffer,
        p: AttentionParams,
        out: &mut B::Buffer,
    ) -> Result<()> {
        let map = *self.layout().layer(layer)?;
        let st = self.storage();
        let tables = match map.pool {
            PoolKind::Full => st.full.as_ref(),
            PoolKind::Window => st.window.as_ref(),
        }
        .ok_or_else(|| ModelError::Invalid("attention before begin_step".into()))?;
        let slab = st
            .slabs
            .get(map.slab.0)
            .ok_or_else(|| ModelError::Invalid(format!("no slab for layer {layer}")))?;
        b.paged_attention(q, slab, &tables.batch, p, out)?;
        Ok(())
    }
}
