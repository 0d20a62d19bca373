#!/usr/bin/env bash
# LoRA decode cost on the GPU, for a machine with an NVIDIA GPU, torch and transformers but no
# Rust: run it from the repository root with target/gpu-bundle/ (`cargo xtask gpu`).
#
#   scripts/bench/lora-decode.sh OUT_DIR [MODEL] [ROUNDS]     # e2b, 2 rounds
#
# The random-weight checkpoint at the real shapes, four random rank-32 adapters on every
# q/k/v/o/gate/up/down (scripts/bench/make_lora_adapters.py), then `strata bench` decode at
# batch 1 / 8 / 64, depth 128, without adapters and with the rows spread over the four
# (`--lora`), alternated ROUNDS times. Ratios are printed last.
set -u
out=${1:?usage: lora-decode.sh OUT_DIR [MODEL] [ROUNDS]}
m=${2:-e2b}
rounds=${3:-2}
strata=${STRATA:-target/gpu-bundle/strata}
work=${WORK:-/tmp/strata-bench}
mkdir -p "$out" "$work"
export STRATA_KERNEL_CACHE=${STRATA_KERNEL_CACHE:-$work/kernels}
ckpt=$work/$m/ckpt
[ -f "$ckpt/config.json" ] || python3 scripts/reference/gemma4_real_shape_parity.py \
    --strata x --models "$m" --work "$work" --checkpoint-only >"$out/$m-checkpoint.txt" 2>&1
[ -d "$work/$m/lora/a4" ] || python3 scripts/bench/make_lora_adapters.py --model "$ckpt" \
    --out "$work/$m/lora" --count 4 --rank 32 >"$out/$m-adapters.txt" 2>&1
loras=$work/$m/lora/a1,$work/$m/lora/a2,$work/$m/lora/a3,$work/$m/lora/a4
for r in $(seq "$rounds"); do
    for v in base lora; do
        extra=()
        [ "$v" = lora ] && extra=(--lora "$loras")
        timeout 300 "$strata" bench --model "$ckpt" --device cuda --batches 1,8,64 --depths 128 \
            --prefill 0 --steps 32 --json "$out/$m-$v-$r.json" "${extra[@]}" \
            >"$out/$m-$v-$r.txt" 2>&1
    done
done
python3 - "$out" "$m" "$rounds" <<'EOF'
import json, sys
out, m, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def tps(v, r):
    d = json.load(open(f"{out}/{m}-{v}-{r}.json"))
    return {p["batch"]: p["tokens_per_second"] for p in d["decode"]}
print("| round | batch | base tok/s | 4 x r32 LoRA tok/s | LoRA / base |")
print("|---|---:|---:|---:|---:|")
for r in range(1, rounds + 1):
    try:
        b, l = tps("base", r), tps("lora", r)
    except Exception as e:
        print(f"| {r} | failed: {e} | | | |")
        continue
    for batch in sorted(b):
        print(f"| {r} | {batch} | {b[batch]:.0f} | {l.get(batch, float('nan')):.0f} | {l.get(batch, float('nan')) / b[batch]:.3f} |")
EOF
