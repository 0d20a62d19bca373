//! Tensor names: Hugging Face <-> GGUF, one table per architecture.
//!
//! HF names may carry any of the prefixes real checkpoints use (`model.`,
//! `model.language_model.` for Gemma's multimodal wrapper, legacy `language_model.model.`)
//! or none; the GGUF side is `token_embd.weight`, `blk.N.attn_q.weight`, ... Vision and
//! audio tower tensors map to nothing. `lm_head.weight` maps to `output.weight`; when a file
//! has no output tensor the embedding is tied (see [`crate::ModelWeights::lm_head`]).

mod gemma3;
mod gemma4;
mod llama;
mod qwen3;
mod shared;

use crate::error::{Result, WeightsError};

/// The architectures with a name table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Gemma-4.
    Gemma4,
    /// Gemma-3.
    Gemma3,
    /// Llama.
    Llama,
    /// Qwen3.
    Qwen3,
}

impl Arch {
    /// From a GGUF `general.architecture` or an HF `model_type` (`gemma4_text`, ...).
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "gemma4" | "gemma4_text" => Arch::Gemma4,
            "gemma3" | "gemma3_text" => Arch::Gemma3,
            "llama" => Arch::Llama,
            "qwen3" => Arch::Qwen3,
            _ => return None,
        })
    }

    /// The GGUF architecture string.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Gemma4 => "gemma4",
            Arch::Gemma3 => "gemma3",
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
        }
    }

    /// (global tensors, per-layer tensor suffixes), each as parts of (HF, GGUF) pairs.
    fn tables(self) -> (&'static [NameTable], &'static [NameTable]) {
        match self {
            Arch::Gemma4 => (gemma4::GLOBALS, gemma4::LAYER),
            Arch::Gemma3 => (gemma3::GLOBALS, gemma3::LAYER),
            Arch::Llama => (llama::GLOBALS, llama::LAYER),
            Arch::Qwen3 => (qwen3::GLOBALS, qwen3::LAYER),
        }
    }

    /// HF prefixes of the text decoder, most specific first.
    pub fn hf_prefixes(self) -> &'static [&'static str] {
        match self {
            Arch::Gemma4 | Arch::Gemma3 => {
                &["model.language_model.", "language_model.model.", "model."]
            }
            Arch::Llama | Arch::Qwen3 => &["model."],
        }
    }
}

/// (HF name, GGUF name) pairs.
type NameTable = &'static [(&'static str, &'static str)];

/// Every (HF, GGUF) pair of a table made of parts.
fn entries(
    parts: &'static [NameTable],
) -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    parts.iter().flat_map(|t| t.iter())
}

/// Top-level HF components of multimodal checkpoints that are not the text decoder.
const NON_TEXT: &[&str] = &[
    "vision_tower.",
    "audio_tower.",
    "embed_vision.",
    "embed_audio.",
    "multi_modal_projector.",
    "vision_model.",
];

const LM_HEAD: &str = "lm_head.weight";
const OUTPUT: &str = "output.weight";

/// Name translation for one architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NameMap {
    arch: Arch,
    /// First KV-shared layer (Gemma-4: `num_hidden_layers - num_kv_shared_layers`); the
    /// stale k/v projections and k norm of this layer and later ones are never mapped.
    first_shared_layer: Option<usize>,
}

impl NameMap {
    /// `arch` is a GGUF architecture or HF model type; `first_shared_layer` matters for
    /// Gemma-4 only.
    pub fn new(arch: &str, first_shared_layer: Option<usize>) -> Result<Self> {
        let arch =
            Arch::from_name(arch).ok_or_else(|| WeightsError::UnknownArch(arch.to_string()))?;
        Ok(Self::for_arch(arch, first_shared_layer))
    }

    /// The name table of `arch`; `first_shared_layer` as in [`NameMap::new`].
    pub fn for_arch(arch: Arch, first_shared_layer: Option<usize>) -> Self {
        Self {
            arch,
            first_shared_layer,
        }
    }

    /// The architecture of the table.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The first KV-shared layer (Gemma-4): its and later layers' stale K/V tensors are
    /// never mapped.
    pub fn first_shared_layer(&self) -> Option<usize> {
        self.first_shared_layer
    }

