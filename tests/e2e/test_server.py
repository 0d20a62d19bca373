"""End-to-end tests of `strata serve` with the real Gemma-3 270M model, through the official
`openai` client and through raw HTTP.

CPU decoding is slow on CI (a few tokens per second on two cores), so every request asks for a
handful of tokens.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import openai
import pytest
import requests

from conftest import BIN, MAX_MODEL_LEN, MODEL
from helpers import assert_api_error, get, post, read_sse

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name one primary colour."}]
TIMING_KEYS = {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
               "predicted_per_second", "cached_n"}


def greedy(server, prompt: str, max_tokens: int, **extra) -> dict:
    r = post(server, "/v1/completions", {"model": server.model_name, "prompt": prompt,
                                         "max_tokens": max_tokens, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def check_usage(usage: dict, max_tokens: int | None = None):
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] >= 1
    if max_tokens is not None:
        assert usage["completion_tokens"] <= max_tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def check_timings(t: dict, usage: dict):
    assert TIMING_KEYS <= set(t), t
    assert t["prompt_n"] == usage["prompt_tokens"]
    assert t["predicted_n"] == usage["completion_tokens"]
    assert 0 <= t["cached_n"] <= t["prompt_n"]
    for k in ("prompt_ms", "prompt_per_second", "predicted_ms", "predicted_per_second"):
        assert isinstance(t[k], (int, float)) and t[k] >= 0 and math.isfinite(t[k]), (k, t)


# --------------------------------------------------------------------------- basic endpoints


def test_health(server):
    r = requests.get(server.base + "/health", timeout=10)
    assert r.status_code == 200
    assert r.json()["status"] == "ok"


def test_models(server, client):
    r = get(server, "/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [server.model_name]
    assert server.model_name == MODEL.stem
    ids = [m.id for m in client.models.list()]
    assert ids == [server.model_name]


# --------------------------------------------------------------------------- completions


def test_completion_openai_client(server, client):
    r = client.completions.create(model=server.model_name, prompt=PROMPT, max_tokens=6, temperature=0)
    assert r.object == "text_completion"
    assert r.model == server.model_name
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0
    assert isinstance(c.text, str) and c.text
    assert c.finish_reason in ("stop", "length")
    check_usage(r.usage.model_dump(), 6)


def test_completion_raw_and_timings(server):
    body = greedy(server, PROMPT, 6)
    assert body["object"] == "text_completion"
    assert body["id"]
    c = body["choices"][0]
    assert c["finish_reason"] in ("stop", "length") and c["logprobs"] is None
    check_usage(body["usage"], 6)
    # The shared server runs with --enable-timings-report.
    check_timings(body["timings"], body["usage"])


def test_completion_stream_raw(server):
    ref = greedy(server, PROMPT, 6)
    r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": True,
                                         "stream_options": {"include_usage": True}}, headers={"Accept": "text/event-stream"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks, done = read_sse(r)
    assert done, "stream did not end with data: [DONE]"
    usage_chunks = [c for c in chunks if c.get("usage")]
    text_chunks = [c for c in chunks if c["choices"]]
    assert len(usage_chunks) == 1 and chunks[-1] is usage_chunks[0], "usage must come last, once"
    assert usage_chunks[0]["choices"] == []
    for c in text_chunks:
        assert c["object"] == "text_completion" and c["model"] == server.model_name
        assert len({c["id"] for c in chunks}) == 1
    finishes = [c["choices"][0]["finish_reason"] for c in text_chunks]
    assert finishes[-1] in ("stop", "length") and all(f is None for f in finishes[:-1])
    assert "timings" in text_chunks[-1]
    check_timings(text_chunks[-1]["timings"], usage_chunks[0]["usage"])
    text = "".join(c["choices"][0]["text"] for c in text_chunks)
    assert text == ref["choices"][0]["text"]
    assert usage_chunks[0]["usage"]["completion_tokens"] == ref["usage"]["completion_tokens"]
    assert finishes[-1] == ref["choices"][0]["finish_reason"]


def test_completion_stream_openai_client(server, client):
    stream = client.completions.create(model=server.model_name, prompt=PROMPT, max_tokens=6, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    assert text == greedy(server, PROMPT, 6)["choices"][0]["text"]


def test_stream_without_usage_has_no_usage_chunk(server):
    r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "stream": True})
    chunks, done = read_sse(r)
    assert done and chunks
    assert all(not c.get("usage") for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


# --------------------------------------------------------------------------- chat


def test_chat_openai_client(server, client):
    r = client.chat.completions.create(model=server.model_name, messages=CHAT, max_tokens=6, temperature=0)
    assert r.object == "chat.completion"
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str)
    assert c.finish_reason in ("stop", "length")
    check_usage(r.usage.model_dump(), 6)
    # max_completion_tokens is the newer name of the same limit.
    r2 = client.chat.completions.create(model=server.model_name, messages=CHAT, max_completion_tokens=6,
                                        temperature=0)
    assert r2.choices[0].message.content == c.message.content


def test_chat_stream_raw(server):
    ref = post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "temperature": 0}).json()
    r = post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "temperature": 0, "stream": True,
                                              "stream_options": {"include_usage": True}})
    assert r.status_code == 200, r.text
    chunks, done = read_sse(r)
    assert done
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    with_choices = [c for c in chunks if c["choices"]]
    assert with_choices[0]["choices"][0]["delta"].get("role") == "assistant"
    assert with_choices[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["choices"][0]["finish_reason"] is None for c in with_choices[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in with_choices)
    assert text == ref["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"] == ref["usage"]


def test_chat_stream_openai_client(server, client):
    stream = client.chat.completions.create(model=server.model_name, messages=CHAT, max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage is not None
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    ref = client.chat.completions.create(model=server.model_name, messages=CHAT, max_tokens=6, temperature=0)
    assert text == ref.choices[0].message.content


# --------------------------------------------------------------------------- agreement with `strata generate`


@pytest.mark.parametrize("prompt", ["The capital of France is", "def fibonacci(n):"])
def test_greedy_matches_generate_cli(server, prompt):
    n = 8
    out = subprocess.run([str(BIN), "generate", "--model", str(MODEL), "--prompt", prompt, "--max-tokens", str(n),
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    cli = json.loads(out.stdout.strip().splitlines()[-1])
    body = greedy(server, prompt, n)
    assert body["choices"][0]["text"] == cli["text"]
    assert body["usage"]["completion_tokens"] == len(cli["tokens"])
    assert body["usage"]["prompt_tokens"] == len(cli["prompt_tokens"])
    assert body["choices"][0]["finish_reason"] == cli["finish_reason"]


# --------------------------------------------------------------------------- logprobs


def test_completion_logprobs(server, client):
    body = greedy(server, PROMPT, 5, logprobs=2)
    lp = body["choices"][0]["logprobs"]
    n = body["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert "".join(lp["tokens"]) == body["choices"][0]["text"]
    for tok, chosen, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert 1 <= len(top) <= 2  # two alternatives (fewer only if both decode to one string)
        assert chosen <= 0 and all(v <= 0 for v in top.values())
        assert tok in top, (tok, top)
        assert chosen == pytest.approx(max(top.values()), abs=1e-4)
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    # The same through the client.
    r = client.completions.create(model=server.model_name, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    assert r.choices[0].logprobs.tokens == lp["tokens"]
    assert r.choices[0].logprobs.token_logprobs == pytest.approx(lp["token_logprobs"], abs=1e-5)


def test_chat_logprobs(server, client):
    r = client.chat.completions.create(model=server.model_name, messages=CHAT, max_tokens=5, temperature=0,
                                       logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        assert len(e.top_logprobs) == 2
        assert e.logprob <= 0
        assert e.logprob == pytest.approx(max(t.logprob for t in e.top_logprobs), abs=1e-4)
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert e.token == e.top_logprobs[0].token
        assert bytes(e.bytes) == e.token.encode()
    # logprobs without top_logprobs: entries with empty top lists.
    raw = post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 3, "temperature": 0,
                                                "logprobs": True}).json()
    assert all(e["top_logprobs"] == [] for e in raw["choices"][0]["logprobs"]["content"])


def test_stream_logprobs(server):
    r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True,
                                         "logprobs": 2})
    chunks, done = read_sse(r)
    assert done
    per_token = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
    ref = greedy(server, PROMPT, 4, logprobs=2)["choices"][0]["logprobs"]
    assert [t for p in per_token for t in p["tokens"]] == ref["tokens"]
    assert [o for p in per_token for o in p["text_offset"]] == ref["text_offset"]


# --------------------------------------------------------------------------- stop, length, seed


def _pick_stop(text: str) -> tuple[str, int]:
    """A substring of `text` whose first occurrence is past the start, and that position."""
    for pos in range(max(1, len(text) // 3), len(text) - 1):
        for width in (3, 2):
            s = text[pos:pos + width]
            if len(s) == width and s.strip() and text.find(s) == pos:
                return s, pos
    pytest.skip(f"no usable stop string in {text!r}")


def test_stop_string(server, client):
    ref = greedy(server, PROMPT, 12, ignore_eos=True)["choices"][0]["text"]
    stop, pos = _pick_stop(ref)
    body = greedy(server, PROMPT, 12, ignore_eos=True, stop=[stop, "\u2603never"])
    c = body["choices"][0]
    assert c["finish_reason"] == "stop"
    assert stop not in c["text"]
    assert c["text"] == ref[:pos]
    # Streaming: the stop string never reaches the client either.
    stream = client.completions.create(model=server.model_name, prompt=PROMPT, max_tokens=12, temperature=0,
                                       stop=stop, stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == ref[:pos] and stop not in text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_max_tokens_length(server, client):
    r = client.completions.create(model=server.model_name, prompt=PROMPT, max_tokens=5, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    r = client.chat.completions.create(model=server.model_name, messages=CHAT, max_tokens=3, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def test_seed_reproducible(server, client):
    kw = dict(model=server.model_name, prompt="Once upon a time", max_tokens=8, temperature=0.8,
              extra_body={"ignore_eos": True})
    a = client.completions.create(seed=1234, **kw).choices[0].text
    b = client.completions.create(seed=1234, **kw).choices[0].text
    assert a == b
    # A sampled answer differs from greedy for some seed (else temperature would be ignored).
    g = greedy(server, "Once upon a time", 8, ignore_eos=True)["choices"][0]["text"]
    others = {client.completions.create(seed=s, **kw).choices[0].text for s in (1, 2, 3)}
    assert others != {g}, "temperature 0.8 gave the greedy text for every seed"


def test_top_k_min_p_accepted(server):
    body = greedy(server, PROMPT, 3, top_k=5, min_p=0.05, top_p=0.9)
    assert body["choices"][0]["finish_reason"] in ("stop", "length")


def test_prompt_as_token_ids(server):
    ref = greedy(server, PROMPT, 4)
    out = subprocess.run([str(BIN), "generate", "--model", str(MODEL), "--prompt", PROMPT, "--max-tokens", "1",
                          "--json"], capture_output=True, text=True, timeout=300)
    ids = json.loads(out.stdout.strip().splitlines()[-1])["prompt_tokens"]
    body = greedy(server, ids, 4)
    assert body["choices"][0]["text"] == ref["choices"][0]["text"]


# --------------------------------------------------------------------------- bad inputs

BAD_COMPLETIONS = {
    "malformed_json": (b'{"prompt": "hi", "max_tokens": ', 400),
    "not_an_object": (b"[1, 2, 3]", 400),
    "wrong_type_max_tokens": ({"prompt": "hi", "max_tokens": "x"}, 400),
    "negative_max_tokens": ({"prompt": "hi", "max_tokens": -1}, 400),
    "zero_max_tokens": ({"prompt": "hi", "max_tokens": 0}, 400),
    "unknown_field": ({"prompt": "hi", "max_tokns": 4}, 400),
    "missing_prompt": ({"max_tokens": 4}, 400),
    "empty_prompt": ({"prompt": "", "max_tokens": 4}, 400),
    "empty_token_list": ({"prompt": [], "max_tokens": 4}, 400),
    "token_outside_vocab": ({"prompt": [2, 999999999], "max_tokens": 4}, 400),
    "two_prompts_streamed": ({"prompt": ["a", "b"], "max_tokens": 4, "stream": True}, 400),
    "too_many_prompts": ({"prompt": ["a"] * 257, "max_tokens": 1}, 400),
    "empty_prompt_in_list": ({"prompt": ["a", ""], "max_tokens": 1}, 400),
    "n_over_cap": ({"prompt": "hi", "max_tokens": 4, "n": 17}, 400),
    "temperature_5": ({"prompt": "hi", "max_tokens": 4, "temperature": 5}, 400),
    "temperature_negative": ({"prompt": "hi", "max_tokens": 4, "temperature": -0.5}, 400),
    "top_p_0": ({"prompt": "hi", "max_tokens": 4, "top_p": 0}, 400),
    "top_p_2": ({"prompt": "hi", "max_tokens": 4, "top_p": 2}, 400),
    "top_k_negative": ({"prompt": "hi", "max_tokens": 4, "top_k": -5}, 400),
    "min_p_2": ({"prompt": "hi", "max_tokens": 4, "min_p": 2}, 400),
    "max_tokens_beyond_context": ({"prompt": "hi", "max_tokens": 10_000_000}, 400),
    "logprobs_too_many": ({"prompt": "hi", "max_tokens": 4, "logprobs": 100}, 400),
    "empty_stop": ({"prompt": "hi", "max_tokens": 4, "stop": [""]}, 400),
    "long_stop": ({"prompt": "hi", "max_tokens": 4, "stop": ["x" * 1025]}, 400),
    "many_stops": ({"prompt": "hi", "max_tokens": 4, "stop": [str(i) for i in range(17)]}, 400),
    "echo_streamed": ({"prompt": "hi", "max_tokens": 4, "echo": True, "stream": True}, 400),
    "presence_penalty": ({"prompt": "hi", "max_tokens": 4, "presence_penalty": 2.5}, 400),
    "stream_options_unknown": ({"prompt": "hi", "max_tokens": 4, "stream": True,
                                "stream_options": {"bogus": 1}}, 400),
    "wrong_model": ({"model": "no-such-model", "prompt": "hi", "max_tokens": 4}, 404),
}

BAD_CHAT = {
    "empty_messages": ({"messages": [], "max_tokens": 4}, 400),
    "bad_role": ({"messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 4}, 400),
    "image_part": ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                    "max_tokens": 4}, 400),
    "top_logprobs_without_logprobs": ({"messages": CHAT, "max_tokens": 4, "top_logprobs": 2}, 400),
    "unknown_field": ({"messages": CHAT, "max_tokens": 4, "frobnicate": True}, 400),
    "wrong_type_messages": ({"messages": "hi", "max_tokens": 4}, 400),
    "n_over_cap": ({"messages": CHAT, "max_tokens": 4, "n": 17}, 400),
    "max_tokens_beyond_context": ({"messages": CHAT, "max_tokens": 10_000_000}, 400),
    "wrong_model": ({"model": "gpt-4", "messages": CHAT, "max_tokens": 4}, 404),
}


def _send_bad(server, path, body):
    raw = body if isinstance(body, bytes) else None
    return post(server, path, None if raw else body, raw=raw)


@pytest.mark.parametrize("case", list(BAD_COMPLETIONS))
def test_bad_completion_request(server, case):
    body, status = BAD_COMPLETIONS[case]
    err = assert_api_error(_send_bad(server, "/v1/completions", body), status)
    assert err.get("type")
    assert requests.get(server.base + "/health", timeout=10).status_code == 200


@pytest.mark.parametrize("case", list(BAD_CHAT))
def test_bad_chat_request(server, case):
    body, status = BAD_CHAT[case]
    assert_api_error(_send_bad(server, "/v1/chat/completions", body), status)
    assert requests.get(server.base + "/health", timeout=10).status_code == 200


def test_bad_request_through_openai_client(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=server.model_name, prompt="hi", max_tokens=4, n=17)
    assert e.value.status_code == 400 and "n" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=server.model_name, messages=CHAT, max_tokens=4, temperature=5)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=4)


def test_oversized_body(server):
    big = json.dumps({"prompt": "x" * (9 << 20), "max_tokens": 1}).encode()
    try:
        r = post(server, "/v1/completions", None, raw=big)
    except requests.ConnectionError as e:  # the server may close before reading it all
        pytest.fail(f"oversized body: connection dropped instead of a 413 answer: {e}")
    assert_api_error(r, 413)
    assert requests.get(server.base + "/health", timeout=10).status_code == 200


def test_wrong_content_type(server):
    r = requests.post(server.v1 + "/completions", data=json.dumps({"prompt": "hi"}),
                      headers={"Content-Type": "text/plain"}, timeout=30)
    assert_api_error(r, 415)


def test_unknown_endpoint_and_wrong_method(server):
    for path in ("/v1/nope", "/v2/completions", "/ui/nope"):
        assert_api_error(requests.get(server.base + path, timeout=10), 404)
    # `/` is the page (test_ui.py): GET only.
    assert_api_error(requests.post(server.base + "/", json={}, timeout=10), 405)
    assert_api_error(requests.post(server.base + "/v1/engines/x/completions", json={}, timeout=10), 404)
    assert_api_error(requests.get(server.v1 + "/completions", timeout=10), 405)
    assert_api_error(requests.delete(server.v1 + "/chat/completions", timeout=10), 405)
    assert_api_error(requests.post(server.v1 + "/models", json={}, timeout=10), 405)
    assert_api_error(requests.post(server.base + "/health", json={}, timeout=10), 405)
    assert requests.get(server.base + "/health", timeout=10).status_code == 200


def test_rejections_counted_in_metrics(server):
    def rejected():
        text = requests.get(server.base + "/metrics", timeout=10).text
        line = next(l for l in text.splitlines() if l.startswith("strata_requests_rejected_total"))
        return float(line.split()[-1])

    before = rejected()
    assert_api_error(post(server, "/v1/completions", {"prompt": "hi", "n": 17}), 400)
    assert rejected() == before + 1


# --------------------------------------------------------------------------- auth and served name


def test_auth(auth_server):
    base = auth_server.base
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    for path, method in (("/v1/models", "GET"), ("/v1/completions", "POST"), ("/v1/chat/completions", "POST"),
                         ("/v1/cache/status", "GET")):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "e2e-secret"},
                        {"Authorization": "Basic e2e-secret"}):
            r = requests.request(method, base + path, json=body, headers=headers, timeout=30)
            assert_api_error(r, 401)
    assert requests.get(base + "/health", timeout=10).status_code == 200
    assert requests.get(base + "/metrics", timeout=10).status_code == 200
    good = {"Authorization": "Bearer e2e-secret"}
    r = requests.post(base + "/v1/completions", json=body, headers=good, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "e2e-model"
    assert "timings" not in r.json()  # no --enable-timings-report on this server
    # The wrong model name is still a 404 behind a good key.
    r = requests.post(base + "/v1/completions", json={**body, "model": MODEL.stem}, headers=good, timeout=30)
    assert_api_error(r, 404)


def test_auth_openai_client(auth_server):
    from openai import OpenAI

    bad = OpenAI(base_url=auth_server.v1, api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = OpenAI(base_url=auth_server.v1, api_key="e2e-secret", max_retries=0, timeout=60)
    assert [m.id for m in good.models.list()] == ["e2e-model"]
    r = good.chat.completions.create(model="e2e-model", messages=CHAT, max_tokens=2, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length")


# --------------------------------------------------------------------------- metrics and cache


def test_metrics(server):
    greedy(server, PROMPT, 2)  # at least one finished request
    r = requests.get(server.base + "/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in ("strata_requests_finished_total", "strata_time_to_first_token_seconds_bucket",
                 "strata_kv_pages_total", "strata_inter_token_latency_seconds_bucket",
                 "strata_generation_tokens_total", "strata_engine_step_seconds_bucket",
                 "strata_engine_step_gap_seconds_bucket"):
        assert name in text, name
    # Every sample line parses as `name{labels} value`.
    for line in text.splitlines():
        if line and not line.startswith("#"):
            float(line.rsplit(" ", 1)[1])
    finished = sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                   if l.startswith("strata_requests_finished_total"))
    assert finished >= 1
    assert 'le="+Inf"' in text
    # Two generated tokens take at least two steps, one after the other: a gap between them.
    count = {l.split(" ")[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
             if l.startswith("strata_engine_step")}
    assert count["strata_engine_step_seconds_count"] >= 2, count
    assert count["strata_engine_step_gap_seconds_count"] >= 1, count
    assert count["strata_engine_step_seconds_sum"] > 0, count


CACHE_KEYS = {"num_pages", "window_num_pages", "page_size", "free_pages", "window_free_pages", "unit_bytes",
              "kv_cache_dtype", "cached_tokens", "cache_hits", "cache_misses"}


def test_cache_status_and_flush(server):
    long_prompt = "Paris is the capital and largest city of France. " * 4
    greedy(server, long_prompt, 2)
    s = get(server, "/v1/cache/status").json()
    assert CACHE_KEYS <= set(s), CACHE_KEYS - set(s)
    assert s["num_pages"] > 0 and s["page_size"] > 0
    assert 0 <= s["free_pages"] <= s["num_pages"]
    assert 0 <= s["window_free_pages"] <= s["window_num_pages"]
    assert isinstance(s["unit_bytes"], list) and s["unit_bytes"]
    assert isinstance(s["kv_cache_dtype"], str)
    assert s["cached_tokens"] > 0, "the radix cache should hold the prompt just served"
    # A repeat of the same prompt hits the cache.
    before_hits = s["cache_hits"]
    again = greedy(server, long_prompt, 2)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert again["timings"]["cached_n"] > 0
    s = get(server, "/v1/cache/status").json()
    assert s["cache_hits"] > before_hits
    r = post(server, "/v1/cache/flush", None, raw=b"")
    assert r.status_code == 200, r.text
    assert r.json()["flushed_pages"] >= 1
    s = get(server, "/v1/cache/status").json()
    assert s["free_pages"] == s["num_pages"] and s["cached_tokens"] == 0


def test_cache_rebuild(server):
    s0 = get(server, "/v1/cache/status").json()
    floor = MAX_MODEL_LEN // s0["page_size"]
    target = max(floor, s0["num_pages"] // 2)
    r = post(server, "/v1/cache/rebuild", {"num_pages": target})
    assert r.status_code == 200, r.text
    assert r.json()["num_pages"] == target
    try:
        s = get(server, "/v1/cache/status").json()
        assert s["num_pages"] == target and s["free_pages"] == target
        assert s["window_num_pages"] >= 1
        # The server still generates on the new pool, and agrees with itself.
        assert greedy(server, PROMPT, 3)["choices"][0]["text"]
        for bad in ({"num_pages": 0}, {"num_pages": -1}, {"num_pages": "many"}, {}, {"num_pages": 8, "x": 1},
                    # Less than one request of --max-model-len tokens.
                    {"num_pages": floor - 1},
                    # Terabytes of KV: refused, not an allocation failure that aborts the server.
                    {"num_pages": 268435455}, {"num_pages": 2**40}):
            assert_api_error(post(server, "/v1/cache/rebuild", bad), 400)
            assert server.alive(), server.log_tail()
        assert get(server, "/v1/cache/status").json()["num_pages"] == target
    finally:
        r = post(server, "/v1/cache/rebuild", {"num_pages": s0["num_pages"]})
        assert r.status_code == 200, r.text
    s = get(server, "/v1/cache/status").json()
    assert s["num_pages"] == s0["num_pages"] and s["free_pages"] == s0["num_pages"]
    # (The window pool may differ by one page from startup's: startup sizes it from the byte
    # budget, a rebuild as ceil(num_pages * swa_ratio).)
    assert abs(s["window_num_pages"] - s0["window_num_pages"]) <= 1


def test_cache_status_fresh_after_rebuild_and_flush(server):
    """/v1/cache/status read right after a rebuild or flush answered must show its result."""
    s0 = get(server, "/v1/cache/status").json()
    stale = []
    try:
        for i in range(10):
            target = MAX_MODEL_LEN // 16 + i
            r = post(server, "/v1/cache/rebuild", {"num_pages": target})
            assert r.status_code == 200, r.text
            s = get(server, "/v1/cache/status").json()
            if s["num_pages"] != target:
                stale.append(f"rebuild to {target}: status says num_pages {s['num_pages']}")
            greedy(server, "Paris is the capital and largest city of France. " * 3, 1)
            assert post(server, "/v1/cache/flush", None, raw=b"").status_code == 200
            s = get(server, "/v1/cache/status").json()
            if s["free_pages"] != s["num_pages"] or s["cached_tokens"] != 0:
                stale.append(f"flush: status says free_pages {s['free_pages']} of {s['num_pages']}, "
                             f"cached_tokens {s['cached_tokens']}")
    finally:
        assert post(server, "/v1/cache/rebuild", {"num_pages": s0["num_pages"]}).status_code == 200
    assert not stale, f"{len(stale)} of 20 status reads were stale: {stale[:4]}"


def test_a_cpu_servers_steps_take_2048_tokens_by_default(server):
    """Without `--max-batch-tokens` the budget follows the device: 2048 tokens a step on the
    CPU (8192 on a GPU), said in the log at start."""
    log = server.log_path.read_text(errors="replace")
    assert "steps of up to 2048 tokens (decode rows and prompt chunks of up to 512)" in log, log


def test_warmup_runs_every_decode_batch_and_empties_the_cache(server, log_dir):
    from conftest import start_server

    warm = start_server(log_dir, "--warmup", "on", "--max-running-requests", "3",
                        "--max-batch-tokens", "64", "--prefill-chunk", "32", name="warmup")
    try:
        log = warm.log_path.read_text(errors="replace")
        assert "warm-up: decode steps of [1, 2, 3] requests and prefill steps of 2 x 32 tokens in" in log, log
        assert "steps of up to 64 tokens (decode rows and prompt chunks of up to 32), 3 requests running" in log, log
        s = get(warm, "/v1/cache/status").json()
        assert s["cached_tokens"] == 0 and s["free_pages"] == s["num_pages"], s
        # The warmed server answers as the unwarmed one does.
        assert greedy(warm, PROMPT, 8)["choices"][0]["text"] == greedy(server, PROMPT, 8)["choices"][0]["text"]
    finally:
        warm.stop()
    # A chunk that fills the step: a step of one such prompt, then one of shorter prompts.
    whole = start_server(log_dir, "--warmup", "on", "--max-running-requests", "3",
                         "--max-batch-tokens", "64", "--prefill-chunk", "64", name="warmup-whole")
    try:
        log = whole.log_path.read_text(errors="replace")
        assert "warm-up: decode steps of [1, 2, 3] requests and prefill steps of 1 x 64 and 2 x 32 tokens in" in log, log
        assert greedy(whole, PROMPT, 8)["choices"][0]["text"] == greedy(server, PROMPT, 8)["choices"][0]["text"]
    finally:
        whole.stop()


def test_overlapped_decode_answers_as_the_plain_server(server, log_dir):
    """`--overlap on` queues each decode step before reading the one ahead of it, its ids fed
    from that step's output: the same text as the plain server (overlap is off on a CPU by
    default), for greedy requests that run together, one ending on a stop string, sampled
    ones drawn where the logits are (their steps overlapped too), and one with logprobs
    among them (which makes its steps read at once). A sampled request that asks for
    logprobs, drawn on the host from its logits, gives the text of the same request without."""
    from concurrent.futures import ThreadPoolExecutor

    from conftest import start_server

    fast = start_server(log_dir, "--overlap", "on", "--warmup", "off", name="overlap")
    try:
        prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,"]
        want = [greedy(server, p, 6)["choices"][0]["text"] for p in prompts]
        with ThreadPoolExecutor(len(prompts)) as pool:
            got = list(pool.map(lambda p: greedy(fast, p, 6)["choices"][0]["text"], prompts))
        assert got == want
        stop, pos = _pick_stop(want[1])
        body = greedy(fast, prompts[1], 6, stop=[stop])
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["choices"][0]["text"] == want[1][:pos]
        sampled = {"model": fast.model_name, "prompt": prompts[1], "max_tokens": 4, "temperature": 0.8,
                   "seed": 11}
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(post, fast, "/v1/completions", sampled),
                       pool.submit(greedy, fast, prompts[2], 6, logprobs=1),
                       pool.submit(greedy, fast, prompts[3], 6)]
            a, b, c = (f.result() for f in futures)
        assert a.status_code == 200, a.text
        assert a.json()["choices"][0]["text"] == post(server, "/v1/completions", sampled).json()["choices"][0]["text"]
        assert b["choices"][0]["text"] == want[2]
        assert c["choices"][0]["text"] == want[3]

        def overlapped_steps():
            text = requests.get(fast.base + "/metrics", timeout=10).text
            return [float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                    if l.startswith("strata_overlapped_steps_total")][0]

        before = overlapped_steps()
        assert before > 0
        drawn = [{"model": fast.model_name, "prompt": p, "max_tokens": 6, "temperature": 0.9, "top_p": 0.95,
                  "seed": 20 + i, "ignore_eos": True} for i, p in enumerate(prompts)]
        with ThreadPoolExecutor(len(drawn)) as pool:
            got = [r.json()["choices"][0]["text"] for r in pool.map(lambda b: post(fast, "/v1/completions", b), drawn)]
        assert got == [post(server, "/v1/completions", b).json()["choices"][0]["text"] for b in drawn]
        assert overlapped_steps() > before
        with_logprobs = post(server, "/v1/completions", {**drawn[0], "logprobs": 1}).json()
        assert with_logprobs["choices"][0]["text"] == got[0]
    finally:
        fast.stop()


def test_step_trace_accounts_for_every_token(log_dir):
    """`--step-trace FILE` writes a CSV line for every engine step: the prompt tokens its
    chunks took and the one-token rows it ran add up to what the requests computed (each
    request's first token comes from its prompt's step, the rest from one row each)."""
    import csv
    import time
    from concurrent.futures import ThreadPoolExecutor

    from conftest import start_server

    trace = log_dir / "steps.csv"
    srv = start_server(log_dir, "--step-trace", str(trace), "--warmup", "off", "--cache-type", "naive",
                       name="trace")
    try:
        prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time there was"]
        with ThreadPoolExecutor(len(prompts)) as pool:
            bodies = list(pool.map(lambda p: greedy(srv, p, 5, ignore_eos=True), prompts))
        want_chunks = sum(b["usage"]["prompt_tokens"] for b in bodies)
        want_rows = sum(b["usage"]["completion_tokens"] - 1 for b in bodies)
        # The engine writes the trace out when it goes idle, just after the last answer.
        deadline = time.monotonic() + 10
        while True:
            with open(trace, newline="") as f:
                rows = list(csv.DictReader(f))
            got = (sum(int(r["chunk_tokens"]) for r in rows), sum(int(r["single_rows"]) for r in rows))
            if got == (want_chunks, want_rows) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert got == (want_chunks, want_rows), rows
        assert list(rows[0]) == ["start_ms", "step_ms", "launch_ms", "single_rows", "chunk_tokens", "overlapped",
                                 "running", "waiting", "drafts"]
        assert all(0 <= float(r["launch_ms"]) <= float(r["step_ms"]) for r in rows)
    finally:
        srv.stop()


def test_serving_with_a_draft_model(log_dir):
    """`--draft`: the tiny Gemma-4 target with its tiny assistant (no tokenizer: prompts as
    token ids). Concurrent greedy requests get their full length and the speculative rounds
    show in /metrics (that the tokens equal plain serving is tested on the engine, since this
    model has no text). A draft directory that is not an assistant is refused at startup,
    naming it."""
    from concurrent.futures import ThreadPoolExecutor

    from conftest import REPO, start_server

    tiny = REPO / "tests" / "fixtures" / "tiny"
    bodies = [{"model": "tiny", "prompt": [5 + r, 9, 300, 17 + r, 2], "max_tokens": 12, "temperature": 0,
               "ignore_eos": True} for r in range(3)]
    srv = start_server(log_dir, "--served-model-name", "tiny", "--draft", str(tiny / "gemma4-tiny-assistant"),
                       "--draft-tokens", "2", "--warmup", "on", name="draft", model=tiny / "gemma4-tiny")

    def counters():
        return {line.split()[0]: float(line.split()[1]) for line in get(srv, "/metrics").text.splitlines()
                if line.startswith("strata_spec_")}

    try:
        # The warm-up's rounds count too: compare before and after.
        before = counters()
        with ThreadPoolExecutor(len(bodies)) as pool:
            got = list(pool.map(lambda b: post(srv, "/v1/completions", b), bodies))
        for r in got:
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            assert (choice["finish_reason"], r.json()["usage"]["completion_tokens"]) == ("length", 12)
        after = counters()
        rounds, drafted, kept = (after[k] - before[k] for k in (
            "strata_spec_rounds_total", "strata_spec_draft_tokens_total", "strata_spec_accepted_tokens_total"))
        assert rounds > 0 and drafted > 0 and kept <= drafted, (before, after)
    finally:
        srv.stop()
    bad = subprocess.run([str(BIN), "serve", "--model", str(tiny / "gemma4-tiny"), "--port", "0",
                          "--draft", str(tiny / "gemma4-tiny")], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0
    assert "draft model" in bad.stderr and "gemma4-tiny" in bad.stderr, bad.stderr


def test_prompt_lookup_keeps_the_greedy_text(server, log_dir):
    """`--prompt-lookup 3`: on a prompt whose answer repeats part of it, drafts from the
    request's own tokens are kept (the counters show it) and the text is the plain server's,
    greedy, streamed or not, and sampled with a seed (text and logprobs)."""
    from conftest import start_server

    prompt = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
              "def mul(a, b):\n    return a * b\n\n\n# The same three functions again, unchanged:\n\n"
              "def add(a, b):\n")
    want = greedy(server, prompt, 48)["choices"][0]["text"]
    srv = start_server(log_dir, "--prompt-lookup", "3", "--draft-tokens", "4", name="lookup")
    try:
        got = greedy(srv, prompt, 48)["choices"][0]["text"]
        assert got == want
        events, done = read_sse(post(srv, "/v1/completions", {"model": srv.model_name, "prompt": prompt,
                                                               "max_tokens": 48, "temperature": 0,
                                                               "stream": True}))
        assert done and "".join(e["choices"][0]["text"] for e in events if e.get("choices")) == want
        counters = {line.split()[0]: float(line.split()[1]) for line in get(srv, "/metrics").text.splitlines()
                    if line.startswith("strata_spec_")}
        assert counters["strata_spec_accepted_tokens_total"] > 0, counters
        assert counters["strata_spec_accepted_tokens_total"] <= counters["strata_spec_draft_tokens_total"]
        # Sampled requests take rounds too: each kept draft is the request's own seeded draw,
        # so text and logprobs equal the plain server's.
        for temperature, logprobs in [(0.3, None), (0.8, 2)]:
            body = {"prompt": prompt, "max_tokens": 40, "temperature": temperature, "seed": 11,
                    "ignore_eos": True, **({"logprobs": logprobs} if logprobs else {})}
            plain = post(server, "/v1/completions", {"model": server.model_name, **body})
            drafted = post(srv, "/v1/completions", {"model": srv.model_name, **body})
            assert plain.status_code == drafted.status_code == 200, drafted.text
            assert drafted.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
            assert drafted.json()["choices"][0]["logprobs"] == plain.json()["choices"][0]["logprobs"]
        after = {line.split()[0]: float(line.split()[1]) for line in get(srv, "/metrics").text.splitlines()
                 if line.startswith("strata_spec_")}
        assert after["strata_spec_rounds_total"] > counters["strata_spec_rounds_total"], (counters, after)
    finally:
        srv.stop()
    both = subprocess.run([str(BIN), "serve", "--model", str(MODEL), "--port", "0", "--prompt-lookup", "3",
                           "--draft", str(MODEL)], capture_output=True, text=True, timeout=60)
    assert both.returncode != 0 and "cannot be combined" in both.stderr, both.stderr


def _serving_bench(server, tmp_path, *args) -> dict:
    """scripts/bench/serving.py against `server` with `args`; its JSON report."""
    from conftest import REPO

    out = tmp_path / "serving.json"
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "bench" / "serving.py"), "--url", server.base,
                          "--model", server.model_name, "--out", str(out), *args],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(out.read_text())


def test_serving_benchmark_with_written_prompts(server, log_dir, tmp_path):
    """The serving benchmark's written prompts (`--prompts`): chat lines go through the chat
    template, every request's tokens are counted from its usage (full lengths with
    ignore_eos), and a server that drafts reports the run's drafted and kept tokens."""
    from conftest import REPO, start_server

    chat = REPO / "scripts" / "bench" / "prompts" / "chat.jsonl"
    report = _serving_bench(server, tmp_path, "--prompts", str(chat), "--requests", "3", "--concurrency", "2",
                            "--output", "8")
    assert (report["requests"], report["output_tokens"]) == (3, 24), report
    assert report["mean_prompt_tokens"] > 10, report
    assert report["speculative"]["drafted"] == 0, report
    lines = tmp_path / "lookup.jsonl"
    prompt = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
              "# The same two functions again, unchanged:\n\ndef add(a, b):\n")
    lines.write_text(json.dumps({"prompt": prompt}) + "\n")
    srv = start_server(log_dir, "--prompt-lookup", "3", name="lookup-bench")
    try:
        report = _serving_bench(srv, tmp_path, "--prompts", str(lines), "--requests", "2", "--output", "24")
    finally:
        srv.stop()
    assert report["output_tokens"] == 48, report
    spec = report["speculative"]
    assert spec["rounds"] > 0 and 0 < spec["kept"] <= spec["drafted"], report
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no such field"}\n')
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "bench" / "serving.py"), "--url", server.base,
                          "--model", server.model_name, "--prompts", str(bad)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode != 0 and "bad.jsonl:1" in run.stderr, run.stderr
