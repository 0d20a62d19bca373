#!/usr/bin/env python3
"""Gemma-4 E2B's audio tower (random f32 weights at its real shape: width 1024, 12 conformer layers,
128 mel bins, into the text width 1536; E4B's is the same tower into 2560, `--text-hidden 2560`) on this machine's CPU: writes the checkpoint (the tiny text
model of tests/fixtures/tiny/gemma4-tiny-vision beside the tower) and, for one clip, its features and
soft tokens to `--out`, then times transformers' tower and embedder on clips of `--seconds`. The peer of
`cargo run --release -p strata-model --example audio_encode -- --model OUT`, which times Strata's on the
same checkpoint and checks the clip's soft tokens.

    python3 scripts/bench/audio_encode.py --out /tmp/audio-e2b [--seconds 5,10,30] [--runs 3] [--text-hidden 2560]
"""
import argparse
import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Gemma4Config, Gemma4ForConditionalGeneration

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "tiny" / "gemma4-tiny-vision"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", default="5,10,30")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--text-hidden", type=int, default=1536, help="E2B 1536, E4B 2560")
    a = ap.parse_args()
    out = Path(a.out)
    torch.manual_seed(0)
    text = json.loads((TINY / "config.json").read_text())["text_config"]
    text["hidden_size"] = a.text_hidden  # the text model's width: the embedder's output
    cfg = Gemma4Config(text_config=text, vision_config=None, audio_config={"model_type": "gemma4_audio"},
                       audio_token_id=503, boa_token_id=504, eoa_token_id=505)
    model = Gemma4ForConditionalGeneration(cfg).float().eval()
    at, embed = model.model.audio_tower, model.model.embed_audio
    with torch.no_grad():
        for name, b in at.named_buffers():
            if name.endswith(("input_min", "output_min")):
                b.fill_(-8.0)
            elif name.endswith(("input_max", "output_max")):
                b.fill_(8.0)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "model.safetensors").exists():
        model.save_pretrained(out, safe_serialization=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| seconds | frames | soft tokens | median ms | ms a second of audio |")
    print("|---:|---:|---:|---:|---:|")
    gen = torch.Generator().manual_seed(1)
    for i, sec in enumerate(map(float, a.seconds.split(","))):
        frames = int(sec * 100)
        feats = torch.randn(1, frames, 128, generator=gen)
        mask = torch.ones(1, frames, dtype=torch.bool)
        times = []
        with torch.no_grad():
            for _ in range(a.runs):
                t0 = time.perf_counter()
                o = at(feats, attention_mask=mask)
                soft = embed(inputs_embeds=o.last_hidden_state)
                times.append((time.perf_counter() - t0) * 1e3)
        if i == 0:
            save_file({"features": feats[0].contiguous(), "soft": soft[0].contiguous()}, str(out / "ref.safetensors"))
        times.sort()
        med = times[len(times) // 2]
        print(f"| {sec:g} | {frames} | {soft.shape[1]} | {med:.0f} | {med / sec:.0f} |")


if __name__ == "__main__":
    main()
