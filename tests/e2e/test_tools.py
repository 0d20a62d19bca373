"""Tool calling through the `openai` client on SmolLM2 (Hermes `<tool_call>` format, the
tools described by Strata since the model's template cannot show them): `tool_choice`
required and named give calls whose arguments parse and validate with `jsonschema`; a
stream reassembles to the same calls; tool turns are accepted; bad tools are refused."""

from __future__ import annotations

import json

import jsonschema
import pytest

from helpers import assert_api_error, post

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {
    "a": {"type": "integer", "minimum": -100, "maximum": 100},
    "b": {"type": "integer", "minimum": -100, "maximum": 100}},
    "required": ["a", "b"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Adds two integers.", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def smol_client(smol):
    from openai import OpenAI

    return OpenAI(base_url=smol.v1, api_key="unused", max_retries=0, timeout=120)


def check_calls(calls, names):
    assert calls, "no tool call"
    for c in calls:
        assert c.type == "function" and c.id
        assert c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_required_and_named_calls_validate(smol, smol_client, temperature):
    kw = dict(model=smol.model_name, messages=ASK, tools=TOOLS, max_tokens=80, temperature=temperature, seed=7)
    r = smol_client.chat.completions.create(tool_choice="required", parallel_tool_calls=False, **kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert ch.message.content is None
    check_calls(ch.message.tool_calls, {"get_weather", "add"})
    assert len(ch.message.tool_calls) == 1
    r = smol_client.chat.completions.create(tool_choice={"type": "function", "function": {"name": "add"}}, **kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    check_calls(ch.message.tool_calls, {"add"})


def test_streamed_calls_equal_the_whole_answer(smol, smol_client):
    kw = dict(model=smol.model_name, messages=ASK, tools=TOOLS, max_tokens=80, temperature=0,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = smol_client.chat.completions.create(**kw).choices[0]
    calls: dict[int, dict] = {}
    content, finish = "", None
    for chunk in smol_client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        finish = chunk.choices[0].finish_reason or finish
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            if tc.id:
                # The first chunk of a call names it; later ones carry only arguments.
                assert c["id"] is None and tc.type == "function"
                c["id"] = tc.id
            c["name"] += (tc.function.name or "") if tc.function else ""
            c["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert finish == whole.finish_reason == "tool_calls"
    assert content == ""
    got = [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]
    assert got == [(t.function.name, t.function.arguments) for t in whole.message.tool_calls]
    check_calls(whole.message.tool_calls, {"get_weather"})


def test_tool_turns_are_accepted(smol, smol_client):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_9", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "{\"temp\": 21}"},
    ]
    r = smol_client.chat.completions.create(model=smol.model_name, messages=history, tools=TOOLS,
                                            tool_choice="none", max_tokens=8, temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason in ("stop", "length") and ch.message.tool_calls is None
    # The call and its answer are in the prompt: it is longer than without them.
    short = smol_client.chat.completions.create(model=smol.model_name, messages=ASK, tools=TOOLS,
                                                tool_choice="none", max_tokens=1)
    assert r.usage.prompt_tokens > short.usage.prompt_tokens + 20


@pytest.mark.parametrize("extra,field", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 12}}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_tools_are_refused_naming_the_field(smol, extra, field):
    r = post(smol, "/v1/chat/completions", {"messages": ASK, "max_tokens": 4, **extra})
    assert_api_error(r, 400)
    assert r.json()["error"]["param"] == field, r.json()


def test_bad_tool_turns_and_templates_without_tools(smol, server):
    no_id = ASK + [{"role": "tool", "content": "x"}]
    r = post(smol, "/v1/chat/completions", {"messages": no_id, "max_tokens": 4})
    assert_api_error(r, 400)
    assert r.json()["error"]["param"] == "messages"
    bad_args = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]
    r = post(smol, "/v1/chat/completions", {"messages": bad_args, "max_tokens": 4})
    assert_api_error(r, 400)
    assert r.json()["error"]["param"] == "messages"
    # Gemma's built-in turn format cannot show tools and that server names no format.
    r = post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 4, "tools": TOOLS})
    assert_api_error(r, 400)
    assert r.json()["error"]["param"] == "tools" and "--tool-call-parser" in r.json()["error"]["message"]
