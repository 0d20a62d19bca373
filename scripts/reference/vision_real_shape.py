#!/usr/bin/env python3
"""Gemma-4's vision tower at E2B's and E4B's real shape (both take transformers' default
`gemma4_vision` config: 16 layers of width 768, patches of 16, 3x3 pooling; the embedder
projects to the text width, 1536 or 2560) with random weights, and transformers'
soft tokens for two images, for the GPU test `vision_tower_at_the_real_shape_matches_transformers`
(crates/strata-model/src/cuda_upload.rs) and its timing.

Writes <out>/ with `config.json` and `model.safetensors` (bf16: the vision tower, its
embedder and a one-layer text model of the text width, which only gives the embedder its
output size) and `reference.safetensors` holding, for image i:

  pixel_values_i   f32 [P_i, 768]   random patches in [0, 1], no padding
  position_ids_i   i64 [P_i, 2]     (x, y) of each patch
  soft_f32_i       f32 [S_i, T]     transformers with the bf16 weights widened to f32
  soft_bf16_i      f32 [S_i, T]     transformers in bf16

and, in its metadata, transformers' bf16 time per image (CUDA events, median of 5).

Usage:  python3 scripts/reference/vision_real_shape.py --out /tmp/vision-e2b [--text-hidden 2560] [--device cuda]
"""
import argparse
import json
import math
import os

import torch
from safetensors.torch import save_file
from transformers import Gemma4Config, Gemma4ForConditionalGeneration


def grid(tokens, k):
    """(height, width) in patches of an image of about `tokens` soft tokens, 5:7."""
    th = max(1, math.floor(math.sqrt(tokens * 5 / 7)))
    return th * k, (tokens // th) * k


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", default="280,70")
    ap.add_argument("--text-hidden", type=int, default=1536, help="E2B 1536, E4B 2560")
    a = ap.parse_args()
    torch.manual_seed(4321)
    text = dict(model_type="gemma4_text", hidden_size=a.text_hidden, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, head_dim=64, vocab_size=512,
                hidden_size_per_layer_input=0, layer_types=["full_attention"])
    cfg = Gemma4Config(text_config=text, vision_config={"model_type": "gemma4_vision"}, audio_config=None)
    model = Gemma4ForConditionalGeneration(cfg).eval()
    vt, embed = model.model.vision_tower, model.model.embed_vision
    vc_head_dim = cfg.vision_config.head_dim
    with torch.no_grad():
        # Activations of order one through every layer: matrices scaled by their fan-in,
        # norms near one, a position table and standardization that matter.
        for p in list(vt.parameters()) + list(embed.parameters()):
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape))
            else:
                p.copy_(torch.randn(p.shape) / math.sqrt(p.shape[-1]))
        # Attention's scale is 1 on normed q and k: their norms' weights set the softmax's
        # temperature. Near d^-1/4 the scores spread by about one, as a trained tower's do;
        # near one they spread by sqrt(d) = 8, every row's softmax is one-hot, and rounding
        # flips which key wins (transformers' own bf16 run then disagrees with its f32 run).
        for layer in vt.encoder.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.mul_(vc_head_dim ** -0.25)
        vt.patch_embedder.position_embedding_table.copy_(
            0.5 * torch.randn(vt.patch_embedder.position_embedding_table.shape))
        if getattr(vt, "std_bias", None) is not None:
            vt.std_bias.copy_(0.5 * torch.randn(vt.std_bias.shape))
            vt.std_scale.copy_(1.0 + torch.rand(vt.std_scale.shape))
    model = model.to(torch.bfloat16)
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    vc = cfg.vision_config
    k, p = vc.pooling_kernel_size, vc.patch_size
    gen = torch.Generator().manual_seed(7)
    ref, timing = {}, {}
    dev = torch.device(a.device)
    for i, tokens in enumerate(map(int, a.tokens.split(","))):
        ph, pw = grid(tokens, k)
        n = ph * pw
        pix = torch.rand(n, 3 * p * p, generator=gen)
        ys, xs = torch.meshgrid(torch.arange(ph), torch.arange(pw), indexing="ij")
        pos = torch.stack([xs.reshape(-1), ys.reshape(-1)], -1).to(torch.int64)
        ref[f"pixel_values_{i}"] = pix.contiguous()
        ref[f"position_ids_{i}"] = pos.contiguous()
        for dtype, name in [(torch.float32, "f32"), (torch.bfloat16, "bf16")]:
            m = model.to(device=dev, dtype=dtype)
            vt, embed = m.model.vision_tower, m.model.embed_vision

            def run():
                with torch.no_grad():
                    h = vt(pixel_values=pix[None].to(dev, dtype), pixel_position_ids=pos[None].to(dev))
                    return embed(inputs_embeds=h.last_hidden_state)

            soft = run()
            ref[f"soft_{name}_{i}"] = soft.float().cpu().contiguous()
            if name == "bf16" and dev.type == "cuda":
                times = []
                for _ in range(5):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    run()
                    e.record()
                    torch.cuda.synchronize()
                    times.append(s.elapsed_time(e))
                timing[f"transformers_bf16_ms_{i}"] = sorted(times)[2]
        print(f"image {i}: {ph}x{pw} patches -> {ref[f'soft_f32_{i}'].shape[0]} soft tokens, "
              f"transformers bf16 {timing.get(f'transformers_bf16_ms_{i}', float('nan')):.2f} ms")
    save_file(ref, os.path.join(a.out, "reference.safetensors"),
              metadata={"transformers": __import__("transformers").__version__, "torch": torch.__version__,
                        "timing": json.dumps(timing)})


if __name__ == "__main__":
    main()
