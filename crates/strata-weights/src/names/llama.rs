//! Llama (`llama`). GGUF `attn_q`/`attn_k` rows are permuted for interleaved RoPE by the
//! converter (see the crate docs); the names map one to one regardless.

use super::{shared, NameTable};

pub(super) const GLOBALS: &[NameTable] = &[shared::GLOBALS];

pub(super) const LAYER: &[NameTable] = &[shared::PRE_NORMS, shared::ATTN, shared::MLP];
