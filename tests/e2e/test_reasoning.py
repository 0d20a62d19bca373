"""`--reasoning-parser qwen3` on SmolLM2: a chat answer's `<think>...</think>` part comes back
as `reasoning_content`, whole or streamed (`delta.reasoning_content`), and tool calls are read
from the content after it. The answers are forced with `guided_choice`, so each case knows its
exact text; a server without the flag returns the same text as content."""

from __future__ import annotations

import json

import pytest

from helpers import post, read_sse

ASK = [{"role": "user", "content": "What is 2 + 40?"}]
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"]}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Adds.", "parameters": ADD}}]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 40}}\n</tool_call>'


@pytest.fixture(scope="module")
def thinking(log_dir):
    from conftest import SMOL, start_server

    if not SMOL.is_file():
        pytest.skip(f"{SMOL} is absent")
    s = start_server(log_dir, "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", name="reasoning",
                     model=SMOL)
    yield s
    s.stop()


def ask(server, output: str, stream: bool, **extra):
    body = {"messages": ASK, "max_tokens": 80, "stream": stream, "guided_choice": [output], **extra}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()["choices"][0]
    chunks, done = read_sse(r)
    assert done
    got = {"reasoning_content": "", "content": "", "tool_calls": {}, "finish_reason": None}
    for c in chunks:
        for ch in c["choices"]:
            d = ch["delta"]
            got["reasoning_content"] += d.get("reasoning_content") or ""
            got["content"] += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                t = got["tool_calls"].setdefault(tc["index"], {"name": "", "arguments": ""})
                t["name"] += tc["function"].get("name") or ""
                t["arguments"] += tc["function"].get("arguments") or ""
            got["finish_reason"] = ch["finish_reason"] or got["finish_reason"]
    return got


@pytest.mark.parametrize("output,reasoning,content", [
    ("<think>\nadd 2 and 40\n</think>\n\n42", "\nadd 2 and 40\n", "\n\n42"),
    ("42, no thinking", None, "42, no thinking"),
    ("<think>it is 42, cut off", "it is 42, cut off", ""),
])
def test_thinking_is_split_whole_and_streamed(thinking, output, reasoning, content):
    whole = ask(thinking, output, False)
    assert whole["message"]["reasoning_content"] == reasoning
    assert whole["message"]["content"] == content
    streamed = ask(thinking, output, True)
    assert streamed["reasoning_content"] == (reasoning or "")
    assert streamed["content"] == content


def test_calls_are_read_after_the_thinking(thinking):
    output = "<think>call add</think>" + CALL
    whole = ask(thinking, output, False, tools=TOOLS, tool_choice="auto")
    m = whole["message"]
    assert m["reasoning_content"] == "call add"
    assert m["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m["tool_calls"]] == [
        ("add", {"a": 2, "b": 40})]
    assert whole["finish_reason"] == "tool_calls"
    streamed = ask(thinking, output, True, tools=TOOLS, tool_choice="auto")
    assert streamed["reasoning_content"] == "call add"
    assert streamed["content"] == ""
    assert [(t["name"], json.loads(t["arguments"])) for t in streamed["tool_calls"].values()] == [
        ("add", {"a": 2, "b": 40})]
    assert streamed["finish_reason"] == "tool_calls"


def test_without_the_flag_thinking_stays_content(smol):
    output = "<think>x</think>42"
    whole = ask(smol, output, False)
    assert whole["message"]["content"] == output
    assert "reasoning_content" not in whole["message"]


def test_the_flag_names_a_known_format(log_dir):
    from conftest import SMOL, start_server

    if not SMOL.is_file():
        pytest.skip(f"{SMOL} is absent")
    with pytest.raises(Exception, match="reasoning-parser"):
        start_server(log_dir, "--reasoning-parser", "nope", name="bad-reasoning", model=SMOL).stop()
