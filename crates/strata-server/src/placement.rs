//! Where and how the model's weights are placed: flags shared by every command that loads
//! a model.

use std::path::Path;

use anyhow::Context;
use clap::Args;
use strata_engine::{Device, LoadSettings, LoadedModel, WeightDtype};

/// Where lookup-only embedding tables live.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbedPlacement {
    /// With the other weights, in the model's device memory.
    Device,
    /// In host memory; each step uploads only the rows it uses.
    Host,
}

/// Where the vision tower runs when the model is on a GPU.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MediaDevice {
    /// A copy on the model's GPU, on a stream of its own.
    Device,
    /// On the host's CPU threads, in f32.
    Host,
}

/// The weight-placement flags.
#[derive(Args, Clone, Debug)]
pub struct PlacementArgs {
    /// auto (CUDA when a GPU starts, else the CPU), cpu or cuda.
    #[arg(long, default_value = "auto")]
    pub device: Device,
    /// Dtype dense weights compute in: auto (as stored; bf16 GEMMs on CUDA), f32 (exact
    /// reference path) or bf16.
    #[arg(long, default_value = "auto")]
    pub dtype: WeightDtype,
    /// device, or host: lookup-only embedding tables (Gemma-4's per-layer embeddings, an
    /// untied token embedding) stay in host memory and only each step's rows are uploaded.
    #[arg(long, value_enum, default_value_t = EmbedPlacement::Device)]
    pub embed_weights: EmbedPlacement,
    /// How a GGUF's block-quantized matrices sit on a GPU: bf16 (decoded at load, 2 bytes
    /// a weight: the faster decode today) or blocks (the file's Q4_0 / Q5_0 / Q8_0 / Q4_K /
    /// Q5_K / Q6_K blocks, 4.5 to 8.5 bits a weight). The CPU always computes on the blocks.
    #[arg(long, value_enum, default_value_t = GgufWeights::Bf16)]
    pub gguf_weights: GgufWeights,
    /// Quantize a dense checkpoint's matrices at load to a GGUF block format: q8_0, q6_k or
    /// q4_k (stored block formats and matrices whose rows are not whole blocks stay as
    /// they are). Off by default.
    #[arg(long, value_parser = parse_load_quant)]
    pub quantize: Option<strata_weights::GgmlType>,
    /// Decode every stored weight before loading and refuse the model if one is NaN or
    /// infinite, naming the tensor (a corrupt or badly converted file otherwise loads and
    /// generates garbage). Costs one pass over the weights.
    #[arg(long)]
    pub check_weights: bool,
    /// With --model ORG/NAME (a Hugging Face repo id): the branch, tag or commit (default:
    /// main).
    #[arg(long)]
    pub revision: Option<String>,
    /// Load only the text model of a multimodal checkpoint (Gemma-4's vision tower is
    /// skipped, and its memory saved); requests with images are then refused.
    #[arg(long)]
    pub text_model_only: bool,
    /// Where a multimodal checkpoint's vision tower runs when the model is on a GPU:
    /// device (a copy on the GPU, on a stream of its own, products in the model's dtype)
    /// or host (f32 on the CPU threads, as on a CPU-only machine). The audio tower runs on
    /// the host either way.
    #[arg(long, value_enum, default_value_t = MediaDevice::Device)]
    pub media_device: MediaDevice,
}

impl PlacementArgs {
    /// Loads `model` as these flags ask (after `--check-weights`' scan, when asked).
    /// `model` may be a path or a Hugging Face repo id (found in the local cache, else
    /// downloaded).
    pub fn load(&self, model: &Path) -> anyhow::Result<LoadedModel> {
        let settings = self.settings()?;
        let model = crate::hub::resolve(model, self.revision.as_deref())?;
        if self.check_weights {
            check_weights(&model)?;
        }
        Ok(LoadedModel::load_with(&model, settings)?)
    }

    /// [`PlacementArgs::load`] with errors naming `model`, then the draft model `draft`
    /// when one is given.
    pub fn load_with_draft(
        &self,
        model: &Path,
        draft: Option<&Path>,
    ) -> anyhow::Result<LoadedModel> {
        let mut loaded = self
            .load(model)
            .with_context(|| format!("loading {}", model.display()))?;
        if let Some(d) = draft {
            loaded
                .load_draft(d)
                .with_context(|| format!("loading the draft model {}", d.display()))?;
        }
        Ok(loaded)
    }

    /// The engine's load settings for these flags.
    pub fn settings(&self) -> anyhow::Result<LoadSettings> {
        Ok(LoadSettings {
            device: self.device,
            dtype: self.dtype,
            host_embeddings: self.embed_weights == EmbedPlacement::Host,
            quantize: self.quantize,
            keep_blocks: self.gguf_weights == GgufWeights::Blocks,
            text_model_only: self.text_model_only,
            media_on_host: self.media_device == MediaDevice::Host,
            progress: true,
        })
    }
}

/// `--gguf-weights`: how a GGUF's block-quantized matrices sit on a GPU.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufWeights {
    /// Decoded to bf16 at load.
    Bf16,
    /// Kept as the file's blocks.
    Blocks,
}

/// `--quantize`'s value: one of the formats weights are quantized to at load.
fn parse_load_quant(s: &str) -> Result<strata_weights::GgmlType, String> {
    let ok = strata_engine::LOAD_QUANT_TYPES;
    strata_weights::GgmlType::from_name(s)
        .filter(|t| ok.contains(t))
        .ok_or_else(|| {
            let names: Vec<_> = ok.iter().map(|t| t.name().to_lowercase()).collect();
            format!("{s:?}: expected one of {}", names.join(", "))
        })
}

/// `--check-weights`: every stored value of the model's weights decoded and found finite.
pub fn check_weights(model: &Path) -> anyhow::Result<()> {
    let (_, source) = strata_config::load_model_config(model)?;
    let Some(path) = crate::inspect::weights_path(&source) else {
        anyhow::bail!(
            "--check-weights: {} has no weights to check",
            model.display()
        );
    };
    let t0 = std::time::Instant::now();
    let weights = strata_weights::Weights::open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    let scan = strata_weights::check_finite(&weights).context("--check-weights")?;
    eprintln!(
        "[strata] --check-weights: {} values in {} tensors finite ({:.1} s){}",
        scan.values,
        scan.tensors,
        t0.elapsed().as_secs_f64(),
        if scan.skipped.is_empty() {
            String::new()
        } else {
            format!(
                "; {} tensors of types with no decoder not checked",
                scan.skipped.len()
            )
        }
    );
    Ok(())
}
