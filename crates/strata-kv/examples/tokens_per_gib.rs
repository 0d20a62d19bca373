//! Prints the tokens-per-GiB table of docs/kv-pool.md: for Gemma-4 E2B and E4B in each KV
//! format, full-pool tokens that 1 GiB holds (window pool at the default 0.2 ratio
//! included) with KV sharing, and without it (computed, never allocated).

use serde_json::json;
use strata_config::ModelConfig;
use strata_kv::{KvCacheDtype, KvLayout, ModelDtype, PoolKind, DEFAULT_WINDOW_RATIO};

fn gemma4(layers: usize, kv_heads: usize, shared: usize, full_every: usize) -> ModelConfig {
    let types: Vec<&str> = (0..layers)
        .map(|i| {
            if (i + 1) % full_every == 0 {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect();
    let cfg = json!({
        "model_type": "gemma4_text", "hidden_size": 1536, "intermediate_size": 6144,
        "num_hidden_layers": layers, "num_attention_heads": 8, "num_key_value_heads": kv_heads,
        "head_dim": 256, "global_head_dim": 512, "sliding_window": 512, "layer_types": types,
        "num_kv_shared_layers": shared, "hidden_size_per_layer_input": 256
    });
    ModelConfig::from_hf_json(&cfg.to_string()).expect("valid Gemma-4 config")
}

fn main() {
    let gib: u64 = 1 << 30;
    println!("| model | format | full B/token | window B/token | tokens per GiB (shared) | tokens per GiB (unshared) | gain |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (name, cfg) in [("E2B", gemma4(35, 1, 20, 5)), ("E4B", gemma4(42, 2, 18, 6))] {
        for dtype in [
            KvCacheDtype::Bf16,
            KvCacheDtype::F32,
            KvCacheDtype::Fp8PerTokenHead,
            KvCacheDtype::Int8PerTokenHead,
        ] {
            let layout = KvLayout::new(&cfg, dtype, ModelDtype::Bf16).expect("layout");
            let shared = layout
                .plan_pages(gib, 1, DEFAULT_WINDOW_RATIO)
                .expect("plan");
            let unshared = layout
                .plan_pages_unshared(gib, 1, DEFAULT_WINDOW_RATIO)
                .expect("plan");
            println!(
                "| {name} | {dtype} | {} | {} | {} | {} | {:.3}x |",
                layout.unit_bytes(PoolKind::Full),
                layout.unit_bytes(PoolKind::Window),
                shared.full,
                unshared.full,
                shared.full as f64 / unshared.full as f64
            );
        }
    }
}
