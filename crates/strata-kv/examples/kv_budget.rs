//! KV bytes per token with and without KV sharing for a small Gemma-4-like model, and how
//! many pages a 1 GiB budget buys, in two KV formats.
use strata_config::ModelConfig;
use strata_kv::{KvCacheDtype, KvLayout, ModelDtype, PoolKind, DEFAULT_WINDOW_RATIO};

const CONFIG: &str = r#"{
    "model_type": "gemma4_text",
    "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 10,
    "num_attention_heads": 8, "num_key_value_heads": 1,
    "head_dim": 256, "global_head_dim": 512, "sliding_window": 512,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
        "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
        "sliding_attention", "sliding_attention", "full_attention"],
    "num_kv_shared_layers": 4
}"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = ModelConfig::from_hf_json(CONFIG)?;
    println!("KV-shared (layer, source): {:?}", cfg.kv_shared_layers());
    let (gib, page_size, ratio) = (1u64 << 30, 16, DEFAULT_WINDOW_RATIO);
    for dtype in [KvCacheDtype::Bf16, KvCacheDtype::Int8PerTokenHead] {
        let layout = KvLayout::new(&cfg, dtype, ModelDtype::Bf16)?;
        let (slabs, layers) = (layout.slabs().len(), cfg.num_layers());
        let (shared, unshared) = (layout.kv_cost(), layout.kv_cost_unshared());
        println!("{dtype}: {slabs} slabs for {layers} layers");
        println!("  bytes per token: {shared} with KV sharing, {unshared} without");
        let plan = layout.plan_pages(gib, page_size, ratio)?;
        let without = layout.plan_pages_unshared(gib, page_size, ratio)?;
        let tokens = plan.slots(PoolKind::Full);
        println!(
            "  1 GiB: {} full pages ({tokens} tokens), {} window pages",
            plan.full, plan.window
        );
        println!("  1 GiB without sharing: {} full pages", without.full);
    }
    Ok(())
}
