//! The facade the scheduler and the model use: requests, their page tables, prefix reuse,
//! status, and rebuilding at run time.

mod audit;
mod host;
mod prefix;
mod requests;
mod status;

use std::collections::HashMap;

pub use host::KvWrite;
pub use status::{KvStatus, PoolStatus};

use crate::radix::{NodeId, RadixTree};
use crate::window_map::SlotPools;
use crate::{CacheType, KvError, KvLayout, KvStorage, PagePlan, PoolKind};

pub use strata_types::RequestId;

/// One request's pages. Pages `[0, borrowed)` belong to the radix cache (pinned through
/// `locked_node`); the rest belong to the request.
#[derive(Clone, Debug, Default)]
struct RequestPages {
    pages: Vec<u32>,
    /// Tokens with slots.
    len: usize,
    /// Tokens whose K/V is written and final: never truncated, and the next query is at or
    /// after this position.
    committed: usize,
    borrowed: usize,
    /// The first page whose window page the request still reads (holds a position its
    /// next query can see); it reads every page from here to its end.
    window_floor: usize,
    locked_node: Option<NodeId>,
}

impl RequestPages {
    /// Refuses (for `op`) a length `len` outside `committed..=len`: the lengths the
    /// request's end may move to.
    fn check_movable_end(&self, op: &'static str, len: usize) -> Result<(), KvError> {
        if len < self.committed || len > self.len {
            return Err(KvError::invalid(
                op,
                format!(
                    "length {len} is outside the request's committed {}..={} tokens",
                    self.committed, self.len
                ),
            ));
        }
        Ok(())
    }
}

/// Hits and misses of prefix reuse.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct CacheStats {
    hits: u64,
    misses: u64,
    hit_tokens: u64,
    lookup_tokens: u64,
    /// Hits that read a window page kept past a request's window.
    window_hits: u64,
    window_hit_tokens: u64,
}

/// Paged KV pool over a storage `S`.
///
/// Token slots are `page * page_size + offset` in the full pool. Sliding layers address the
/// window pool through [`full_to_window_mapping`](Self::full_to_window_mapping). All methods
/// return errors on misuse; none panics.
pub struct KvPool<S: KvStorage> {
    layout: KvLayout,
    plan: PagePlan,
    cache_type: CacheType,
    pools: SlotPools,
    tree: Option<RadixTree>,
    requests: HashMap<u64, RequestPages>,
    next_request: u64,
    stats: CacheStats,
    storage: S,
}

impl<S: KvStorage> KvPool<S> {
    /// Builds the pool: checks the plan, sizes `storage` for it, and starts with every page
    /// free.
    pub fn new(
        layout: KvLayout,
        plan: PagePlan,
        cache_type: CacheType,
        mut storage: S,
    ) -> Result<Self, KvError> {
        layout.check_plan(&plan)?;
        storage.reserve(&layout, &plan)?;
        let (pools, tree) = fresh_books(&layout, &plan, cache_type);
        Ok(KvPool {
            layout,
            plan,
            cache_type,
            pools,
            tree,
            requests: HashMap::new(),
            next_request: 0,
            stats: CacheStats::default(),
            storage,
        })
    }

    /// Builds the pool with the pages `budget_bytes` allows.
    pub fn with_budget(
        layout: KvLayout,
        budget_bytes: u64,
        page_size: usize,
        window_ratio: f64,
        cache_type: CacheType,
        storage: S,
    ) -> Result<Self, KvError> {
        let plan = layout.plan_pages(budget_bytes, page_size, window_ratio)?;
        KvPool::new(layout, plan, cache_type, storage)
    }

    /// Resizes the pool to `plan`. Refused while any request holds pages; drops the prefix
    /// cache (its page ids mean nothing in the new pool). If the storage cannot hold the
    /// new plan, the pool is left as it was.
    pub fn rebuild(&mut self, plan: PagePlan) -> Result<(), KvError> {
        if !self.requests.is_empty() {
            return Err(KvError::RequestsActive(self.requests.len()));
        }
        self.layout.check_plan(&plan)?;
        self.storage.reserve(&self.layout, &plan)?;
        let (pools, tree) = fresh_books(&self.layout, &plan, self.cache_type);
        self.pools = pools;
        self.tree = tree;
        self.plan = plan;
        Ok(())
    }

    /// Which slabs exist and which slab each layer reads.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// Pages per pool and the page size.
    pub fn plan(&self) -> &PagePlan {
        &self.plan
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.plan.page_size
    }

    /// Whether finished prefixes are kept for reuse.
    pub fn cache_type(&self) -> CacheType {
        self.cache_type
    }

    /// The K/V buffers.
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// Mutable access to the buffers (kernels write K/V through it). The bookkeeping does
    /// not depend on the bytes, so nothing here can break the pool's invariants.
    pub fn storage_mut(&mut self) -> &mut S {
        &mut self.storage
    }

    /// Free pages in `pool`.
    pub fn free_pages(&self, pool: PoolKind) -> usize {
        match pool {
            PoolKind::Full => self.pools.full.available(),
            PoolKind::Window => self.pools.window.available(),
        }
    }

    /// Window page of each full page, [`NO_PAGE`](crate::NO_PAGE) where there is none. A
    /// sliding layer's slot for full slot `s` is
    /// `map[s / page_size] * page_size + s % page_size`.
    pub fn full_to_window_mapping(&self) -> &[u32] {
        self.pools.mapping()
    }

    /// The window-pool slot of `full_slot`, if its window page still exists.
    pub fn window_slot(&self, full_slot: u32) -> Option<u32> {
        let ps = self.plan.page_size as u32;
        self.pools
            .window_of(full_slot / ps)
            .map(|w| w * ps + full_slot % ps)
    }
}

fn fresh_books(
    layout: &KvLayout,
    plan: &PagePlan,
    cache_type: CacheType,
) -> (SlotPools, Option<RadixTree>) {
    let has_window = layout.group(PoolKind::Window).is_some();
    let radix = cache_type == CacheType::Radix;
    let pools = SlotPools::new(plan.full, plan.window, has_window, radix);
    let tree = radix.then(|| RadixTree::new(plan.page_size, layout.window(), plan.full));
    (pools, tree)
}
