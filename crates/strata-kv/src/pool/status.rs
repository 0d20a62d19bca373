//! Figures for `/v1/cache/status` and `/metrics`.

use serde::Serialize;
use strata_config::AttentionType;

use super::KvPool;
use crate::{CacheType, KvCacheDtype, KvStorage, PoolKind};

/// One pool's pages.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolStatus {
    /// Which pool.
    pub pool: PoolKind,
    /// The attention type of the layers using it.
    pub attention: AttentionType,
    /// The sliding window in tokens; `None` for the full pool.
    pub window: Option<usize>,
    /// Bytes one token costs across the pool's slabs.
    pub unit_bytes: usize,
    /// Pages in the pool.
    pub pages_total: usize,
    /// Pages no request or cached prefix holds.
    pub pages_free: usize,
    /// Pages held by requests or the prefix cache.
    pub pages_used: usize,
    /// Pages held by the prefix cache (part of `pages_used`). For the window pool: the
    /// window pages of cached prefixes, out-of-window ones included.
    pub pages_cached: usize,
    /// Pages the pool can take back on demand without touching a running request's
    /// window: for the window pool, the idle window pages (of cached prefixes and of
    /// positions running requests have moved past); for the full pool, `pages_cached`
    /// (an upper bound: pinned prefixes are counted too).
    pub pages_evictable: usize,
}

/// Pool-wide figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KvStatus {
    /// The `--kv-cache-dtype` the stored format corresponds to.
    pub kv_cache_dtype: KvCacheDtype,
    /// Whether finished prefixes are kept for reuse.
    pub cache_type: CacheType,
    /// Tokens per page.
    pub page_size: usize,
    /// One entry per pool the model uses.
    pub pools: Vec<PoolStatus>,
    /// Requests holding pages.
    pub running_requests: usize,
    /// Tokens held by the prefix cache.
    pub cached_tokens: usize,
    /// Prefix lookups that reused at least one token.
    pub cache_hits: u64,
    /// Prefix lookups that reused nothing (every lookup when the cache is off).
    pub cache_misses: u64,
    /// Prompt tokens served from the cache, and prompt tokens looked up.
    pub hit_tokens: u64,
    /// Prompt tokens looked up in the prefix cache.
    pub lookup_tokens: u64,
    /// Window pages kept after their positions left a running request's window (cached
    /// prefixes' and running requests' alike): what lets a request diverging from a
    /// cached prompt well before its end still hit.
    pub window_pages_past_window: usize,
    /// Hits that read at least one of those pages.
    pub window_hits: u64,
    /// Tokens those hits served.
    pub window_hit_tokens: u64,
    /// Idle window pages evicted to make room.
    pub window_pages_evicted: u64,
    /// Bytes the storage holds for the K/V buffers.
    pub bytes_reserved: u64,
}

impl<S: KvStorage> KvPool<S> {
    /// The pool's current figures.
    pub fn status(&self) -> KvStatus {
        let (cached_full, cached_window) = self.tree.as_ref().map_or((0, 0), |t| {
            t.nodes().fold((0, 0), |(f, w), (_, n)| {
                (f + n.pages.len(), w + n.window_pages)
            })
        });
        let pools = self
            .layout
            .groups()
            .iter()
            .map(|g| {
                let (total, free, cached, evictable) = match g.pool {
                    PoolKind::Full => (
                        self.plan.full,
                        self.pools.full.available(),
                        cached_full,
                        cached_full,
                    ),
                    PoolKind::Window => (
                        self.plan.window,
                        self.pools.window.available(),
                        cached_window,
                        self.pools.idle_pages(),
                    ),
                };
                PoolStatus {
                    pool: g.pool,
                    attention: g.attention,
                    window: g.window,
                    unit_bytes: g.unit_bytes,
                    pages_total: total,
                    pages_free: free,
                    pages_used: total - free,
                    pages_cached: cached,
                    pages_evictable: evictable,
                }
            })
            .collect();
        KvStatus {
            kv_cache_dtype: self.layout.format().cache_dtype(),
            cache_type: self.cache_type,
            page_size: self.plan.page_size,
            pools,
            running_requests: self.requests.len(),
            cached_tokens: self.tree.as_ref().map_or(0, |t| t.cached_tokens()),
            cache_hits: self.stats.hits,
            cache_misses: self.stats.misses,
            hit_tokens: self.stats.hit_tokens,
            lookup_tokens: self.stats.lookup_tokens,
            window_pages_past_window: self.pools.past_window_pages(),
            window_hits: self.stats.window_hits,
            window_hit_tokens: self.stats.window_hit_tokens,
            window_pages_evicted: self.pools.evicted_pages(),
            bytes_reserved: self.storage.bytes_reserved(),
        }
    }
}
