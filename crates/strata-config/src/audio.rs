//! Gemma-4's audio tower (`audio_config` of a `Gemma4ForConditionalGeneration` checkpoint)
//! -> [`AudioConfig`].

use std::path::Path;

use serde::Serialize;

use crate::hf::{root_object, token_id, tower_section, Fields};
use crate::ConfigError;

/// The conformer audio encoder and its projection into the text model's width.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AudioConfig {
    /// Conformer width.
    pub hidden_size: usize,
    /// Conformer layers.
    pub num_layers: usize,
    /// Attention heads (`hidden_size / num_heads` wide each).
    pub num_heads: usize,
    /// Channels of the two stride-2 subsampling convolutions; the first is also the log-mel
    /// bins each frame holds.
    pub subsampling_channels: [usize; 2],
    /// Taps of the light convolution (causal, depthwise).
    pub conv_kernel_size: usize,
    /// Scale of each feed-forward block's output before its residual.
    pub residual_weight: f64,
    /// Frames a block of queries holds in the chunked local attention.
    pub chunk_size: usize,
    /// `attention_context_left`: the keys a query sees are itself and `left - 2` before it.
    pub context_left: usize,
    /// `attention_context_right`.
    pub context_right: usize,
    /// Attention logits are soft-capped at this value.
    pub logit_cap: f64,
    /// The logit a masked key gets.
    pub invalid_logit: f64,
    /// Whether each clippable linear clamps its input and output to stored bounds.
    pub clipped_linears: bool,
    /// RMSNorm (and the subsampling LayerNorm) epsilon.
    pub rms_norm_eps: f64,
    /// Activations are clamped to +-this around each block.
    pub gradient_clipping: f64,
    /// Width of the tower's output projection (the embedder's input).
    pub output_dims: usize,
    /// The text model's width: the soft tokens' size.
    pub text_hidden_size: usize,
    /// The placeholder id each soft token takes in the prompt (`audio_token_id`).
    pub audio_token_id: u32,
    /// The id before a clip's placeholders (`boa_token_id`).
    pub boa_token_id: u32,
    /// The id after them (`eoa_token_id`, else `eoa_token_index`).
    pub eoa_token_id: u32,
}

impl AudioConfig {
    /// The `audio_config` of a multimodal `config.json`; `None` when it has none.
    pub fn from_hf_json(text: &str) -> Result<Option<Self>, ConfigError> {
        let root = root_object(text)?;
        let Some((f, text_hidden_size)) = tower_section(&root, "audio_config.")? else {
            return Ok(None);
        };
        let top = Fields {
            obj: &root,
            prefix: "",
        };
        let hidden_size = f.positive("hidden_size", Some(1024))?;
        let num_heads = f.positive("num_attention_heads", Some(8))?;
        if hidden_size % num_heads != 0 {
            return Err(ConfigError::invalid(
                f.name("num_attention_heads"),
                format!("{num_heads} does not divide the width {hidden_size}"),
            ));
        }
        let channels = match f.get("subsampling_conv_channels") {
            None => [128, 32],
            Some(v) => {
                let list: Vec<usize> = v
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_u64())
                            .map(|x| x as usize)
                            .collect()
                    })
                    .unwrap_or_default();
                match list[..] {
                    [a, b] if a > 0 && b > 0 && a % 4 == 0 => [a, b],
                    _ => {
                        return Err(ConfigError::invalid(
                            f.name("subsampling_conv_channels"),
                            "two positive channel counts, the first a multiple of 4",
                        ))
                    }
                }
            }
        };
        match f.str_opt("hidden_act")? {
            None | Some("silu") => {}
            Some(other) => {
                return Err(ConfigError::unsupported(
                    f.name("hidden_act"),
                    format!("{other:?} (Strata's audio tower runs silu)"),
                ))
            }
        }
        let context_left = f.positive("attention_context_left", Some(13))?;
        if context_left < 2 {
            return Err(ConfigError::invalid(
                f.name("attention_context_left"),
                "at least 2 (a query sees itself and left - 2 frames before it)",
            ));
        }
        // Google's configs name it `eoa_token_index`; a re-saved one may carry both.
        let eoa_key = if top.get("eoa_token_id").is_some() {
            "eoa_token_id"
        } else {
            "eoa_token_index"
        };
        Ok(Some(Self {
            hidden_size,
            num_layers: f.positive("num_hidden_layers", Some(12))?,
            num_heads,
            subsampling_channels: channels,
            conv_kernel_size: f.positive("conv_kernel_size", Some(5))?,
            residual_weight: f.f64_or("residual_weight", 0.5)?,
            chunk_size: f.positive("attention_chunk_size", Some(12))?,
            context_left,
            context_right: f.usize_or("attention_context_right", 0)?,
            logit_cap: f.f64_or("attention_logit_cap", 50.0)?,
            invalid_logit: f.f64_or("attention_invalid_logits_value", -1e9)?,
            clipped_linears: f.bool_or("use_clipped_linears", true)?,
            rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
            gradient_clipping: f.f64_or("gradient_clipping", 1e10)?,
            output_dims: f.positive("output_proj_dims", Some(1536))?,
            text_hidden_size,
            audio_token_id: token_id(&top, "audio_token_id", 258_881)?,
            boa_token_id: token_id(&top, "boa_token_id", 256_000)?,
            eoa_token_id: token_id(&top, eoa_key, 258_883)?,
        }))
    }

    /// The `audio_config` of the checkpoint at `dir` (or of `config.json` itself).
    pub fn load(path: &Path) -> Result<Option<Self>, ConfigError> {
        Self::from_hf_json(&crate::load::read_config_json(path)?)
    }

    /// Frames of the attention's context window per block of queries.
    pub fn context_size(&self) -> usize {
        self.chunk_size + self.context_left - 1 + self.context_right
    }
}
