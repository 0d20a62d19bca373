"""Logit controls (presence, frequency and repetition penalties, logit_bias, min_tokens) and
stop_token_ids, through the `openai` client and raw HTTP, checked against a Python reference of
each rule applied to the model's unpenalised logits (`strata score`, teacher-forced over the
server's own output)."""

from __future__ import annotations

import json
import math
import subprocess

import numpy as np
import pytest

from conftest import BIN, MODEL
from helpers import assert_api_error, post

# A prompt whose greedy continuation repeats itself, so that penalties change it.
REPEATING = "one two three one two three one two three one two"
CHAT = [{"role": "user", "content": "Say hi."}]


def tokenize(server, text: str, special: bool = True) -> list[int]:
    r = post(server, "/tokenize", {"prompt": text, "add_special_tokens": special})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def completion(server, **body) -> dict:
    r = post(server, "/v1/completions", {"temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def score(tmp_path, ids: list[int], decode_tail: int) -> np.ndarray:
    """`strata score`'s logits of `ids`, one row a position; the last `decode_tail` positions
    computed one decode step at a time, as the server computes generated tokens."""
    src, out = tmp_path / "ids.json", tmp_path / "logits.f32"
    src.write_text(json.dumps(ids))
    run = subprocess.run([str(BIN), "score", "--model", str(MODEL), "--ids", str(src), "--out",
                          str(out), "--decode-tail", str(decode_tail)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    vocab = json.loads(run.stdout.strip().splitlines()[-1])["vocab"]
    return np.fromfile(out, dtype="<f4").reshape(len(ids), vocab)


def penalised(logits: np.ndarray, prompt: list[int], completion: list[int], presence: float,
              frequency: float, repetition: float) -> np.ndarray:
    """The reference rule: transformers' repetition penalty over prompt and completion tokens,
    then OpenAI's `logit - count * frequency - (count > 0) * presence` over the completion."""
    x = logits.astype(np.float64).copy()
    seen = sorted(set(prompt) | set(completion))
    x[seen] = np.where(x[seen] > 0, x[seen] / repetition, x[seen] * repetition)
    counts = np.bincount(np.array(completion, dtype=np.int64), minlength=len(x))[:len(x)]
    return x - frequency * counts - presence * (counts > 0)


@pytest.mark.parametrize("penalties", [
    {"frequency_penalty": 1.5, "presence_penalty": 0.5},
    {"repetition_penalty": 1.8},
])
def test_greedy_penalties_follow_the_reference_rule(server, tmp_path, penalties):
    """Greedy decoding under penalties: at every step the server's token is the argmax of the
    reference rule applied to the unpenalised logits of the prefix, and the penalties change
    the answer (the unpenalised argmax differs somewhere)."""
    n = 6
    out = completion(server, prompt=REPEATING, max_tokens=n, **penalties)
    text = out["choices"][0]["text"]
    assert out["usage"]["completion_tokens"] == n
    prompt = tokenize(server, REPEATING)
    gen = tokenize(server, text, special=False)
    assert len(gen) == n, f"{text!r} re-tokenizes to {len(gen)} ids"
    logits = score(tmp_path, prompt + gen[:-1], decode_tail=n - 1)
    presence = penalties.get("presence_penalty", 0.0)
    frequency = penalties.get("frequency_penalty", 0.0)
    repetition = penalties.get("repetition_penalty", 1.0)
    changed, checked = False, 0
    for i in range(n):
        row = logits[len(prompt) - 1 + i]
        ref = penalised(row, prompt, gen[:i], presence, frequency, repetition)
        best = np.sort(ref)[-2:]
        if best[1] - best[0] < 1e-3:
            break  # a near tie: the rest depends on rounding, not on the rule
        assert int(np.argmax(ref)) == gen[i], f"step {i}: {text!r}"
        changed |= int(np.argmax(row)) != gen[i]
        checked += 1
    assert checked >= n // 2, f"only {checked} steps had a clear reference choice"
    assert changed, f"the penalties changed nothing in {text!r}"


def test_logit_bias_forces_and_bans_tokens(server, client):
    forced = tokenize(server, " banana", special=False)[0]
    out = completion(server, prompt="The sky is", max_tokens=3, logit_bias={str(forced): 100})
    assert out["choices"][0]["text"] == post(server, "/detokenize",
                                             {"tokens": [forced] * 3}).json()["prompt"]
    # -100 on the greedy token: the next best, and its logprob is the raw one (vLLM's default).
    plain = completion(server, prompt="The sky is", max_tokens=1, logprobs=2)
    top = plain["choices"][0]["logprobs"]["top_logprobs"][0]
    (first, _), (second, second_lp) = list(top.items())[:2]
    greedy = tokenize(server, first, special=False)
    assert len(greedy) == 1
    banned = client.completions.create(model=server.model_name, prompt="The sky is", max_tokens=1,
                                       temperature=0, logprobs=2,
                                       logit_bias={str(greedy[0]): -100})
    lp = banned.choices[0].logprobs
    assert banned.choices[0].text == second
    assert math.isclose(lp.token_logprobs[0], second_lp, abs_tol=1e-4)
    # The same through chat, streamed: +100 forces the token there too.
    stream = client.chat.completions.create(model=server.model_name, messages=CHAT, max_tokens=2,
                                            temperature=0, stream=True,
                                            logit_bias={str(forced): 100})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == post(server, "/detokenize", {"tokens": [forced] * 2}).json()["prompt"]


def test_min_tokens_holds_back_the_end_of_sequence(server, client):
    """A bias of 100 on the end-of-sequence id ends the answer at once; with min_tokens 3 the
    id is masked for three tokens (the unbiased greedy ones), then drawn."""
    eos = tokenize(server, "<eos>", special=False)
    assert len(eos) == 1
    bias = {str(eos[0]): 100}
    at_once = completion(server, prompt="The sky is", max_tokens=8, logit_bias=bias)
    assert at_once["choices"][0]["finish_reason"] == "stop"
    assert at_once["usage"]["completion_tokens"] == 1
    plain = tokenize(server, completion(server, prompt="The sky is", max_tokens=3)["choices"][0]["text"],
                     special=False)
    stream = client.completions.create(model=server.model_name, prompt="The sky is", max_tokens=8,
                                       temperature=0, stream=True, logit_bias=bias,
                                       stream_options={"include_usage": True},
                                       extra_body={"min_tokens": 3})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 4
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == post(server, "/detokenize", {"tokens": plain}).json()["prompt"]


def test_stop_token_ids_end_with_stop(server, client):
    plain = completion(server, prompt="The capital of France is", max_tokens=6)
    gen = tokenize(server, plain["choices"][0]["text"], special=False)
    assert len(gen) == 6
    k = next(i for i in range(2, 6) if gen[i] not in gen[:i])
    stream = client.completions.create(model=server.model_name, prompt="The capital of France is",
                                       max_tokens=6, temperature=0, stream=True,
                                       extra_body={"stop_token_ids": [gen[k]]})
    chunks = [c for c in stream if c.choices]
    assert chunks[-1].choices[0].finish_reason == "stop"
    text = "".join(c.choices[0].text for c in chunks)
    assert text == post(server, "/detokenize", {"tokens": gen[:k + 1]}).json()["prompt"]


@pytest.mark.parametrize("field,value", [
    ("presence_penalty", 2.5), ("frequency_penalty", -2.1), ("repetition_penalty", 0),
    ("logit_bias", {"999999999": 1}), ("logit_bias", {"5": 101}),
    ("logit_bias", {str(i): 1 for i in range(1025)}), ("stop_token_ids", list(range(65))),
    ("min_tokens", 5),
])
def test_out_of_range_controls_are_refused_by_name(server, field, value):
    for path, body in [("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions",
                                                                 {"messages": CHAT})]:
        err = assert_api_error(post(server, path, {**body, "max_tokens": 4, field: value}), 400)
        assert err["param"] == field, err
