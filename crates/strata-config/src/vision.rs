//! Gemma-4's vision tower (`vision_config` of a `Gemma4ForConditionalGeneration`
//! checkpoint) -> [`VisionConfig`].

use std::path::Path;

use serde::Serialize;

use crate::hf::{root_object, token_id, tower_section, Fields};
use crate::ConfigError;

/// The vision encoder and its projection into the text model's width.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VisionConfig {
    /// Encoder width.
    pub hidden_size: usize,
    /// The MLP's inner width.
    pub intermediate_size: usize,
    /// Encoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (divides `num_heads`).
    pub num_kv_heads: usize,
    /// Width of a head; a multiple of 4 (two axes, each rotated in halves).
    pub head_dim: usize,
    /// RMSNorm epsilon (the encoder's and the embedder's).
    pub rms_norm_eps: f64,
    /// Side of a square patch in pixels.
    pub patch_size: usize,
    /// Patches averaged along each axis into one soft token.
    pub pooling_kernel_size: usize,
    /// Rows of each axis's position-embedding table (the most patches along an axis).
    pub position_embedding_size: usize,
    /// The axial RoPE's base.
    pub rope_theta: f64,
    /// Whether the pooled output is standardized by `std_bias` and `std_scale`.
    pub standardize: bool,
    /// Whether each linear clamps its input and output to stored bounds.
    pub clipped_linears: bool,
    /// The text model's width: the soft tokens' size.
    pub text_hidden_size: usize,
    /// The placeholder id each soft token takes in the prompt (`image_token_id`).
    pub image_token_id: u32,
    /// The id before an image's placeholders (`boi_token_id`).
    pub boi_token_id: u32,
    /// The id after them (`eoi_token_id`).
    pub eoi_token_id: u32,
}

impl VisionConfig {
    /// The `vision_config` of a multimodal `config.json`; `None` when it has none.
    pub fn from_hf_json(text: &str) -> Result<Option<Self>, ConfigError> {
        let root = root_object(text)?;
        let Some((f, text_hidden_size)) = tower_section(&root, "vision_config.")? else {
            return Ok(None);
        };
        let top = Fields {
            obj: &root,
            prefix: "",
        };
        let hidden_size = f.positive("hidden_size", Some(768))?;
        let num_heads = f.positive("num_attention_heads", Some(12))?;
        let num_kv_heads = f.positive("num_key_value_heads", Some(num_heads))?;
        if num_heads % num_kv_heads != 0 {
            return Err(ConfigError::invalid(
                f.name("num_key_value_heads"),
                format!("{num_kv_heads} does not divide {num_heads} heads"),
            ));
        }
        let head_dim = f.positive("head_dim", Some(hidden_size / num_heads))?;
        if head_dim % 4 != 0 {
            return Err(ConfigError::invalid(
                f.name("head_dim"),
                format!("{head_dim}: the axial RoPE needs a multiple of 4"),
            ));
        }
        let (mut rope_theta, mut rope_type) = (100.0, "axial");
        if let Some(rp) = f.obj_opt("rope_parameters")? {
            let r = Fields {
                obj: rp,
                prefix: "vision_config.rope_parameters.",
            };
            rope_theta = r.f64_or("rope_theta", rope_theta)?;
            rope_type = r.str_opt("rope_type")?.unwrap_or(rope_type);
        }
        if rope_type != "axial" {
            return Err(ConfigError::unsupported(
                "vision_config.rope_parameters.rope_type",
                format!("{rope_type:?} (the vision tower's RoPE is axial)"),
            ));
        }
        match f.str_opt("hidden_activation")? {
            None | Some("gelu_pytorch_tanh") => {}
            Some(other) => {
                return Err(ConfigError::unsupported(
                    f.name("hidden_activation"),
                    format!("{other:?} (Strata's vision tower runs gelu_pytorch_tanh)"),
                ))
            }
        }
        Ok(Some(Self {
            hidden_size,
            intermediate_size: f.positive("intermediate_size", Some(3072))?,
            num_layers: f.positive("num_hidden_layers", Some(16))?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
            patch_size: f.positive("patch_size", Some(16))?,
            pooling_kernel_size: f.positive("pooling_kernel_size", Some(3))?,
            position_embedding_size: f.positive("position_embedding_size", Some(10 * 1024))?,
            rope_theta,
            standardize: f.bool_or("standardize", false)?,
            clipped_linears: f.bool_or("use_clipped_linears", false)?,
            text_hidden_size,
            image_token_id: token_id(&top, "image_token_id", 258_880)?,
            boi_token_id: token_id(&top, "boi_token_id", 255_999)?,
            eoi_token_id: token_id(&top, "eoi_token_id", 258_882)?,
        }))
    }

    /// The `vision_config` of the checkpoint at `dir` (or of `config.json` itself).
    pub fn load(path: &Path) -> Result<Option<Self>, ConfigError> {
        Self::from_hf_json(&crate::load::read_config_json(path)?)
    }
}
