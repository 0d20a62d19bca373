//! A model: configuration plus weights on a backend.

use std::path::Path;
use std::sync::Arc;

use strata_config::{load_model_config, ModelConfig, ModelSource, SourceFormat};
use strata_kernels::{Backend, DType};
use strata_weights::{GgmlType, ModelWeights};

use crate::error::Result;
use crate::linear::QuantUpload;
use crate::lora::{LoraAdapter, LoraInfo, LoraSet, LoraStats};
use crate::tensors::ModelTensors;

/// Called as a model's weights load: `(done, total)` in steps of the load (the embeddings,
/// each layer, the output projection), `done` rising to `total`.
#[derive(Clone)]
pub struct LoadProgress(pub Arc<dyn Fn(usize, usize) + Send + Sync>);

impl LoadProgress {
    pub(crate) fn report(&self, done: usize, total: usize) {
        (self.0)(done, total)
    }
}

impl std::fmt::Debug for LoadProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoadProgress")
    }
}

/// How weights are placed on the backend.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Dense (F32/BF16/F16) weights are converted to this dtype on upload; `None` keeps the
    /// stored dtype. GGUF block formats follow the backend's `QuantUpload`.
    pub weight_dtype: Option<DType>,
    /// Keep the lookup-only tables (Gemma-4's per-layer embeddings; the token embedding
    /// when it is not tied to the output projection) in host memory; each step's rows are
    /// gathered there and uploaded.
    pub host_embeddings: bool,
    /// Dense matrices quantized to this GGUF block format as they load
    /// (`quantize::LOAD_QUANT_TYPES`); `None` keeps them dense.
    pub quantize: Option<strata_weights::GgmlType>,
    /// A GGUF's block-quantized matrices stay blocks on a backend that can compute with
    /// them (CUDA); otherwise they are decoded to bf16 there at load. The CPU always
    /// computes on the blocks. Weights quantized at load (`quantize`) always stay blocks.
    pub keep_blocks: bool,
    /// Told of the load's progress.
    pub progress: Option<LoadProgress>,
}

/// A decoder model: its configuration and its weights on backend `B`.
pub struct Model<B: Backend> {
    pub(crate) backend: B,
    pub(crate) config: ModelConfig,
    pub(crate) tensors: ModelTensors<B>,
    /// Token embedding multiplier (Gemma: `sqrt(H)`, rounded as the reference does).
    pub(crate) embed_scale: f32,
    /// Per-layer embedding multiplier (`sqrt(P)`).
    pub(crate) ple_scale: f32,
    /// Whether the KV-shared layers run only the rows whose logits are wanted (on unless
    /// a test turns it off; see `Model::set_kv_shared_trim`).
    pub(crate) trim_shared_rows: bool,
    /// LoRA adapters the batches may name (`ForwardBatch::adapters`).
    pub(crate) loras: LoraSet<B>,
}

/// `sqrt(n)` as the reference applies it: transformers casts the scale to the weight dtype;
/// llama.cpp (GGUF) multiplies by the exact f32 value.
fn embedding_scale(n: usize, source: SourceFormat, weight: GgmlType) -> f32 {
    let s = (n as f32).sqrt();
    match (source, weight) {
        (SourceFormat::HuggingFace, GgmlType::BF16) => half::bf16::from_f32(s).to_f32(),
        (SourceFormat::HuggingFace, GgmlType::F16) => half::f16::from_f32(s).to_f32(),
        _ => s,
    }
}

impl<B: QuantUpload> Model<B> {
    /// Loads the model at `path` (a model directory, `config.json`'s directory, or a `.gguf`).
    pub fn load(backend: B, path: &Path) -> Result<Self> {
        Self::load_with(backend, path, LoadOptions::default())
    }

    /// [`Model::load`] with placement options.
    pub fn load_with(backend: B, path: &Path, opts: LoadOptions) -> Result<Self> {
        let (config, source) = load_model_config(path)?;
        let weights_path = match &source {
            ModelSource::HuggingFace { dir, .. } => dir.clone(),
            ModelSource::Gguf(p) => p.clone(),
        };
        let first_shared = (config.num_kv_shared_layers > 0)
            .then(|| config.num_layers() - config.num_kv_shared_layers);
        let weights = ModelWeights::open(
            &weights_path,
            Some(config.architecture.name()),
            first_shared,
        )?;
        Self::from_weights_with(backend, config, &weights, opts)
    }

    /// Builds the model from weights already opened, with default placement.
    pub fn from_weights(backend: B, config: ModelConfig, weights: &ModelWeights) -> Result<Self> {
        Self::from_weights_with(backend, config, weights, LoadOptions::default())
    }

