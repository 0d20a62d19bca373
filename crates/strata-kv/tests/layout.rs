//! Layout and pricing against the real E2B/E4B layouts.

mod common;

use strata_config::AttentionType;
use strata_kv::{KvCacheDtype, KvError, KvFormat, KvLayout, ModelDtype, PoolKind};

fn layout(cfg: &strata_config::ModelConfig, dtype: &str) -> KvLayout {
    KvLayout::new(cfg, dtype.parse().unwrap(), ModelDtype::Bf16).unwrap()
}

#[test]
fn e2b_has_one_slab_per_owning_layer() {
    let l = layout(&common::e2b(), "auto");
    assert_eq!(l.slabs().len(), 15, "35 layers, 20 shared");
    let full = l.group(PoolKind::Full).unwrap();
    assert_eq!(full.owner_layers, vec![4, 9, 14]);
    assert_eq!(full.shared_layers, vec![19, 24, 29, 34]);
    let window = l.group(PoolKind::Window).unwrap();
    assert_eq!(window.owner_layers.len(), 12);
    assert_eq!(window.shared_layers.len(), 16);
    assert_eq!(window.window, Some(512));
    assert_eq!(l.layers_mapping().len(), 35);
}

#[test]
fn e4b_has_one_slab_per_owning_layer() {
    let l = layout(&common::e4b(), "auto");
    assert_eq!(l.slabs().len(), 24, "42 layers, 18 shared");
    assert_eq!(
        l.group(PoolKind::Full).unwrap().owner_layers,
        vec![5, 11, 17, 23]
    );
    assert_eq!(l.group(PoolKind::Window).unwrap().owner_layers.len(), 20);
}

#[test]
fn shared_layers_resolve_to_their_source_slab() {
    for (cfg, full_src, sliding_src, first_shared) in
        [(common::e2b(), 14, 13, 15), (common::e4b(), 23, 22, 24)]
    {
        let l = layout(&cfg, "fp8_per_token_head");
        for (i, m) in l.layers_mapping().iter().enumerate() {
            let slab = l.slab(m.slab).unwrap();
            assert_eq!(slab.layer, m.source_layer, "layer {i}");
            if i < first_shared {
                assert!(!m.shared);
                assert_eq!(m.source_layer, i);
            } else {
                assert!(m.shared, "layer {i}");
                let want = match cfg.layers[i].attention {
                    AttentionType::Full => full_src,
                    AttentionType::Sliding => sliding_src,
                };
                assert_eq!(m.source_layer, want, "layer {i}");
                // Same slab id as the source: the same values and the same scales.
                assert_eq!(m.slab, l.layers_mapping()[want].slab);
            }
            assert_eq!(m.pool, PoolKind::of(cfg.layers[i].attention));
        }
    }
}

#[test]
fn unit_bytes_match_the_published_figures() {
    let cases = [
        // (model, dtype, full, window)
        (common::e2b(), "bf16", 6144, 12288),
        (common::e2b(), "auto", 6144, 12288),
        (common::e2b(), "f16", 6144, 12288),
        (common::e2b(), "f32", 12288, 24576),
        (common::e2b(), "fp8_per_token_head", 3096, 6240),
        (common::e2b(), "int8_per_token_head", 3096, 6240),
        (common::e4b(), "bf16", 16384, 40960),
        (common::e4b(), "f32", 32768, 81920),
        (common::e4b(), "fp8_per_token_head", 8256, 20800),
        (common::e4b(), "int8_per_token_head", 8256, 20800),
    ];
    for (cfg, dtype, full, window) in cases {
        let l = layout(&cfg, dtype);
        assert_eq!(l.unit_bytes(PoolKind::Full), full, "{dtype} full");
        assert_eq!(l.unit_bytes(PoolKind::Window), window, "{dtype} window");
        assert_eq!(l.kv_cost(), full + window);
        let per_slab: usize = l.slabs().iter().map(|s| s.bytes_per_token()).sum();
        assert_eq!(per_slab, full + window);
    }
}

