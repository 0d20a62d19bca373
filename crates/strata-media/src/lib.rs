//! Media inputs for multimodal models, turned into what their encoders read.
//!
//! - [`ImagePatcher`]: PNG / JPEG / WebP bytes or RGB pixels -> Gemma-4's patches and their
//!   positions, as transformers 5.17's `Gemma4ImageProcessorPil` makes them.
//! - [`decode_wav`], [`resample`]: WAV bytes -> mono samples at the extractor's rate.
//! - [`LogMel`]: audio (mono, at the extractor's rate) -> log-mel frames, as transformers
//!   5.17's `Gemma4AudioFeatureExtractor` computes them.

mod audio;
mod image;
mod mel;

pub use crate::audio::{decode_mp3, decode_wav, resample};
pub use crate::image::{ImagePatcher, Patches};
pub use mel::{LogMel, LogMelFeatures};

/// Media that cannot be turned into an encoder's input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaError {
    /// Undecodable, empty or oversized input; the text says which.
    Invalid(String),
}

impl std::fmt::Display for MediaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MediaError::Invalid(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for MediaError {}
