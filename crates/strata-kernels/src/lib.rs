//! Model ops behind one [`Backend`] trait, each implemented once per backend: a rayon CPU
//! backend ([`cpu::CpuBackend`]) that is the numerical reference, and (separately) CUDA.
//!
//! - [`Backend`]: memory (upload / zeros / download / strided copy) and the ops: embedding,
//!   RMSNorm (plain and fused residual forms), RoPE, dense and quantized matmul, gated
//!   activations, softcap, elementwise helpers, attention, sampling.
//! - [`RowDot`]: how quantized weight formats plug into CPU matmul and embedding.
//! - [`sampling`]: the host sampler (greedy / temperature / top-k / top-p / min-p, seeded)
//!   and log-probabilities.
//! - [`conformance`]: backend-agnostic checks of every op against scalar f64 references;
//!   any backend runs the same checks, one `#[test]` a case through
//!   [`conformance_tests!`].
//! - [`gpu_test`]: how GPU tests skip (and say so) where no GPU starts.

mod backend;
pub mod conformance;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod dtype;
mod error;
pub mod gpu_test;
mod paged;
mod params;
mod quant;
mod tuning;
/// The host sampler (settings, seeded uniforms, the draw's definition), from
/// `strata-types`, where the scheduler reads it too.
pub use strata_types::sampling;

pub use backend::{Backend, DeviceBuffer, RopeAt};
pub use dtype::{DType, HostSlice};
pub use error::{KernelError, Result};
pub use paged::{expand_page_slots, has_scales, KvFormat, KvSlabContents, KvSlabShape, PagedSeq};
pub use params::{
    lora_slot_index, Activation, AttentionParams, ChunkedAttentionParams, ClusterPick,
    DepthwiseConv, LoraOut, LoraShape, LoraStacks, MatmulOut, MatmulShape, NextNorm, QkvPrep,
    ResidualStep, RmsNormParams, RopeParams, RopeStyle, StridedCopy, TableSlice,
};
pub use quant::{MatrixShape, RowDot};
pub use tuning::{CudaTuning, DecodeGraphs, TuningVariable};
