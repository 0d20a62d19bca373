//! The types the scheduler and the model share, so that neither depends on the other for
//! them: a step's batch and its output ([`batch`]), the KV pool's request handle
//! ([`RequestId`]), and sampling ([`sampling`]: the settings, the seeded uniforms and the
//! host sampler that defines a draw for every backend).
//!
//! ```
//! use strata_types::sampling::{draw_uniform, sample, SamplingParams};
//!
//! let logits = [0.1f32, 2.0, -1.0, 1.5];
//! let params = SamplingParams { temperature: 0.8, top_k: 3, ..SamplingParams::greedy() };
//! // Token 5 of a request seeded with 42: the same token on every run and every backend.
//! let token = sample(&logits, &params, draw_uniform(42, 5)).unwrap();
//! assert!(token < 4);
//! ```

pub mod batch;
mod error;
pub mod sampling;

pub use batch::{ForwardBatch, ForwardOutput, LogitsMode, RowEmbeds, SeqChunk};
pub use error::SamplingError;

/// A request's handle in the KV pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);
