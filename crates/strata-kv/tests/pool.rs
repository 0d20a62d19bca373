//! The pool facade: host reads and writes through layers_mapping, window release, running
//! out of pages, rebuild, status.

mod common;

use strata_kv::{
    CacheType, HostStorage, KvCacheDtype, KvError, KvLayout, KvPool, KvStorage, KvWrite,
    ModelDtype, NullStorage, PagePlan, PoolKind,
};

fn plan(full: usize, window: usize, page_size: usize) -> PagePlan {
    PagePlan {
        full,
        window,
        page_size,
    }
}

fn row(seed: f32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((seed + i as f32) * 0.731).sin() * (1.0 + seed))
        .collect()
}

#[test]
fn shared_layers_read_their_source_values_and_scales() {
    let cfg = common::e2b();
    for dtype in [
        KvCacheDtype::Bf16,
        KvCacheDtype::Fp8PerTokenHead,
        KvCacheDtype::Int8PerTokenHead,
    ] {
        let mut pool = common::host_pool(&cfg, dtype, plan(8, 8, 1));
        let req = pool.alloc_request();
        pool.extend(req, 3).unwrap();
        let slot = pool.slot(req, 2).unwrap();
        for layer in 0..15 {
            let n = cfg.layers[layer].num_kv_heads * cfg.layers[layer].head_dim;
            let (k, v) = (row(layer as f32, n), row(layer as f32 + 0.5, n));
            assert_eq!(pool.write_kv(layer, slot, &k, &v).unwrap(), KvWrite::Stored);
        }
        for layer in 15..35 {
            let source = cfg.kv_layer_for(layer);
            let n = cfg.layers[layer].num_kv_heads * cfg.layers[layer].head_dim;
            // Writing garbage to a shared layer changes nothing.
            let junk = vec![1e6; n];
            assert_eq!(
                pool.write_kv(layer, slot, &junk, &junk).unwrap(),
                KvWrite::SkippedSharedLayer
            );
            let (mut k, mut v) = (vec![0.0; n], vec![0.0; n]);
            let (mut ks, mut vs) = (vec![0.0; n], vec![0.0; n]);
            pool.read_kv(layer, slot, &mut k, &mut v).unwrap();
            pool.read_kv(source, slot, &mut ks, &mut vs).unwrap();
            assert_eq!((k, v), (ks, vs), "{dtype} layer {layer}");
            let (a, b) = (
                pool.layer_slab(layer).unwrap(),
                pool.layer_slab(source).unwrap(),
            );
            assert!(std::ptr::eq(a.k, b.k) && std::ptr::eq(a.v, b.v));
            assert!(std::ptr::eq(a.k_scales, b.k_scales) && std::ptr::eq(a.v_scales, b.v_scales));
            assert_eq!(a.k_scales.is_empty(), dtype == KvCacheDtype::Bf16);
        }
        // The source's own values came back within the format's error.
        let n = 512;
        let (mut k, mut v) = (vec![0.0; n], vec![0.0; n]);
        pool.read_kv(34, slot, &mut k, &mut v).unwrap();
        let want = row(14.0, n);
        let err = k
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 0.1 * 15.0, "{dtype}: {err}");
    }
}

#[test]
fn slabs_are_sized_for_owning_layers_only() {
    let cfg = common::e2b();
    let p = plan(100, 20, 4);
    let pool = common::host_pool(&cfg, KvCacheDtype::Int8PerTokenHead, p);
    let want = 100 * 4 * 3096 + 20 * 4 * 6240;
    assert_eq!(pool.storage().bytes_reserved(), want as u64);
    assert_eq!(p.bytes(pool.layout()), want as u64);
}

#[test]
fn window_slots_of_old_positions_are_released() {
    let cfg = common::tiny(8);
    let mut pool = KvPool::new(
        KvLayout::new(&cfg, KvCacheDtype::F32, ModelDtype::F32).unwrap(),
        plan(16, 12, 2),
        CacheType::Naive,
        HostStorage::new(),
    )
    .unwrap();
    let req = pool.alloc_request();
    pool.extend(req, 20).unwrap();
    assert_eq!(pool.free_pages(PoolKind::Window), 2);
    pool.commit(req, 20).unwrap();
    // The query at 20 sees 13..=19: pages 0..=5 (positions 0..=11) are dead, and without
    // the radix cache nobody could reuse them.
    assert_eq!(pool.free_pages(PoolKind::Window), 8);
    let sliding = 0;
    let full = 4;
    let n = 2 * 4;
    let (mut k, mut v) = (vec![0.0; n], vec![0.0; n]);
    let s11 = pool.slot(req, 11).unwrap();
    let s12 = pool.slot(req, 12).unwrap();
    assert_eq!(pool.window_slot(s11), None);
    assert!(pool.window_slot(s12).is_some());
    assert_eq!(
        pool.read_kv(sliding, s11, &mut k, &mut v),
        Err(KvError::WindowSlotReleased {
            position: s11 as usize
        })
    );
    pool.read_kv(sliding, s12, &mut k, &mut v).unwrap();
    let (mut k2, mut v2) = (vec![0.0; 2 * 8], vec![0.0; 2 * 8]);
    pool.read_kv(full, s11, &mut k2, &mut v2).unwrap();
    pool.audit().unwrap();
}

