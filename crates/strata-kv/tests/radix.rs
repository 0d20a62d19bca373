//! Prefix reuse: plain full attention, sliding windows, eviction order.

mod common;

use strata_config::ModelConfig;
use strata_kv::{
    CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, ModelDtype, NullStorage, PagePlan,
    PoolKind, RequestId,
};

fn pool<S: strata_kv::KvStorage>(
    cfg: &ModelConfig,
    full: usize,
    window: usize,
    ps: usize,
    s: S,
) -> KvPool<S> {
    let layout = KvLayout::new(cfg, KvCacheDtype::F32, ModelDtype::F32).unwrap();
    let plan = PagePlan {
        full,
        window,
        page_size: ps,
    };
    KvPool::new(layout, plan, CacheType::Radix, s).unwrap()
}

/// Runs a request over `tokens` in chunks (committing after each), caches it, releases it.
fn run_and_cache<S: strata_kv::KvStorage>(
    p: &mut KvPool<S>,
    tokens: &[u32],
    chunk: usize,
) -> RequestId {
    let req = p.alloc_request();
    let mut done = p.reuse_prefix(req, tokens).unwrap();
    while done < tokens.len() {
        let n = chunk.min(tokens.len() - done);
        p.extend(req, n).unwrap();
        done += n;
        p.commit(req, done).unwrap();
    }
    p.cache_prefix(req, tokens).unwrap();
    p.release(req).unwrap();
    p.audit().unwrap();
    req
}

#[test]
fn a_second_request_reuses_the_first_ones_pages() {
    let cfg = common::llama();
    let mut p = pool(&cfg, 64, 0, 1, NullStorage);
    let a: Vec<u32> = (0..40).collect();
    let ra = p.alloc_request();
    p.extend(ra, 40).unwrap();
    p.commit(ra, 40).unwrap();
    let pages_a = p.page_table(ra).unwrap().to_vec();
    assert_eq!(p.cache_prefix(ra, &a).unwrap(), 40);
    p.release(ra).unwrap();
    assert_eq!(
        p.free_pages(PoolKind::Full),
        24,
        "the cache keeps A's pages"
    );

    let mut b = a[..25].to_vec();
    b.extend([900, 901, 902]);
    assert_eq!(p.match_prefix(&b), 25);
    let rb = p.alloc_request();
    assert_eq!(p.reuse_prefix(rb, &b).unwrap(), 25);
    assert_eq!(p.page_table(rb).unwrap(), &pages_a[..25]);
    p.extend(rb, 3).unwrap();
    p.commit(rb, 28).unwrap();
    // Pinned pages cannot be evicted; A's unshared tail can.
    assert_eq!(p.evict(1000), 15);
    assert_eq!(p.match_prefix(&a), 25);
    p.cache_prefix(rb, &b).unwrap();
    p.release(rb).unwrap();
    assert_eq!(p.match_prefix(&b), 28);
    p.audit().unwrap();
}

#[test]
fn reuse_is_whole_pages() {
    let cfg = common::llama();
    let mut p = pool(&cfg, 64, 0, 4, NullStorage);
    let a: Vec<u32> = (0..30).collect();
    run_and_cache(&mut p, &a, 30);
    assert_eq!(p.status().cached_tokens, 28);
    assert_eq!(p.match_prefix(&a[..23]), 20);
    let mut b = a[..14].to_vec();
    b.push(77);
    assert_eq!(p.match_prefix(&b), 12);
}

fn value(token: u32, position: usize, layer: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|e| (token as usize * 1000 + position * 10 + layer) as f32 + e as f32 * 0.125)
        .collect()
}

/// Extends `req` over `tokens[from..]` one chunk at a time, writing every owning layer's
/// K/V for each new position.
fn prefill(
    p: &mut KvPool<HostStorage>,
    cfg: &ModelConfig,
    req: RequestId,
    tokens: &[u32],
    from: usize,
    chunk: usize,
) {
    let mut done = from;
    while done < tokens.len() {
        let n = chunk.min(tokens.len() - done);
        let r = p.extend(req, n).unwrap();
        for pos in r.clone() {
            let slot = p.slot(req, pos).unwrap();
            for (l, layer) in cfg.layers.iter().enumerate() {
                let n = layer.num_kv_heads * layer.head_dim;
                let kv = value(tokens[pos], pos, l, n);
                p.write_kv(l, slot, &kv, &kv).unwrap();
            }
        }
        done = r.end;
        p.commit(req, done).unwrap();
    }
}

