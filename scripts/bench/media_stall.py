#!/usr/bin/env python3
"""Does a chat turn with an image stall the other requests' decode steps? Serves a checkpoint with
the tiny Gemma-4 text model (tests/fixtures/tiny/gemma4-tiny-vision's) and a vision tower at E2B's
real shape (random weights, f32), streams a long completion, and in the middle of it sends a chat
turn with a 280-soft-token image (the processor's largest). Prints the streamed request's gaps between
tokens before, while and after the image is encoded.

    python3 scripts/bench/media_stall.py [--strata target/release/strata] [--work /tmp/media-stall]

Needs torch, transformers, Pillow and requests.
"""
import argparse
import base64
import io
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import requests
import torch
from PIL import Image
from transformers import Gemma4Config, Gemma4ForConditionalGeneration

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "bench"))
import byte_tokenizer  # noqa: E402

TINY = REPO / "tests" / "fixtures" / "tiny" / "gemma4-tiny-vision"
TEMPLATE = REPO / "tests" / "fixtures" / "templates" / "gemma4.jinja"


def checkpoint(out: Path):
    if (out / "model.safetensors").exists():
        return
    text = json.loads((TINY / "config.json").read_text())["text_config"]
    text["max_position_embeddings"] = 4096  # room for the long stream
    cfg = Gemma4Config(text_config=text, vision_config={"model_type": "gemma4_vision"}, audio_config=None,
                       image_token_id=500, boi_token_id=501, eoi_token_id=502)
    model = Gemma4ForConditionalGeneration(cfg).float().eval()
    model.save_pretrained(out, safe_serialization=True)
    tok = byte_tokenizer.tokenizer_json(extra={500: "<|image|>", 501: "<|image>", 502: "<image|>"}, vocab_size=512)
    (out / "tokenizer.json").write_text(json.dumps(tok))
    (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=str(REPO / "target" / "release" / "strata"))
    ap.add_argument("--work", default="/tmp/media-stall")
    ap.add_argument("--port", type=int, default=8941)
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    checkpoint(work / "ckpt")
    log = open(work / "server.log", "w")
    srv = subprocess.Popen([a.strata, "serve", "--model", str(work / "ckpt"), "--chat-template", str(TEMPLATE),
                            "--port", str(a.port), "--max-image-bytes", str(20 << 20)], stdout=log, stderr=log)
    base = f"http://127.0.0.1:{a.port}"
    try:
        for _ in range(600):
            try:
                if requests.get(base + "/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        arrivals = []

        def stream():
            body = {"prompt": "The", "max_tokens": 3900, "ignore_eos": True, "stream": True, "temperature": 0}
            with requests.post(base + "/v1/completions", json=body, stream=True, timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith(b"data: {"):
                        arrivals.append(time.perf_counter())

        t = threading.Thread(target=stream)
        t.start()
        time.sleep(2.0)
        rng = np.random.default_rng(0)
        img = Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8))
        buf = io.BytesIO()
        img.save(buf, "PNG")
        url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
        chat = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                           {"type": "text", "text": "What is it?"}]}],
                "max_tokens": 4, "temperature": 0}
        t0 = time.perf_counter()
        r = requests.post(base + "/v1/chat/completions", json=chat, timeout=600)
        t1 = time.perf_counter()
        assert r.status_code == 200, r.text
        prompt_tokens = r.json()["usage"]["prompt_tokens"]
        t.join()
        gaps = [(b - a_, b) for a_, b in zip(arrivals, arrivals[1:])]
        before = [g for g, at in gaps if at < t0]
        during = [g for g, at in gaps if t0 <= at <= t1]
        after = [g for g, at in gaps if at > t1]
        def ms(xs):
            if not xs:
                return "none"
            return f"median {statistics.median(xs) * 1e3:.2f} ms, max {max(xs) * 1e3:.1f} ms, n {len(xs)}"
        print(f"image turn: {t1 - t0:.2f} s, {prompt_tokens} prompt tokens")
        print(f"gaps before: {ms(before)}")
        print(f"gaps while encoding: {ms(during)}")
        print(f"gaps after: {ms(after)}")
        base_med = statistics.median(before)
        print(f"longest gap while encoding / median before: {max(during) / base_med:.1f}x; "
              f"tokens streamed while encoding: {len(during)}")
    finally:
        srv.terminate()
        srv.wait(timeout=30)


if __name__ == "__main__":
    main()
