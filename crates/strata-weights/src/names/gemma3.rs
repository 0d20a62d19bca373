//! Gemma-3 text decoder (`gemma3`). The GGUF converter stores every RMSNorm weight as
//! `1 + w` (HF applies `1 + w` at run time), see [`super::NameMap::gguf_norm_offset`].

use super::{shared, NameTable};

pub(super) const GLOBALS: &[NameTable] = &[shared::GLOBALS];

pub(super) const LAYER: &[NameTable] = &[
    shared::SANDWICH_NORMS,
    shared::ATTN,
    shared::QK_NORMS,
    shared::MLP,
];
