//! Gemma-4's assistant (MTP drafter) `config.json` -> `AssistantConfig`.
//!
//! The assistant is a small Gemma-4 decoder whose every layer reads the target's K/V: it
//! owns no K/V projections and no cache. Its text configuration parses as any Gemma-4 text
//! model's; what it reads from the target is fixed once by [`AssistantConfig::bind`].

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::hf::{gemma4, root_object, Fields, Obj};
use crate::{Architecture, ConfigError, ModelConfig};

/// The ordered-embedding output head: the vocabulary split into `count` clusters of equal
/// size, of which the `top_k` nearest to the state are scored exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CentroidHead {
    /// Number of clusters (`num_centroids`); divides the vocabulary.
    pub count: usize,
    /// Clusters scored exactly per step (`centroid_intermediate_top_k`).
    pub top_k: usize,
}

/// A drafter for a Gemma-4 target.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AssistantConfig {
    /// The drafter's decoder. Once bound to a target, every layer's `kv_source` is the
    /// target layer whose K/V it reads, and its sliding layers' `window` is what it sees.
    pub decoder: ModelConfig,
    /// The target's hidden size: the drafter reads `[embedding, hidden state]` of that size
    /// and returns a state of that size for its next step.
    pub backbone_hidden_size: usize,
    /// `None`: the whole vocabulary is scored.
    pub centroids: Option<CentroidHead>,
    /// The drafter's own `sliding_window`.
    pub sliding_window: usize,
}

impl AssistantConfig {
    /// Parses an assistant's `config.json` document.
    pub fn from_hf_json(text: &str) -> Result<Self, ConfigError> {
        let root = root_object(text)?;
        let top = Fields {
            obj: &root,
            prefix: "",
        };
        match top.str_opt("model_type")? {
            Some("gemma4_assistant") => {}
            Some(other) => {
                return Err(ConfigError::unsupported(
                    "model_type",
                    format!("{other:?} as a draft model; Strata drafts with gemma4_assistant"),
                ))
            }
            None => return Err(ConfigError::Missing("model_type".into())),
        }
        let tc = top
            .obj_opt("text_config")?
            .ok_or_else(|| ConfigError::Missing("text_config".into()))?;
        let f = Fields {
            obj: tc,
            prefix: "text_config.",
        };
        // What the reference refuses for an assistant.
        if f.usize_or("hidden_size_per_layer_input", 256)? != 0 {
            return Err(ConfigError::unsupported(
                f.name("hidden_size_per_layer_input"),
                "per-layer inputs in a draft model (must be 0)",
            ));
        }
        if f.bool_or("use_double_wide_mlp", false)? {
            return Err(ConfigError::unsupported(
                f.name("use_double_wide_mlp"),
                "a double-wide MLP in a draft model",
            ));
        }
        let n = f.positive("num_hidden_layers", None)?;
        match f.usize_or("num_kv_shared_layers", 0)? {
            0 => {}
            s if s == n => {}
            s => {
                return Err(ConfigError::unsupported(
                    f.name("num_kv_shared_layers"),
                    format!(
                    "{s} of {n} layers shared: every layer of a draft model reads the target's K/V"
                ),
                ))
            }
        }
        // The layers parse as an ordinary Gemma-4 text model's; which target layers they
        // read is decided by `bind`, so here none is marked shared.
        let mut own: Obj = tc.clone();
        own.insert("num_kv_shared_layers".into(), Value::from(0));
        let decoder = gemma4(&Fields {
            obj: &own,
            prefix: "text_config.",
        })?;
        let vocab = decoder.vocab_size;
        let centroids = if top.bool_or("use_ordered_embeddings", false)? {
            let count = top.positive("num_centroids", Some(2048))?;
            let top_k = top.positive("centroid_intermediate_top_k", Some(32))?;
            if vocab % count != 0 {
                return Err(ConfigError::invalid(
                    "num_centroids",
                    format!("{count} does not divide the vocabulary of {vocab}"),
                ));
            }
            if top_k > count {
                return Err(ConfigError::invalid(
                    "centroid_intermediate_top_k",
                    format!("{top_k} exceeds num_centroids ({count})"),
                ));
            }
            Some(CentroidHead { count, top_k })
        } else {
            None
        };
        Ok(Self {
            sliding_window: f.positive("sliding_window", Some(512))?,
            backbone_hidden_size: top.positive("backbone_hidden_size", Some(1536))?,
            centroids,
            decoder,
        })
    }

