//! Name pairs that several architectures share (the Llama-style decoder core).

use super::NameTable;

/// The token embedding and the final norm.
pub(super) const GLOBALS: NameTable = &[
    ("embed_tokens.weight", "token_embd.weight"),
    ("norm.weight", "output_norm.weight"),
];

/// Llama's two layer norms: before attention and before the MLP.
pub(super) const PRE_NORMS: NameTable = &[
    ("input_layernorm.weight", "attn_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
];

/// Gemma's four layer norms: before and after attention and the MLP.
pub(super) const SANDWICH_NORMS: NameTable = &[
    ("input_layernorm.weight", "attn_norm.weight"),
    (
        "post_attention_layernorm.weight",
        "post_attention_norm.weight",
    ),
    ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
    ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
];

/// The attention projections.
pub(super) const ATTN: NameTable = &[
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
];

/// Per-head q/k RMSNorms.
pub(super) const QK_NORMS: NameTable = &[
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
];

/// The gated MLP.
pub(super) const MLP: NameTable = &[
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];
