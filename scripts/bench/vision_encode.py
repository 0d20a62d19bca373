#!/usr/bin/env python3
"""The peer of `cargo run --release -p strata-model --example vision_encode`: transformers'
Gemma-4 vision tower and embedder (f32, random weights, E2B's shape) on images of the same
soft-token counts, on this machine's CPU threads. Prints the median of `--runs` encodes.

    python3 scripts/bench/vision_encode.py [--runs 3] [--tokens 70,140,280] [--threads N]
"""
import argparse
import math
import time

import torch
from transformers import Gemma4Config, Gemma4ForConditionalGeneration


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", default="70,140,280")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    # Only the towers are built: a one-layer text model of E2B's width.
    text = dict(model_type="gemma4_text", hidden_size=1536, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=64, vocab_size=512,
                hidden_size_per_layer_input=0, layer_types=["full_attention"])
    cfg = Gemma4Config(text_config=text, vision_config={"model_type": "gemma4_vision"}, audio_config=None)
    model = Gemma4ForConditionalGeneration(cfg).float().eval()
    vt, embed = model.model.vision_tower, model.model.embed_vision
    k, p = cfg.vision_config.pooling_kernel_size, cfg.vision_config.patch_size
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| soft tokens | patches | median ms | ms a soft token |")
    print("|---:|---:|---:|---:|")
    for tokens in map(int, a.tokens.split(",")):
        th = max(1, math.floor(math.sqrt(tokens * 5 / 7)))
        tw = tokens // th
        ph, pw = th * k, tw * k
        n = ph * pw
        pix = torch.rand(1, n, 3 * p * p)
        ys, xs = torch.meshgrid(torch.arange(ph), torch.arange(pw), indexing="ij")
        pos = torch.stack([xs.reshape(-1), ys.reshape(-1)], -1)[None]
        times = []
        with torch.no_grad():
            for _ in range(a.runs):
                t0 = time.perf_counter()
                out = embed(inputs_embeds=vt(pixel_values=pix, pixel_position_ids=pos).last_hidden_state)
                times.append((time.perf_counter() - t0) * 1e3)
        assert out.shape[-2] == th * tw, out.shape
        times.sort()
        med = times[len(times) // 2]
        print(f"| {th * tw} | {n} | {med:.0f} | {med / (th * tw):.1f} |")


if __name__ == "__main__":
    main()
