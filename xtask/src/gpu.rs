//! `cargo xtask gpu`: builds what the GPU checks need and gathers it into one folder,
//! `target/gpu-bundle/`, to copy to a machine with an NVIDIA GPU (which needs no Rust):
//! the release `strata` binary, the CUDA test binaries, and `run-gpu-tests.sh`.
//! See docs/gpu-testing.md.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The test binaries the bundle carries: (cargo arguments selecting it, name in the bundle).
const TEST_BINARIES: &[(&[&str], &str)] = &[
    (
        &[
            "-p",
            "strata-kernels",
            "--features",
            "cuda",
            "--test",
            "conformance_cuda",
        ],
        "conformance_cuda",
    ),
    (
        &[
            "-p",
            "strata-kernels",
            "--features",
            "cuda",
            "--test",
            "cuda_nvrtc",
        ],
        "cuda_nvrtc",
    ),
    (
        &[
            "-p",
            "strata-kernels",
            "--features",
            "cuda",
            "--test",
            "quant_cuda",
        ],
        "quant_cuda",
    ),
    (
        &["-p", "strata-model", "--features", "cuda", "--lib"],
        "strata_model_tests",
    ),
    (
        &[
            "-p",
            "strata-engine",
            "--features",
            "cuda",
            "--test",
            "tiny_models",
        ],
        "strata_sched_tiny",
    ),
];

const RUN_SCRIPT: &str = r#"#!/usr/bin/env bash
# Runs the CUDA checks from this bundle. Run it from the repository root (the model test
# reads tests/fixtures/tiny there). Logs: $LOG_DIR (default: ./gpu-logs). Exit 0 iff all pass.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
log="${LOG_DIR:-$PWD/gpu-logs}"
mkdir -p "$log"
export STRATA_REQUIRE_GPU=1
export STRATA_TINY_FIXTURES="${STRATA_TINY_FIXTURES:-$PWD/tests/fixtures/tiny}"
# A fresh kernel cache, so the first start shows the NVRTC compile and the next a cache hit.
export STRATA_KERNEL_CACHE="${STRATA_KERNEL_CACHE:-$(mktemp -d)}"
status=0
check() {
    local name=$1
    shift
    echo "== $name: $*"
    local t0=$(date +%s%N)
    "$@" >"$log/$name.log" 2>&1
    local rc=$?
    local t1=$(date +%s%N)
    grep -E "^test result|FAILED|panicked|CUDA backend on|largest|^  |max \||greedy|sm_|NVRTC|GPU k|equal the" "$log/$name.log" | head -n 80
    echo "== $name: exit $rc, $(( (t1 - t0) / 1000000 )) ms"
    [ "$rc" -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv | tee "$log/gpu.txt"
check cold_start "$here/conformance_cuda" upload_download --nocapture
check nvrtc "$here/cuda_nvrtc" --nocapture
check conformance "$here/conformance_cuda" --nocapture --test-threads=4
check quant "$here/quant_cuda" --nocapture
check model "$here/strata_model_tests" cuda_upload --nocapture
check scheduler "$here/strata_sched_tiny" gpu --nocapture
if [ -x "$here/strata" ]; then
    check strata "$here/strata" inspect --model examples/configs/gemma-4-e2b.json
else
    echo "== strata: not in this bundle"
fi
echo "kernel cache: $(ls "$STRATA_KERNEL_CACHE" | tr '\n' ' ')"
exit $status
"#;

fn cargo_cmd() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// The `"executable"` of every compiler artifact in cargo's JSON messages.
fn executables(json: &str) -> Vec<PathBuf> {
    const KEY: &str = "\"executable\":\"";
    json.lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\""))
        .filter_map(|l| {
            let start = l.find(KEY)? + KEY.len();
            let end = start + l[start..].find('"')?;
            Some(PathBuf::from(&l[start..end]))
        })
        .collect()
}

/// Builds with `args` and returns the one executable produced.
fn build_one(args: &[&str]) -> anyhow::Result<PathBuf> {
    let out = cargo_cmd()
        .args(args)
        .args(["--release", "--message-format=json"])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "cargo {} failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    let exes = executables(&String::from_utf8_lossy(&out.stdout));
    match exes.as_slice() {
        [one] => Ok(one.clone()),
        _ => anyhow::bail!("cargo {} built {} executables", args.join(" "), exes.len()),
    }
}

fn place(src: &Path, dir: &Path, name: &str) -> anyhow::Result<u64> {
    let dst = dir.join(name);
    std::fs::copy(src, &dst)?;
    // Release builds are already stripped (profile.release); `strip` is only a second pass.
    let _ = Command::new("strip").arg(&dst).status();
    Ok(std::fs::metadata(&dst)?.len())
}

pub fn gpu() -> anyhow::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_path_buf();
    let dir = root.join("target").join("gpu-bundle");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;

    let mut total = 0;
    for (args, name) in TEST_BINARIES {
        let mut full = vec!["test", "--no-run"];
        full.extend_from_slice(args);
        total += place(&build_one(&full)?, &dir, name)?;
    }
    // The GPU checks do not need the binary, so a tree where it does not build still
    // yields a bundle (the script then reports the missing binary).
    match build_one(&["build", "-p", "strata-server", "--bin", "strata"]) {
        Ok(strata) => total += place(&strata, &dir, "strata")?,
        Err(e) => eprintln!("warning: the strata binary is left out of the bundle: {e:#}"),
    }
    let script = dir.join("run-gpu-tests.sh");
    std::fs::write(&script, RUN_SCRIPT)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    }
    println!(
        "GPU bundle: {} ({:.1} MiB). On the GPU machine, from the repository root:\n  \
         target/gpu-bundle/run-gpu-tests.sh",
        dir.display(),
        total as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}
