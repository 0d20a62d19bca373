//! KV slabs in a backend's memory, and the forward pass's view of them.
//!
//! `PagedStorage<B>` is the pool's storage (`strata_kv::KvStorage`): one backend slab per
//! KV-owning layer, sized for the page plan. At the start of each step the pool's page
//! tables are flattened into slot lists, once per attention group (full and window pools
//! address different slots): the store slots of the batch's tokens and, per sequence, the
//! slots of the keys it can see. Every layer of the group reuses them, so a step uploads
//! its tables once, not once per layer.

use std::collections::HashMap;

use strata_kernels::{
    expand_page_slots, AttentionParams, Backend, KvSlabShape, PagedSeq, QkvPrep, RopeAt,
};
use strata_kv::{KvError, KvLayout, KvPool, KvStorage, PagePlan, PoolKind, NO_PAGE};

use crate::batch::ForwardBatch;
use crate::decode_graph::DecodeGraph;
use crate::error::{ModelError, Result};
use crate::forward::Prepared;
use crate::greedy_rows::GreedyRows;
use crate::kv_cache::KvCache;
use crate::launch::Launched;
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
    pub(crate) graphs: HashMap<crate::decode_graph::GraphKey, DecodeGraph<B>>,
    /// The `[rows, vocab]` logits buffers captured steps write, shared by the graphs:
    /// replays run one after another on the stream and each step's logits are read
    /// (argmax, draws, copies) before the next replay is queued. New captures take the
    /// last; an earlier one (outgrown) stays while a graph captured on it does.
    pub(crate) graph_logits: Vec<Option<B::Buffer>>,
    /// Draft rounds captured as graphs, by (sequences, steps).
    pub(crate) draft_graphs: HashMap<(usize, usize), crate::draft_graph::DraftGraph<B>>,
    pub(crate) graph_mode: DecodeGraphs,
}

/// How decode-only steps run: `STRATA_CUDA_GRAPHS` ([`strata_kernels::CudaTuning`]) or
/// [`PagedStorage::set_graph_mode`].
pub use strata_kernels::DecodeGraphs;

impl<B: Backend> PagedStorage<B> {
    /// Storage with no slabs yet (the pool sizes them); decode graphs as `STRATA_CUDA_GRAPHS`
    /// says.
    pub fn new(backend: B) -> Self {
        Self {
            backend,
            slabs: Vec::new(),
            bytes: 0,
            current: None,
            full: None,
            window: None,
            graphs: HashMap::new(),
            graph_logits: Vec::new(),
            draft_graphs: HashMap::new(),
            graph_mode: strata_kernels::CudaTuning::get().cuda_graphs,
        }
    }

    /// Turns decode graphs on or off (on by default where the backend has them).
    pub fn set_graphs(&mut self, on: bool) {
        self.set_graph_mode(if on {
            DecodeGraphs::Replay
        } else {
            DecodeGraphs::Off
        });
    }

    /// How decode-only steps run from now on (drops captured graphs unless replaying).
    pub fn set_graph_mode(&mut self, mode: DecodeGraphs) {
        self.graph_mode = mode;
        if mode != DecodeGraphs::Replay {
            self.graphs.clear();
            self.graph_logits.clear();
            self.draft_graphs.clear();
        }
    }

    /// Drops every captured graph (they hold the addresses of the weights they were
    /// captured with: a weight update makes them stale); later steps capture anew.
    pub fn forget_graphs(&mut self) {
        self.graphs.clear();
        self.graph_logits.clear();
        self.draft_graphs.clear();
    }

    /// Decode graphs captured so far (one per batch-size bucket).
    pub fn graph_count(&self) -> usize {
        self.graphs.len()
    }

    /// Draft rounds captured as graphs.
    pub fn draft_graph_count(&self) -> usize {
        self.draft_graphs.len()
    }

    /// The slab of slab id `i`, for checks.
    pub fn slab(&self, i: usize) -> Option<&B::KvSlab> {
        self.slabs.get(i)
    }

