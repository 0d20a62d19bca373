"""The OpenAI surface around generation: fields clients send by default are accepted, fields
that would change the output and that Strata cannot honour are refused naming them, the
tokenize endpoints, and a model looked up by id."""

from __future__ import annotations

import math

import openai
import pytest
import requests

from helpers import assert_api_error, get, post

CHAT = [{"role": "user", "content": "Say hi."}]

# Neutral values a client may send: each leaves the output as it is, so the answer must equal
# the plain request's.
NEUTRAL = {
    "store": False, "metadata": {"k": "v"}, "service_tier": "auto", "user": "u1",
    "parallel_tool_calls": True, "logit_bias": {}, "response_format": {"type": "text"},
    "repetition_penalty": 1.0, "min_tokens": 0, "stop_token_ids": [],
    "stream": None, "ignore_eos": None, "stream_options": None, "seed": None, "stop": None,
    "presence_penalty": 0, "frequency_penalty": None,
}
NEUTRAL_CHAT = {**NEUTRAL, "tools": None, "tool_choice": "none", "functions": [],
                "function_call": None, "modalities": ["text"], "logprobs": None,
                "top_logprobs": None}
NEUTRAL_COMPLETION = {**NEUTRAL, "best_of": 1, "echo": False, "suffix": None, "logprobs": None}

# Each would change the output; Strata cannot honour it yet (tools: test_tools.py).
REFUSED = {}
REFUSED_CHAT = {**REFUSED, "modalities": ["text", "audio"], "reasoning_effort": "high"}
REFUSED_COMPLETION = {**REFUSED, "suffix": "end"}


def test_neutral_fields_are_accepted_and_change_nothing(server):
    base = {"messages": CHAT, "max_tokens": 6, "temperature": 0}
    plain = post(server, "/v1/chat/completions", base).json()["choices"][0]["message"]["content"]
    r = post(server, "/v1/chat/completions", {**base, **NEUTRAL_CHAT})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == plain
    base = {"prompt": "The sky is", "max_tokens": 6, "temperature": 0}
    plain = post(server, "/v1/completions", base).json()["choices"][0]["text"]
    r = post(server, "/v1/completions", {**base, **NEUTRAL_COMPLETION})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == plain


@pytest.mark.parametrize("field", sorted(REFUSED_CHAT))
def test_chat_fields_that_change_output_are_refused_by_name(server, field):
    body = {"messages": CHAT, "max_tokens": 4, field: REFUSED_CHAT[field]}
    err = assert_api_error(post(server, "/v1/chat/completions", body), 400)
    assert err["param"] == field, err


@pytest.mark.parametrize("field", sorted(REFUSED_COMPLETION))
def test_completion_fields_that_change_output_are_refused_by_name(server, field):
    body = {"prompt": "hi", "max_tokens": 4, field: REFUSED_COMPLETION[field]}
    err = assert_api_error(post(server, "/v1/completions", body), 400)
    assert err["param"] == field, err


def test_the_openai_client_with_its_default_extras(client):
    """The official client, with the fields applications commonly pass through it."""
    r = client.chat.completions.create(model=client_model(client), messages=CHAT, max_tokens=4,
                                       temperature=0, store=False, metadata={"a": "b"},
                                       parallel_tool_calls=None, tools=openai.NOT_GIVEN,
                                       logit_bias=None, user="someone")
    assert r.choices[0].message.content is not None


def client_model(client) -> str:
    return client.models.list().data[0].id


def test_completion_top_logprobs_are_most_likely_first(server):
    r = post(server, "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 3,
                                         "temperature": 0, "logprobs": 5})
    assert r.status_code == 200, r.text
    for top in r.json()["choices"][0]["logprobs"]["top_logprobs"]:
        values = list(top.values())
        assert values == sorted(values, reverse=True), top
        assert all(math.isfinite(v) and v <= 0 for v in values)


def test_tokenize_and_detokenize(server):
    text = "The capital of France is Paris."
    r = post(server, "/tokenize", {"prompt": text})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] > 0
    # The same ids the completions endpoint computes for this prompt.
    usage = post(server, "/v1/completions", {"prompt": text, "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == body["count"]
    plain = post(server, "/tokenize", {"prompt": text, "add_special_tokens": False,
                                       "return_token_strs": True}).json()
    assert plain["count"] in (body["count"], body["count"] - 1)
    assert "".join(plain["token_strs"]) == text
    back = post(server, "/detokenize", {"tokens": plain["tokens"]}).json()
    assert back == {"prompt": text}
    # A chat conversation, rendered with the model's template.
    chat = post(server, "/tokenize", {"messages": CHAT}).json()
    usage = post(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1}).json()["usage"]
    assert chat["count"] == usage["prompt_tokens"]
    # Bad input names the field.
    assert assert_api_error(post(server, "/detokenize", {"tokens": [10**9]}), 400)["param"] == "tokens"
    assert_api_error(post(server, "/tokenize", {"prompt": "x", "messages": CHAT}), 400)
    assert_api_error(post(server, "/tokenize", {}), 400)


def test_a_model_by_id(server, client):
    name = client_model(client)
    r = get(server, f"/v1/models/{name}")
    assert r.status_code == 200, r.text
    assert r.json()["id"] == name and r.json()["object"] == "model"
    assert client.models.retrieve(name).id == name
    assert_api_error(get(server, "/v1/models/not-this-one"), 404)


def test_several_prompts_come_back_in_order(server, client):
    """A list of prompts (texts or token-id lists, as evaluation harnesses send them): one
    choice each, in prompt order, each what the prompt alone gives."""
    prompts = ["The capital of France is", "One, two, three,", "Water is made of"]
    alone = [post(server, "/v1/completions", {"prompt": p, "max_tokens": 5, "temperature": 0})
             .json() for p in prompts]
    r = client.completions.create(model=client_model(client), prompt=prompts, max_tokens=5,
                                  temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [a["choices"][0]["text"] for a in alone]
    assert r.usage.prompt_tokens == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert r.usage.completion_tokens == sum(a["usage"]["completion_tokens"] for a in alone)
    ids = [post(server, "/tokenize", {"prompt": p}).json()["tokens"] for p in prompts]
    r = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200, r.text
    assert [c["text"] for c in r.json()["choices"]] == [a["choices"][0]["text"] for a in alone]
