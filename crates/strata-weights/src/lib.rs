//! Model tensors from Hugging Face safetensors and GGUF files, and the GGUF quantized block
//! formats. No model maths lives here: this crate hands out typed byte views and decodes them.
//!
//! - [`SafetensorsModel`]: one `.safetensors` file or a sharded checkpoint
//!   (`model.safetensors.index.json`), memory-mapped; F32/F16/BF16.
//! - [`GgufModel`]: a GGUF file (via `strata-gguf`), any of [`quant::SUPPORTED_TYPES`].
//! - [`Weights`]: either of the two behind the [`WeightSource`] trait; [`TensorView`] is what
//!   both return. Shapes are always in HF order (outermost first): a GGUF `{in, out}` matrix is
//!   reported as `[out, in]`, with identical bytes.
//! - [`quant`]: block layouts, dequantization, dot products, quantization.
//! - [`names`]: HF <-> GGUF tensor names per architecture; [`ModelWeights`] looks tensors up
//!   by HF name in either kind of file.
//! - [`inspect()`]: tensor count, types and parameter count of a file or model directory.
//!
//! Layout caveat for GGUF `llama`: llama.cpp's converter permutes the rows of `attn_q` and
//! `attn_k` so that its interleaved ("normal") RoPE gives the same result as HF's
//! rotate-half RoPE. This crate does not undo that: a GGUF llama model must use interleaved
//! RoPE on those weights, while the same model from safetensors uses rotate-half. Gemma and
//! Qwen3 GGUFs are not permuted (they use NeoX-style RoPE in llama.cpp too).

pub mod bnb;
mod error;
mod finite;
mod gguf_model;
pub mod inspect;
mod model;
pub mod names;
pub mod quant;
mod safetensors;
mod source;
mod view;

#[doc(hidden)]
pub mod fuzzing;

pub use error::{Result, WeightsError};
pub use finite::{check_finite, FiniteScan};
pub use gguf_model::GgufModel;
pub use inspect::{inspect, WeightsSummary};
pub use model::ModelWeights;
pub use names::NameMap;
pub use safetensors::{write_safetensors, SafetensorsModel};
pub use source::{WeightSource, Weights};
pub use strata_gguf::{GgmlType, GgufFile, Value};
pub use view::TensorView;

/// The type of a tensor's elements: one of ggml's types (F32/F16/BF16 for safetensors).
pub type TensorType = GgmlType;