    /// The backend the slabs live on.
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
                // A page past the plan's: the rows padded graph batches write and read (a
                // verification's pad of `q` tokens takes `q` of its slots).
                slots: plan.slots(s.pool) + plan.page_size,
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
        self.graph_logits.clear();
        self.draft_graphs.clear();
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

/// The group's page holding full-pool page `full_page` (the window pool's, through `map`);
/// `position` names the first key asked for in it, for the error when the window has
/// released it.
fn group_page(window_of: Option<&[u32]>, full_page: u32, position: usize) -> Result<u32> {
    match window_of {
        None => Ok(full_page),
        Some(map) => match map.get(full_page as usize) {
            Some(&w) if w != NO_PAGE => Ok(w),
            _ => Err(KvError::WindowSlotReleased { position }.into()),
        },
    }
}

/// Appends the slots of `positions` (all below the request's length) to `out`, a page at a
/// time: one page-table read per page instead of a lookup per position.
fn push_slots(
    out: &mut Vec<u32>,
    pages: &[u32],
    window_of: Option<&[u32]>,
    page_size: usize,
    positions: std::ops::Range<usize>,
) -> Result<()> {
    let mut pos = positions.start;
    while pos < positions.end {
        let (page, off) = (pos / page_size, pos % page_size);
        let n = (page_size - off).min(positions.end - pos);
        let page_id = group_page(window_of, pages[page], pos)?;
        let base = page_id * page_size as u32 + off as u32;
        out.extend(base..base + n as u32);
        pos += n;
    }
    Ok(())
}

/// Flattens the pool's page tables for `batch` in one group (`kind`, sliding `window`):
/// the same slots as [`KvPool::slot`] / [`KvPool::window_slot`] per position, expanded from
/// [`host_pages`].
pub(crate) fn host_tables<B: Backend>(
    pool: &KvPool<PagedStorage<B>>,
    kind: PoolKind,
    window: Option<usize>,
    batch: &ForwardBatch,
) -> Result<HostTables> {
    let p = host_pages(pool, kind, window, batch)?;
    let slots = expand_page_slots(&p.seqs, &p.pages, &p.page_start, pool.plan().page_size)?;
    Ok(HostTables {
        store: p.store,
        seqs: p.seqs,
        slots,
    })
}

/// A group's step as pages (what a replayed decode step uploads): the K/V store slots, the
/// sequences, and each sequence's pages over its keys (`page_start[i]` indexes `pages`),
/// which the backend expands into the slot table ([`Backend::paged_batch_update_pages`]).
pub(crate) struct HostPages {
    pub(crate) store: Vec<u32>,
    pub(crate) seqs: Vec<PagedSeq>,
    pub(crate) pages: Vec<u32>,
    pub(crate) page_start: Vec<u32>,
    /// Keys of all sequences (the slot table's length).
    pub(crate) keys: usize,
}

/// The pool's page tables for `batch` in one group (`kind`, sliding `window`) as pages: each
/// sequence's page ids over its visible keys, which [`host_tables`] (or a device backend)
/// expands into a slot a key (at 112 decode rows and depth 768, about 9,000 values against
/// 143,000).
pub(crate) fn host_pages<B: Backend>(
    pool: &KvPool<PagedStorage<B>>,
    kind: PoolKind,
    window: Option<usize>,
    batch: &ForwardBatch,
) -> Result<HostPages> {
    let page_size = pool.plan().page_size;
    let window_of = match kind {
        PoolKind::Full => None,
        PoolKind::Window => Some(pool.full_to_window_mapping()),
    };
    let rows: usize = batch.seqs.iter().map(|s| s.tokens.len()).sum();
    let mut t = HostPages {
        store: Vec::with_capacity(rows),
        seqs: Vec::with_capacity(batch.seqs.len()),
        pages: Vec::new(),
        page_start: Vec::with_capacity(batch.seqs.len()),
        keys: 0,
    };
    let mut q_offset = 0;
    for s in &batch.seqs {
        let end = s.start + s.tokens.len();
        // The last position's slot exists (the request is known and long enough), so every
        // earlier one does.
        pool.slot(s.request, end - 1)?;
        let pages = pool.page_table(s.request)?;
        push_slots(&mut t.store, pages, window_of, page_size, s.start..end)?;
        let k_start = window.map_or(0, |w| s.start.saturating_sub(w - 1));
        t.seqs.push(PagedSeq {
            q_offset,
            q_len: s.tokens.len(),
            q_start: s.start,
            k_start,
            slot_offset: t.keys,
        });
        t.page_start.push(t.pages.len() as u32);
        let first = k_start / page_size;
        for (i, &full_page) in pages[first..end.div_ceil(page_size)].iter().enumerate() {
            let position = ((first + i) * page_size).max(k_start);
            t.pages.push(group_page(window_of, full_page, position)?);
        }
        t.keys += end - k_start;
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

/// Where a layer's K/V goes this step (a trait because the pool's type is `strata-kv`'s).
trait StoreTarget<B: Backend> {
    /// The slab of KV-owning `layer` and this step's slot a token; `None` for a KV-shared
    /// layer, which stores nothing.
    #[allow(clippy::type_complexity)]
    fn store_target(&mut self, layer: usize) -> Result<Option<(&mut B::KvSlab, &B::Index)>>;
}

impl<B: Backend> StoreTarget<B> for KvPool<PagedStorage<B>> {
    fn store_target(&mut self, layer: usize) -> Result<Option<(&mut B::KvSlab, &B::Index)>> {
        let map = *self.layout().layer(layer)?;
        if map.shared {
            return Ok(None);
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
        Ok(Some((slab, &tables.store)))
    }
}

impl<B: Backend> KvCache<B> for KvPool<PagedStorage<B>> {
    #[allow(private_interfaces)]
    fn replay_decode(
        &mut self,
        model: &Model<B>,
        batch: &ForwardBatch,
        prep: &Prepared,
        fed: Option<&B::Tokens>,
    ) -> Result<Option<Launched<B>>> {
        crate::decode_graph::replay(self, model, batch, prep, fed)
    }

    fn draft_round(
        &mut self,
        assistant: &crate::Assistant<B>,
        target: &Model<B>,
        seqs: &[crate::DraftSeq],
        tokens: &[u32],
        hidden: &B::Buffer,
        steps: usize,
    ) -> Result<Option<Vec<Vec<u32>>>> {
        crate::draft_graph::draft_round(self, assistant, target, seqs, tokens, hidden, steps)
    }

    #[allow(private_interfaces)]
    fn replay_rows(
        &mut self,
        model: &Model<B>,
        batch: &ForwardBatch,
        prep: &Prepared,
        choices: crate::greedy_rows::RowChoices,
    ) -> Result<Option<GreedyRows<B>>> {
        crate::decode_graph::replay_rows(self, model, batch, prep, choices)
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
        if let Some((slab, slots)) = self.store_target(layer)? {
            b.kv_store(slab, k, v, slots)?;
        }
        Ok(())
    }

    fn prepare_and_store(
        &mut self,
        b: &B,
        layer: usize,
        _batch: &ForwardBatch,
        [q, k, v]: [&mut B::Buffer; 3],
        norms: [&B::Buffer; 2],
        at: RopeAt<'_, B>,
        prep: QkvPrep,
    ) -> Result<()> {
        match self.store_target(layer)? {
            Some(target) => b.qkv_norm_rope_store_idx([q, k, v], norms, at, prep, target)?,
            None => b.qkv_norm_rope_idx([q, k, v], norms, at, prep)?,
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{LogitsMode, SeqChunk};
    use strata_kernels::cpu::CpuBackend;
    use strata_kv::{CacheType, KvCacheDtype};

    /// The tables as the per-position API defines them.
    fn reference(
        pool: &KvPool<PagedStorage<CpuBackend>>,
        kind: PoolKind,
        window: Option<usize>,
        batch: &ForwardBatch,
    ) -> (Vec<u32>, Vec<u32>) {
        let slot = |req, pos| {
            let full = pool.slot(req, pos).unwrap();
            match kind {
                PoolKind::Full => full,
                PoolKind::Window => pool.window_slot(full).unwrap(),
            }
        };
        let (mut store, mut slots) = (vec![], vec![]);
        for s in &batch.seqs {
            let end = s.start + s.tokens.len();
            store.extend((s.start..end).map(|p| slot(s.request, p)));
            let k_start = window.map_or(0, |w| s.start.saturating_sub(w - 1));
            slots.extend((k_start..end).map(|p| slot(s.request, p)));
        }
        (store, slots)
    }

    /// Page-wise flattening equals the per-position slots for both attention groups, with
    /// window pages of old positions already released, decode rows and an extend chunk, and
    /// page-straddling ranges; a chunk past the request's tokens is an error.
    #[test]
    fn page_wise_tables_equal_the_per_position_slots() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/configs/gemma-4-e2b.json"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let cfg = strata_config::ModelConfig::from_hf_json(&text).unwrap();
        let layout = KvLayout::for_config(&cfg, KvCacheDtype::Bf16).unwrap();
        let plan = PagePlan {
            full: 160,
            window: 120,
            page_size: 16,
        };
        let storage = PagedStorage::new(CpuBackend::new());
        let mut pool = KvPool::new(layout, plan, CacheType::Naive, storage).unwrap();
        let (a, b, c) = (
            pool.alloc_request(),
            pool.alloc_request(),
            pool.alloc_request(),
        );
        pool.extend(a, 1301).unwrap();
        pool.commit(a, 1300).unwrap();
        pool.extend(b, 45).unwrap();
        pool.commit(b, 30).unwrap();
        pool.extend(c, 1).unwrap();
        let chunk = |request, start, n| SeqChunk {
            request,
            tokens: vec![0; n],
            start,
            logits: LogitsMode::Last,
        };
        let batch = ForwardBatch {
            embeds: Vec::new(),
            seqs: vec![chunk(a, 1300, 1), chunk(b, 30, 15), chunk(c, 0, 1)],
            adjust: Vec::new(),
            masked: Vec::new(),
            adapters: Vec::new(),
        };
        let groups: Vec<_> = pool
            .layout()
            .groups()
            .iter()
            .map(|g| (g.pool, g.window))
            .collect();
        assert_eq!(groups.len(), 2, "E2B has a full and a sliding group");
        for (kind, window) in groups {
            let got = host_tables(&pool, kind, window, &batch).unwrap();
            let (store, slots) = reference(&pool, kind, window, &batch);
            assert_eq!(got.store, store, "{kind:?} store slots");
            assert_eq!(got.slots, slots, "{kind:?} key slots");
            assert_eq!(got.seqs.len(), 3);
            assert_eq!(got.seqs[1].slot_offset, got.seqs[0].k_len());
            // The same step as pages expands to the same slots (what a replay uploads).
            let pages = host_pages(&pool, kind, window, &batch).unwrap();
            assert_eq!(pages.store, store, "{kind:?} store slots from pages");
            assert_eq!(pages.seqs, got.seqs, "{kind:?} sequences from pages");
            assert_eq!(pages.keys, slots.len());
            let expanded =
                strata_kernels::expand_page_slots(&pages.seqs, &pages.pages, &pages.page_start, 16)
                    .unwrap();
            assert_eq!(expanded, slots, "{kind:?} key slots from pages");
            assert!(
                pages.pages.len() * 8 < slots.len(),
                "a page id a page, not a slot a key"
            );
        }
        let past = ForwardBatch {
            embeds: Vec::new(),
            seqs: vec![chunk(b, 40, 6)],
            adjust: Vec::new(),
            masked: Vec::new(),
            adapters: Vec::new(),
        };
        assert!(host_tables(&pool, PoolKind::Full, None, &past).is_err());
        assert!(host_pages(&pool, PoolKind::Full, None, &past).is_err());
    }
}
