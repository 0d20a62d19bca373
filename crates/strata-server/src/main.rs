//! `strata`: the command-line entry point of the engine.

mod bench;
mod generate;
mod inspect;
mod placement;
mod sampling_args;
mod score;
mod serve;
mod step_budget;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "strata",
    version,
    about = "Strata: a Gemma-4-first inference engine"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a model's architecture, layer layout, KV sharing and KV groups.
    Inspect(inspect::InspectArgs),
    /// Generate text from a prompt (one request, greedy by default).
    Generate(generate::GenerateArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Teacher-forced logits of token ids, written as raw f32 (for parity checks against
    /// a reference implementation).
    Score(score::ScoreArgs),
    /// Engine benchmark: decode and prefill speed, KV capacity, decode roofline.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Score(args) => score::run(&args),
        Command::Bench(args) => bench::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
