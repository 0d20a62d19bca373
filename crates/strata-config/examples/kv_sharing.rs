//! Parses a small Gemma-4-like `config.json` and prints its layers, the KV-shared layer pairs
//! and the KV groups.
use strata_config::ModelConfig;

const CONFIG: &str = r#"{
    "model_type": "gemma4_text",
    "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 10,
    "num_attention_heads": 8, "num_key_value_heads": 1,
    "head_dim": 128, "global_head_dim": 256, "sliding_window": 512,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention",
        "sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
        "sliding_attention", "sliding_attention", "full_attention"],
    "num_kv_shared_layers": 4
}"#;

fn main() -> Result<(), strata_config::ConfigError> {
    let cfg = ModelConfig::from_hf_json(CONFIG)?;
    let (arch, n) = (cfg.architecture.name(), cfg.num_layers());
    println!("{arch} with {n} layers");
    for (i, layer) in cfg.layers.iter().enumerate() {
        let kv = match layer.kv_source {
            Some(src) => format!("reads layer {src}'s KV"),
            None => "owns its KV".to_string(),
        };
        let (ty, dim, window) = (layer.attention.short_name(), layer.head_dim, layer.window);
        println!("  layer {i}: {ty:7} head_dim {dim}, window {window:?}, {kv}");
    }
    println!("KV-shared (layer, source): {:?}", cfg.kv_shared_layers());
    for g in cfg.kv_group_specs() {
        let (ty, owners, shared) = (g.attention.short_name(), &g.layer_ids, &g.shared_layers);
        println!("{ty} group: owners {owners:?}, shared {shared:?}");
    }
    Ok(())
}
