"""`n` > 1 and `best_of` through the official `openai` client: indexed choices, the seed
rule (sample i draws with seed + i), streaming, greedy samples, shared prompt pages, and
the bounds."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from helpers import assert_api_error, get, post

PROMPT = "Once upon a time, in a small village by the sea,"


class Api:
    """The `openai` client with the served model's name filled in."""

    def __init__(self, client, model: str):
        self.client = client
        self.model = model

    def completion(self, **kw):
        kw.setdefault("prompt", PROMPT)
        kw.setdefault("max_tokens", 6)
        return self.client.completions.create(model=self.model, **kw)

    def chat(self, **kw):
        return self.client.chat.completions.create(model=self.model, **kw)


@pytest.fixture
def api(server, client) -> Api:
    return Api(client, server.model_name)


def test_samples_are_indexed_and_each_is_the_single_request_of_its_seed(api):
    r = api.completion(n=3, temperature=1.0, seed=42, logprobs=1)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.text for c in r.choices]
    # The documented rule, checked against independent single requests: sample i draws
    # with seed + i.
    singles = [api.completion(temperature=1.0, seed=42 + i) for i in range(3)]
    assert texts == [one.choices[0].text for one in singles]
    assert len(set(texts)) > 1, texts
    again = api.completion(n=3, temperature=1.0, seed=42, logprobs=1)
    assert [c.text for c in again.choices] == texts
    # Usage: the prompt once, every sample's tokens.
    assert r.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r.choices)


def test_streamed_samples_reassemble_to_the_unstreamed_answer(api):
    kw = dict(messages=[{"role": "user", "content": "Name a colour."}],
              n=3, temperature=1.0, seed=7, max_tokens=8)
    whole = api.chat(**kw)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    parts = {i: "" for i in range(3)}
    finished = set()
    usage = None
    for chunk in api.chat(stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts[c.index] += c.delta.content or ""
            if c.finish_reason is not None:
                finished.add(c.index)
    assert finished == {0, 1, 2}
    assert [parts[i] for i in range(3)] == [c.message.content for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_greedy_samples_are_equal_to_the_single_answer(api):
    single = api.completion(temperature=0).choices[0].text
    r = api.completion(n=2, temperature=0)
    assert [c.text for c in r.choices] == [single, single]


def test_best_of_returns_the_sample_with_the_highest_summed_logprob(api):
    # The same three samples (seeds 5, 6, 7), all returned with their logprobs.
    every = api.completion(n=3, temperature=1.0, seed=5, logprobs=1, max_tokens=6)
    sums = [sum(c.logprobs.token_logprobs) for c in every.choices]
    best = every.choices[max(range(3), key=lambda i: sums[i])]
    r = api.completion(n=1, best_of=3, temperature=1.0, seed=5, logprobs=1, max_tokens=6)
    assert len(r.choices) == 1 and r.choices[0].index == 0
    assert r.choices[0].text == best.text
    assert sum(r.choices[0].logprobs.token_logprobs) == pytest.approx(max(sums), abs=1e-4)
    # Usage counts every generated sample.
    assert r.usage.completion_tokens == every.usage.completion_tokens
    # Without logprobs asked for, none come back.
    r = api.completion(n=1, best_of=3, temperature=1.0, seed=5, max_tokens=6)
    assert r.choices[0].text == best.text and r.choices[0].logprobs is None


def test_prompt_lists_times_n_come_back_prompt_major(api):
    prompts = ["The sky is", "Water is"]
    r = api.completion(prompt=prompts, n=2, temperature=1.0, seed=3, max_tokens=4)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for p, prompt in enumerate(prompts):
        want = api.completion(prompt=prompt, n=2, temperature=1.0, seed=3, max_tokens=4)
        assert [c.text for c in r.choices[2 * p:2 * p + 2]] == [c.text for c in want.choices]


def test_samples_share_the_prompt_pages(server, api):
    post(server, "/v1/cache/flush", None, raw=b"")
    before = get(server, "/v1/cache/status").json()
    page = before["page_size"]
    prompt = " ".join(f"word{i}" for i in range(60))
    peak = [before["used_pages"]]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], get(server, "/v1/cache/status").json()["used_pages"])
            time.sleep(0.02)

    t = threading.Thread(target=watch)
    t.start()
    try:
        r = api.completion(prompt=prompt, n=4, temperature=1.0, seed=1, max_tokens=4)
    finally:
        stop.set()
        t.join()
    after = get(server, "/v1/cache/status").json()
    n_prompt = r.usage.prompt_tokens
    assert n_prompt > 4 * page, n_prompt
    prompt_pages = -(-n_prompt // page)
    # Samples 2..4 each reused the prompt's whole pages (all but its last token) from the
    # first sample's prefill, rather than computing them.
    whole = (n_prompt - 1) // page * page
    assert after["hit_tokens"] - before["hit_tokens"] >= 3 * whole
    assert after["cache_hits"] - before["cache_hits"] >= 3
    # One copy of the prompt plus a few pages per sample, far from four copies.
    assert peak[0] - before["used_pages"] < 2 * prompt_pages, (peak, prompt_pages)
    print(f"prompt {n_prompt} tokens ({prompt_pages} pages of {page}); peak pages used "
          f"{peak[0] - before['used_pages']}; hit tokens {after['hit_tokens'] - before['hit_tokens']}")


CANCELLED = 'strata_requests_finished_total{reason="cancelled"}'


def cancelled_total(server) -> float:
    text = get(server, "/metrics").text
    return float(next(l for l in text.splitlines() if l.startswith(CANCELLED)).split()[-1])


def test_dropping_the_stream_cancels_every_sample(server):
    before = cancelled_total(server)
    body = {"model": server.model_name, "prompt": PROMPT, "n": 3, "max_tokens": 400,
            "ignore_eos": True, "temperature": 1.0, "stream": True}
    with requests.post(server.v1 + "/completions", json=body, stream=True, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        seen = 0
        while seen < 3:
            seen += bool(next(lines))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and cancelled_total(server) < before + 3:
        time.sleep(0.05)
    assert cancelled_total(server) == before + 3
    status = get(server, "/v1/cache/status").json()
    assert status["running_requests"] == 0 and status["waiting_requests"] == 0


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "hi", "n": 17}, "n"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 17}, "n"),
    ("/v1/completions", {"prompt": "hi", "n": 3, "best_of": 2}, "best_of"),
    ("/v1/completions", {"prompt": "hi", "best_of": 17}, "best_of"),
    ("/v1/completions", {"prompt": "hi", "best_of": 3, "stream": True}, "best_of"),
    ("/v1/completions", {"prompt": ["a"] * 17, "n": 16}, "n"),
])
def test_bad_sample_counts_are_refused_by_name(server, path, body, param):
    err = assert_api_error(post(server, path, {"model": server.model_name, "max_tokens": 2, **body}), 400)
    assert err["param"] == param, err