#[test]
fn out_of_window_slots_stay_idle_until_needed() {
    let cfg = common::tiny(8);
    let mut pool = common::host_pool(&cfg, KvCacheDtype::F32, plan(32, 12, 2));
    let req = pool.alloc_request();
    pool.extend(req, 20).unwrap();
    pool.commit(req, 20).unwrap();
    // Pages 0..=5 left the window: still mapped, but idle and evictable.
    let window = |p: &KvPool<HostStorage>| p.status().pools[1].clone();
    assert_eq!(window(&pool).pages_free, 2);
    assert_eq!(window(&pool).pages_evictable, 6);
    assert_eq!(pool.status().window_pages_past_window, 6);
    let s1 = pool.slot(req, 1).unwrap();
    let s11 = pool.slot(req, 11).unwrap();
    assert!(pool.window_slot(s11).is_some());
    // Another request needs 4 window pages: the 2 free ones, then the 2 read longest ago
    // (the oldest positions).
    let other = pool.alloc_request();
    pool.extend(other, 8).unwrap();
    assert_eq!(window(&pool).pages_evictable, 4);
    assert_eq!(pool.status().window_pages_evicted, 2);
    assert_eq!(pool.window_slot(s1), None);
    assert!(pool.window_slot(s11).is_some());
    // Nothing the running requests read can go (4 + 4 read pages, 4 idle): 8 more pages
    // cannot fit, and a request that cannot fit evicts nothing.
    let err = pool.extend(other, 16).unwrap_err();
    assert!(
        matches!(
            err,
            KvError::OutOfPages {
                pool: PoolKind::Window,
                needed: 8,
                available: 0
            }
        ),
        "{err}"
    );
    assert!(pool.window_slot(s11).is_some());
    pool.extend(other, 8).unwrap();
    assert_eq!(pool.window_slot(s11), None);
    pool.audit().unwrap();
}

#[test]
fn long_generation_does_not_exhaust_the_window_pool() {
    let cfg = common::tiny(8);
    // 12 window slots per request are enough: 7 past positions + a chunk of 4 (+ page slack).
    let mut pool = KvPool::new(
        KvLayout::new(&cfg, KvCacheDtype::Bf16, ModelDtype::Bf16).unwrap(),
        plan(1024, 4, 4),
        CacheType::Radix,
        NullStorage,
    )
    .unwrap();
    let req = pool.alloc_request();
    for _ in 0..1000 {
        let r = pool.extend(req, 4).unwrap();
        pool.commit(req, r.end).unwrap();
    }
    assert_eq!(pool.seq_len(req).unwrap(), 4000);
    let window = pool.status().pools[1].clone();
    assert!(window.pages_free + window.pages_evictable >= 1);
    pool.audit().unwrap();
}

#[test]
fn running_out_of_pages_allocates_nothing() {
    let cfg = common::tiny(8);
    let mut pool = common::host_pool(&cfg, KvCacheDtype::Bf16, plan(10, 4, 4));
    let a = pool.alloc_request();
    pool.extend(a, 12).unwrap();
    let before = (
        pool.free_pages(PoolKind::Full),
        pool.free_pages(PoolKind::Window),
    );
    let err = pool.extend(a, 8).unwrap_err();
    assert_eq!(
        err,
        KvError::OutOfPages {
            pool: PoolKind::Window,
            needed: 2,
            available: 1
        }
    );
    assert_eq!(
        before,
        (
            pool.free_pages(PoolKind::Full),
            pool.free_pages(PoolKind::Window)
        )
    );
    assert_eq!(pool.seq_len(a).unwrap(), 12);
    // After committing, old window pages go back and the same request can grow.
    pool.commit(a, 12).unwrap();
    pool.extend(a, 8).unwrap();
    let b = pool.alloc_request();
    assert!(matches!(
        pool.extend(b, 1000),
        Err(KvError::OutOfPages {
            pool: PoolKind::Full,
            ..
        })
    ));
    pool.audit().unwrap();
}

#[test]
fn rebuild_waits_for_requests_and_keeps_invariants() {
    let cfg = common::e2b();
    let mut pool = common::host_pool(&cfg, KvCacheDtype::Bf16, plan(64, 16, 1));
    let req = pool.alloc_request();
    pool.extend(req, 10).unwrap();
    assert_eq!(
        pool.rebuild(plan(128, 32, 16)),
        Err(KvError::RequestsActive(1))
    );
    pool.commit(req, 10).unwrap();
    pool.cache_prefix(req, &(0..10).collect::<Vec<u32>>())
        .unwrap();
    pool.release(req).unwrap();
    assert!(pool.status().cached_tokens > 0);
    pool.rebuild(plan(128, 32, 16)).unwrap();
    assert_eq!(pool.page_size(), 16);
    assert_eq!(pool.free_pages(PoolKind::Full), 128);
    assert_eq!(pool.free_pages(PoolKind::Window), 32);
    assert_eq!(pool.status().cached_tokens, 0);
    assert_eq!(
        pool.storage().bytes_reserved(),
        (128 * 16 * 6144 + 32 * 16 * 12288) as u64
    );
    assert!(pool.rebuild(plan(0, 32, 16)).is_err());
    assert!(pool.rebuild(plan(8, 0, 16)).is_err());
    assert!(pool.rebuild(plan(8, 8, 6)).is_err());
    assert_eq!(
        pool.free_pages(PoolKind::Full),
        128,
        "a refused rebuild changes nothing"
    );
    pool.audit().unwrap();
}

