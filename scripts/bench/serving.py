#!/usr/bin/env python3
"""Serving benchmark against a running `strata serve` (in the spirit of bench_serving):
random prompts of --input token ids, --output tokens each (ignore_eos), --requests requests
at --concurrency clients, streamed. Reports TTFT, TPOT and ITL (mean, median, p99) and
output / total token throughput as one JSON object. Greedy by default; `--temperature T`
(with `--top-p P`) samples, each request with a seed of its own; `--logprobs N` asks for
the chosen token's logprob and N top logprobs with every token.

  python3 scripts/bench/serving.py --url http://127.0.0.1:8080 --model NAME \
      --input 512 --output 512 --concurrency 100 --requests 200
"""
import argparse
import json
import random
import statistics
import threading
import time

import requests


def one(url, model, prompt, output, out, sampling):
    body = {"model": model, "prompt": prompt, "max_tokens": output, "ignore_eos": True, "stream": True,
            **sampling}
    t0 = time.perf_counter()
    times = []
    with requests.post(f"{url}/v1/completions", json=body, stream=True, timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and ev["choices"][0].get("finish_reason") is None:
                times.append(time.perf_counter())
    end = time.perf_counter()
    out.append({"start": t0, "end": end, "tokens": times})


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary(xs):
    return {"mean": statistics.fmean(xs) * 1e3 if xs else None,
            "median": statistics.median(xs) * 1e3 if xs else None,
            "p99": pct(xs, 99) * 1e3 if xs else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", type=int, default=512)
    ap.add_argument("--output", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--out", default=None)
    # Prompts come from this seed: a second run on the same server with the same seed would
    # find every prompt in its prefix cache.
    ap.add_argument("--seed", type=int, default=5)
    # Greedy by default; a temperature above 0 samples on the server (each request seeded).
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    # Ask for the chosen token's logprob and this many top logprobs with every token.
    ap.add_argument("--logprobs", type=int, default=None)
    # Prompts that repeat themselves: a random block of --input / R ids, R times (what prompt
    # lookup can draft from).
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    n = a.requests or max(a.concurrency * 2, 4)
    rng = random.Random(a.seed)
    block = max(1, a.input // max(1, a.repeat))
    prompts = [([rng.randrange(3, a.vocab) for _ in range(block)] * (a.input // block + 1))[:a.input]
               for _ in range(n)]
    results, lock, next_i = [], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= n:
                return
            sampling = {"temperature": a.temperature}
            if a.temperature > 0:
                sampling.update(top_p=a.top_p, seed=a.seed * 100_003 + i)
            if a.logprobs is not None:
                sampling["logprobs"] = a.logprobs
            one(a.url, a.model, prompts[i], a.output, results, sampling)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [r["tokens"][0] - r["start"] for r in results if r["tokens"]]
    tpot = [(r["tokens"][-1] - r["tokens"][0]) / (len(r["tokens"]) - 1) for r in results if len(r["tokens"]) > 1]
    itl = [b - a_ for r in results for a_, b in zip(r["tokens"], r["tokens"][1:])]
    out_tokens = sum(len(r["tokens"]) for r in results)
    report = {"concurrency": a.concurrency, "requests": n, "input": a.input, "output": a.output, "repeat": a.repeat,
              "temperature": a.temperature, "top_p": a.top_p, "logprobs": a.logprobs,
              "duration_s": wall, "output_tokens": out_tokens,
              "output_throughput": out_tokens / wall,
              "total_throughput": (out_tokens + n * a.input) / wall,
              "ttft_ms": summary(ttft), "tpot_ms": summary(tpot), "itl_ms": summary(itl)}
    print(json.dumps(report))
    if a.out:
        json.dump(report, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