    /// A `gemma4-assistant` GGUF, as llama.cpp's converter writes one. The converter drops
    /// the ordered-embedding (centroid) head, so a GGUF drafter scores the whole
    /// vocabulary, as llama.cpp's does.
    pub fn from_gguf(file: &strata_gguf::GgufFile) -> Result<Self, ConfigError> {
        let (decoder, meta) = crate::gguf::parse_assistant_decoder(file)?;
        Ok(Self {
            decoder,
            backbone_hidden_size: meta.backbone_hidden_size,
            centroids: None,
            sliding_window: meta.sliding_window,
        })
    }

    /// Checks the drafter against `target` and points each of its layers at the target
    /// layer it reads: the last KV-owning layer of the same attention type (the layer whose
    /// K/V the target's own KV-shared layers read). A sliding layer sees the last
    /// `sliding_window + 1` positions before the drafted one, as the reference's mask does,
    /// but never more than the target keeps (its own window).
    pub fn bind(&mut self, target: &ModelConfig) -> Result<(), ConfigError> {
        if target.architecture != Architecture::Gemma4 {
            return Err(ConfigError::unsupported(
                "model_type",
                format!(
                    "a gemma4_assistant drafts for Gemma-4 targets, not {}",
                    target.architecture.name()
                ),
            ));
        }
        if self.backbone_hidden_size != target.hidden_size {
            return Err(ConfigError::invalid(
                "backbone_hidden_size",
                format!(
                    "{} but the target's hidden size is {}",
                    self.backbone_hidden_size, target.hidden_size
                ),
            ));
        }
        if self.decoder.vocab_size != target.vocab_size {
            return Err(ConfigError::invalid(
                "text_config.vocab_size",
                format!(
                    "{} but the target's vocabulary is {}",
                    self.decoder.vocab_size, target.vocab_size
                ),
            ));
        }
        for (l, layer) in self.decoder.layers.iter_mut().enumerate() {
            let ty = layer.attention;
            let source = (0..target.num_layers())
                .rev()
                .find(|&j| target.layers[j].attention == ty && target.layers[j].owns_kv())
                .ok_or_else(|| {
                    ConfigError::unsupported(
                        "text_config.layer_types",
                        format!(
                            "layer {l} is {} but the target has no such layer owning K/V",
                            ty.hf_name()
                        ),
                    )
                })?;
            let src = &target.layers[source];
            if (src.num_kv_heads, src.head_dim) != (layer.num_kv_heads, layer.head_dim) {
                return Err(ConfigError::invalid(
                    "text_config.num_key_value_heads",
                    format!(
                        "layer {l} reads target layer {source}, whose K/V is {} heads x {} but \
                         the draft layer's is {} x {}",
                        src.num_kv_heads, src.head_dim, layer.num_kv_heads, layer.head_dim
                    ),
                ));
            }
            layer.kv_source = Some(source);
            layer.window = src.window.map(|w| (self.sliding_window + 1).min(w));
        }
        self.decoder.num_kv_shared_layers = self.decoder.num_layers();
        Ok(())
    }

    /// The target layer each drafter layer reads, once bound.
    pub fn target_layers(&self) -> Vec<usize> {
        self.decoder
            .layers
            .iter()
            .enumerate()
            .map(|(l, c)| c.kv_source.unwrap_or(l))
            .collect()
    }
}

/// Loads a drafter's configuration from its directory (or its `config.json`).
pub fn load_assistant_config(path: &Path) -> Result<AssistantConfig, ConfigError> {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return AssistantConfig::from_gguf(&strata_gguf::GgufFile::open(path)?);
    }
    AssistantConfig::from_hf_json(&crate::load::read_config_json(path)?)
}
