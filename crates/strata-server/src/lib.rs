//! The `strata` command line and HTTP server as a library: `main.rs` parses the command
//! line and calls [`run`]; tests and other programs build the server's routes in process
//! ([`serve::router`] over a [`serve::AppState`]).

// A request must never take the server down: failures here are errors, not panics.
#![warn(clippy::unwrap_used)]

pub mod bench;
pub mod generate;
pub mod hub;
pub mod inspect;
pub mod placement;
pub mod sampling_args;
pub mod score;
pub mod serve;
pub mod step_budget;
pub mod verify_drift;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The command line.
#[derive(Parser)]
#[command(
    name = "strata",
    version,
    about = "Strata: a Gemma-4-first inference engine"
)]
pub struct Cli {
    /// The subcommand to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// Print a model's architecture, layer layout, KV sharing and KV groups.
    Inspect(inspect::InspectArgs),
    /// Generate text from a prompt (one request, greedy by default).
    Generate(generate::GenerateArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(Box<serve::ServeArgs>),
    /// Teacher-forced logits of token ids, written as raw f32 (for parity checks against
    /// a reference implementation).
    Score(score::ScoreArgs),
    /// Engine benchmark: decode and prefill speed, KV capacity, decode roofline.
    Bench(bench::BenchArgs),
    /// Perturb the weights, refresh them from the checkpoint as a weight update does, and
    /// check they come back bit for bit (a digest per tensor) with identical greedy output.
    VerifyDrift(verify_drift::DriftArgs),
}

/// Runs one command; errors are printed and give a failing exit code.
pub fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Score(args) => score::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::VerifyDrift(args) => verify_drift::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
