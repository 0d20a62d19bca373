//! Random sequences of pool operations: the bookkeeping audit passes after every step, every
//! readable slot holds the K/V of the token and position it claims (so no page is read
//! after being freed and handed to another request), the window pool's pages add up
//! (free + read by running requests + idle == total, the read ones recomputed here from the
//! page tables), a request diverging from a cached prefix before any eviction hits at the
//! last page boundary before the divergence, and once everything is released the pool is
//! full again.

mod common;

use proptest::prelude::*;
use strata_config::ModelConfig;
use strata_kv::{
    CacheType, HostStorage, KvCacheDtype, KvError, KvLayout, KvPool, ModelDtype, PagePlan,
    PoolKind, RequestId,
};

#[derive(Clone, Debug)]
enum Op {
    /// New request on conversation `base`: its first `len` tokens, then `suffix`; with
    /// `reuse`, it first takes the longest cached prefix.
    Start {
        base: u32,
        len: usize,
        suffix: Vec<u32>,
        reuse: bool,
    },
    /// Next turn of an earlier request that was cached: its tokens plus `extra`, reused.
    NextTurn {
        earlier: usize,
        extra: usize,
    },
    Extend {
        req: usize,
        n: usize,
    },
    Commit {
        req: usize,
    },
    Truncate {
        req: usize,
        by: usize,
    },
    Cache {
        req: usize,
    },
    Release {
        req: usize,
        cache: bool,
    },
    Evict {
        pages: usize,
    },
    /// A request sharing the first `at` tokens of an earlier cached sequence, then
    /// different ones (a shared system prompt, then another question).
    Diverge {
        earlier: usize,
        at: usize,
        extra: usize,
    },
    Flush,
    /// Computes the rest of a request's prompt in chunks, committing after each (as the
    /// scheduler's chunked prefill does), if the pool has room.
    Prefill {
        req: usize,
        chunk: usize,
    },
    Rebuild {
        full: usize,
        window: usize,
        page_size_log2: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    // Few conversations, so prompts share long prefixes with what earlier requests cached.
    let start = (
        0u32..3,
        0usize..48,
        prop::collection::vec(0u32..3, 0..3),
        any::<bool>(),
    );
    prop_oneof![
        3 => start.prop_map(|(base, len, suffix, reuse)| Op::Start { base, len, suffix, reuse }),
        2 => (0usize..8, 0usize..6).prop_map(|(earlier, extra)| Op::NextTurn { earlier, extra }),
        6 => (0usize..4, 1usize..10).prop_map(|(req, n)| Op::Extend { req, n }),
        4 => (0usize..4).prop_map(|req| Op::Commit { req }),
        1 => (0usize..4, 1usize..6).prop_map(|(req, by)| Op::Truncate { req, by }),
        2 => (0usize..4).prop_map(|req| Op::Cache { req }),
        3 => (0usize..4, any::<bool>()).prop_map(|(req, cache)| Op::Release { req, cache }),
        1 => (0usize..12).prop_map(|pages| Op::Evict { pages }),
        3 => (0usize..8, 0usize..40, 1usize..4)
            .prop_map(|(earlier, at, extra)| Op::Diverge { earlier, at, extra }),
        1 => Just(Op::Flush),
        3 => (0usize..4, 1usize..12).prop_map(|(req, chunk)| Op::Prefill { req, chunk }),
        1 => (6usize..40, 4usize..24, 0u32..3)
            .prop_map(|(full, window, page_size_log2)| Op::Rebuild { full, window, page_size_log2 }),
    ]
}

/// Token `pos` of conversation `base`.
fn base_token(base: u32, pos: usize) -> u32 {
    (base * 7 + (pos as u32 * pos as u32) % 11) % 13
}

struct Running {
    id: RequestId,
    base: u32,
    /// Tokens with slots, then the prompt tokens still to compute.
    tokens: Vec<u32>,
    pending: Vec<u32>,
}

fn value(token: u32, position: usize, layer: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|e| (token as usize * 100_000 + position * 100 + layer * 4 + e % 4) as f32)
        .collect()
}

struct Harness {
    cfg: ModelConfig,
    pool: KvPool<HostStorage>,
    running: Vec<Running>,
    /// Token sequences handed to the cache, for later turns.
    history: Vec<(u32, Vec<u32>)>,
    /// Whether anything was ever evicted or dropped from the cache (full or window pages,
    /// a flush, a rebuild): until then every cached page keeps its window page.
    evicted: bool,
    /// Tokens no conversation uses, so a diverging request shares exactly what it copies.
    fresh_token: u32,
}

impl Harness {
    fn new(window: usize, page_size: usize, cache: CacheType, roomy: bool) -> Self {
        let cfg = common::tiny(window);
        let layout = KvLayout::new(&cfg, KvCacheDtype::F32, ModelDtype::F32).unwrap();
        let scale = if roomy { 8 } else { 1 };
        let plan = PagePlan {
            full: 32 * scale,
            window: 24 * scale,
            page_size,
        };
        let pool = KvPool::new(layout, plan, cache, HostStorage::new()).unwrap();
        Harness {
            cfg,
            pool,
            running: Vec::new(),
            history: Vec::new(),
            evicted: false,
            fresh_token: 1000,
        }
    }

