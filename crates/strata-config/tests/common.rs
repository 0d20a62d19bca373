//! Real Gemma-4 configurations, built from the published values.
#![allow(dead_code)]

use serde_json::{json, Value};

fn gemma4_text(
    layers: usize,
    hidden: usize,
    ffn: usize,
    kv_heads: usize,
    shared: usize,
    double: bool,
    full_every: usize,
) -> Value {
    let types: Vec<&str> = (0..layers)
        .map(|i| {
            if (i + 1) % full_every == 0 {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect();
    json!({
        "model_type": "gemma4_text",
        "vocab_size": 262144,
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "num_key_value_heads": kv_heads,
        "head_dim": 256,
        "global_head_dim": 512,
        "num_global_key_value_heads": null,
        "attention_k_eq_v": false,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "sliding_window": 512,
        "layer_types": types,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}
        },
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": true,
        "attention_bias": false,
        "hidden_size_per_layer_input": 256,
        "vocab_size_per_layer_input": 262144,
        "num_kv_shared_layers": shared,
        "use_double_wide_mlp": double,
        "enable_moe_block": false,
        "use_bidirectional_attention": null,
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2
    })
}

/// E2B text config as Google ships it (`global_head_dim`), under a multimodal wrapper.
pub fn e2b() -> Value {
    multimodal(gemma4_text(35, 1536, 6144, 1, 20, true, 5))
}

/// E4B text config as Google ships it, under a multimodal wrapper.
pub fn e4b() -> Value {
    multimodal(gemma4_text(42, 2560, 10240, 2, 18, false, 6))
}

/// Wraps a text config the way Gemma-4's multimodal `config.json` does (`text_config`, with
/// vision and audio siblings).
pub fn multimodal(text: Value) -> Value {
    json!({
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": text,
        "vision_config": {"model_type": "gemma4_vision"},
        "audio_config": {"model_type": "gemma4_audio"},
        "image_token_id": 258880,
        "eos_token_id": [1, 106]
    })
}

/// The transformers re-save form: `per_layer_config` with zero-padded layer keys instead of
/// `global_head_dim`.
pub fn resaved(mut cfg: Value) -> Value {
    let tc = cfg.get_mut("text_config").unwrap().as_object_mut().unwrap();
    tc.remove("global_head_dim");
    let types = tc["layer_types"].as_array().unwrap().clone();
    let mut plc = serde_json::Map::new();
    for (i, t) in types.iter().enumerate() {
        if t == "full_attention" {
            plc.insert(format!("{i:02}"), json!({"head_dim": 512}));
        }
    }
    tc.insert("per_layer_config".into(), Value::Object(plc));
    cfg
}
