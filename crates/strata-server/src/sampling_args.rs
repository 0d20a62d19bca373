//! Sampling settings on the command line (`generate`, `bench`).

use clap::Args;
use strata_kernels::sampling::SamplingParams;

/// The sampling flags.
#[derive(Args, Clone, Debug)]
pub struct SamplingArgs {
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens below `min_p` times the most likely one's probability (0: off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Seed of the draws (by default each request has one of its own).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampling parameters these flags ask for.
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
        }
    }
}
