//! Media inputs for multimodal models, turned into what their encoders read.
//!
//! - [`LogMel`]: audio (mono, at the extractor's rate) -> log-mel frames, as transformers
//!   5.17's `Gemma4AudioFeatureExtractor` computes them.

mod mel;

pub use mel::{LogMel, LogMelFeatures};