    /// [`Model::from_weights`] with placement options.
    pub fn from_weights_with(
        backend: B,
        config: ModelConfig,
        weights: &ModelWeights,
        opts: LoadOptions,
    ) -> Result<Self> {
        let tensors = ModelTensors::load(&backend, &config, weights, &opts)?;
        let stored = weights
            .require(
                "embed_tokens.weight",
                &[config.vocab_size, config.hidden_size],
            )?
            .ty;
        // The scale is rounded to the dtype the weights compute in (transformers casts it
        // to the embedding's dtype after loading).
        let embed_ty = match opts.weight_dtype {
            Some(DType::F32) => GgmlType::F32,
            Some(DType::BF16) => GgmlType::BF16,
            Some(DType::F16) => GgmlType::F16,
            None => stored,
        };
        let embed_scale = if config.scale_embeddings {
            embedding_scale(config.hidden_size, config.source_format, embed_ty)
        } else {
            1.0
        };
        let ple_scale = config.per_layer_input.map_or(1.0, |p| {
            embedding_scale(p.hidden_size, config.source_format, embed_ty)
        });
        Ok(Self {
            backend,
            config,
            tensors,
            embed_scale,
            ple_scale,
            trim_shared_rows: true,
            loras: LoraSet::default(),
        })
    }

    /// Loads the PEFT adapter in `dir` as adapter `id` (1 and up), replacing any of that
    /// id; see [`LoraAdapter::load`] for what is refused.
    pub fn load_lora(&self, id: u32, dir: &Path, max_rank: usize) -> Result<LoraInfo> {
        let adapter = LoraAdapter::load(&self.tensors.layers, dir, max_rank)?;
        let info = adapter.info().clone();
        self.loras.insert(id, adapter)?;
        Ok(info)
    }
}

impl<B: Backend> Model<B> {
    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The backend the weights live on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Whether a lookup table lives in host memory (steps then cross to the host, so they
    /// cannot be captured as graphs).
    pub fn has_host_tables(&self) -> bool {
        self.tensors.embed.is_host() || self.tensors.ple.as_ref().is_some_and(|p| p.table.is_host())
    }

    /// Whether a step runs its KV-shared layers (Gemma-4's top layers, which store no K/V)
    /// for the rows whose logits are wanted only: a prompt's last row instead of all of
    /// them, nothing for a prompt chunk that is not the last. The logits are the same
    /// either way (nothing those layers compute for other rows is read again), which the
    /// parity tests check by turning it off; on by default.
    pub fn set_kv_shared_trim(&mut self, on: bool) {
        self.trim_shared_rows = on;
    }

    /// Drops LoRA adapter `id`; whether it was loaded. A batch naming it afterwards fails.
    pub fn unload_lora(&self, id: u32) -> bool {
        self.loras.remove(id)
    }

    /// At most `n` LoRA adapters on the backend at once (the others wait in host memory and
    /// are uploaded when a step names them); a step may name no more than `n`.
    pub fn set_max_resident_loras(&self, n: usize) {
        self.loras.set_max_resident(n);
    }

    /// Adapters loaded, on the backend, and uploads so far.
    pub fn lora_stats(&self) -> LoraStats {
        self.loras.stats()
    }

    /// The KV-shared layers a prompt's step runs for its last row only (none when the model
    /// has none or trimming is off; see [`Model::set_kv_shared_trim`]).
    pub fn kv_shared_trimmed_layers(&self) -> usize {
        self.first_trimmed_layer()
            .map_or(0, |first| self.config.num_layers() - first)
    }

    /// The first layer past the last KV-owning one, where a step may drop rows: `None`
    /// when trimming is off or every layer owns its K/V.
    pub(crate) fn first_trimmed_layer(&self) -> Option<usize> {
        let layers = &self.config.layers;
        let first = layers.iter().rposition(|l| l.owns_kv()).map(|i| i + 1)?;
        (self.trim_shared_rows && first < layers.len()).then_some(first)
    }

    /// See [`ModelTensors::matmul_elements`].
    pub fn matmul_elements(&self) -> usize {
        self.tensors.matmul_elements()
    }
}

impl<B: QuantUpload> Model<B> {
    /// See [`ModelTensors::weight_bytes`]: (bytes of the backend's memory the weights take,
    /// bytes a decode step's products read).
    pub fn weight_bytes(&self) -> (usize, usize) {
        self.tensors.weight_bytes()
    }
}
