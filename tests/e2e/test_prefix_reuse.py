"""Prefix reuse on a sliding-window model (Gemma-3 270M, window 512): requests sharing a long
system prompt and then asking different questions reuse the shared part, although the shared
part ends more than a window past where the first request's window moved on; the greedy text
equals a server without prefix reuse (`--cache-type naive`)."""

from __future__ import annotations

import pytest

from conftest import start_server
from helpers import get, post

TOPICS = ["rivers", "mountains", "deserts", "forests", "oceans", "islands", "lakes", "glaciers"]
# About 700 tokens: the shared prefix ends well past one 512-token window.
SYSTEM = "You are a careful geography tutor. " + " ".join(
    f"Rule {i}: when asked about {TOPICS[i % len(TOPICS)]}, answer in one short sentence "
    f"and cite section {i * 7 % 97}."
    for i in range(31)
)
QUESTIONS = [
    "What is the longest river in Africa?",
    "Which mountain is the highest on Earth?",
    "Name the largest hot desert.",
]
# The window is 512 tokens and pages hold 16: a hit that needs window pages from before the
# first request's last window must still reach this far.
MIN_CACHED = 672


@pytest.fixture(scope="module")
def naive_server(log_dir):
    s = start_server(log_dir, "--cache-type", "naive", name="naive")
    yield s
    s.stop()


def ask(server, question: str) -> dict:
    body = {
        "model": server.model_name,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 6,
        "temperature": 0,
    }
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def window_figures(server) -> tuple[int, int, int]:
    s = get(server, "/v1/cache/status").json()
    return s["window_hits"], s["window_hit_tokens"], s["window_past_window_pages"]


def test_shared_system_prompt_is_reused_past_the_window(server, naive_server):
    post(server, "/v1/cache/flush", None, raw=b"")
    hits0, tokens0, _ = window_figures(server)
    radix = [ask(server, q) for q in QUESTIONS]
    prompt_tokens = [r["usage"]["prompt_tokens"] for r in radix]
    assert all(680 <= n <= 760 for n in prompt_tokens), prompt_tokens
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in radix]
    assert cached[0] == 0, cached
    assert all(c >= MIN_CACHED for c in cached[1:]), cached

    hits, tokens, past = window_figures(server)
    assert hits - hits0 == 2, (hits0, hits)
    assert tokens - tokens0 == sum(cached[1:])
    assert past > 0
    metrics = get(server, "/metrics").text
    line = next(l for l in metrics.splitlines() if l.startswith("strata_prefix_cache_window_hits_total"))
    assert float(line.split()[-1]) == hits

    # The last request, served from pages that two earlier requests computed and cached,
    # answers as a server without prefix reuse does (one request: each costs a full prefill).
    naive = ask(naive_server, QUESTIONS[-1])
    assert naive["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert naive["usage"]["prompt_tokens"] == prompt_tokens[-1]
    assert radix[-1]["choices"][0]["message"]["content"] == naive["choices"][0]["message"]["content"]
