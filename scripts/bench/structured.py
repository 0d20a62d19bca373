#!/usr/bin/env python3
"""Constrained-serving benchmark: output tokens a second at a fixed concurrency with 0%, 50%
and 100% of the requests under a JSON Schema (`response_format`), on one `strata serve`, and
the host time per grammar mask (from `/metrics`). The shares run in interleaved rounds, so
their ratios hold on a shared, noisy machine.

    python3 scripts/bench/structured.py --bin target/release/strata \\
        [--model models/SmolLM2-135M-Instruct.Q4_1.gguf] [--concurrency 8] [--requests 32] \\
        [--rounds 2] [-- EXTRA SERVE FLAGS]

Every request asks for the same kind of answer (a record of a person, at most --max-tokens
tokens, sampled with a seed of its own so the prefix cache serves only the shared prompt);
a constrained request ends when its JSON is complete, the others at their end of sequence
or the length limit, so the figure is completion tokens over the wall time of the batch.
With --full-length the schema is a string too long to finish: every constrained answer runs
to the limit, and on a model that never ends (random weights) the rates compare like with
like.

Only the standard library is used.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import statistics
import tempfile
import time
import urllib.request

from shared_prefix import start  # the same `strata serve` start-up and port read

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "hobbies", "employed"],
    "additionalProperties": False,
}
PROMPT = "Invent a person and describe them as a JSON record with name, age, city, hobbies and employed."


def metric(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    m = re.search(rf"^{name} ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def long_text(max_tokens: int) -> dict:
    """A schema no answer can finish within `max_tokens`: constrained answers then run as
    long as the others, so the rates compare the steps alone."""
    return {"type": "object", "properties": {"text": {"type": "string", "minLength": 16 * max_tokens}},
            "required": ["text"]}


def ask(base: str, seed: int, constrained: bool, max_tokens: int, schema: dict) -> int:
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "seed": seed,
    }
    if constrained:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "answer", "schema": schema}}
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        out = json.load(resp)
    if constrained and out["choices"][0]["finish_reason"] == "stop":
        json.loads(out["choices"][0]["message"]["content"])  # a finished record must parse
    return out["usage"]["completion_tokens"]


def batch(base: str, share: float, args, seed0: int) -> dict:
    n = args.requests
    k = round(share * n)
    # Constrained requests spread through the batch, not bunched at its start.
    flags = [i * k // n != (i + 1) * k // n for i in range(n)]
    masks0 = metric(base, "strata_structured_masks_total")
    secs0 = metric(base, "strata_structured_mask_seconds_total")
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        schema = long_text(args.max_tokens) if args.full_length else SCHEMA
        tokens = list(pool.map(lambda i: ask(base, seed0 + i, flags[i], args.max_tokens, schema), range(n)))
    wall = time.monotonic() - t0
    masks = metric(base, "strata_structured_masks_total") - masks0
    secs = metric(base, "strata_structured_mask_seconds_total") - secs0
    return {"share": share, "tokens": sum(tokens), "wall_s": wall, "tok_s": sum(tokens) / wall,
            "masks": masks, "ms_per_mask": 1e3 * secs / masks if masks else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="the strata binary")
    p.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=32, help="requests a batch")
    p.add_argument("--rounds", type=int, default=2, help="rounds over the three shares")
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--full-length", action="store_true",
                   help="constrain to a string too long to finish, so every answer runs to --max-tokens")
    p.add_argument("extra", nargs="*", help="flags for strata serve (after --)")
    args = p.parse_args()
    shares = [0.0, 0.5, 1.0]
    with tempfile.NamedTemporaryFile("w", prefix="structured-", suffix=".log", delete=False) as log:
        proc, base = start(args.bin, args.model, args.extra, log)
    rows = []
    try:
        batch(base, 0.5, args, 10_000)  # warm-up: grammar compiled and cached, first steps paid
        for r in range(args.rounds):
            order = shares if r % 2 == 0 else shares[::-1]
            for s in order:
                rows.append(batch(base, s, args, 1000 * r))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(json.dumps(rows, indent=1))
    base_rate = statistics.mean(x["tok_s"] for x in rows if x["share"] == 0.0)
    print(f"\n| constrained | output tok/s (each round) | mean vs 0% | tokens a batch | host ms per mask |")
    print("|---:|---|---:|---:|---:|")
    for s in shares:
        xs = [x for x in rows if x["share"] == s]
        rate = statistics.mean(x["tok_s"] for x in xs)
        per_mask = [x["ms_per_mask"] for x in xs if x["ms_per_mask"] is not None]
        mask = f"{statistics.mean(per_mask):.3f}" if per_mask else "-"
        each = ", ".join("%.1f" % x["tok_s"] for x in xs)
        print(f"| {s:.0%} | {each} | {rate / base_rate:.3f}x "
              f"| {statistics.mean(x['tokens'] for x in xs):.0f} | {mask} |")


if __name__ == "__main__":
    main()
