"""Images in chat, served: the tiny Gemma-4 vision checkpoint (tests/fixtures/tiny/gemma4-tiny-vision)
with a byte-level tokenizer carrying Gemma-4's image markers and Gemma-4's chat template. Each
conversation's prompt size and greedy tokens are transformers' (tests/fixtures/media/chat_reference.json,
made by scripts/reference/make_vision_chat_reference.py); then the prefix cache across turns,
streaming, fetching from an allowed host, and every bad-media refusal (400 naming the part)."""

from __future__ import annotations

import base64
import copy
import functools
import http.server
import json
import threading

import pytest

from helpers import post
from media_helpers import MEDIA, REPO, TEMPLATE, ask, assert_refused, openai_client, servable_copy

TINY = REPO / "tests" / "fixtures" / "tiny" / "gemma4-tiny-vision"
REF = json.loads((MEDIA / "chat_reference.json").read_text())
MARKERS = {500: "<|image|>", 501: "<|image>", 502: "<image|>"}


def data_url(name: str, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode((MEDIA / name).read_bytes()).decode()


def with_data_urls(messages, url=data_url):
    """The reference's messages with each `fixture:NAME` URL swapped for the file's URL."""
    out = copy.deepcopy(messages)
    for m in out:
        for p in m["content"] if isinstance(m["content"], list) else []:
            if p["type"] == "image_url":
                p["image_url"]["url"] = url(p["image_url"]["url"].removeprefix("fixture:"))
    return out


@pytest.fixture(scope="module")
def vision(log_dir, tmp_path_factory):
    from conftest import start_server

    d = servable_copy(tmp_path_factory, TINY, MARKERS, {"image_processor": REF["processor"]})
    s = start_server(log_dir, "--chat-template", str(TEMPLATE), "--limit-mm-per-prompt", "image=2",
                     "--max-image-bytes", "100000", "--allowed-media-domains", "127.0.0.1",
                     name="vision", model=d)
    yield s
    s.stop()


def reference_pieces(case: str) -> list[str]:
    """Each reference token's text alone, as the server's logprobs show it (a lone byte of a
    longer character is U+FFFD in both), up to a stop token."""
    return REF["cases"][case]["pieces"]


@pytest.mark.parametrize("case", sorted(REF["cases"]))
def test_images_give_transformers_tokens(vision, case):
    ref = REF["cases"][case]
    r = ask(vision, with_data_urls(ref["messages"]))
    # The soft tokens count as prompt tokens.
    assert r.usage.prompt_tokens == ref["prompt_tokens"], (r.usage, ref["soft_tokens"])
    got = [t.token for t in r.choices[0].logprobs.content]
    assert got == reference_pieces(case), (got, ref["greedy"])


def test_streamed_image_answer_equals_the_whole_one(vision):
    messages = with_data_urls(REF["cases"]["two_images"]["messages"])
    whole = ask(vision, messages).choices[0].message.content
    stream = openai_client(vision).chat.completions.create(
        model=vision.model_name, messages=messages, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True})
    parts, usage = [], None
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        usage = chunk.usage or usage
    assert "".join(parts) == whole
    assert usage.prompt_tokens == REF["cases"]["two_images"]["prompt_tokens"]


def test_an_image_of_an_earlier_turn_is_a_prefix_cache_hit(vision):
    # A system turn no other test sends: nothing of these prompts is cached before.
    system = {"role": "system", "content": "cache-test"}
    turn = [system] + with_data_urls(REF["cases"]["second_turn"]["messages"])
    first = ask(vision, turn[:2])
    soft = REF["cases"]["second_turn"]["soft_tokens"][0]
    assert first.usage.prompt_tokens_details.cached_tokens < soft, first.usage
    # The second turn reuses the first, image and all (in whole pages of 16 tokens).
    second = ask(vision, turn)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 16, second.usage
    # Another image at the same place matches no more than the text before it.
    other = with_data_urls(user(img("fixture:image_1.png"), {"type": "text", "text": "What is it?"}))
    third = ask(vision, [system] + other)
    assert third.usage.prompt_tokens == first.usage.prompt_tokens
    assert third.usage.prompt_tokens_details.cached_tokens <= first.usage.prompt_tokens - soft, third.usage


