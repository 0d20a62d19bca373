#!/usr/bin/env python3
"""Shared-prefix serving benchmark: N requests (default 20) share one long document (about
2,000 tokens) and each asks a different question of about 50 tokens, sent one after another (streamed, greedy,
a few output tokens). For each binary given it starts `strata serve` on the model, runs the
workload and reports the mean and median time to first token of requests 2..N, the prompt
tokens computed (prompt - cached) and the share of the shareable tokens (document prefix of
requests 2..N) served from the cache. Binaries run one after another in the same
invocation, so their ratios are comparable even on a shared, noisy machine.

    python3 scripts/bench/shared_prefix.py --bin before=PATH --bin after=PATH \\
        [--model models/gemma-3-270m-q4_k_m.gguf] [--requests 20] [--concurrency 1] \\
        [-- EXTRA SERVE FLAGS]

With --concurrency C the first request goes alone (it puts the document in the cache, as
the first user of a system prompt does) and requests 2..N then go C at a time, a thread
each. A binary given as
NAME=PATH@FLAGS gets FLAGS (space-separated) after the common EXTRA flags: one binary under
several settings, such as --swa-ratio, in one invocation.

With --prefix-tokens N the prompts are token ids sent to /v1/completions: a document of N
ids and questions of 50, drawn from a seeded generator. That serves a checkpoint without a
tokenizer (random weights at a real shape) and fixes the prefix length exactly.

Only the standard library is used.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

TOPICS = ["rivers", "mountains", "deserts", "forests", "oceans", "islands", "lakes", "glaciers"]


def document(rules: int) -> str:
    return "Read the reference below, then answer the question after it. " + " ".join(
        f"Section {i}: the survey of {TOPICS[i % len(TOPICS)]} in region {i * 13 % 89} "
        f"counted {i * 37 % 1000} sites and rated access as grade {i % 5}."
        for i in range(rules)
    )


def start(binary: str, model: str, extra: list[str], log) -> tuple[subprocess.Popen, str]:
    args = [binary, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0", *extra]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{binary} exited with {proc.returncode}; log: {log.name}")
        with open(log.name, errors="replace") as f:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", f.read())
        if m:
            return proc, m.group(1)
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"{binary} did not start; log: {log.name}")


def messages(doc: str, question: str) -> list[dict]:
    return [{"role": "user", "content": f"{doc}\n\nQuestion: {question}"}]


def tokens(base: str, msgs: list[dict]) -> list[int]:
    req = urllib.request.Request(base + "/tokenize", json.dumps({"messages": msgs}).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)["tokens"]


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def ask(base: str, doc, question, max_tokens: int) -> tuple[float, dict]:
    body = {
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if isinstance(doc, str):
        body["messages"] = messages(doc, question)
        path = "/v1/chat/completions"
    else:  # token ids
        body["prompt"] = doc + question
        path = "/v1/completions"
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    ttft, usage = None, None
    with urllib.request.urlopen(req, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("choices"):
                ttft = time.monotonic() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert ttft is not None and usage is not None, "no token or no usage came back"
    return ttft, usage


def id_workload(prefix: int, requests: int, vocab_low: int = 1000, vocab_high: int = 200_000):
    """A document of `prefix` token ids and a question of 50 ids per request."""
    rng = random.Random(0)
    doc = [rng.randrange(vocab_low, vocab_high) for _ in range(prefix)]
    questions = [[rng.randrange(vocab_low, vocab_high) for _ in range(50)] for _ in range(requests)]
    return doc, questions


def run(name: str, binary: str, args, extra: list[str]) -> dict:
    with tempfile.NamedTemporaryFile("w", prefix=f"shared-prefix-{name}-", suffix=".log",
                                     delete=False) as log:
        proc, base = start(binary, args.model, extra, log)
    try:
        if args.prefix_tokens:
            doc, questions = id_workload(args.prefix_tokens, args.requests)
            ask(base, [7, 8, 9], [10], 1)  # first-request costs stay out of the figures
            ids = [doc + q for q in questions]
        else:
            doc = document(args.rules)
            ask(base, "Warm-up.", "Say hi.", 1)
            # Questions of a few pages (about 50 tokens), as users write them: the requests
            # diverge well before the end of the first one's prompt.
            questions = [f"I am preparing a field trip for group {i} and we can only visit "
                         f"places rated grade {i % 5} or better. Which region surveyed the "
                         f"most sites of kind {TOPICS[i % len(TOPICS)]}, and how many sites "
                         f"did it count?" for i in range(args.requests)]
            ids = [tokens(base, messages(doc, q)) for q in questions]
        # What a perfect cache could serve: each request's prefix shared with an earlier one.
        shareable = sum(max(common_prefix(ids[i], ids[j]) for j in range(i))
                        for i in range(1, len(ids)))
        rows = [ask(base, doc, questions[0], args.max_tokens)]
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            rows += pool.map(lambda q: ask(base, doc, q, args.max_tokens), questions[1:])
        elapsed = time.monotonic() - t0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    ttfts = [t for t, _ in rows[1:]]
    prompt = [u["prompt_tokens"] for _, u in rows]
    cached = [u.get("prompt_tokens_details", {}).get("cached_tokens", 0) for _, u in rows]
    return {
        "name": name,
        "first_ttft_s": rows[0][0],
        "ttft_mean_s": statistics.mean(ttfts),
        "ttft_median_s": statistics.median(ttfts),
        "prompt_tokens": sum(prompt),
        "computed_tokens": sum(p - c for p, c in zip(prompt, cached)),
        "cached_tokens_2_to_n": sum(cached[1:]),
        "shareable_tokens": shareable,
        "prompt_tokens_each": prompt[0],
        "elapsed_s": elapsed,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", action="append", required=True, help="NAME=PATH of a strata binary")
    p.add_argument("--model", default="models/gemma-3-270m-q4_k_m.gguf")
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--rules", type=int, default=62, help="document sections (~32 tokens each)")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--prefix-tokens", type=int, default=0,
                   help="token-id prompts: a document of this many ids (no tokenizer needed)")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    p.add_argument("extra", nargs="*", help="flags for strata serve (after --)")
    args = p.parse_args()
    results = []
    for b in args.bin:
        name, spec = b.split("=", 1)
        path, _, flags = spec.partition("@")
        results.append(run(name, path, args, args.extra + flags.split()))
    print(json.dumps(results, indent=1))
    base = results[0]
    print(f"\n| binary | TTFT mean 2..N (s) | TTFT median 2..N (s) | prompt tokens computed "
          f"| cached / shareable (2..N) | requests 2..N (s) | TTFT mean vs {base['name']} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        share = r["cached_tokens_2_to_n"] / max(1, r["shareable_tokens"])
        print(f"| {r['name']} | {r['ttft_mean_s']:.3f} | {r['ttft_median_s']:.3f} "
              f"| {r['computed_tokens']} of {r['prompt_tokens']} | {share:.1%} "
              f"| {r['elapsed_s']:.2f} "
              f"| {r['ttft_mean_s'] / base['ttft_mean_s']:.3f}x |")


if __name__ == "__main__":
    main()
