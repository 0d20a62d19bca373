"""Small HTTP helpers shared by the end-to-end tests."""

from __future__ import annotations

import json

import requests


ADMIN_PATHS = ("/v1/cache/rebuild", "/v1/cache/flush", "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
               "/v1/weights/update")


def post(server, path: str, body, *, timeout: float = 120, headers=None, raw: bytes | None = None):
    """POSTs with the server's key: its admin key on the operator's routes."""
    h = {"Content-Type": "application/json"}
    key = server.admin_key if path in ADMIN_PATHS else server.api_key
    if key:
        h["Authorization"] = f"Bearer {key}"
    h.update(headers or {})
    data = raw if raw is not None else json.dumps(body).encode()
    return requests.post(server.base + path, data=data, headers=h, timeout=timeout)


def get(server, path: str, *, timeout: float = 30, headers=None):
    h = {}
    if server.api_key:
        h["Authorization"] = f"Bearer {server.api_key}"
    h.update(headers or {})
    return requests.get(server.base + path, headers=h, timeout=timeout)


def read_sse(resp) -> tuple[list[dict], bool]:
    """Reads an SSE response to its end: the parsed `data:` payloads and whether `[DONE]` came
    last. Fails on a payload that is not JSON or on anything after `[DONE]`."""
    chunks: list[dict] = []
    done = False
    # Bytes, split on ASCII line ends only: SSE is UTF-8 whatever the headers say, and
    # str.splitlines would also break inside a payload at U+0085 and friends.
    for raw in resp.iter_lines():
        line = raw.decode("utf-8")
        if not line or line.startswith(":"):
            continue  # event separator or keep-alive comment
        assert line.startswith("data: "), f"unexpected SSE line {line!r}"
        payload = line[len("data: "):]
        assert not done, f"data after [DONE]: {payload!r}"
        if payload == "[DONE]":
            done = True
            continue
        chunks.append(json.loads(payload))
    return chunks, done


def assert_api_error(resp, status: int | None = None):
    """An OpenAI-style JSON error: with a 4xx status, or the given status."""
    if status is None or status < 500:
        assert 400 <= resp.status_code < 500, f"expected 4xx, got {resp.status_code}: {resp.text[:500]}"
    if status is not None:
        assert resp.status_code == status, f"expected {status}, got {resp.status_code}: {resp.text[:500]}"
    assert resp.headers.get("content-type", "").startswith("application/json"), resp.headers
    body = resp.json()
    assert isinstance(body.get("error"), dict), body
    assert isinstance(body["error"].get("message"), str) and body["error"]["message"], body
    return body["error"]
