"""A bounded loopback load test: 64 concurrent streaming clients, 96 requests, a quarter of them
hanging up after the first chunk. Afterwards the server must be up, every finished answer well
formed (greedy ones equal to a sequential run), and the KV pool whole again.
"""

from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from helpers import get, post, read_sse

CLIENTS = 64
REQUESTS = 96
WORDS = ("river stone light window garden paper music winter orange silver market bridge engine "
         "forest candle letter harbor planet yellow thunder quiet number castle morning").split()


def make_prompts(rng: random.Random, count: int) -> list[str]:
    """Prompts from a few to ~100 tokens (the words are mostly one token each)."""
    out = []
    for _ in range(count):
        n = rng.choice([2, 4, 8, 16, 32, 64, 96])
        out.append(" ".join(rng.choice(WORDS) for _ in range(n)))
    return out


def plan(seed: int = 7):
    rng = random.Random(seed)
    greedy_prompts = make_prompts(rng, 12)  # each reused by several requests
    jobs = []
    for i in range(REQUESTS):
        greedy = i % 3 != 2
        job = {
            "i": i,
            "greedy": greedy,
            "prompt": rng.choice(greedy_prompts) if greedy else make_prompts(rng, 1)[0],
            "max_tokens": rng.randint(4, 8),
            "disconnect": i % 4 == 3,
            "chat": i % 8 == 5,
        }
        if not greedy:
            job["seed"] = rng.randint(0, 1 << 30)
        jobs.append(job)
    return jobs


def body_for(job: dict, stream: bool) -> dict:
    b = {"max_tokens": job["max_tokens"], "stream": stream, "ignore_eos": True}
    if job["chat"]:
        b["messages"] = [{"role": "user", "content": job["prompt"]}]
    else:
        b["prompt"] = job["prompt"]
    if job["greedy"]:
        b["temperature"] = 0
    else:
        b.update(temperature=0.8, top_p=0.95, seed=job["seed"])
    if stream:
        b["stream_options"] = {"include_usage": True}
    return b


def path_for(job: dict) -> str:
    return "/v1/chat/completions" if job["chat"] else "/v1/completions"


def run_one(server, job: dict, start: threading.Barrier) -> dict:
    start.wait()
    t0 = time.monotonic()
    r = requests.post(server.base + path_for(job), json=body_for(job, True), stream=True, timeout=300)
    if r.status_code != 200:
        return {"job": job, "error": f"{r.status_code}: {r.text[:300]}"}
    if job["disconnect"]:
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                break  # one chunk arrived: hang up
        r.close()
        return {"job": job, "disconnected": True}
    chunks, done = read_sse(r)
    return {"job": job, "chunks": chunks, "done": done, "seconds": time.monotonic() - t0}


def stream_text(job: dict, chunks: list[dict]) -> str:
    parts = []
    for c in chunks:
        if not c["choices"]:
            continue
        ch = c["choices"][0]
        parts.append((ch.get("delta") or {}).get("content") or "" if job["chat"] else ch["text"])
    return "".join(parts)


def check_well_formed(res: dict):
    job, chunks = res["job"], res["chunks"]
    assert res["done"], f"request {job['i']}: no [DONE]"
    assert chunks, f"request {job['i']}: no chunks"
    assert len({c["id"] for c in chunks}) == 1
    usage = chunks[-1].get("usage")
    assert usage and chunks[-1]["choices"] == [], f"request {job['i']}: last chunk is not the usage chunk"
    with_choices = [c for c in chunks if c["choices"]]
    finishes = [c["choices"][0]["finish_reason"] for c in with_choices]
    assert all(f is None for f in finishes[:-1]), finishes
    assert finishes[-1] == "length", (job, finishes)  # ignore_eos: always runs to max_tokens
    assert usage["completion_tokens"] == job["max_tokens"], (job, usage)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_load(server):
    jobs = plan()
    # Start from a clean pool so the reference run and the page accounting are not affected by
    # earlier tests.
    assert post(server, "/v1/cache/flush", None, raw=b"").status_code == 200

    # Sequential reference for each distinct greedy request.
    reference: dict[str, str] = {}
    keys = {}
    for job in jobs:
        if job["greedy"] and not job["disconnect"]:
            keys[json.dumps(body_for(job, False), sort_keys=True)] = job
    t_ref = time.monotonic()
    for key, job in keys.items():
        r = post(server, path_for(job), body_for(job, False), timeout=300)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        reference[key] = c["message"]["content"] if job["chat"] else c["text"]
    t_ref = time.monotonic() - t_ref

    start = threading.Barrier(CLIENTS)
    results = []
    t0 = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        # The first wave starts together; the rest follow as clients free up.
        first = [pool.submit(run_one, server, job, start) for job in jobs[:CLIENTS]]
        rest_barrier = threading.Barrier(1)
        rest = [pool.submit(run_one, server, job, rest_barrier) for job in jobs[CLIENTS:]]
        for f in first + rest:
            results.append(f.result())
    elapsed = time.monotonic() - t0
    print(f"\nload: {REQUESTS} requests, {CLIENTS} clients, {elapsed:.1f} s "
          f"(sequential reference of {len(keys)} requests: {t_ref:.1f} s)")

    assert requests.get(server.base + "/health", timeout=10).status_code == 200
    errors = [r for r in results if "error" in r]
    assert not errors, errors[:3]
    completed = [r for r in results if "chunks" in r]
    assert len(completed) == REQUESTS - sum(j["disconnect"] for j in jobs)
    mismatches = []
    for res in completed:
        check_well_formed(res)
        job = res["job"]
        if job["greedy"]:
            want = reference[json.dumps(body_for(job, False), sort_keys=True)]
            got = stream_text(job, res["chunks"])
            if got != want:
                mismatches.append((job["i"], job["prompt"][:40], want, got))
    assert not mismatches, f"{len(mismatches)} greedy answers differ from the sequential run: {mismatches[:5]}"

    # Every page comes back: free or held by the prefix cache only, and nothing running.
    deadline = time.monotonic() + 10
    while True:
        s = get(server, "/v1/cache/status").json()
        settled = (s["running_requests"] == 0 and s["waiting_requests"] == 0
                   and s["free_pages"] + s["cached_pages"] == s["num_pages"])
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert settled, f"pool not settled after the load: {s}"
    r = post(server, "/v1/cache/flush", None, raw=b"")
    assert r.status_code == 200, r.text
    s = get(server, "/v1/cache/status").json()
    assert s["free_pages"] == s["num_pages"], s
    assert s["window_free_pages"] == s["window_num_pages"], s
    assert s["cached_tokens"] == 0, s

    # Cancelled requests are counted as such.
    text = requests.get(server.base + "/metrics", timeout=10).text
    print(next(l for l in text.splitlines() if "strata_requests_finished_total" in l and "cancel" in l))
