#!/usr/bin/env bash
# Quantized weights on the GPU, for a machine with an NVIDIA GPU, torch and transformers but
# no Rust: run it from the repository root with target/gpu-bundle/ (`cargo xtask gpu`).
#
#   scripts/bench/quant-gpu.sh OUT_DIR [MODELS] [FORMATS]   # e2b; none,q8_0,q4_k
#
# For each model: the random-weight checkpoint at the real shapes (bf16), then for each
# format (none = the bf16 weights as stored; q8_0 / q4_k = quantized at load with
# --quantize, the blocks kept on the GPU):
#   - `strata bench` (decode at batch 1-64, depth 128; prefill 512 and 2048), whose JSON
#     has `weight_bytes_resident` and `weight_bytes_per_step`;
#   - `strata serve --kv-budget-bytes 1e9` and nvidia-smi's memory.used while it idles
#     (weights + 1 GB of KV + the CUDA context and scratch), and the serving client at
#     concurrency 1 (3 requests, 512 ids in, 512 out); SERVE=0 skips this part.
# Results land in OUT_DIR as text and JSON; a summary table is printed last.
set -u
out=${1:?usage: quant-gpu.sh OUT_DIR [MODELS] [FORMATS]}
models=${2:-e2b}
formats=${3:-none,q8_0,q4_k}
strata=${STRATA:-target/gpu-bundle/strata}
work=${WORK:-/tmp/strata-bench}
mkdir -p "$out" "$work"
export STRATA_KERNEL_CACHE=${STRATA_KERNEL_CACHE:-$work/kernels}
port=8091

for m in ${models//,/ }; do
    ckpt=$work/$m/ckpt
    [ -f "$ckpt/config.json" ] || python3 scripts/reference/gemma4_real_shape_parity.py \
        --strata x --models "$m" --work "$work" --checkpoint-only >"$out/$m-checkpoint.txt" 2>&1
    for f in ${formats//,/ }; do
        q=()
        [ "$f" = none ] || q=(--quantize "$f")
        timeout 300 "$strata" bench --model "$ckpt" --device cuda "${q[@]}" --batches 1,8,32,64 \
            --depths 128 --prefill 512,2048 --json "$out/$m-$f-bench.json" \
            >"$out/$m-$f-bench.txt" 2>&1
        [ "${SERVE:-1}" = 0 ] && continue
        "$strata" serve --model "$ckpt" --served-model-name bench --device cuda --port $port \
            --kv-budget-bytes 1000000000 "${q[@]}" >"$out/$m-$f-serve.log" 2>&1 &
        pid=$!
        for _ in $(seq 180); do
            python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health')" \
                2>/dev/null && break
            sleep 1
        done
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits >"$out/$m-$f-mem.txt"
        timeout 200 python3 scripts/bench/serving.py --url "http://127.0.0.1:$port" --model bench \
            --concurrency 1 --requests 3 --out "$out/$m-$f-c1.json" >"$out/$m-$f-c1.txt" 2>&1
        kill $pid
        wait $pid 2>/dev/null
    done
done

python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
print("| model | weights | resident GB | nvidia-smi MiB (1 GB KV) | GB a step | decode tok/s B=1 / 8 / 32 / 64 | prefill 2048 tok/s | served c=1 tok/s |")
print("|---|---|---|---|---|---|---|---|")
for name in sorted(os.listdir(out)):
    if not name.endswith("-bench.json"):
        continue
    stem = name[: -len("-bench.json")]
    m, f = stem.split("-", 1)
    b = json.load(open(os.path.join(out, name)))
    dec = {d["batch"]: d["tokens_per_second"] for d in b["decode"]}
    pre = {p["tokens"]: p["tokens_per_second"] for p in b["prefill"]}
    mem = open(os.path.join(out, f"{stem}-mem.txt")).read().strip() if os.path.exists(os.path.join(out, f"{stem}-mem.txt")) else "?"
    served = "?"
    c1 = os.path.join(out, f"{stem}-c1.json")
    if os.path.exists(c1):
        s = json.load(open(c1))
        served = f'{s.get("output_tokens_per_second", s.get("output_throughput", "?"))}'
    print(f"| {m} | {f} | {b.get('weight_bytes_resident', 0) / 1e9:.2f} | {mem} | "
          f"{b['weight_bytes_per_step'] / 1e9:.2f} | "
          + " / ".join(f"{dec.get(x, float('nan')):.0f}" for x in (1, 8, 32, 64))
          + f" | {pre.get(2048, float('nan')):.0f} | {served} |")
EOF
