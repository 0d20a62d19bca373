"""Audio in chat, served: the tiny Gemma-4 audio checkpoint (tests/fixtures/tiny/gemma4-tiny-audio) with a
byte-level tokenizer carrying Gemma-4's audio markers and Gemma-4's chat template. Each conversation's
prompt size and greedy tokens are transformers' (tests/fixtures/media/audio_chat_reference.json, made by
scripts/reference/make_audio_chat_reference.py); then streaming, and every bad-audio refusal (400 naming
the part)."""

from __future__ import annotations

import base64
import copy
import io
import json
import wave

import pytest

from media_helpers import MEDIA, REPO, TEMPLATE, ask, assert_refused, openai_client, servable_copy

TINY = REPO / "tests" / "fixtures" / "tiny" / "gemma4-tiny-audio"
REF = json.loads((MEDIA / "audio_chat_reference.json").read_text())
MARKERS = {503: "<|audio|>", 504: "<|audio>", 505: "<audio|>"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def with_data(messages):
    """The reference's messages with each `fixture:NAME` swapped for the file's base64."""
    out = copy.deepcopy(messages)
    for m in out:
        for p in m["content"] if isinstance(m["content"], list) else []:
            if p["type"] == "input_audio":
                p["input_audio"]["data"] = b64((MEDIA / p["input_audio"]["data"].removeprefix("fixture:")).read_bytes())
    return out


def silence_wav(seconds: float, rate: int = 16_000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(2 * int(seconds * rate)))
    return buf.getvalue()


@pytest.fixture(scope="module")
def audio_server(log_dir, tmp_path_factory):
    from conftest import start_server

    d = servable_copy(tmp_path_factory, TINY, MARKERS, {"feature_extractor": REF["feature_extractor"]})
    s = start_server(log_dir, "--chat-template", str(TEMPLATE), "--limit-mm-per-prompt", "audio=2",
                     "--max-audio-seconds", "1.5", name="audio", model=d)
    yield s
    s.stop()


@pytest.mark.parametrize("case", sorted(REF["cases"]))
def test_audio_gives_transformers_tokens(audio_server, case):
    ref = REF["cases"][case]
    r = ask(audio_server, with_data(ref["messages"]))
    assert r.usage.prompt_tokens == ref["prompt_tokens"], (r.usage, ref["soft_tokens"])
    got = [t.token for t in r.choices[0].logprobs.content]
    assert got == ref["pieces"], (got, ref["greedy"])


def test_streamed_audio_answer_equals_the_whole_one(audio_server):
    messages = with_data(REF["cases"]["one_clip"]["messages"])
    whole = ask(audio_server, messages).choices[0].message.content
    stream = openai_client(audio_server).chat.completions.create(model=audio_server.model_name, messages=messages, max_tokens=8,
                                       temperature=0, stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == whole


def clip_part(data: str, fmt: str = "wav"):
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


SHORT = b64(silence_wav(0.2))
BAD = [
    ("undecodable", [clip_part(b64(b"RIFF not a wav"))], "messages[0].content[0]", "WAV"),
    ("bad base64", [clip_part("@@@@")], "messages[0].content[0]", "base64"),
    ("not an mp3", [clip_part(SHORT, "mp3")], "messages[0].content[0]", "MP3"),
    ("other format", [clip_part(SHORT, "flac")], "messages[0].content[0]", "flac"),
    ("too long", [clip_part(b64(silence_wav(2.0)))], "messages[0].content[0]", "limit"),
    ("too many", [clip_part(SHORT), clip_part(SHORT), clip_part(SHORT)], "messages[0].content[2]", "audio=2"),
    ("no data", [{"type": "input_audio", "input_audio": {"format": "wav"}}], "messages[0].content[0]", "data"),
    ("an image", [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                      + b64((MEDIA / "image_0.png").read_bytes())}}],
     "messages[0].content[0]", "no vision encoder"),
]


@pytest.mark.parametrize("name,parts,param,words", BAD, ids=[b[0] for b in BAD])
def test_bad_audio_is_refused_naming_the_part(audio_server, name, parts, param, words):
    assert_refused(audio_server, [{"role": "user", "content": parts}], param, words)
    assert audio_server.alive()
