//! Where and how the model's weights are placed: flags shared by every command that loads
//! a model.

use std::path::Path;

use anyhow::Context;
use clap::Args;
use strata_engine::{Device, LoadSettings, LoadedModel, WeightDtype};

#[derive(Args, Clone, Debug)]
pub struct PlacementArgs {
    /// auto (CUDA when a GPU starts, else the CPU), cpu or cuda.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Dtype dense weights compute in: auto (as stored; bf16 GEMMs on CUDA), f32 (exact
    /// reference path) or bf16.
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// device, or host: lookup-only embedding tables (Gemma-4's per-layer embeddings, an
    /// untied token embedding) stay in host memory and only each step's rows are uploaded.
    #[arg(long, default_value = "device")]
    pub embed_weights: String,
    /// Decode every stored weight before loading and refuse the model if one is NaN or
    /// infinite, naming the tensor (a corrupt or badly converted file otherwise loads and
    /// generates garbage). Costs one pass over the weights.
    #[arg(long)]
    pub check_weights: bool,
}

impl PlacementArgs {
    /// Loads `model` as these flags ask (after `--check-weights`' scan, when asked).
    pub fn load(&self, model: &Path) -> anyhow::Result<LoadedModel> {
        let settings = self.settings()?;
        if self.check_weights {
            check_weights(model)?;
        }
        Ok(LoadedModel::load_with(model, settings)?)
    }

    pub fn settings(&self) -> anyhow::Result<LoadSettings> {
        let device: Device = self.device.parse()?;
        let dtype: WeightDtype = self.dtype.parse()?;
        let host_embeddings = match self.embed_weights.as_str() {
            "device" => false,
            "host" => true,
            other => anyhow::bail!("--embed-weights: unknown placement {other:?} (host, device)"),
        };
        Ok(LoadSettings {
            device,
            dtype,
            host_embeddings,
        })
    }
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
