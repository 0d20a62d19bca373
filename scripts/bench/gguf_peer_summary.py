#!/usr/bin/env python3
"""The summary table of scripts/bench/gguf-gpu-peer.sh: Strata against llama.cpp on the same
GGUF files, from the JSON each wrote into OUT_DIR.

  python3 scripts/bench/gguf_peer_summary.py OUT_DIR

Decode at one sequence: Strata's `strata bench` step at depth 128 against llama-bench's
tg128 (128 tokens from an empty context). At 8-64 sequences: Strata's step at depth 128
against llama-batched-bench's generation phase (128 tokens each after a 128-token prompt,
so depths 128-256). Prefill: Strata's 512-token prompt against llama-bench's pp512.
"""
import glob
import json
import os
import sys


def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None


def jsonl(path):
    try:
        return [json.loads(line) for line in open(path) if line.strip().startswith("{")]
    except OSError:
        return []


def main(out):
    rows = []
    for lb in sorted(glob.glob(os.path.join(out, "*-llama-bench.json"))):
        stem = os.path.basename(lb)[: -len("-llama-bench.json")]
        model, quant = stem.split("-", 1)
        peer = load(lb) or []
        pp = next((r["avg_ts"] for r in peer if r.get("n_prompt") == 512 and r.get("n_gen") == 0), None)
        tg = next((r["avg_ts"] for r in peer if r.get("n_gen") == 128 and r.get("n_prompt") == 0), None)
        size = next((r.get("model_size") for r in peer), None)
        batched = {r["pl"]: r["speed_tg"] for r in jsonl(os.path.join(out, f"{stem}-llama-batched.jsonl"))}
        peer_dec = {1: tg, **{b: batched.get(b) for b in (8, 32, 64)}}
        for w in ("blocks", "bf16"):
            s = load(os.path.join(out, f"{stem}-strata-{w}.json"))
            if not s:
                continue
            dec = {d["batch"]: d["tokens_per_second"] for d in s["decode"]}
            pre = {p["tokens"]: p["tokens_per_second"] for p in s["prefill"]}
            rows.append(dict(model=model, quant=quant, weights=w,
                             resident_gb=s.get("weight_bytes_resident", 0) / 1e9,
                             peer_file_gb=(size or 0) / 1e9,
                             decode={b: dec.get(b) for b in (1, 8, 32, 64)}, peer_decode=peer_dec,
                             prefill512=pre.get(512), peer_pp512=pp))
    json.dump(rows, open(os.path.join(out, "summary.json"), "w"), indent=1)

    def f(x):
        return "?" if x is None else f"{x:,.0f}"

    def r(a, b):
        return "?" if a is None or not b else f"{a / b:.2f}x"

    print("| file | Strata weights | resident GB (file GB) | decode tok/s B = 1 / 8 / 32 / 64: Strata | llama.cpp | ratio | prefill 512 tok/s: Strata / llama.cpp | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for x in rows:
        d, p = x["decode"], x["peer_decode"]
        bs = (1, 8, 32, 64)
        print(f"| {x['model']} {x['quant']} | {x['weights']} | {x['resident_gb']:.2f} ({x['peer_file_gb']:.2f}) | "
              + " / ".join(f(d[b]) for b in bs) + " | " + " / ".join(f(p[b]) for b in bs) + " | "
              + " / ".join(r(d[b], p[b]) for b in bs)
              + f" | {f(x['prefill512'])} / {f(x['peer_pp512'])} | {r(x['prefill512'], x['peer_pp512'])} |")


if __name__ == "__main__":
    main(sys.argv[1])