#[test]
fn status_reports_pages_and_cache_figures() {
    let cfg = common::e4b();
    let layout = KvLayout::new(&cfg, KvCacheDtype::Fp8PerTokenHead, ModelDtype::Bf16).unwrap();
    let mut pool =
        KvPool::with_budget(layout, 1 << 26, 16, 0.2, CacheType::Radix, NullStorage).unwrap();
    let total = pool.plan().full;
    let req = pool.alloc_request();
    pool.extend(req, 40).unwrap();
    let s = pool.status();
    assert_eq!(s.kv_cache_dtype, KvCacheDtype::Fp8PerTokenHead);
    assert_eq!(s.page_size, 16);
    assert_eq!(s.pools[0].pool, PoolKind::Full);
    assert_eq!(s.pools[0].unit_bytes, 8256);
    assert_eq!(s.pools[1].unit_bytes, 20800);
    assert_eq!(s.pools[0].pages_total, total);
    assert_eq!(s.pools[0].pages_used, 3);
    assert_eq!(s.pools[1].pages_used, 3);
    assert_eq!(s.pools[0].pages_free + 3, total);
    assert_eq!(s.running_requests, 1);
    let tokens: Vec<u32> = (0..40).collect();
    pool.commit(req, 40).unwrap();
    assert_eq!(pool.cache_prefix(req, &tokens).unwrap(), 32);
    pool.release(req).unwrap();
    let b = pool.alloc_request();
    assert_eq!(pool.reuse_prefix(b, &tokens).unwrap(), 32);
    let c = pool.alloc_request();
    assert_eq!(pool.reuse_prefix(c, &[7; 40]).unwrap(), 0);
    let s = pool.status();
    assert_eq!(
        (s.cache_hits, s.cache_misses, s.hit_tokens, s.lookup_tokens),
        (1, 1, 32, 80)
    );
    assert_eq!(s.cached_tokens, 32);
    assert_eq!(s.pools[0].pages_cached, 2);
}

#[test]
fn misuse_is_an_error_not_a_panic() {
    let cfg = common::tiny(8);
    let mut pool = common::host_pool(&cfg, KvCacheDtype::Bf16, plan(8, 4, 2));
    let ghost = strata_kv::RequestId(999);
    assert_eq!(pool.extend(ghost, 1), Err(KvError::UnknownRequest(999)));
    assert_eq!(pool.release(ghost), Err(KvError::UnknownRequest(999)));
    let req = pool.alloc_request();
    pool.extend(req, 3).unwrap();
    assert!(pool.commit(req, 4).is_err());
    pool.commit(req, 2).unwrap();
    assert!(pool.truncate(req, 1).is_err(), "committed tokens stay");
    assert!(pool.slot(req, 3).is_err());
    assert!(
        pool.reuse_prefix(req, &[1, 2]).is_err(),
        "only empty requests reuse"
    );
    let (mut k, mut v) = (vec![0.0; 8], vec![0.0; 8]);
    assert!(pool.read_kv(0, 1_000_000, &mut k, &mut v).is_err());
    assert!(pool.read_kv(99, 0, &mut k, &mut v).is_err());
    assert!(
        pool.write_kv(0, 0, &k[..3], &v[..3]).is_err(),
        "row length checked"
    );
    // A slot on a page nobody holds.
    assert!(pool.write_kv(0, 15, &k, &v).is_err());
    pool.truncate(req, 2).unwrap();
    pool.release(req).unwrap();
    assert_eq!(pool.release(req), Err(KvError::UnknownRequest(req.0)));
    pool.audit().unwrap();
}

#[test]
fn naive_cache_never_reuses() {
    let cfg = common::llama();
    let layout = KvLayout::new(&cfg, KvCacheDtype::Auto, ModelDtype::Bf16).unwrap();
    let mut pool =
        KvPool::new(layout, plan(16, 0, 4), CacheType::Naive, HostStorage::new()).unwrap();
    let tokens: Vec<u32> = (0..16).collect();
    let a = pool.alloc_request();
    pool.extend(a, 16).unwrap();
    pool.commit(a, 16).unwrap();
    assert_eq!(pool.cache_prefix(a, &tokens).unwrap(), 0);
    pool.release(a).unwrap();
    let b = pool.alloc_request();
    assert_eq!(pool.reuse_prefix(b, &tokens).unwrap(), 0);
    assert_eq!(pool.free_pages(PoolKind::Full), 16);
    assert_eq!("naive".parse::<CacheType>().unwrap(), CacheType::Naive);
    assert!("lru".parse::<CacheType>().is_err());
}
