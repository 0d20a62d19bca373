#!/usr/bin/env bash
# The quantized-weight decisions waiting for a GPU, in one run on one card: E2B (random
# weights at the real shape) quantized at load to Q4_K, `strata bench` at 1-64 rows and a
# 2048-token prefill, for each variant:
#   new     the kernels as built
#   old     kernels/quant.cu of OLD_REV (default: the commit before the 16-byte stores) through
#           STRATA_KERNEL_DIR, the parent of the dense-decode change
#   dp4a    STRATA_QUANT_DP4A=1 (the GEMV over 8-bit x)
#   rows8 / rows16   STRATA_QUANT_GEMV_MAX_ROWS=8 / 16 (the GEMV/decoded crossover)
#   bf16    the same checkpoint's bf16 weights
#   nsys    a kernel summary of the 64-row step (when nsys is installed)
# Run from the repository root with target/gpu-bundle/ (`cargo xtask gpu`); torch and
# transformers make the checkpoint. Needs git only for OLD_REV (or pass OLD_DIR holding a
# quant.cu).
#
#   scripts/bench/quant-ab.sh OUT_DIR [VARIANTS]    # default: new old dp4a rows8 rows16 bf16
set -u
out=${1:?usage: quant-ab.sh OUT_DIR [VARIANTS]}
variants=${2:-new old dp4a rows8 rows16 bf16}
b=${BUNDLE:-target/gpu-bundle}
work=${WORK:-/tmp/strata-bench}
mkdir -p "$out" "$work"
export STRATA_KERNEL_CACHE=${STRATA_KERNEL_CACHE:-$work/kernels}
ckpt=$work/e2b/ckpt
[ -f "$ckpt/config.json" ] || python3 scripts/reference/gemma4_real_shape_parity.py --strata x \
    --models e2b --work "$work" --checkpoint-only >"$out/checkpoint.txt" 2>&1
old=${OLD_DIR:-$work/old-kernels}
if [ -z "${OLD_DIR:-}" ] && [[ " $variants " == *" old "* ]]; then
    mkdir -p "$old"
    git show "${OLD_REV:-862dcfb}:crates/strata-kernels/kernels/quant.cu" >"$old/quant.cu"
fi
bench() { # name, env assignments..., --, bench arguments
    local name=$1
    shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" timeout 300 "$b/strata" bench --model "$ckpt" --device cuda --depths 128 \
        --json "$out/$name.json" "$@" >"$out/$name.txt" 2>&1
    echo "== $name"
    grep -E "^\|" "$out/$name.txt" | head -12
}
q=(--quantize q4_k)
for v in $variants; do
    case $v in
    new) bench new X=1 -- "${q[@]}" --batches 1,8,16,32,64 --prefill 2048 ;;
    old) bench old STRATA_KERNEL_DIR="$old" -- "${q[@]}" --batches 1,8,16,32,64 --prefill 2048 ;;
    dp4a) bench dp4a STRATA_QUANT_DP4A=1 -- "${q[@]}" --batches 1,8,16,32 --prefill 512 ;;
    rows8) bench rows8 STRATA_QUANT_GEMV_MAX_ROWS=8 -- "${q[@]}" --batches 8,16,32,64 --prefill 512 ;;
    rows16) bench rows16 STRATA_QUANT_GEMV_MAX_ROWS=16 -- "${q[@]}" --batches 16,32,64 --prefill 512 ;;
    bf16) bench bf16 X=1 -- --batches 1,8,16,32,64 --prefill 2048 ;;
    nsys)
        command -v nsys >/dev/null || { echo "nsys: not installed"; continue; }
        nsys profile -o "$work/b64" --force-overwrite true timeout 300 "$b/strata" bench \
            --model "$ckpt" --device cuda "${q[@]}" --batches 64 --depths 128 --prefill 512 \
            >"$out/nsys-run.txt" 2>&1
        nsys stats --report cuda_gpu_kern_sum "$work/b64.nsys-rep" >"$out/nsys-kern.txt" 2>&1
        head -30 "$out/nsys-kern.txt"
        ;;
    *) echo "unknown variant $v" ;;
    esac
done
