//! `cargo xtask bench --gpu [--models e2b,e4b]`: the GPU benchmark suite on this machine
//! (an NVIDIA GPU, with Python, torch and transformers for the checkpoints and the peer):
//! builds the release `strata` binary and runs `scripts/bench/gpu-suite.sh` with it, which
//! writes every step's text and JSON to `target/bench/gpu/` and prints the summary table
//! last. Machines without Rust run the same script from a `cargo xtask gpu` bundle.

use std::process::Command;

use anyhow::{bail, Context};

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let mut models = "e2b,e4b".to_string();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--gpu" => {}
            "--models" => models = it.next().context("--models needs a value")?.clone(),
            other => bail!("bench --gpu: unknown argument {other}"),
        }
    }
    if let Some(bad) = models.split(',').find(|m| !matches!(*m, "e2b" | "e4b")) {
        bail!("bench --gpu: unknown model {bad:?} (e2b, e4b)");
    }
    let root = super::bench::workspace_root();
    let status = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["build", "--release", "-p", "strata-server"])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build --release -p strata-server failed");
    }
    let out = root.join("target/bench/gpu");
    let status = Command::new("bash")
        .current_dir(&root)
        .env("STRATA", root.join("target/release/strata"))
        .arg("scripts/bench/gpu-suite.sh")
        .arg(&out)
        .arg(&models)
        .status()
        .context("running scripts/bench/gpu-suite.sh")?;
    if !status.success() {
        bail!("the GPU suite failed (logs in {})", out.display());
    }
    Ok(())
}
