//! Model configuration: one `ModelConfig` from a Hugging Face `config.json` or GGUF metadata.
//!
//! Everything the engine needs to know about a model's shape is resolved here, once, per
//! layer: attention type, head dim, KV heads, window, RoPE, MLP width and, for KV-shared
//! layers, the layer whose KV they read. Shapes the engine cannot serve are refused with an
//! error naming the field, so nothing downstream has to guess.

mod assistant;
mod audio;
mod error;
mod gguf;
mod gguf_tensors;
mod hf;
mod kv;
mod load;
mod rope;
mod validate;
mod vision;

use serde::Serialize;

pub use assistant::{load_assistant_config, AssistantConfig, CentroidHead};
pub use audio::AudioConfig;
pub use error::ConfigError;
pub use kv::{KvGroupSpec, KvShape};
pub use load::{load_model_config, ModelSource};
pub use rope::{RopeConfig, RopeKind, RopeStyle};
pub use vision::VisionConfig;

/// Model families the engine serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Gemma-4 (`gemma4`, `gemma4_text`).
    Gemma4,
    /// Gemma-3 (`gemma3`, `gemma3_text`).
    Gemma3,
    /// Llama (`llama`).
    Llama,
    /// Qwen3.
    Qwen3,
}

impl Architecture {
    /// The lowercase name (`"gemma4"`), as serialized.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Gemma4 => "gemma4",
            Architecture::Gemma3 => "gemma3",
            Architecture::Llama => "llama",
            Architecture::Qwen3 => "qwen3",
        }
    }
}

/// The two attention types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum AttentionType {
    /// Every earlier position is visible.
    #[serde(rename = "full_attention")]
    Full,
    /// Only the last `window` positions are visible ([`LayerConfig::window`]).
    #[serde(rename = "sliding_attention")]
    Sliding,
}

impl AttentionType {
    /// The HF `layer_types` spelling.
    pub fn hf_name(self) -> &'static str {
        match self {
            AttentionType::Full => "full_attention",
            AttentionType::Sliding => "sliding_attention",
        }
    }

    /// The short name used in KV group listings ("full" / "sliding").
    pub fn short_name(self) -> &'static str {
        match self {
            AttentionType::Full => "full",
            AttentionType::Sliding => "sliding",
        }
    }
}

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `gelu(x, approximate="tanh")` (Gemma's `gelu_pytorch_tanh`).
    GeluTanh,
    /// `x * sigmoid(x)` (Llama, Qwen3).
    Silu,
}

/// Where the configuration (and so the weights) came from; it decides weight conventions
/// such as Gemma-3's `(1 + w)` norms, which GGUF files store already added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceFormat {
    /// A Hugging Face directory with `config.json` (and safetensors).
    HuggingFace,
    /// A single GGUF file.
    Gguf,
}

/// One decoder layer's resolved shape.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerConfig {
    /// Full or sliding attention.
    pub attention: AttentionType,
    /// Width of one attention head, in elements.
    pub head_dim: usize,
    /// KV heads (grouped-query attention: fewer than the query heads).
    pub num_kv_heads: usize,
    /// `Some(W)` for sliding layers: a query at `t` sees keys `s` with `t - s < W`.
    pub window: Option<usize>,
    /// Rotary embedding of the layer's queries and keys.
    pub rope: RopeConfig,
    /// MLP width (double for KV-shared layers when `use_double_wide_mlp`).
    pub intermediate_size: usize,
    /// For a KV-shared layer, the layer whose K/V it reads; `None` when it owns its KV.
    pub kv_source: Option<usize>,
}

impl LayerConfig {
    /// Whether the layer has KV of its own (is not KV-shared).
    pub fn owns_kv(&self) -> bool {
        self.kv_source.is_none()
    }
}

/// Per-layer input embeddings (Gemma-4 PLE).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PerLayerInput {
    /// `hidden_size_per_layer_input` (P).
    pub hidden_size: usize,
    /// `vocab_size_per_layer_input`.
    pub vocab_size: usize,
}

