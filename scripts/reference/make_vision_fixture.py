#!/usr/bin/env python3
"""A tiny Gemma-4 vision tower (transformers 5.17, random weights, f32) and its outputs on two
images of different sizes, for the encoder's parity test.

Writes <out>/ with `config.json` and `model.safetensors` (the `Gemma4ForConditionalGeneration`
checkpoint: the tiny text model of ../tiny/gemma4-tiny and a 2-layer vision tower) and
`reference.safetensors` holding, for image i in 0..2:

  pixel_values_i     f32 [P_i, 3 * patch^2]   patches as the image processor lays them out
  position_ids_i     i64 [P_i, 2]             (x, y) of each patch; (-1, -1) marks padding
  encoder_i          f32 [P_i, H]             the encoder's last hidden state (before pooling)
  vision_i           f32 [S_i, H]             the vision tower's output (pooled, scaled, standardized)
  soft_tokens_i      f32 [S_i, T]             `embed_vision` of it: the soft tokens in the text width
  prompt_ids         i64 [N]                  text, then image 0's placeholders (id 500) between
                                              501 and 502, text, image 1's, text
  prompt_logits      f32 [N, V]               the whole model's logits for it with both images
  prompt_greedy      i64 [8]                  `generate`'s greedy tokens after it

The second image is padded to the first's patch count, as a batch of two sizes is.

Usage:  python3 scripts/reference/make_vision_fixture.py --out tests/fixtures/tiny/gemma4-tiny-vision
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

PATCH = 4
POOL = 2
IMAGE, BOI, EOI = 500, 501, 502


def vision_config():
    return dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                pooling_kernel_size=POOL, patch_size=PATCH, position_embedding_size=64,
                rope_parameters={"rope_type": "axial", "rope_theta": 100.0}, standardize=True,
                use_clipped_linears=False)


def patches(h, w, total, gen):
    """An image of h x w patches as the processor gives it: row-major patches of
    3 * PATCH^2 values in [0, 1], positions (x, y), padded to `total` with (-1, -1)."""
    n = h * w
    pix = torch.zeros(total, 3 * PATCH * PATCH)
    pix[:n] = torch.rand(n, 3 * PATCH * PATCH, generator=gen)
    pos = torch.full((total, 2), -1, dtype=torch.int64)
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    pos[:n, 0] = xs.reshape(-1)
    pos[:n, 1] = ys.reshape(-1)
    return pix, pos


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(1234)
    # Placeholder ids inside the tiny vocabulary (the real ones are past its 512 ids).
    cfg = Gemma4Config(text_config=gemma4_config().to_dict(), vision_config=vision_config(), audio_config=None,
                       image_token_id=IMAGE, boi_token_id=BOI, eoi_token_id=EOI)
    model = Gemma4ForConditionalGeneration(cfg).float().eval()
    # Random buffers the initializer leaves at fixed values: make them count.
    vt = model.model.vision_tower
    with torch.no_grad():
        vt.std_bias.copy_(torch.randn(vt.std_bias.shape) * 0.5)
        vt.std_scale.copy_(1.0 + torch.rand(vt.std_scale.shape))
        for p in vt.parameters():
            p.copy_(torch.randn(p.shape) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    gen = torch.Generator().manual_seed(7)
    # (height, width) in patches, each a multiple of the pooling kernel.
    sizes = [(6, 8), (4, 6)]
    total = max(h * w for h, w in sizes)
    ref = {}
    with torch.no_grad():
        for i, (h, w) in enumerate(sizes):
            pix, pos = patches(h, w, total, gen)
            out = vt.patch_embedder(pix[None], pos[None], (pos[None] == -1).all(-1))
            enc = vt.encoder(inputs_embeds=out, attention_mask=~(pos[None] == -1).all(-1),
                             pixel_position_ids=pos[None]).last_hidden_state[0]
            vision = vt(pixel_values=pix[None], pixel_position_ids=pos[None]).last_hidden_state
            soft = model.model.embed_vision(inputs_embeds=vision)
            ref.update({f"pixel_values_{i}": pix.contiguous(), f"position_ids_{i}": pos.contiguous(),
                        f"encoder_{i}": enc.contiguous(), f"vision_{i}": vision.contiguous(),
                        f"soft_tokens_{i}": soft.contiguous()})
            print(f"image {i}: {h}x{w} patches -> {soft.shape[0]} soft tokens")
        # A prompt with both images between text, through the whole model: the soft tokens
        # replace the placeholders' embeddings (their per-layer inputs are the pad token's).
        text = torch.randint(3, 400, (12,), generator=gen)
        n0 = ref["soft_tokens_0"].shape[0]
        n1 = ref["soft_tokens_1"].shape[0]
        ids = torch.cat([torch.tensor([2]), text[:4], torch.tensor([BOI]), torch.full((n0,), IMAGE),
                         torch.tensor([EOI]), text[4:8], torch.tensor([BOI]), torch.full((n1,), IMAGE),
                         torch.tensor([EOI]), text[8:]])
        pix = torch.stack([ref["pixel_values_0"], ref["pixel_values_1"]])
        pos = torch.stack([ref["position_ids_0"], ref["position_ids_1"]])
        logits = model(input_ids=ids[None], pixel_values=pix, image_position_ids=pos).logits[0]
        out = model.generate(input_ids=ids[None], pixel_values=pix, image_position_ids=pos, max_new_tokens=8,
                             do_sample=False, attention_mask=torch.ones_like(ids[None]))
        ref.update({"prompt_ids": ids.to(torch.int64), "prompt_logits": logits.contiguous(),
                    "prompt_greedy": out[0, len(ids):].to(torch.int64).contiguous()})
        print(f"prompt: {len(ids)} ids, {n0 + n1} of them soft tokens")
    save_file(ref, os.path.join(args.out, "reference.safetensors"),
              metadata={"transformers": __import__("transformers").__version__, "torch": torch.__version__,
                        "sizes": json.dumps(sizes)})


if __name__ == "__main__":
    main()
