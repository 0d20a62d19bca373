//! Model configurations for the tests: the real Gemma-4 E2B/E4B layouts, small ones with
//! the same structure, and a full-attention-only model.
#![allow(dead_code)]

use serde_json::{json, Value};
use strata_config::ModelConfig;
use strata_kv::{CacheType, HostStorage, KvCacheDtype, KvLayout, KvPool, ModelDtype, PagePlan};

pub struct Gemma4Shape {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub global_head_dim: usize,
    pub window: usize,
    pub shared: usize,
    pub full_every: usize,
}

pub fn gemma4_text(s: &Gemma4Shape) -> Value {
    let types: Vec<&str> = (0..s.layers)
        .map(|i| {
            if (i + 1) % s.full_every == 0 {
                "full_attention"
            } else {
                "sliding_attention"
            }
        })
        .collect();
    json!({
        "model_type": "gemma4_text",
        "vocab_size": 262144,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": s.layers,
        "num_attention_heads": 8,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "global_head_dim": s.global_head_dim,
        "num_global_key_value_heads": null,
        "attention_k_eq_v": false,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "sliding_window": s.window,
        "layer_types": types,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}
        },
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": true,
        "attention_bias": false,
        "hidden_size_per_layer_input": 64,
        "vocab_size_per_layer_input": 262144,
        "num_kv_shared_layers": s.shared,
        "use_double_wide_mlp": false,
        "enable_moe_block": false,
        "use_bidirectional_attention": null,
        "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
        "dtype": "bfloat16"
    })
}

fn parse(v: Value) -> ModelConfig {
    ModelConfig::from_hf_json(&v.to_string()).expect("test config parses")
}

/// Gemma-4 E2B: 35 layers, full every 5th, 1 KV head, last 20 layers KV-shared.
pub fn e2b() -> ModelConfig {
    parse(gemma4_text(&Gemma4Shape {
        layers: 35,
        kv_heads: 1,
        head_dim: 256,
        global_head_dim: 512,
        window: 512,
        shared: 20,
        full_every: 5,
    }))
}

/// Gemma-4 E4B: 42 layers, full every 6th, 2 KV heads, last 18 layers KV-shared.
pub fn e4b() -> ModelConfig {
    parse(gemma4_text(&Gemma4Shape {
        layers: 42,
        kv_heads: 2,
        head_dim: 256,
        global_head_dim: 512,
        window: 512,
        shared: 18,
        full_every: 6,
    }))
}

/// E2B's structure at toy sizes: 10 layers (full at 4 and 9), layers 5..9 shared,
/// window 8 tokens.
pub fn tiny(window: usize) -> ModelConfig {
    parse(gemma4_text(&Gemma4Shape {
        layers: 10,
        kv_heads: 2,
        head_dim: 4,
        global_head_dim: 8,
        window,
        shared: 5,
        full_every: 5,
    }))
}

/// A Llama-style model: full attention only, no sharing.
pub fn llama() -> ModelConfig {
    parse(json!({
        "model_type": "llama",
        "vocab_size": 1000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": false,
        "torch_dtype": "float16"
    }))
}

pub fn host_pool(cfg: &ModelConfig, dtype: KvCacheDtype, plan: PagePlan) -> KvPool<HostStorage> {
    let layout = KvLayout::new(cfg, dtype, ModelDtype::Bf16).unwrap();
    KvPool::new(layout, plan, CacheType::Radix, HostStorage::new()).unwrap()
}
