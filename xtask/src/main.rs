//! `cargo xtask <task>`: project automation that needs more than one cargo command.

mod bench;
mod bench_gpu;
mod bench_probe;
mod bench_serving;
mod gpu;
mod serve;

use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  serve [ARGS]     serve a model over the OpenAI-compatible API (default: Gemma-3 270M,
                   fetched once into models/); ARGS go to `strata serve`
  inspect [ARGS]   build the release binary and run `strata inspect` (default: the bundled
                   Gemma-4 E2B configuration)
  gpu              build the release binary and the GPU test binaries into
                   target/gpu-bundle/ (see docs/gpu-testing.md)
  ci               run the checks CI runs (fmt, clippy, tests)
  bench --cpu [--model PATH]... [--threads N] [--pp N] [--tg N] [--depth N] [--reps N]
              [--rounds N] [--starved CORES] [--peer-file-layout] [--serving]
                   Strata's CPU prompt (pp), decode (tg) and decode-at-depth tokens/s on
                   the real models (default: both models/*.gguf), 2 threads, 3 rounds;
                   with LLAMA_BENCH set to a llama-bench binary, llama.cpp interleaved in
                   each round, each run's load probed, starved rounds marked and left out
                   of the median ratio; --serving (LLAMA_SERVER set) adds strata serve
                   against llama-server. Tables last; JSON in target/bench/cpu.json
  bench --gpu [--models e2b,e4b]
                   on a machine with an NVIDIA GPU, torch and transformers: the engine and
                   serving benchmarks on real-shape Gemma-4 checkpoints and transformers as
                   the peer (scripts/bench/gpu-suite.sh); summary table last, files in
                   target/bench/gpu/";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("inspect") => inspect(&args[1..]),
        Some("ci") => ci(),
        Some("bench") => bench::run(&args[1..]),
        Some("gpu") => gpu::gpu(),
        Some("serve") => serve::serve(&args[1..]),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn cargo(args: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo).args(args).status()?;
    anyhow::ensure!(status.success(), "cargo {} failed", args.join(" "));
    Ok(())
}

fn inspect(rest: &[String]) -> anyhow::Result<()> {
    let default = [
        "--model".to_string(),
        "examples/configs/gemma-4-e2b.json".to_string(),
    ];
    let rest = if rest.is_empty() { &default[..] } else { rest };
    let mut args = strata_run("inspect");
    args.extend(rest.iter().map(String::as_str));
    cargo(&args)
}

fn ci() -> anyhow::Result<()> {
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ])?;
    cargo(&["test", "--workspace"])
}

/// `cargo` arguments that run the release `strata` binary's `subcommand`.
pub(crate) fn strata_run(subcommand: &str) -> Vec<&str> {
    vec![
        "run",
        "--release",
        "--quiet",
        "--bin",
        "strata",
        "--",
        subcommand,
    ]
}