#[test]
fn sliding_layers_reuse_wherever_the_window_pages_survive() {
    let window = 8;
    let cfg = common::tiny(window);
    let mut p = pool(&cfg, 256, 64, 1, HostStorage::new());
    let a: Vec<u32> = (100..140).collect();
    let ra = p.alloc_request();
    prefill(&mut p, &cfg, ra, &a, 0, 4);
    assert_eq!(p.cache_prefix(ra, &a).unwrap(), 40);
    p.release(ra).unwrap();

    // Continuing A: positions 33..=39 still have window slots.
    let mut b = a.clone();
    b.extend([1, 2, 3]);
    assert_eq!(p.match_prefix(&b), 40);
    let rb = p.alloc_request();
    assert_eq!(p.reuse_prefix(rb, &b).unwrap(), 40);
    // Every layer reads A's K/V for the reused positions the next token can see.
    for (pos, &token) in a.iter().enumerate().skip(33) {
        let slot = p.slot(rb, pos).unwrap();
        for (l, layer) in cfg.layers.iter().enumerate() {
            let n = layer.num_kv_heads * layer.head_dim;
            let (mut k, mut v) = (vec![0.0; n], vec![0.0; n]);
            p.read_kv(l, slot, &mut k, &mut v).unwrap();
            let src = cfg.kv_layer_for(l);
            assert_eq!(k, value(token, pos, src, n), "layer {l} position {pos}");
            assert_eq!(v, k);
        }
    }
    prefill(&mut p, &cfg, rb, &b, 40, 4);
    p.release(rb).unwrap();

    // Diverging after 20 tokens: A's window slots for 13..=19 left A's window during its
    // prefill but stayed cached (idle), so C reuses all 20 and reads A's K/V there.
    let mut c = a[..20].to_vec();
    c.extend([5, 6]);
    assert_eq!(p.match_prefix(&c), 20);
    let hits = p.status().window_hits;
    let rc = p.alloc_request();
    assert_eq!(p.reuse_prefix(rc, &c).unwrap(), 20);
    assert_eq!(p.status().window_hits, hits + 1);
    for (pos, &token) in a.iter().enumerate().take(20).skip(13) {
        let slot = p.slot(rc, pos).unwrap();
        for (l, layer) in cfg.layers.iter().enumerate() {
            let n = layer.num_kv_heads * layer.head_dim;
            let (mut k, mut v) = (vec![0.0; n], vec![0.0; n]);
            p.read_kv(l, slot, &mut k, &mut v).unwrap();
            assert_eq!(
                k,
                value(token, pos, cfg.kv_layer_for(l), n),
                "layer {l} pos {pos}"
            );
        }
    }
    p.release(rc).unwrap();
    p.audit().unwrap();
}

#[test]
fn caching_at_prefill_end_makes_the_prompt_reusable() {
    let window = 8;
    let cfg = common::tiny(window);
    let mut p = pool(&cfg, 256, 64, 2, HostStorage::new());
    let prompt: Vec<u32> = (0..30).collect();
    let ra = p.alloc_request();
    prefill(&mut p, &cfg, ra, &prompt, 0, 30);
    assert_eq!(p.cache_prefix(ra, &prompt).unwrap(), 30);
    // A decodes on; its window moves past the prompt, but the cache keeps the prompt's tail.
    let mut full = prompt.clone();
    full.extend(200..240);
    prefill(&mut p, &cfg, ra, &full, 30, 1);
    let mut other = prompt.clone();
    other.extend([7, 7]);
    assert_eq!(p.match_prefix(&other), 30);
    p.release(ra).unwrap();
    assert_eq!(p.match_prefix(&other), 30);
    p.audit().unwrap();
}

#[test]
fn eviction_takes_the_least_recently_used_first() {
    let cfg = common::llama();
    let mut p = pool(&cfg, 64, 0, 1, NullStorage);
    let a: Vec<u32> = (0..10).collect();
    let b: Vec<u32> = (100..110).collect();
    run_and_cache(&mut p, &a, 10);
    run_and_cache(&mut p, &b, 10);
    // Touch A: B becomes the oldest.
    let r = p.alloc_request();
    p.reuse_prefix(r, &a).unwrap();
    p.release(r).unwrap();
    assert_eq!(p.evict(1), 10);
    assert_eq!(p.match_prefix(&a), 10);
    assert_eq!(p.match_prefix(&b), 0);
}

