#!/usr/bin/env python3
"""transformers 5.17's Gemma-4 image processor (the PIL one) on two PNG images, for
strata-media's test.

Writes tests/fixtures/media/: `image_0.png` (37 x 53, RGB) and `image_1.png` (200 x 120,
RGBA), and `images.safetensors` with, for each, `resized_i` (u8 [H, W, 3]: Pillow's bicubic
resize to the processor's size), `pixel_values_i` (f32 [max_patches, 3 * patch^2]) and
`position_ids_i` (i64 [max_patches, 2]) from `Gemma4ImageProcessorPil(patch_size=4,
pooling_kernel_size=2, max_soft_tokens=70)`: small patches keep the fixture small; the code
path is the one the real sizes take.

Usage:  python3 scripts/reference/make_image_fixture.py
"""
import os

import numpy as np
from PIL import Image
from safetensors.numpy import save_file
from transformers.models.gemma4.image_processing_pil_gemma4 import (
    Gemma4ImageProcessorPil,
    get_aspect_ratio_preserving_size,
)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/fixtures/media")
PATCH, POOL, SOFT = 4, 2, 70


def picture(h, w, channels, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 7) % 256], -1)
    noisy = base + rng.integers(-40, 40, size=base.shape)
    img = np.clip(noisy, 0, 255).astype(np.uint8)
    if channels == 4:
        img = np.concatenate([img, rng.integers(0, 256, size=(h, w, 1), dtype=np.uint8)], -1)
    return img


def main():
    proc = Gemma4ImageProcessorPil(patch_size=PATCH, pooling_kernel_size=POOL, max_soft_tokens=SOFT)
    out = {}
    for i, (h, w, c) in enumerate([(37, 53, 3), (200, 120, 4)]):
        arr = picture(h, w, c, i)
        img = Image.fromarray(arr, "RGBA" if c == 4 else "RGB")
        img.save(os.path.join(OUT, f"image_{i}.png"))
        loaded = Image.open(os.path.join(OUT, f"image_{i}.png"))
        th, tw = get_aspect_ratio_preserving_size(h, w, PATCH, SOFT * POOL * POOL, POOL)
        out[f"resized_{i}"] = np.asarray(loaded.convert("RGB").resize((tw, th), Image.BICUBIC))
        r = proc(loaded, return_tensors="np")
        out[f"pixel_values_{i}"] = r["pixel_values"][0].astype(np.float32)
        out[f"position_ids_{i}"] = r["image_position_ids"][0].astype(np.int64)
        print(i, (h, w), "->", (th, tw), r["pixel_values"].shape, r["num_soft_tokens_per_image"])
    save_file(out, os.path.join(OUT, "images.safetensors"),
              metadata={"transformers": __import__("transformers").__version__,
                        "pillow": Image.__version__})


if __name__ == "__main__":
    main()