    fn write(&mut self, r: usize, pos: usize) {
        let (id, token) = (self.running[r].id, self.running[r].tokens[pos]);
        let slot = self.pool.slot(id, pos).unwrap();
        for (l, layer) in self.cfg.layers.iter().enumerate() {
            let kv = value(token, pos, l, layer.num_kv_heads * layer.head_dim);
            self.pool.write_kv(l, slot, &kv, &kv).unwrap();
        }
    }

    fn start(&mut self, base: u32, prompt: Vec<u32>, reuse: bool) -> usize {
        let id = self.pool.alloc_request();
        let reused = if reuse {
            self.pool.reuse_prefix(id, &prompt).unwrap()
        } else {
            0
        };
        assert!(reused <= prompt.len());
        assert_eq!(self.pool.seq_len(id).unwrap(), reused);
        self.running.push(Running {
            id,
            base,
            tokens: prompt[..reused].to_vec(),
            pending: prompt[reused..].to_vec(),
        });
        reused
    }

    fn apply(&mut self, op: Op) {
        let before = self.pool.status();
        self.apply_op(op);
        let after = self.pool.status();
        if after.cached_tokens < before.cached_tokens
            || after.window_pages_evicted > before.window_pages_evicted
        {
            self.evicted = true;
        }
    }

    fn apply_op(&mut self, op: Op) {
        match op {
            Op::Diverge { earlier, at, extra } => {
                if self.history.is_empty() {
                    return;
                }
                let (base, cached) = self.history[earlier % self.history.len()].clone();
                let at = at.min(cached.len());
                let mut prompt = cached[..at].to_vec();
                for _ in 0..extra {
                    prompt.push(self.fresh_token);
                    self.fresh_token += 1;
                }
                let exact = self.pool.cache_type() == CacheType::Radix && !self.evicted;
                let reused = self.start(base, prompt, true);
                if exact {
                    // Every window page of the cached prefix is still there: the hit
                    // ends at the last page boundary before the divergence.
                    let ps = self.pool.page_size();
                    assert_eq!(reused, at / ps * ps, "diverging at {at} of {cached:?}");
                }
            }
            Op::Prefill { req, chunk } => {
                let idx = req % self.running.len().max(1);
                while self.running.get(idx).is_some_and(|r| !r.pending.is_empty()) {
                    let r = &mut self.running[idx];
                    let n = chunk.min(r.pending.len());
                    let Ok(range) = self.pool.extend(r.id, n) else {
                        return;
                    };
                    r.tokens.extend(r.pending.drain(..n));
                    for pos in range.clone() {
                        self.write(idx, pos);
                    }
                    self.pool.commit(self.running[idx].id, range.end).unwrap();
                }
            }
            Op::Flush => {
                self.pool.flush_cache();
                self.evicted = true;
            }
            Op::NextTurn { earlier, extra } => {
                if self.history.is_empty() {
                    return;
                }
                let (base, mut prompt) = self.history[earlier % self.history.len()].clone();
                let at = prompt.len();
                prompt.extend((at..at + extra).map(|p| base_token(base + 1, p)));
                self.start(base, prompt, true);
            }
            Op::Start {
                base,
                len,
                suffix,
                reuse,
            } => {
                let mut prompt: Vec<u32> = (0..len).map(|p| base_token(base, p)).collect();
                prompt.extend(suffix);
                self.start(base, prompt, reuse);
            }
            Op::Extend { req, n } => {
                let idx = req % self.running.len().max(1);
                let Some(r) = self.running.get_mut(idx) else {
                    return;
                };
                let id = r.id;
                match self.pool.extend(id, n) {
                    Ok(range) => {
                        for _ in range.clone() {
                            let t = if r.pending.is_empty() {
                                base_token(r.base, r.tokens.len())
                            } else {
                                r.pending.remove(0)
                            };
                            r.tokens.push(t);
                        }
                        for pos in range {
                            self.write(idx, pos);
                        }
                    }
                    Err(KvError::OutOfPages { .. }) => {}
                    Err(e) => panic!("extend: {e}"),
                }
            }
            Op::Commit { req } => {
                let Some(r) = self.running.get(req % self.running.len().max(1)) else {
                    return;
                };
                self.pool.commit(r.id, r.tokens.len()).unwrap();
            }
            Op::Truncate { req, by } => {
                let idx = req % self.running.len().max(1);
                let Some(r) = self.running.get_mut(idx) else {
                    return;
                };
                let committed = self.pool.committed_len(r.id).unwrap();
                let len = r.tokens.len().saturating_sub(by).max(committed);
                self.pool.truncate(r.id, len).unwrap();
                let dropped = r.tokens.split_off(len);
                r.pending.splice(0..0, dropped);
            }
            Op::Cache { req } => {
                let Some(r) = self.running.get(req % self.running.len().max(1)) else {
                    return;
                };
                let got = self.pool.cache_prefix(r.id, &r.tokens).unwrap();
                assert!(got <= self.pool.committed_len(r.id).unwrap());
                self.history.push((r.base, r.tokens[..got].to_vec()));
            }
            Op::Release { req, cache } => {
                if self.running.is_empty() {
                    return;
                }
                let r = self.running.remove(req % self.running.len());
                if cache {
                    let got = self.pool.cache_prefix(r.id, &r.tokens).unwrap();
                    self.history.push((r.base, r.tokens[..got].to_vec()));
                }
                self.pool.release(r.id).unwrap();
            }
            Op::Evict { pages } => {
                self.pool.evict(pages);
            }
            Op::Rebuild {
                full,
                window,
                page_size_log2,
            } => {
                let plan = PagePlan {
                    full,
                    window,
                    page_size: 1 << page_size_log2,
                };
                let result = self.pool.rebuild(plan);
                self.evicted |= result.is_ok();
                if self.running.is_empty() {
                    result.unwrap();
                    assert_eq!(self.pool.free_pages(PoolKind::Full), full);
                    assert_eq!(self.pool.free_pages(PoolKind::Window), window);
                } else {
                    assert_eq!(result, Err(KvError::RequestsActive(self.running.len())));
                }
            }
        }
    }

