//! Where and how the model's weights are placed: flags shared by every command that loads
//! a model.

use clap::Args;
use strata_engine::{Device, LoadSettings, WeightDtype};

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
}

impl PlacementArgs {
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
