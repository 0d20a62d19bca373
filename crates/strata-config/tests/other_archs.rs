//! Gemma-3, Llama and Qwen3 configurations in both field layouts transformers has used.

use serde_json::json;
use strata_config::{Activation, Architecture, AttentionType, ModelConfig, RopeKind};

fn parse(v: serde_json::Value) -> ModelConfig {
    ModelConfig::from_hf_json(&v.to_string()).unwrap()
}

#[test]
fn gemma3_270m_legacy_fields() {
    let c = parse(json!({
        "model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 640,
        "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 512,
        "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 256,
        "sliding_window_pattern": 6, "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
        "eos_token_id": 1, "bos_token_id": 2, "torch_dtype": "bfloat16"
    }));
    assert_eq!(c.architecture, Architecture::Gemma3);
    let full: Vec<usize> = (0..18)
        .filter(|&i| c.layers[i].attention == AttentionType::Full)
        .collect();
    assert_eq!(full, vec![5, 11, 17]);
    assert_eq!(c.layers[0].rope.theta, 1e4);
    assert_eq!(c.layers[5].rope.theta, 1e6);
    assert_eq!(c.layers[0].window, Some(512));
    assert_eq!(c.attention_scale, 1.0 / 16.0);
    assert_eq!(c.norm_weight_offset, 1.0);
    assert!(c.kv_shared_layers().is_empty());
    assert_eq!(c.kv_group_specs().len(), 2);
    assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
}

#[test]
fn gemma3_rope_parameters_per_type_with_linear_scaling() {
    let c = parse(json!({
        "model_type": "gemma3", "text_config": {
            "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
            "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4,
            "layer_types": ["sliding_attention","sliding_attention","sliding_attention","sliding_attention","sliding_attention","full_attention"],
            "sliding_window": 1024,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}
            }
        }
    }));
    assert_eq!(c.layers[5].rope.kind, RopeKind::Linear { factor: 8.0 });
    assert_eq!(c.layers[0].rope.kind, RopeKind::Default);
    assert_eq!(c.vocab_size, 262208);
}

#[test]
fn llama_with_llama3_rope_scaling() {
    let c = parse(json!({
        "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": true, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]
    }));
    assert_eq!(c.layers[0].head_dim, 64);
    assert!(matches!(c.layers[0].rope.kind, RopeKind::Llama3 { .. }));
    assert_eq!(c.activation, Activation::Silu);
    assert_eq!(c.eos_token_ids, vec![128001, 128008, 128009]);
    assert_eq!(c.attention_scale, 0.125);
    let g = c.kv_group_specs();
    assert_eq!(g.len(), 1);
    assert_eq!(g[0].layer_ids.len(), 16);
}

#[test]
fn smollm2_style_llama_defaults() {
    let c = parse(json!({
        "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "rope_theta": 100000, "rms_norm_eps": 1e-5, "tie_word_embeddings": true
    }));
    assert_eq!(c.layers[0].head_dim, 64);
    assert_eq!(c.layers[0].rope.theta, 1e5);
    assert!(!c.qk_norm && !c.sandwich_norms && !c.scale_embeddings);
}

#[test]
fn qwen3_explicit_head_dim_and_rope_parameters() {
    let c = parse(json!({
        "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "use_sliding_window": false, "sliding_window": null, "tie_word_embeddings": true
    }));
    assert_eq!(c.layers[0].head_dim, 128);
    assert!(c.qk_norm);
    assert_eq!(c.layers[3].rope.theta, 1e6);
    assert!(c.layers.iter().all(|l| l.attention == AttentionType::Full));
}

#[test]
fn refusals_name_the_field() {
    let cases = [
        (json!({"model_type": "qwen3_moe"}), "model_type"),
        (
            json!({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 8, "vocab_size": 10, "attention_bias": true}),
            "attention_bias",
        ),
        (
            json!({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 3, "intermediate_size": 8, "vocab_size": 10}),
            "num_key_value_heads",
        ),
        (
            json!({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 8, "vocab_size": 10, "hidden_act": "relu2"}),
            "hidden_act",
        ),
        (
            json!({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "intermediate_size": 8, "vocab_size": 10, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}),
            "rope_scaling.rope_type",
        ),
        (
            json!({"model_type": "llama", "num_hidden_layers": 2}),
            "hidden_size",
        ),
        (
            json!({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": "big"}),
            "hidden_size",
        ),
        (json!([1, 2]), "(root)"),
    ];
    for (cfg, field) in cases {
        let e = ModelConfig::from_hf_json(&cfg.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains(field), "{cfg}: {e}");
    }
    let e = ModelConfig::from_hf_json("{not json")
        .unwrap_err()
        .to_string();
    assert!(e.contains("JSON"), "{e}");
}

/// bitsandbytes 4-bit loads (dequantized at load); any other quantization method is refused
/// by name rather than failing later on a tensor that looks missing.
#[test]
fn quantization_methods_other_than_bnb_4bit_are_refused_by_name() {
    let base = json!({
        "model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0
    });
    let with = |q: serde_json::Value| {
        let mut v = base.clone();
        v["quantization_config"] = q;
        ModelConfig::from_hf_json(&v.to_string())
    };
    for ok in [
        json!({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4"}),
        json!({"quant_method": "bitsandbytes", "_load_in_4bit": true, "bnb_4bit_quant_type": "fp4"}),
    ] {
        with(ok).unwrap();
    }
    for (q, needle) in [
        (
            json!({"quant_method": "bitsandbytes", "load_in_8bit": true}),
            "8-bit",
        ),
        (json!({"quant_method": "gptq", "bits": 4}), "gptq"),
        (json!({"quant_method": "awq"}), "awq"),
        (json!({"quant_method": "fp8"}), "fp8"),
        (
            json!({"quant_method": "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "int4"}),
            "int4",
        ),
    ] {
        let e = with(q).unwrap_err().to_string();
        assert!(
            e.contains("quantization_config") && e.contains(needle),
            "{e}"
        );
    }
}
