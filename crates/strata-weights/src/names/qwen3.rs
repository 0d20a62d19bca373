//! Qwen3 dense (`qwen3`): Llama's layout plus per-head q/k RMSNorms. Not permuted in GGUF.

use super::{shared, NameTable};

pub(super) const GLOBALS: &[NameTable] = &[shared::GLOBALS];

pub(super) const LAYER: &[NameTable] = &[
    shared::PRE_NORMS,
    shared::ATTN,
    shared::QK_NORMS,
    shared::MLP,
];
