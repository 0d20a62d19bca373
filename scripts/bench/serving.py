#!/usr/bin/env python3
"""Serving benchmark against a running `strata serve` (in the spirit of bench_serving):
random prompts of --input token ids, --output tokens each (ignore_eos), --requests requests
at --concurrency clients, streamed. Reports TTFT, TPOT and ITL (mean, median, p99) and
output / total token throughput as one JSON object. Greedy by default; `--temperature T`
(with `--top-p P`) samples, each request with a seed of its own; `--logprobs N` asks for
the chosen token's logprob and N top logprobs with every token.

  python3 scripts/bench/serving.py --url http://127.0.0.1:8080 --model NAME \
      --input 512 --output 512 --concurrency 100 --requests 200

The clients are threads spread over --processes processes, each thread on a kept-alive
connection: at concurrency 100 the server streams over 20,000 events a second, and one
Python process parsing them all under its interpreter lock falls behind (its clock stamps
a token when it gets to it, and a finished client starts its next request late). The
processes start together; the run's duration is from that start to the last token.
"""
import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import threading
import time

import requests


def one(session, url, model, prompt, output, sampling):
    body = {"model": model, "prompt": prompt, "max_tokens": output, "ignore_eos": True, "stream": True,
            **sampling}
    t0 = time.perf_counter()
    times = []
    with session.post(f"{url}/v1/completions", json=body, stream=True, timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and ev["choices"][0].get("finish_reason") is None:
                times.append(time.perf_counter())
    return {"start": t0, "end": time.perf_counter(), "tokens": times}


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary(xs):
    return {"mean": statistics.fmean(xs) * 1e3 if xs else None,
            "median": statistics.median(xs) * 1e3 if xs else None,
            "p99": pct(xs, 99) * 1e3 if xs else None}


def sampling_of(a, i):
    sampling = {"temperature": a.temperature}
    if a.temperature > 0:
        sampling.update(top_p=a.top_p, seed=a.seed * 100_003 + i)
    if a.logprobs is not None:
        sampling["logprobs"] = a.logprobs
    return sampling


def client_process(a, prompts, threads, next_i, ready, out):
    """`threads` clients taking request indices from the shared counter `next_i` until
    every prompt is taken; puts ("ok", results) or ("error", message) on `out`."""
    results, errors = [], []

    def worker():
        session = requests.Session()
        try:
            while True:
                with next_i.get_lock():
                    i = next_i.value
                    next_i.value += 1
                if i >= len(prompts):
                    return
                results.append(one(session, a.url, a.model, prompts[i], a.output, sampling_of(a, i)))
        except Exception as e:  # reported by the parent, which fails the run
            errors.append(f"{type(e).__name__}: {e}")
        finally:
            session.close()

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    ready.wait()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put(("error", errors[0]) if errors else ("ok", results))


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
    # Processes the clients are spread over (default: one per 12 clients, at most the CPUs).
    ap.add_argument("--processes", type=int, default=None)
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
    procs = a.processes or min(os.cpu_count() or 1, -(-a.concurrency // 12))
    procs = max(1, min(procs, a.concurrency))
    # Fork: the children inherit the prompts and the arguments.
    ctx = mp.get_context("fork")
    next_i, ready, out = ctx.Value("q", 0), ctx.Barrier(procs + 1), ctx.Queue()
    children = [ctx.Process(target=client_process,
                            args=(a, prompts, a.concurrency // procs + (p < a.concurrency % procs),
                                  next_i, ready, out))
                for p in range(procs)]
    for c in children:
        c.start()
    ready.wait()
    t0 = time.perf_counter()  # CLOCK_MONOTONIC: the same clock in every process
    results = []
    for _ in children:
        status, value = out.get()
        if status != "ok":
            raise SystemExit(f"a request failed: {value}")
        results.extend(value)
    for c in children:
        c.join()
    wall = max((r["end"] for r in results), default=t0) - t0
    ttft = [r["tokens"][0] - r["start"] for r in results if r["tokens"]]
    tpot = [(r["tokens"][-1] - r["tokens"][0]) / (len(r["tokens"]) - 1) for r in results if len(r["tokens"]) > 1]
    itl = [b - a_ for r in results for a_, b in zip(r["tokens"], r["tokens"][1:])]
    out_tokens = sum(len(r["tokens"]) for r in results)
    report = {"concurrency": a.concurrency, "requests": n, "input": a.input, "output": a.output, "repeat": a.repeat,
              "processes": procs, "temperature": a.temperature, "top_p": a.top_p, "logprobs": a.logprobs,
              "duration_s": wall, "output_tokens": out_tokens,
              "output_throughput": out_tokens / wall,
              "total_throughput": (out_tokens + n * a.input) / wall,
              "ttft_ms": summary(ttft), "tpot_ms": summary(tpot), "itl_ms": summary(itl)}
    print(json.dumps(report))
    if a.out:
        json.dump(report, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
