#!/usr/bin/env python3
"""Serving benchmark against a running `strata serve` (in the spirit of bench_serving):
random prompts of --input token ids, --output tokens each (ignore_eos), --requests requests
at --concurrency clients, streamed. Reports TTFT, TPOT and ITL (mean, median, p99) and
output / total token throughput as one JSON object. Greedy by default; `--temperature T`
(with `--top-p P`) samples, each request with a seed of its own; `--logprobs N` asks for
the chosen token's logprob and N top logprobs with every token.

  python3 scripts/bench/serving.py --url http://127.0.0.1:8080 --model NAME \
      --input 512 --output 512 --concurrency 100 --requests 200

`--prompts FILE` sends written prompts instead (JSON lines: {"messages": [...]} for
/v1/chat/completions, {"prompt": "..."} for /v1/completions; request i takes line i modulo
the file's length): what a drafter needs, since how many drafts it keeps depends on the text
(random ids say nothing about it). Token counts come from each request's usage. Where the
server counts speculative rounds (/metrics), the report has the run's rounds, drafted and
kept tokens.

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
    """One streamed request. `prompt` is token ids or text (/v1/completions) or a
    {"messages": [...]} object (/v1/chat/completions). A token whose text is not yet whole
    sends no event, so the token count is the usage's; `times` are the events'."""
    body = {"model": model, "max_tokens": output, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, **sampling}
    path = "/v1/completions"
    if isinstance(prompt, dict):
        body["messages"] = prompt["messages"]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
    for attempt in range(2):
        t0 = time.perf_counter()
        try:
            r = session.post(f"{url}{path}", json=body, stream=True, timeout=3600)
            break
        except requests.exceptions.ConnectionError:
            # A server that closes a kept-alive connection after a stream (llama-server)
            # makes the next request on it fail before it is sent: once more, afresh.
            if attempt:
                raise
    times, usage = [], None
    with r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(f"the server failed the request: {ev['error']}")
            if ev.get("usage"):
                usage = ev["usage"]
            if ev.get("choices") and ev["choices"][0].get("finish_reason") is None:
                times.append(time.perf_counter())
    if usage is None:
        raise RuntimeError("the stream ended without a usage chunk")
    return {"start": t0, "end": time.perf_counter(), "tokens": times,
            "completion_tokens": usage["completion_tokens"], "prompt_tokens": usage["prompt_tokens"]}


def read_prompts(path):
    """Written prompts, a JSON object a line: {"messages": [...]} (chat) or {"prompt": "..."}."""
    prompts = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            p = json.loads(line)
            if isinstance(p.get("messages"), list) and p["messages"]:
                prompts.append({"messages": p["messages"]})
            elif isinstance(p.get("prompt"), str):
                prompts.append(p["prompt"])
            else:
                raise SystemExit(f"{path}:{n}: a line needs \"messages\" (a list) or \"prompt\" (a string)")
    if not prompts:
        raise SystemExit(f"{path}: no prompts")
    return prompts


SPEC_COUNTERS = {"strata_spec_rounds_total": "rounds", "strata_spec_draft_tokens_total": "drafted",
                 "strata_spec_accepted_tokens_total": "kept"}


def spec_counters(url):
    """The server's speculative counters ({} when it has none, or no /metrics)."""
    try:
        text = requests.get(f"{url}/metrics", timeout=10).text
    except requests.RequestException:
        return {}
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in SPEC_COUNTERS:
            out[SPEC_COUNTERS[parts[0]]] = float(parts[1])
    return out


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
    # Written prompts (JSON lines) instead of random ids; --input and --repeat then do not apply.
    ap.add_argument("--prompts", default=None)
    a = ap.parse_args()
    n = a.requests or max(a.concurrency * 2, 4)
    if a.prompts:
        written = read_prompts(a.prompts)
        prompts = [written[i % len(written)] for i in range(n)]
    else:
        rng = random.Random(a.seed)
        block = max(1, a.input // max(1, a.repeat))
        prompts = [([rng.randrange(3, a.vocab) for _ in range(block)] * (a.input // block + 1))[:a.input]
                   for _ in range(n)]
    spec_before = spec_counters(a.url)
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
    # Over the request's tokens (the usage's count), not its events.
    tpot = [(r["tokens"][-1] - r["tokens"][0]) / (r["completion_tokens"] - 1)
            for r in results if len(r["tokens"]) > 1 and r["completion_tokens"] > 1]
    itl = [b - a_ for r in results for a_, b in zip(r["tokens"], r["tokens"][1:])]
    out_tokens = sum(r["completion_tokens"] for r in results)
    in_tokens = sum(r["prompt_tokens"] for r in results)
    report = {"concurrency": a.concurrency, "requests": n, "input": a.input, "output": a.output, "repeat": a.repeat,
              "prompts": a.prompts, "mean_prompt_tokens": in_tokens / max(1, len(results)),
              "processes": procs, "temperature": a.temperature, "top_p": a.top_p, "logprobs": a.logprobs,
              "duration_s": wall, "output_tokens": out_tokens,
              "output_throughput": out_tokens / wall,
              "total_throughput": (out_tokens + in_tokens) / wall,
              "ttft_ms": summary(ttft), "tpot_ms": summary(tpot), "itl_ms": summary(itl)}
    spec_after = spec_counters(a.url)
    if spec_after:
        spec = {k: spec_after[k] - spec_before.get(k, 0.0) for k in spec_after}
        if spec.get("drafted"):
            spec["kept_share"] = spec.get("kept", 0.0) / spec["drafted"]
        report["speculative"] = spec
    print(json.dumps(report))
    if a.out:
        json.dump(report, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
