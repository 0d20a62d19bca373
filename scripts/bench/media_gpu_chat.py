#!/usr/bin/env python3
"""Images in chat served from a GPU, for a machine with no pytest or openai client: the tiny
Gemma-4 vision checkpoint (tests/fixtures/tiny/gemma4-tiny-vision) served by `strata serve
--device cuda` with its vision tower on the GPU, and each conversation of
tests/fixtures/media/chat_reference.json (transformers' prompt sizes and greedy tokens, the
same cases as tests/e2e/test_images.py) asked through /v1/chat/completions. Prints a table;
exits 1 when a case's prompt size or greedy tokens differ.

    python3 scripts/bench/media_gpu_chat.py [--strata target/gpu-bundle/strata] [--media-device device]

Only the standard library is used.
"""
from __future__ import annotations

import argparse
import base64
import copy
import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "bench"))
import byte_tokenizer  # noqa: E402

TINY = REPO / "tests" / "fixtures" / "tiny" / "gemma4-tiny-vision"
MEDIA = REPO / "tests" / "fixtures" / "media"
TEMPLATE = REPO / "tests" / "fixtures" / "templates" / "gemma4.jinja"
MARKERS = {500: "<|image|>", 501: "<|image>", 502: "<image|>"}


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=str(REPO / "target" / "gpu-bundle" / "strata"))
    ap.add_argument("--media-device", default="device")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="auto", help="f32: the exact path (tokens must equal transformers')")
    ap.add_argument("--port", type=int, default=8097)
    a = ap.parse_args()
    ref = json.loads((MEDIA / "chat_reference.json").read_text())
    d = byte_tokenizer.servable_dir(TINY, Path(tempfile.mkdtemp(prefix="vision-chat-")), MARKERS,
                                    {"image_processor": ref["processor"]})
    log = open(d / "serve.log", "w")
    server = subprocess.Popen([a.strata, "serve", "--model", str(d), "--device", a.device, "--dtype", a.dtype, "--port", str(a.port),
                               "--served-model-name", "m", "--chat-template", str(TEMPLATE),
                               "--limit-mm-per-prompt", "image=2", "--media-device", a.media_device],
                              stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{a.port}"
    failures = 0
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        print("| case | prompt tokens (transformers) | greedy equal | ms |")
        print("|---|---:|---|---:|")
        for name, case in sorted(ref["cases"].items()):
            messages = copy.deepcopy(case["messages"])
            for m in messages:
                for p in m["content"] if isinstance(m["content"], list) else []:
                    if p["type"] == "image_url":
                        f = p["image_url"]["url"].removeprefix("fixture:")
                        p["image_url"]["url"] = "data:image/png;base64," + base64.b64encode(
                            (MEDIA / f).read_bytes()).decode()
            t = time.perf_counter()
            try:
                r = post(f"{base}/v1/chat/completions", {"model": "m", "messages": messages, "max_tokens": 8,
                                                        "temperature": 0, "logprobs": True})
            except urllib.error.HTTPError as e:
                failures += 1
                print(f"| {name} | HTTP {e.code}: {e.read().decode(errors='replace')[:300]} | | |")
                continue
            ms = (time.perf_counter() - t) * 1e3
            got = [c["token"] for c in r["choices"][0]["logprobs"]["content"]]
            ok = got == case["pieces"] and r["usage"]["prompt_tokens"] == case["prompt_tokens"]
            failures += not ok
            print(f"| {name} | {r['usage']['prompt_tokens']} ({case['prompt_tokens']}) | "
                  f"{'yes' if ok else f'no: {got}'} | {ms:.0f} |")
    finally:
        server.terminate()
        server.wait()
        log.close()
    for line in (d / "serve.log").read_text().splitlines():
        if any(w in line.lower() for w in ("image", "error", "vision", "loaded")):
            print(line)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
