//! Random Gemma-4 layer layouts: every shared layer reads an earlier owning layer of its own
//! type, and the KV groups partition the layers.

use proptest::prelude::*;
use serde_json::json;
use strata_config::ModelConfig;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn shared_sources_and_groups_are_consistent(
        types in proptest::collection::vec(any::<bool>(), 1..40),
        shared_frac in 0.0f64..1.0,
    ) {
        let n = types.len();
        let shared = ((n as f64) * shared_frac) as usize;
        let names: Vec<&str> = types.iter().map(|&full| if full { "full_attention" } else { "sliding_attention" }).collect();
        let cfg = json!({
            "model_type": "gemma4_text", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 8,
            "num_hidden_layers": n, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 8, "global_head_dim": 8, "layer_types": names, "sliding_window": 4,
            "num_kv_shared_layers": shared, "use_double_wide_mlp": true,
            "hidden_size_per_layer_input": 0
        });
        match ModelConfig::from_hf_json(&cfg.to_string()) {
            Ok(c) => {
                let first = n - shared;
                for (l, s) in c.kv_shared_layers() {
                    prop_assert!(l >= first && s < first);
                    prop_assert_eq!(c.layers[l].attention, c.layers[s].attention);
                    prop_assert!(c.layers[s].owns_kv());
                    // The source is the *last* earlier layer of that type.
                    prop_assert!((s + 1..first).all(|j| c.layers[j].attention != c.layers[l].attention));
                    prop_assert_eq!(c.layers[l].intermediate_size, 16);
                }
                let mut seen = vec![0; n];
                for g in c.kv_group_specs() {
                    for &l in g.layer_ids.iter().chain(&g.shared_layers) {
                        seen[l] += 1;
                        prop_assert_eq!(c.layers[l].attention, g.attention);
                    }
                    prop_assert!(g.layer_ids.iter().all(|&l| c.layers[l].owns_kv()));
                    prop_assert!(g.shared_layers.iter().all(|&l| !c.layers[l].owns_kv()));
                }
                prop_assert!(seen.iter().all(|&k| k == 1));
            }
            Err(e) => {
                // Only refusal: a shared layer whose type has no owner before `first`.
                let msg = e.to_string();
                prop_assert!(msg.contains("num_kv_shared_layers"), "{}", msg);
                let first = n - shared;
                let last_is_full = true; // the parser forces the last layer to full attention
                let mut t = types.clone();
                t[n - 1] = last_is_full;
                let orphan = (first..n).any(|l| !(0..first).any(|j| t[j] == t[l]));
                prop_assert!(orphan);
            }
        }
    }
}
