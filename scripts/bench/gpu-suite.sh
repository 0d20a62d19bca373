#!/usr/bin/env bash
# The GPU benchmark suite behind docs/benchmarks.md, for a machine with an NVIDIA GPU, torch
# and transformers but no Rust: run it from the repository root with target/gpu-bundle/
# (built by `cargo xtask gpu`) copied there.
#
#   scripts/bench/gpu-suite.sh OUT_DIR [MODELS]     # MODELS: e2b,e4b by default
#
# For each model: a random-weight checkpoint at the real shapes, the engine benchmark
# (`strata bench`: decode at batch 1-128 and depth 128 / 4096 / 16384, prefill 512-16384,
# KV pages), the serving benchmark against `strata serve` (512 random ids in, 512 out,
# concurrency 1 with 3 requests and 100 with 200), and transformers on the same checkpoint
# as the peer (prefill; decode eager with a static cache). Results land in OUT_DIR as text
# and JSON, one file per step; the summary table (scripts/bench/summarize.py, also
# OUT_DIR/summary.json) is printed last.
# STRATA=path/to/strata picks another binary (e.g. target/release/strata).
#
# Real weights: CKPT_E2B / CKPT_E4B name a checkpoint directory to measure instead of the
# random one, and DRAFT_E2B / DRAFT_E4B its assistant. With an assistant the suite also
# measures what drafting gives, which random weights cannot show (they keep almost no
# drafts): the rounds' costs (`strata bench --draft` at 1 and 100 requests, depth 768) and
# the served output on written prompts (scripts/bench/prompts/chat.jsonl, random ids where
# the checkpoint has no tokenizer) at concurrency 1 and 100, without and with the drafter
# (every request drafting: --draft-max-requests 128), the kept share from /metrics.
# PARTS picks steps (default bench,serve,peer,draft; draft runs only with an assistant).
set -u
out=${1:?usage: gpu-suite.sh OUT_DIR [MODELS]}
models=${2:-e2b,e4b}
strata=${STRATA:-target/gpu-bundle/strata}
work=${WORK:-/tmp/strata-bench}
parts=,${PARTS:-bench,serve,peer,draft},
mkdir -p "$out" "$work"
export STRATA_KERNEL_CACHE=${STRATA_KERNEL_CACHE:-$work/kernels}
port=8090

# strata serve on $port with the checkpoint and any further flags; returns when /health
# answers (pid in $pid).
serve() {
    local log=$1
    shift
    "$strata" serve --model "$ckpt" --served-model-name bench --device cuda --port $port \
        --max-running-requests 128 "$@" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 120); do
        python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health')" \
            2>/dev/null && break
        sleep 1
    done
}

# The serving client at concurrency 1 (3 requests) and 100 (200 requests), results as
# $out/$1-c1 and -c100 (.json, .txt); further arguments go to the client.
clients() {
    local name=$1
    shift
    # At concurrency 100, 200 requests: two waves, the second arriving as the first
    # finishes, as a loaded server runs (one wave of 100 weighs the admission burst and the
    # wave's tail more than a steady load does).
    for c in 1 100; do
        n=$([ $c -eq 1 ] && echo 3 || echo 200)
        timeout 300 python3 scripts/bench/serving.py --url "http://127.0.0.1:$port" --model bench \
            --concurrency $c --requests $n --out "$out/$name-c$c.json" "$@" \
            >"$out/$name-c$c.txt" 2>&1
    done
}

stop() {
    kill $pid
    wait $pid 2>/dev/null
}

for m in ${models//,/ }; do
    ckpt_var=CKPT_${m^^}
    draft_var=DRAFT_${m^^}
    ckpt=${!ckpt_var:-}
    draft=${!draft_var:-}
    if [ -z "$ckpt" ]; then
        python3 scripts/reference/gemma4_real_shape_parity.py --strata x --models "$m" \
            --work "$work" --checkpoint-only >"$out/$m-checkpoint.txt" 2>&1
        ckpt=$work/$m/ckpt
    fi
    if [[ $parts == *,bench,* ]]; then
        timeout 400 "$strata" bench --model "$ckpt" --device cuda --depths 128,4096,16384 \
            --prefill 512,2048,4096,16384 --json "$out/$m-bench.json" >"$out/$m-bench.txt" 2>&1
    fi
    if [[ $parts == *,serve,* ]]; then
        serve "$out/$m-serve.log"
        clients "$m-serving"
        stop
    fi
    if [[ $parts == *,draft,* && -n $draft ]]; then
        timeout 400 "$strata" bench --model "$ckpt" --device cuda --batches 1 --depths 768 \
            --prefill 0 --draft "$draft" --draft-batches 1,100 --draft-tokens 1,2,3 \
            --json "$out/$m-draft-bench.json" >"$out/$m-draft-bench.txt" 2>&1
        written=(--prompts scripts/bench/prompts/chat.jsonl)
        [ -f "$ckpt/tokenizer.json" ] || written=()
        serve "$out/$m-serve-prompts.log"
        clients "$m-prompts" "${written[@]}"
        stop
        serve "$out/$m-serve-draft.log" --draft "$draft" --draft-max-requests 128
        clients "$m-prompts-draft" "${written[@]}"
        stop
    fi
    [[ $parts == *,peer,* ]] || continue
    # The decode peer runs eager by default: compiling (PEER_COMPILE=auto, generate()'s own
    # torch.compile with CUDA graphs) takes minutes per batch shape on this model with
    # transformers 5.17 / torch 2.11 (E2B batch 1: 140 tok/s compiled, docs/benchmarks.md);
    # give it PEER_TIMEOUT seconds where the machine allows.
    timeout "${PEER_TIMEOUT:-300}" python3 scripts/bench/transformers_peer.py --model "$ckpt" \
        --batches 1,8 --compile "${PEER_COMPILE:-none}" --prefill 512,2048,4096,16384 \
        --out "$out/$m-transformers.json" \
        >"$out/$m-transformers.txt" 2>&1
done
python3 scripts/bench/summarize.py "$out"
