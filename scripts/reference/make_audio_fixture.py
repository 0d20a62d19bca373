#!/usr/bin/env python3
"""A tiny Gemma-4 audio tower (transformers 5.17, random weights, f32) and its outputs on two
clips of log-mel features, for the audio encoder's parity test.

Writes <out>/ with `config.json` (a `Gemma4ForConditionalGeneration` config: the tiny text model
of ../tiny/gemma4-tiny and a 2-layer conformer) and `model.safetensors` (the whole checkpoint:
the text model, the audio tower and its embedder), and
`reference.safetensors` holding, for clip i in 0..2:

  features_i   f32 [T_i, 16]   log-mel frames (16 bins: the first subsampling conv's channels)
  tower_i      f32 [S_i, 24]   the tower's output (`last_hidden_state`, every frame valid)
  soft_i       f32 [S_i, 64]   `embed_audio` of it: the soft tokens in the text width

The linears' clamps and the gradient clipping are set low enough to bite, the attention has a
right context, and clip 1 is longer than a few attention chunks.

Usage:  python3 scripts/reference/make_audio_fixture.py --out tests/fixtures/tiny/gemma4-tiny-audio
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import Gemma4Config, Gemma4ForConditionalGeneration

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_fixtures import gemma4_config  # noqa: E402

BINS = 16


def audio_config():
    return dict(model_type="gemma4_audio", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                hidden_act="silu", subsampling_conv_channels=[BINS, 8], conv_kernel_size=5, residual_weight=0.5,
                attention_chunk_size=4, attention_context_left=5, attention_context_right=1,
                attention_logit_cap=50.0, attention_invalid_logits_value=-1.0e9, use_clipped_linears=True,
                rms_norm_eps=1e-6, gradient_clipping=4.0, output_proj_dims=24)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(4321)
    cfg = Gemma4Config(text_config=gemma4_config().to_dict(), vision_config=None, audio_config=audio_config(),
                       audio_token_id=503, boa_token_id=504, eoa_token_id=505)
    model = Gemma4ForConditionalGeneration(cfg).float().eval()
    at = model.model.audio_tower
    with torch.no_grad():
        for name, p in at.named_parameters():
            if name.endswith("per_dim_scale"):
                p.copy_(torch.randn(p.shape) * 0.5)
            elif p.dim() == 1:
                p.copy_(1.0 + torch.randn(p.shape) * 0.2)
            else:
                p.copy_(torch.randn(p.shape) * (1.0 / p[0].numel() ** 0.5))
        for name, b in at.named_buffers():
            if name.endswith(("input_min", "output_min")):
                b.fill_(-2.5 - torch.rand(()).item())
            elif name.endswith(("input_max", "output_max")):
                b.fill_(2.5 + torch.rand(()).item())
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    # Tied to the input embedding: transformers' checkpoints leave it out.
    state.pop("lm_head.weight", None)
    os.makedirs(args.out, exist_ok=True)
    save_file(state, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    cfg_dict = cfg.to_dict()
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2)
    ref = {}
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for i, frames in enumerate([37, 50]):
            feats = torch.randn(frames, BINS, generator=gen)
            mask = torch.ones(1, frames, dtype=torch.bool)
            out = at(feats[None], attention_mask=mask)
            tower = out.last_hidden_state[0][out.attention_mask[0]]
            soft = model.model.embed_audio(inputs_embeds=tower[None])[0]
            ref.update({f"features_{i}": feats.contiguous(), f"tower_{i}": tower.contiguous(),
                        f"soft_{i}": soft.contiguous()})
            print(f"clip {i}: {frames} frames -> {tower.shape[0]} soft tokens; |tower| max {tower.abs().max():.3f}")
    save_file(ref, os.path.join(args.out, "reference.safetensors"),
              metadata={"transformers": __import__("transformers").__version__, "torch": torch.__version__})


if __name__ == "__main__":
    main()
