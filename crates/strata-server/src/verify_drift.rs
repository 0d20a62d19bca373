//! `strata verify-drift`: perturb the served weights, refresh them from the checkpoint as a
//! weight update does, and check they come back bit for bit, greedy output included.

use std::path::PathBuf;

use clap::Args;

/// `strata verify-drift`'s flags.
#[derive(Args)]
pub struct DriftArgs {
    /// A model directory (dense safetensors) or `.gguf` file with dense weights.
    #[arg(long)]
    pub model: PathBuf,
    /// Perturb-and-refresh cycles.
    #[arg(long, default_value_t = 10)]
    pub cycles: usize,
    /// Greedy tokens compared each cycle.
    #[arg(long, default_value_t = 32)]
    pub tokens: usize,
    /// The prompt as token ids (default: ids 5 to 16).
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Device, dtype and the other placement flags, as `strata generate` takes them.
    #[command(flatten)]
    pub placement: crate::placement::PlacementArgs,
}

/// Runs the cycles and prints one line each; fails unless every cycle restored the
/// weights exactly.
pub fn run(a: &DriftArgs) -> anyhow::Result<()> {
    let loaded = a.placement.load(&a.model)?;
    let prompt = a.prompt_ids.clone().unwrap_or_else(|| (5..17).collect());
    let report = strata_engine::verify_drift(&loaded, a.cycles, &prompt, a.tokens)?;
    println!(
        "{} tensors compared; reference tokens {:?}",
        report.tensors, report.reference_tokens
    );
    println!("| cycle | factor | tensors perturbed | output changed | tensors drifted | output identical |");
    println!("|---:|---:|---:|---|---:|---|");
    for (i, c) in report.cycles.iter().enumerate() {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            i + 1,
            c.factor,
            c.perturbed_tensors,
            c.perturbed_output_differs,
            c.drifted_tensors,
            c.output_identical
        );
    }
    if !report.passed() {
        anyhow::bail!("drift: the refreshed weights are not those of a fresh load");
    }
    println!("passed: every refresh restored the weights bit for bit");
    Ok(())
}
