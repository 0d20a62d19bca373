"""Forced tool calls in Gemma-4's format, served: the tiny random Gemma-4 fixture with a
byte-level tokenizer that carries Gemma-4's control tokens (`<|tool_call>`, `<tool_call|>`,
`<|"|>`, ...) and Gemma-4's own chat template. The weights are random, so whatever the answer
says comes from the grammar alone: with `tool_choice` required or named, every call must
parse and its arguments validate with `jsonschema`, greedy and sampled, streamed or not."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import jsonschema
import pytest

from helpers import post, read_sse

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))
import byte_tokenizer  # noqa: E402  (Gemma's layout: <pad>, <eos>, <bos>, bytes, controls)

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "tiny" / "gemma4-tiny"
TEMPLATE = REPO / "tests" / "fixtures" / "templates" / "gemma4.jinja"
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "minLength": 1, "maxLength": 16},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "hourly": {"type": "boolean"}},
    "required": ["city", "unit", "days"], "additionalProperties": False}
# Integers, not decimals: random weights would write a number's digits until max_tokens.
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 9},
                                        "note": {"type": ["string", "null"], "maxLength": 8}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Adds.", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def gemma(log_dir, tmp_path_factory):
    from conftest import start_server

    model = tmp_path_factory.mktemp("gemma4-tiny-tokens")
    for f in ("generation_config.json", "model.safetensors"):
        shutil.copy(TINY / f, model / f)
    # Room for the tools the template writes into the prompt (one token a byte here).
    config = json.loads((TINY / "config.json").read_text())
    for c in (config, config.get("text_config", {})):
        if "max_position_embeddings" in c:
            c["max_position_embeddings"] = 4096
    (model / "config.json").write_text(json.dumps(config))
    (model / "tokenizer.json").write_text(json.dumps(byte_tokenizer.tokenizer_json()))
    s = start_server(log_dir, "--chat-template", str(TEMPLATE), name="gemma4-tools", model=model)
    yield s
    s.stop()


def calls_of(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 5}, {"temperature": 1.0, "seed": 6}])
def test_forced_gemma4_calls_parse_and_validate(gemma, choice, sampling):
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": choice, "max_tokens": 600,
            "parallel_tool_calls": False, **sampling}
    r = post(gemma, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    out = r.json()["choices"][0]
    assert out["finish_reason"] == "tool_calls", out
    calls = calls_of(out["message"])
    assert len(calls) == 1, out
    for name, args in calls:
        if choice != "required":
            assert name == "add"
        jsonschema.validate(args, SCHEMAS[name])
    # Streamed, the same calls.
    r = post(gemma, "/v1/chat/completions", {**body, "stream": True})
    chunks, done = read_sse(r)
    assert done
    streamed: dict[int, dict] = {}
    for c in chunks:
        for ch in c["choices"]:
            for tc in ch["delta"].get("tool_calls") or []:
                t = streamed.setdefault(tc["index"], {"name": "", "arguments": ""})
                t["name"] += tc["function"].get("name") or ""
                t["arguments"] += tc["function"].get("arguments") or ""
    assert [(t["name"], json.loads(t["arguments"])) for t in streamed.values()] == calls


def test_parallel_forced_calls(gemma):
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "max_tokens": 2000,
            "temperature": 1.0, "seed": 11}
    out = post(gemma, "/v1/chat/completions", body).json()["choices"][0]
    assert out["finish_reason"] == "tool_calls", out
    calls = calls_of(out["message"])
    assert 1 <= len(calls) <= 8, out
    for name, args in calls:
        jsonschema.validate(args, SCHEMAS[name])


def test_a_schema_the_format_cannot_force_is_refused(gemma):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "integer"}}}}}]
    r = post(gemma, "/v1/chat/completions", {"messages": ASK, "tools": tools, "tool_choice": "required",
                                             "max_tokens": 10})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tool_choice"