    /// Every position a running request can still attend to reads back the K/V written
    /// for its token and position, through every layer (shared ones included).
    fn check_contents(&self) {
        let window = self.pool.layout().window().unwrap();
        for r in &self.running {
            let committed = self.pool.committed_len(r.id).unwrap();
            assert_eq!(self.pool.seq_len(r.id).unwrap(), r.tokens.len());
            for (pos, &token) in r.tokens.iter().enumerate() {
                let slot = self.pool.slot(r.id, pos).unwrap();
                let sliding_visible = pos + window > committed;
                for (l, layer) in self.cfg.layers.iter().enumerate() {
                    if layer.window.is_some() && !sliding_visible {
                        continue;
                    }
                    let n = layer.num_kv_heads * layer.head_dim;
                    let (mut k, mut v) = (vec![0.0; n], vec![0.0; n]);
                    self.pool.read_kv(l, slot, &mut k, &mut v).unwrap();
                    let want = value(token, pos, self.cfg.kv_layer_for(l), n);
                    assert_eq!(k, want, "request {:?} position {pos} layer {l}", r.id);
                    assert_eq!(v, want);
                }
            }
        }
    }

    /// Window pages: free + read + idle == total, where the read ones are recomputed from
    /// the running requests' page tables: a request reads the pages holding positions its
    /// next query can see (`> committed - window`) and every page after them.
    fn check_window_accounting(&self) {
        let window = self.pool.layout().window().unwrap();
        let ps = self.pool.page_size();
        let mut read = std::collections::HashSet::new();
        for r in &self.running {
            let committed = self.pool.committed_len(r.id).unwrap();
            let floor = (committed + 1).saturating_sub(window) / ps;
            read.extend(self.pool.page_table(r.id).unwrap()[floor..].iter().copied());
        }
        let status = self.pool.status();
        let w = &status.pools[1];
        assert_eq!(w.pool, PoolKind::Window);
        assert_eq!(
            w.pages_free + w.pages_evictable + read.len(),
            w.pages_total,
            "{w:?}"
        );
        assert!(w.pages_cached <= w.pages_used);
        if self.pool.cache_type() == CacheType::Naive {
            assert_eq!(w.pages_evictable, 0);
        }
    }

    fn drain(&mut self) {
        for r in std::mem::take(&mut self.running) {
            self.pool.release(r.id).unwrap();
        }
        self.pool.flush_cache();
        self.pool.audit().unwrap();
        let plan = *self.pool.plan();
        assert_eq!(self.pool.free_pages(PoolKind::Full), plan.full);
        assert_eq!(self.pool.free_pages(PoolKind::Window), plan.window);
        assert_eq!(self.pool.status().cached_tokens, 0);
    }
}

fn run(window: usize, page_size_log2: u32, cache: CacheType, roomy: bool, ops: Vec<Op>) {
    let mut h = Harness::new(window, 1 << page_size_log2, cache, roomy);
    for op in ops {
        h.apply(op.clone());
        if let Err(e) = h.pool.audit() {
            panic!("after {op:?}: {e}");
        }
        h.check_contents();
        h.check_window_accounting();
    }
    h.drain();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn radix_pool_never_leaks_or_double_owns(
        window in 2usize..24,
        page_size_log2 in 0u32..3,
        roomy in any::<bool>(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        run(window, page_size_log2, CacheType::Radix, roomy, ops);
    }

    #[test]
    fn naive_pool_never_leaks_or_double_owns(
        window in 2usize..10,
        page_size_log2 in 0u32..3,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(window, page_size_log2, CacheType::Naive, false, ops);
    }
}