/// Everything the engine reads about a model's shape.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelConfig {
    /// The model family.
    pub architecture: Architecture,
    /// Whether the configuration came from `config.json` or GGUF metadata.
    pub source_format: SourceFormat,
    /// Vocabulary size: rows of the embedding table and of the logits.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Query heads per layer.
    pub num_attention_heads: usize,
    /// Every decoder layer's resolved shape, in order.
    pub layers: Vec<LayerConfig>,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f64,
    /// The MLP's gate activation.
    pub activation: Activation,
    /// Longest context the model was trained for, in tokens.
    pub max_position_embeddings: usize,
    /// The output head reuses the token embedding matrix.
    pub tie_word_embeddings: bool,
    /// Multiplier of q·k before softmax (1.0 for Gemma-4, `query_pre_attn_scalar^-1/2` for
    /// Gemma-3, `head_dim^-1/2` for Llama and Qwen3).
    pub attention_scale: f64,
    /// `cap`: final logits become `cap * tanh(logits / cap)`; `None` for no cap.
    pub final_logit_softcapping: Option<f64>,
    /// `cap`: attention scores become `cap * tanh(scores / cap)`; `None` for no cap.
    pub attn_logit_softcapping: Option<f64>,
    /// Added to every norm weight before multiplying: 1.0 for Gemma-3 HF checkpoints.
    pub norm_weight_offset: f32,
    /// Token embeddings are multiplied by `sqrt(hidden_size)` (Gemma).
    pub scale_embeddings: bool,
    /// Per-head RMSNorm of q and k (Gemma-3, Gemma-4, Qwen3).
    pub qk_norm: bool,
    /// Weightless RMSNorm of v (Gemma-4).
    pub v_norm: bool,
    /// Norms after attention and MLP as well as before (Gemma-3, Gemma-4).
    pub sandwich_norms: bool,
    /// Each layer scales the residual stream by a loaded scalar (Gemma-4).
    pub layer_scalar: bool,
    /// Gemma-4 per-layer input embeddings; `None` for models without them.
    pub per_layer_input: Option<PerLayerInput>,
    /// How many of the last layers read an earlier layer's KV instead of owning their own.
    pub num_kv_shared_layers: usize,
    /// Beginning-of-sequence token id, when the configuration gives one.
    pub bos_token_id: Option<u32>,
    /// Ids that end generation (several: e.g. GGUF's EOS, EOT and EOM); may be empty.
    pub eos_token_ids: Vec<u32>,
    /// Padding token id, when the configuration gives one.
    pub pad_token_id: Option<u32>,
    /// A multimodal checkpoint's placeholder ids (image, audio, video): transformers embeds
    /// each as the pad token wherever it appears (with its per-layer inputs), so Strata does.
    pub placeholder_ids: Vec<u32>,
    /// The checkpoint's declared dtype (`torch_dtype` / `dtype`), when given.
    pub dtype: Option<String>,
}

impl ModelConfig {
    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// The per-layer attention types in order.
    pub fn layer_types(&self) -> Vec<AttentionType> {
        self.layers.iter().map(|l| l.attention).collect()
    }

    /// `(layer, source)` for every KV-shared layer, in layer order.
    pub fn kv_shared_layers(&self) -> Vec<(usize, usize)> {
        self.layers
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.kv_source.map(|s| (i, s)))
            .collect()
    }

    /// The layer whose KV buffers layer `layer` reads: itself, or its source when shared.
    pub fn kv_layer_for(&self, layer: usize) -> usize {
        self.layers[layer].kv_source.unwrap_or(layer)
    }

    /// Largest head dim over all layers (workspace sizing).
    pub fn max_head_dim(&self) -> usize {
        self.layers.iter().map(|l| l.head_dim).max().unwrap_or(0)
    }
}