#[test]
fn sharing_holds_seven_thirds_and_seven_quarters_the_tokens() {
    let e2b = layout(&common::e2b(), "bf16");
    for g in e2b.groups() {
        assert_eq!(g.unit_bytes_unshared * 3, g.unit_bytes * 7, "{:?}", g.pool);
    }
    assert_eq!(
        e2b.group(PoolKind::Full).unwrap().unit_bytes_unshared,
        14336
    );
    assert_eq!(
        e2b.group(PoolKind::Window).unwrap().unit_bytes_unshared,
        28672
    );
    let e4b = layout(&common::e4b(), "int8_per_token_head");
    for g in e4b.groups() {
        assert_eq!(g.unit_bytes_unshared * 4, g.unit_bytes * 7, "{:?}", g.pool);
    }
    let budget = 1 << 30;
    let shared = e2b.plan_pages(budget, 1, 0.2).unwrap();
    let unshared = e2b.plan_pages_unshared(budget, 1, 0.2).unwrap();
    let ratio = shared.full as f64 / unshared.full as f64;
    assert!((ratio - 7.0 / 3.0).abs() < 1e-3, "{ratio}");
}

#[test]
fn auto_follows_the_model_dtype() {
    let cfg = common::llama();
    let l = KvLayout::for_config(&cfg, KvCacheDtype::Auto).unwrap();
    assert_eq!(l.format(), KvFormat::F16);
    let l = KvLayout::new(&cfg, KvCacheDtype::Auto, ModelDtype::F32).unwrap();
    assert_eq!(l.format(), KvFormat::F32);
    // 4 layers x 2 x 2 heads x 16 x 4 bytes.
    assert_eq!(l.unit_bytes(PoolKind::Full), 1024);
    assert!(l.group(PoolKind::Window).is_none());
    assert_eq!(l.window(), None);
}

#[test]
fn dtype_names_round_trip() {
    for d in KvCacheDtype::ALL {
        assert_eq!(d.to_string().parse::<KvCacheDtype>().unwrap(), d);
    }
    assert_eq!(
        "FP8_per_token_head".parse::<KvCacheDtype>().unwrap(),
        KvCacheDtype::Fp8PerTokenHead
    );
    assert!(matches!(
        "fp8".parse::<KvCacheDtype>(),
        Err(KvError::UnknownKvCacheDtype(_))
    ));
    assert_eq!(
        KvFormat::Int8PerTokenHead.to_string(),
        "int8_per_token_head"
    );
    assert!("bf17".parse::<ModelDtype>().is_err());
}

#[test]
fn pages_for_a_budget() {
    let l = layout(&common::e2b(), "bf16");
    let budget: u64 = 1 << 30;
    let plan = l.plan_pages(budget, 1, 0.2).unwrap();
    // 1 GiB / (6144 + 0.2 * 12288) bytes per full token.
    assert_eq!(plan.full, 124_830);
    assert_eq!(plan.window, 24_966);
    assert!(plan.bytes(&l) <= budget);
    // One more full page would not fit.
    let one_more = (plan.full + 1) as u64 * 6144 + ((plan.full + 1) as f64 * 0.2) as u64 * 12288;
    assert!(one_more > budget);

    let paged = l.plan_pages(budget, 16, 0.2).unwrap();
    assert_eq!(paged.page_size, 16);
    assert!(paged.bytes(&l) <= budget);
    // Whole pages in both pools: within a couple of pages of the token-granular plan.
    assert!((paged.full * 16).abs_diff(plan.full) < 32, "{paged:?}");
    let next =
        (paged.full + 1) as u64 * 16 * 6144 + ((paged.full + 1) as f64 * 0.2) as u64 * 16 * 12288;
    assert!(next > budget);

    let wide = l.plan_pages(budget, 1, 0.5).unwrap();
    assert_eq!(wide.window, wide.full / 2);
    assert!(wide.bytes(&l) <= budget);
}

#[test]
fn bad_plans_are_refused() {
    let l = layout(&common::e2b(), "bf16");
    assert_eq!(
        l.plan_pages(1 << 30, 3, 0.2),
        Err(KvError::InvalidPageSize(3))
    );
    assert_eq!(
        l.plan_pages(1 << 30, 0, 0.2),
        Err(KvError::InvalidPageSize(0))
    );
    assert!(matches!(
        l.plan_pages(1 << 30, 1, 0.0),
        Err(KvError::InvalidWindowRatio(_))
    ));
    assert!(matches!(
        l.plan_pages(1 << 30, 1, f64::NAN),
        Err(KvError::InvalidWindowRatio(_))
    ));
    assert!(matches!(
        l.plan_pages(1000, 1, 0.2),
        Err(KvError::BudgetTooSmall { .. })
    ));
}

#[test]
fn full_only_models_get_no_window_pool() {
    let l = layout(&common::llama(), "bf16");
    let plan = l.plan_pages(1 << 20, 4, 0.2).unwrap();
    assert_eq!(plan.window, 0);
    assert_eq!(plan.full, (1 << 20) / (4 * 512));
}
