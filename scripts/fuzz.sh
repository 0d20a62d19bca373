#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for SECONDS each (default 30) on the stable toolchain,
# without a sanitizer (Rust's own checks find what matters here: panics, overflows, hangs).
# Uses `cargo fuzz` when it is installed; otherwise builds the same binaries with the same
# coverage flags through plain cargo, which needs nothing installed. Needs models/
# (scripts/fetch-models.sh). A failing input lands in fuzz/artifacts/TARGET/.
#
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-30}
targets=(tokenize chat_template)
export STRATA_FUZZ_MODELS="${STRATA_FUZZ_MODELS:-$PWD/../models}"
# -timeout: one input running past it is a failure (a hang), as is a panic.
fuzz_args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=4096)
if cargo fuzz --version >/dev/null 2>&1; then
    for t in "${targets[@]}"; do
        mkdir -p "corpus/$t"
        cargo fuzz run "$t" -s none -O "corpus/$t" -- "${fuzz_args[@]}"
    done
    exit 0
fi
# What `cargo fuzz build -s none -O` passes to rustc.
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions"
target=$(rustc -vV | sed -n 's/^host: //p')
cargo build --release --target "$target" --bins
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    "target/$target/release/$t" "${fuzz_args[@]}" -artifact_prefix="artifacts/$t/" "corpus/$t"
done
