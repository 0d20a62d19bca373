"""Tool calling through the `openai` client on SmolLM2 (Hermes `<tool_call>` format, the
tools described by Strata since the model's template cannot show them): `tool_choice`
required and named give calls whose arguments parse and validate with `jsonschema`; a
stream reassembles to the same calls; tool turns are accepted; bad tools are refused."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import requests

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


def test_required_and_named_calls_validate(smol, smol_client):
    """`required` greedy, a named function sampled."""
    kw = dict(model=smol.model_name, messages=ASK, tools=TOOLS, max_tokens=80, seed=7)
    r = smol_client.chat.completions.create(tool_choice="required", parallel_tool_calls=False, temperature=0, **kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert ch.message.content is None
    check_calls(ch.message.tool_calls, {"get_weather", "add"})
    assert len(ch.message.tool_calls) == 1
    r = smol_client.chat.completions.create(tool_choice={"type": "function", "function": {"name": "add"}},
                                            temperature=1.0, **kw)
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


# An output fixed with guided_choice (the 135M model does not call tools on its own): what
# `auto` reads from it is known beforehand.
SAID = "Let me add.\n"
CALLED = {"name": "add", "arguments": {"a": 2, "b": 40}}
FIXED = SAID + "<tool_call>\n" + json.dumps(CALLED) + "\n</tool_call>"


@pytest.mark.parametrize("output,content,calls", [
    (FIXED, SAID, [CALLED]),
    ("2 <tool 3", "2 <tool 3", []),  # held back as a possible call, then sent as text
])
def test_auto_reads_calls_streamed_or_not(smol, smol_client, output, content, calls):
    kw = dict(model=smol.model_name, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=60,
              extra_body={"guided_choice": [output]})
    whole = smol_client.chat.completions.create(**kw).choices[0]
    assert whole.message.content == content
    got = [{"name": t.function.name, "arguments": json.loads(t.function.arguments)}
           for t in whole.message.tool_calls or []]
    assert got == calls
    assert whole.finish_reason == ("tool_calls" if calls else "stop")
    text, streamed = "", {}
    for chunk in smol_client.chat.completions.create(stream=True, **kw):
        d = chunk.choices[0].delta if chunk.choices else None
        if d is None:
            continue
        assert "<tool_call>" not in (d.content or "")
        text += d.content or ""
        for tc in d.tool_calls or []:
            c = streamed.setdefault(tc.index, {"name": "", "arguments": ""})
            c["name"] += tc.function.name or ""
            c["arguments"] += tc.function.arguments or ""
    assert text == content
    assert [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in streamed.values()] == calls


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


TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"


@pytest.fixture(scope="module")
def qwen_template_server(log_dir):
    """SmolLM2 (whose tokens include Qwen's `<|im_start|>` turn markers) with the Qwen3
    template by --chat-template: tools rendered by the template, the format told from it."""
    from conftest import SMOL, start_server

    if not SMOL.is_file():
        pytest.skip(f"{SMOL} is absent")
    s = start_server(log_dir, "--chat-template", str(TEMPLATES / "qwen3.jinja"), name="qwen-template", model=SMOL)
    yield s
    s.stop()


def as_sent(messages):
    """The reference conversation as an OpenAI client sends it: a call turn's content null,
    its arguments as JSON text."""
    out = []
    for m in messages:
        m = dict(m)
        if "tool_calls" in m:
            m["content"] = None
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def test_template_renders_tools_as_transformers_does(qwen_template_server):
    """Through HTTP: the prompt Strata renders (tools and tool turns) tokenizes to the ids of
    transformers' rendering of the same conversation (tests/fixtures/templates)."""
    s = qwen_template_server
    ref = json.loads((TEMPLATES / "tools-reference.json").read_text())
    cases = [c for c in ref["cases"] if c["template"] == "qwen3.jinja"]
    assert len(cases) == 4
    for c in cases:
        body = {"messages": as_sent(ref["conversations"][c["conversation"]])}
        if c["tools"]:
            body["tools"] = ref["tools"]
        got = post(s, "/tokenize", body).json()
        want = post(s, "/tokenize", {"prompt": c["text"], "add_special_tokens": False}).json()
        assert got["tokens"] == want["tokens"], (c["conversation"], c["tools"])
    info = requests.get(s.base + "/tokenizer_info", timeout=10).json()
    assert info["chat_template"] == (TEMPLATES / "qwen3.jinja").read_text()


def test_chat_template_kwargs(qwen_template_server):
    s = qwen_template_server
    plain = post(s, "/tokenize", {"messages": ASK, "return_token_strs": True}).json()
    off = post(s, "/tokenize", {"messages": ASK, "return_token_strs": True,
                                "chat_template_kwargs": {"enable_thinking": False}}).json()
    # Qwen3's switch closes an empty thinking block after the assistant's turn opener.
    assert off["tokens"][:plain["count"]] == plain["tokens"]
    assert "".join(off["token_strs"][plain["count"]:]) == "<think>\n\n</think>\n\n"
    r = post(s, "/v1/chat/completions", {"messages": ASK, "max_tokens": 1,
                                         "chat_template_kwargs": {"enable_thinking": False}})
    assert r.json()["usage"]["prompt_tokens"] == off["count"]
    for bad in ({"messages": []}, {f"k{i}": i for i in range(33)}, {"x": "y" * 20000}):
        r = post(s, "/v1/chat/completions", {"messages": ASK, "max_tokens": 1, "chat_template_kwargs": bad})
        assert_api_error(r, 400)
        assert r.json()["error"]["param"] == "chat_template_kwargs"


def test_control_token_text_in_calls_and_tools_stays_text(qwen_template_server):
    """`<|im_end|>` written in a call's arguments, a tool answer or a tool's description is
    text: the prompt holds as many control tokens `<|im_end|>` as the template writes."""
    s = qwen_template_server
    im_end = post(s, "/tokenize", {"prompt": "<|im_end|>", "add_special_tokens": False}).json()["tokens"]
    assert len(im_end) == 1

    def count(text):
        tools = [{"type": "function", "function": {"name": "f", "description": "d" + text, "parameters": {}}}]
        msgs = ASK + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": json.dumps({"x": text})}}]},
            {"role": "tool", "tool_call_id": "c", "content": "r" + text}]
        return post(s, "/tokenize", {"messages": msgs, "tools": tools}).json()["tokens"].count(im_end[0])

    assert count("<|im_end|>") == count("plain") > 0
