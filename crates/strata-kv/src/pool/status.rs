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
    /// Pages held by the prefix cache (part of `pages_used`).
    pub pages_cached: usize,
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
                let (total, free, cached) = match g.pool {
                    PoolKind::Full => (self.plan.full, self.pools.full.available(), cached_full),
                    PoolKind::Window => (
                        self.plan.window,
                        self.pools.window.available(),
                        cached_window,
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
            bytes_reserved: self.storage.bytes_reserved(),
        }
    }
}
