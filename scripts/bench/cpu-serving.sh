#!/usr/bin/env bash
# Serving on the CPU, Strata against llama-server, through the same client
# (scripts/bench/serving.py), both on the same model with the same threads:
#
#   LLAMA_SERVER=/path/to/llama-server scripts/bench/cpu-serving.sh OUT_DIR [MODEL] [ROUNDS]
#
# MODEL defaults to models/SmolLM2-135M-Instruct.Q4_1.gguf, ROUNDS to 2; THREADS (2) and
# VOCAB (49152, the default model's) can be set. Each round serves with one engine, then the
# other (llama-server with its defaults and --parallel 8), and runs: 1 client (4 requests of
# 128 random ids in, 128 out), 8 clients (16 such requests) and one long prompt (2 requests
# of 1,579 ids in, 16 out: TTFT). Build llama-server from the llama-cpp-python sdist as
# docs/benchmarks.md says for llama-bench, with `--target llama-server`. Ratios come last.
set -u
out=${1:?usage: cpu-serving.sh OUT_DIR [MODEL] [ROUNDS]}
model=${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
rounds=${3:-2}
threads=${THREADS:-2}
vocab=${VOCAB:-49152}
strata=${STRATA:-target/release/strata}
llama=${LLAMA_SERVER:?set LLAMA_SERVER to a llama-server binary}
mkdir -p "$out"
port=8093

# Stops the run when something already answers on $port: a server started now could not
# bind it, and the figures would be the other one's.
port_free() {
    if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
        echo "cpu-serving: port $port already answers; stop what listens there" >&2
        exit 1
    fi
}

# $1: the path that answers 200 once the model is loaded (`/ready`, llama-server's `/health`);
# $2: the server's pid, which must still run (one that failed to start has exited).
wait_up() {
    for _ in $(seq 600); do
        kill -0 "$2" 2>/dev/null || break
        curl -sf "http://127.0.0.1:$port$1" >/dev/null && return 0
        sleep 0.2
    done
    echo "cpu-serving: the server (pid $2) did not come up; see $out" >&2
    exit 1
}

loads() {
    local tag=$1
    python3 scripts/bench/serving.py --url "http://127.0.0.1:$port" --model m --vocab "$vocab" \
        --input 128 --output 128 --concurrency 1 --requests 4 --out "$out/$tag-c1.json" >/dev/null
    python3 scripts/bench/serving.py --url "http://127.0.0.1:$port" --model m --vocab "$vocab" \
        --input 128 --output 128 --concurrency 8 --requests 16 --out "$out/$tag-c8.json" >/dev/null
    python3 scripts/bench/serving.py --url "http://127.0.0.1:$port" --model m --vocab "$vocab" \
        --input 1579 --output 16 --concurrency 1 --requests 2 --out "$out/$tag-long.json" >/dev/null
}

for r in $(seq "$rounds"); do
    port_free
    RAYON_NUM_THREADS=$threads "$strata" serve --model "$model" --port "$port" \
        --served-model-name m >"$out/strata-$r.log" 2>&1 &
    pid=$!
    wait_up /ready "$pid"
    loads "strata-$r"
    kill "$pid"; wait "$pid" 2>/dev/null
    port_free
    "$llama" -m "$model" -t "$threads" --parallel 8 -c 16384 --port "$port" -a m \
        >"$out/llama-$r.log" 2>&1 &
    pid=$!
    wait_up /health "$pid"
    loads "llama-$r"
    kill "$pid"; wait "$pid" 2>/dev/null
done

python3 - "$out" "$rounds" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def get(tag, load):
    return json.load(open(f"{out}/{tag}-{load}.json"))
print("| round | load | figure | Strata | llama-server | Strata / llama-server |")
print("|---|---|---|---:|---:|---:|")
for r in range(1, rounds + 1):
    for load, key, name, higher in [("c1", "output_throughput", "output tok/s", True),
                                    ("c8", "output_throughput", "output tok/s", True),
                                    ("long", "ttft", "TTFT ms", False)]:
        pick = lambda d: d["ttft_ms"]["mean"] if key == "ttft" else d[key]
        s, l = pick(get(f"strata-{r}", load)), pick(get(f"llama-{r}", load))
        ratio = s / l if higher else l / s
        print(f"| {r} | {load} | {name} | {s:.1f} | {l:.1f} | {ratio:.2f}x |")
print("(TTFT: llama-server / Strata, so above 1 is Strata faster.)")
PY
