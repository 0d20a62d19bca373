//! Qwen3 dense (`qwen3`): Llama's layout plus per-head q/k RMSNorms. Not permuted in GGUF.

pub(super) const GLOBALS: &[(&str, &str)] = &[
    ("embed_tokens.weight", "token_embd.weight"),
    ("norm.weight", "output_norm.weight"),
];

pub(super) const LAYER: &[(&str, &str)] = &[
    ("input_layernorm.weight", "attn_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];
