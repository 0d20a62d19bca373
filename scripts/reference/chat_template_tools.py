#!/usr/bin/env python3
"""Reference renderings of conversations with tools and tool turns, made with transformers'
own chat-template renderer (what `apply_chat_template(..., tools=...)` runs), for the
templates under tests/fixtures/templates/. Writes tests/fixtures/templates/tools-reference.json,
which strata-tokenizer's tests render again and compare byte for byte.

    pip install transformers   # no torch needed
    python3 scripts/reference/chat_template_tools.py
"""

from __future__ import annotations

import json
from pathlib import Path

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "tests" / "fixtures" / "templates"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add",
        "description": "Adds two numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number", "description": "first"},
            "b": {"type": "number", "description": "second"}},
            "required": ["a", "b"]}}},
]

# As a server receives them: null content on a call turn becomes "" (as vLLM renders it),
# the arguments JSON text becomes an object.
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
CONVERSATIONS = {
    "tools_first_turn": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
    ],
    "tool_turns": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear <sunny>\"}"},
    ],
}
# Which conversations each template can render (Llama-3 takes one call per turn, and needs
# a first user message for its tools).
FAMILIES = ["qwen3", "llama3", "gemma4", "hermes"]
BOS = {"qwen3": "", "llama3": "<|begin_of_text|>", "gemma4": "<bos>", "hermes": "<|begin_of_text|>"}
EOS = {"qwen3": "<|im_end|>", "llama3": "<|eot_id|>", "gemma4": "<eos>", "hermes": "<|im_end|>"}
# Hermes' tool-use template is for requests with tools only (it iterates `tools`).
WITHOUT_TOOLS = {"qwen3", "llama3", "gemma4"}


def main() -> None:
    cases = []
    for family in FAMILIES:
        template = (TEMPLATES / f"{family}.jinja").read_text()
        for name, messages in CONVERSATIONS.items():
            for tools in (TOOLS, None) if family in WITHOUT_TOOLS else (TOOLS,):
                text = render_jinja_template(
                    [messages], tools=tools, chat_template=template, add_generation_prompt=True,
                    bos_token=BOS[family], eos_token=EOS[family],
                )[0][0]
                cases.append({"template": f"{family}.jinja", "conversation": name,
                              "tools": tools is not None, "bos_token": BOS[family],
                              "eos_token": EOS[family], "text": text})
    out = {"transformers": transformers.__version__, "tools": TOOLS,
           "conversations": CONVERSATIONS, "cases": cases}
    (TEMPLATES / "tools-reference.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(cases)} renderings")


if __name__ == "__main__":
    main()
