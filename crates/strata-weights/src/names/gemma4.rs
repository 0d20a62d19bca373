//! Gemma-4 text decoder (`gemma4`). HF names after the `model.` / `model.language_model.`
//! prefix. Norms are stored as-is in GGUF (no `+1`).

use super::{shared, NameTable};

pub(super) const GLOBALS: &[NameTable] = &[shared::GLOBALS, PER_LAYER_GLOBALS, ASSISTANT];

/// The assistant's (MTP drafter's) projections between the target's width and its own
/// (`gemma4-assistant` GGUFs; the HF checkpoint stores them unprefixed at the top).
const ASSISTANT: NameTable = &[
    ("pre_projection.weight", "nextn.pre_projection.weight"),
    ("post_projection.weight", "nextn.post_projection.weight"),
];

const PER_LAYER_GLOBALS: NameTable = &[
    (
        "embed_tokens_per_layer.weight",
        "per_layer_token_embd.weight",
    ),
    (
        "per_layer_model_projection.weight",
        "per_layer_model_proj.weight",
    ),
    (
        "per_layer_projection_norm.weight",
        "per_layer_proj_norm.weight",
    ),
];

pub(super) const LAYER: &[NameTable] = &[
    shared::SANDWICH_NORMS,
    &[("layer_scalar", "layer_output_scale.weight")],
    shared::ATTN,
    shared::QK_NORMS,
    shared::MLP,
    PER_LAYER,
    MOE,
];

const PER_LAYER: NameTable = &[
    ("per_layer_input_gate.weight", "inp_gate.weight"),
    ("per_layer_projection.weight", "proj.weight"),
    ("post_per_layer_input_norm.weight", "post_norm.weight"),
];

/// Mixture-of-experts variant only.
const MOE: NameTable = &[
    ("router.proj.weight", "ffn_gate_inp.weight"),
    ("router.scale", "ffn_gate_inp.scale"),
    ("router.per_expert_scale", "ffn_down_exps.scale"),
    ("experts.gate_up_proj", "ffn_gate_up_exps.weight"),
    ("experts.down_proj", "ffn_down_exps.weight"),
    (
        "pre_feedforward_layernorm_2.weight",
        "pre_ffw_norm_2.weight",
    ),
    (
        "post_feedforward_layernorm_1.weight",
        "post_ffw_norm_1.weight",
    ),
    (
        "post_feedforward_layernorm_2.weight",
        "post_ffw_norm_2.weight",
    ),
];

/// Per-layer tensors that KV-shared layers must not use (some releases still ship them).
pub(super) const STALE_WHEN_SHARED: &[&str] = &[
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.k_norm.weight",
];
