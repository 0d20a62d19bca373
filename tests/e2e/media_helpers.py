"""Shared by the served image and audio tests: a tiny multimodal Gemma-4 checkpoint made servable
(a byte-level tokenizer carrying its media markers, Gemma's BOS, its processor settings), greedy
requests through the openai client, and the refusal check."""

from __future__ import annotations

import sys
from pathlib import Path

import openai

from helpers import post

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "bench"))
import byte_tokenizer  # noqa: E402

MEDIA = REPO / "tests" / "fixtures" / "media"
TEMPLATE = REPO / "tests" / "fixtures" / "templates" / "gemma4.jinja"


def servable_copy(tmp_path_factory, fixture: Path, markers: dict[int, str], processor: dict) -> Path:
    """`fixture`'s config and weights with a tokenizer carrying `markers` (ids within the
    512-id vocabulary) and `processor` as its `processor_config.json`."""
    return byte_tokenizer.servable_dir(fixture, tmp_path_factory.mktemp(fixture.name), markers, processor)


def openai_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.v1, api_key=server.api_key or "none", max_retries=0)


def ask(server, messages, **kw):
    """Eight greedy tokens with their logprobs."""
    return openai_client(server).chat.completions.create(
        model=server.model_name, messages=messages, max_tokens=8, temperature=0, logprobs=True, **kw)


def assert_refused(server, messages, param: str, words: str):
    """A 400 whose `param` names the part and whose message holds `words`."""
    r = post(server, "/v1/chat/completions", {"model": server.model_name, "messages": messages, "max_tokens": 4})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert words in err["message"], err