def test_concurrent_requests_keep_their_answers_and_share_tower_passes(vision):
    """Every conversation three times at once: each answer is transformers' still, and
    /metrics counts every image once in passes that may carry several requests' images
    (whether two requests meet in a pass depends on timing; the batching itself has unit
    tests)."""
    import concurrent.futures

    import requests

    def counters():
        text = requests.get(vision.base + "/metrics", timeout=10).text
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                if line.startswith("strata_image_pass")}

    def images(case):
        return sum(p["type"] == "image_url" for m in REF["cases"][case]["messages"]
                   if isinstance(m["content"], list) for p in m["content"])

    cases = sorted(REF["cases"]) * 3
    before = counters()
    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
        answers = list(pool.map(lambda c: ask(vision, with_data_urls(REF["cases"][c]["messages"])), cases))
    for case, r in zip(cases, answers):
        assert [t.token for t in r.choices[0].logprobs.content] == reference_pieces(case), case
    after = counters()
    sent = sum(images(c) for c in cases)
    took = after["strata_image_pass_images_total"] - before["strata_image_pass_images_total"]
    passes = after["strata_image_passes_total"] - before["strata_image_passes_total"]
    assert took == sent, (took, sent)
    assert 1 <= passes <= sent, (passes, sent)


def test_an_image_from_an_allowed_host_is_fetched(vision):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(MEDIA))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}/"
        case = REF["cases"]["one_image"]
        r = ask(vision, with_data_urls(case["messages"], url=lambda name: base + name))
        assert [t.token for t in r.choices[0].logprobs.content] == reference_pieces("one_image")
        missing = with_data_urls(case["messages"], url=lambda name: base + "absent.png")
        assert_refused(vision, missing, "messages[0].content[1]", "HTTP 404")
    finally:
        httpd.shutdown()


def user(*parts):
    return [{"role": "user", "content": list(parts)}]


def img(url):
    return {"type": "image_url", "image_url": {"url": url}}


TEXT = {"type": "text", "text": "hi"}
BAD = [
    ("undecodable", user(TEXT, img("data:image/png;base64," + base64.b64encode(b"not a png").decode())),
     "messages[0].content[1]", "undecodable image"),
    ("bad base64", user(img("data:image/png;base64,@@@@")), "messages[0].content[0]", "base64"),
    ("wrong type", user(img("data:text/plain;base64,aGk=")), "messages[0].content[0]", "text/plain"),
    ("too big", user(img("data:image/png;base64," + base64.b64encode(bytes(150_000)).decode())),
     "messages[0].content[0]", "--max-image-bytes"),
    ("too many", user(img(data_url("image_0.png")), img(data_url("image_0.png")), img(data_url("image_0.png"))),
     "messages[0].content[2]", "image=2"),
    ("host not allowed", user(img("https://example.com/cat.png")), "messages[0].content[0]",
     "--allowed-media-domains"),
    ("not a URL", user(img("file:///etc/passwd")), "messages[0].content[0]", "data: URL"),
    ("no url", user({"type": "image_url", "image_url": {}}), "messages[0].content[0]", "url"),
    ("audio", user({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
     "messages[0].content[0]", "audio"),
    ("unknown part", user({"type": "video_url", "video_url": {"url": "x"}}), "messages[0].content[0]",
     "video_url"),
    ("image from the assistant", [{"role": "user", "content": "hi"},
                                  {"role": "assistant", "content": [img(data_url("image_0.png"))]},
                                  {"role": "user", "content": "and?"}],
     "messages[1].content[0]", "user messages"),
]


@pytest.mark.parametrize("name,messages,param,words", BAD, ids=[b[0] for b in BAD])
def test_bad_media_is_refused_naming_the_part(vision, name, messages, param, words):
    assert_refused(vision, messages, param, words)
    assert vision.alive()


def test_text_only_servers_refuse_images(log_dir, tmp_path_factory, server):
    from conftest import start_server

    messages = user(TEXT, img(data_url("image_0.png")))
    # A GGUF text model (the suite's server).
    assert_refused(server, messages, "messages[0].content[1]", "no vision encoder")
    d = servable_copy(tmp_path_factory, TINY, MARKERS, {"image_processor": REF["processor"]})
    s = start_server(log_dir, "--chat-template", str(TEMPLATE), "--text-model-only", name="text-only", model=d)
    try:
        assert_refused(s, messages, "messages[0].content[1]", "--text-model-only")
        # Text still works.
        r = post(s, "/v1/chat/completions", {"model": s.model_name, "max_tokens": 2,
                                              "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
    finally:
        s.stop()
