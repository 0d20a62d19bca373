#!/usr/bin/env python3
"""transformers 5.17's Gemma-4 audio features on two clips, for strata-media's test.

Writes tests/fixtures/media/logmel.safetensors: for clip i in 0..2, `clip_i` (f32 samples at
16 kHz: tones, a chirp and noise, of 0.7 s and 1.3 s plus 37 samples, so that the second needs
padding), `features_i` (f32 [frames, 128]) and `mask_i` (u8 [frames]) from
`Gemma4AudioFeatureExtractor()` with its defaults.

Usage:  python3 scripts/reference/make_logmel_fixture.py
"""
import os

import numpy as np
import torch
from safetensors.numpy import save_file
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/fixtures/media/logmel.safetensors")


def clip(n, seed):
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 16000.0
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * (200 + 1500 * t) * t)
    x += 0.05 * rng.standard_normal(n)
    return x.astype(np.float32)


def main():
    fe = Gemma4AudioFeatureExtractor()
    out = {}
    for i, n in enumerate([11200, 20837]):
        x = clip(n, i)
        r = fe([x], return_tensors="np")
        out[f"clip_{i}"] = x
        out[f"features_{i}"] = r["input_features"][0].astype(np.float32)
        out[f"mask_{i}"] = r["input_features_mask"][0].astype(np.uint8)
        print(i, x.shape, r["input_features"].shape, int(r["input_features_mask"].sum()))
    save_file(out, OUT, metadata={"transformers": __import__("transformers").__version__,
                                  "numpy": np.__version__, "torch": torch.__version__})


if __name__ == "__main__":
    main()