    /// The decoder-relative HF name (`layers.3.mlp.up_proj.weight`, `lm_head.weight`), or
    /// `None` for tensors outside the text decoder.
    pub fn strip_prefix<'a>(&self, hf: &'a str) -> Option<&'a str> {
        if hf == LM_HEAD || hf.ends_with(".lm_head.weight") {
            return Some(LM_HEAD);
        }
        let rest = self
            .arch
            .hf_prefixes()
            .iter()
            .find_map(|p| hf.strip_prefix(p))
            .unwrap_or(hf);
        if NON_TEXT.iter().any(|p| rest.starts_with(p)) {
            return None;
        }
        Some(rest)
    }

    /// Whether `hf` is a stale k/v projection or k norm of a KV-shared Gemma-4 layer, which
    /// must be ignored.
    pub fn is_stale_shared(&self, hf: &str) -> bool {
        let (Arch::Gemma4, Some(first)) = (self.arch, self.first_shared_layer) else {
            return false;
        };
        match self
            .strip_prefix(hf)
            .and_then(|r| split_layer("layers.", r))
        {
            Some((layer, suffix)) => layer >= first && gemma4::STALE_WHEN_SHARED.contains(&suffix),
            None => false,
        }
    }

    /// The GGUF name of an HF tensor, or `None` when it has none (other towers, stale
    /// shared-layer tensors, buffers such as `rotary_emb.inv_freq`).
    pub fn to_gguf(&self, hf: &str) -> Option<String> {
        if self.is_stale_shared(hf) {
            return None;
        }
        let rest = self.strip_prefix(hf)?;
        if rest == LM_HEAD {
            return Some(OUTPUT.to_string());
        }
        let (globals, layer) = self.arch.tables();
        if let Some((_, g)) = entries(globals).find(|(h, _)| *h == rest) {
            return Some(g.to_string());
        }
        let (n, suffix) = split_layer("layers.", rest)?;
        let (_, g) = entries(layer).find(|(h, _)| *h == suffix)?;
        Some(format!("blk.{n}.{g}"))
    }

    /// The HF name (text-only checkpoint form, `model.` prefix) of a GGUF tensor, or `None`
    /// for GGUF-only tensors such as `rope_freqs.weight`.
    pub fn to_hf(&self, gguf: &str) -> Option<String> {
        if gguf == OUTPUT {
            return Some(LM_HEAD.to_string());
        }
        let (globals, layer) = self.arch.tables();
        if let Some((h, _)) = entries(globals).find(|(_, g)| *g == gguf) {
            return Some(format!("model.{h}"));
        }
        let (n, suffix) = split_layer("blk.", gguf)?;
        let (h, _) = entries(layer).find(|(_, g)| *g == suffix)?;
        Some(format!("model.layers.{n}.{h}"))
    }

    /// How much a GGUF norm weight exceeds the HF one: 1.0 for Gemma-3 norms (its converter
    /// stores `1 + w`), else 0.0. Either way, GGUF norms multiply by the stored weight.
    pub fn gguf_norm_offset(&self, gguf: &str) -> f32 {
        if self.arch == Arch::Gemma3 && gguf.ends_with("norm.weight") {
            1.0
        } else {
            0.0
        }
    }
}

/// Splits `"{prefix}{N}.{suffix}"` into `(N, suffix)`; `N` must be a plain decimal.
fn split_layer<'a>(prefix: &str, name: &'a str) -> Option<(usize, &'a str)> {
    let rest = name.strip_prefix(prefix)?;
    let (n, suffix) = rest.split_once('.')?;
    let canonical =
        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0'));
    if !canonical {
        return None;
    }
    Some((n.parse().ok()?, suffix))
}

/// [`NameMap::to_gguf`] in one call.
pub fn gguf_name(arch: &str, hf_name: &str, first_shared_layer: Option<usize>) -> Option<String> {
    NameMap::new(arch, first_shared_layer)
        .ok()?
        .to_gguf(hf_name)
}

/// [`NameMap::to_hf`] in one call.
pub fn hf_name(arch: &str, gguf_name: &str) -> Option<String> {
    NameMap::new(arch, None).ok()?.to_hf(gguf_name)
}

#[cfg(test)]
mod tests;