/// Many multi-turn sessions share a window pool that cannot hold every session's window.
/// Recently active sessions must keep hitting; an engine that drops every cached sliding
/// tail when the window pool runs short would make every later turn a miss.
#[test]
fn interleaved_sessions_keep_hitting_under_window_pressure() {
    let window = 16;
    let cfg = common::tiny(window);
    // Each cached session holds ~4 window pages (16 tokens, page 4), plus one running request.
    let mut p = pool(&cfg, 4096, 32, 4, NullStorage);
    let sessions = 12;
    let mut convs: Vec<Vec<u32>> = (0..sessions).map(|s| vec![s as u32 * 1000; 8]).collect();
    let mut hot_hits = 0;
    let mut hot_turns = 0;
    for turn in 0..30 {
        // Three hot sessions every turn, one cold session in rotation.
        let active = [0, 1, 2, 3 + turn % (sessions - 3)];
        for &s in &active {
            let conv = &mut convs[s];
            conv.extend((0..8).map(|i| (s * 1000 + turn * 10 + i) as u32));
            let cached_before = p.match_prefix(conv);
            if s < 3 && turn > 0 {
                hot_turns += 1;
                if cached_before >= conv.len() - 8 {
                    hot_hits += 1;
                }
            }
            run_and_cache(&mut p, conv, 4);
        }
    }
    assert_eq!(
        hot_hits, hot_turns,
        "hot sessions must always find their last turn"
    );
    let s = p.status();
    assert!(s.pools[1].pages_free <= 32);
    assert!(s.cache_hits as usize >= hot_turns);
}

#[test]
fn cache_prefix_refuses_tokens_that_differ_from_the_reused_prefix() {
    let cfg = common::llama();
    let mut p = pool(&cfg, 64, 0, 1, NullStorage);
    let a: Vec<u32> = (0..10).collect();
    run_and_cache(&mut p, &a, 10);
    let r = p.alloc_request();
    assert_eq!(p.reuse_prefix(r, &a).unwrap(), 10);
    p.extend(r, 2).unwrap();
    p.commit(r, 12).unwrap();
    let wrong: Vec<u32> = (50..62).collect();
    assert!(p.cache_prefix(r, &wrong).is_err());
    assert!(p.cache_prefix(r, &a[..5]).is_err());
    p.audit().unwrap();
    p.release(r).unwrap();
    p.audit().unwrap();
}

#[test]
fn duplicate_prefixes_share_pages() {
    // Two requests compute the same prompt concurrently; the second to cache it gives its
    // duplicate pages back and reads the cached ones.
    let cfg = common::tiny(8);
    let mut p = pool(&cfg, 128, 64, 1, HostStorage::new());
    let t: Vec<u32> = (0..12).collect();
    let (ra, rb) = (p.alloc_request(), p.alloc_request());
    prefill(&mut p, &cfg, ra, &t, 0, 12);
    prefill(&mut p, &cfg, rb, &t, 0, 12);
    let free = p.free_pages(PoolKind::Full);
    p.cache_prefix(ra, &t).unwrap();
    p.cache_prefix(rb, &t).unwrap();
    assert_eq!(p.free_pages(PoolKind::Full), free + 12);
    assert_eq!(p.page_table(ra).unwrap(), p.page_table(rb).unwrap());
    p.audit().unwrap();
    for r in [ra, rb] {
        p.release(r).unwrap();
    }
    assert_eq!(p.flush_cache(), 12);
    assert_eq!(p.free_pages(PoolKind::Full), 128);
    assert_eq!(p.free_pages(PoolKind::Window), 64);
}

#[test]
fn a_leaf_that_loses_its_window_gives_back_its_full_pages() {
    let cfg = common::tiny(8);
    let mut p = pool(&cfg, 64, 8, 2, NullStorage);
    let a: Vec<u32> = (0..16).collect();
    run_and_cache(&mut p, &a, 4);
    assert_eq!(p.match_prefix(&a), 16);
    let cached_full = 64 - p.free_pages(PoolKind::Full);
    assert_eq!(cached_full, 8);
    // A new request needs every window page: A's window tail must go, and with it A's
    // leaf, whose full pages can serve no match without it.
    let r = p.alloc_request();
    p.extend(r, 16).unwrap();
    assert_eq!(p.match_prefix(&a), 0);
    assert_eq!(p.status().cached_tokens, 0);
    assert_eq!(p.free_pages(PoolKind::Full), 64 - 8);
    p.audit().unwrap();
}
