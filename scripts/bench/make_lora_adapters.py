#!/usr/bin/env python3
"""Random PEFT LoRA adapters at a checkpoint's real shapes, for the LoRA decode benchmark.

    python3 scripts/bench/make_lora_adapters.py --model CKPT --out DIR [--count 4] [--rank 32]

Writes DIR/a1 .. DIR/aN, each `adapter_config.json` + `adapter_model.safetensors` (bf16),
adapting q, k, v, o, gate, up and down of every layer that stores the matrix (Gemma-4's
KV-shared layers have no k/v of their own: those are skipped). A and B are N(0, 0.02^2), so
the products change every logit. Shapes are read from the checkpoint's safetensors headers.
"""
import argparse
import json
import os
import re

import torch
from safetensors import safe_open
from safetensors.torch import save_file

MODULES = {
    "self_attn.q_proj": "q_proj",
    "self_attn.k_proj": "k_proj",
    "self_attn.v_proj": "v_proj",
    "self_attn.o_proj": "o_proj",
    "mlp.gate_proj": "gate_proj",
    "mlp.up_proj": "up_proj",
    "mlp.down_proj": "down_proj",
}


def shapes(ckpt):
    """(layer, module path, [out, in]) of every text-decoder matrix an adapter may target."""
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    text = cfg.get("text_config", cfg)
    layers = text["num_hidden_layers"]
    first_shared = layers - (text.get("num_kv_shared_layers") or 0)
    pat = re.compile(r"(?:^|\.)language_model\.layers\.(\d+)\.(.+)\.weight$|^model\.layers\.(\d+)\.(.+)\.weight$")
    found = []
    for f in sorted(os.listdir(ckpt)):
        if not f.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(ckpt, f), "pt") as st:
            for name in st.keys():
                m = pat.search(name)
                if not m:
                    continue
                layer = int(m.group(1) or m.group(3))
                module = m.group(2) or m.group(4)
                if module not in MODULES:
                    continue
                if MODULES[module] in ("k_proj", "v_proj") and layer >= first_shared:
                    continue
                found.append((layer, module, list(st.get_slice(name).get_shape())))
    return sorted(found)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=4)
    ap.add_argument("--rank", type=int, default=32)
    args = ap.parse_args()
    mats = shapes(args.model)
    if not mats:
        raise SystemExit(f"no q/k/v/o/gate/up/down matrices found in {args.model}")
    for i in range(1, args.count + 1):
        g = torch.Generator().manual_seed(i)
        tensors = {}
        for layer, module, (out_f, in_f) in mats:
            base = f"base_model.model.model.language_model.layers.{layer}.{module}"
            a = torch.randn(args.rank, in_f, generator=g) * 0.02
            b = torch.randn(out_f, args.rank, generator=g) * 0.02
            tensors[f"{base}.lora_A.weight"] = a.to(torch.bfloat16).contiguous()
            tensors[f"{base}.lora_B.weight"] = b.to(torch.bfloat16).contiguous()
        d = os.path.join(args.out, f"a{i}")
        os.makedirs(d, exist_ok=True)
        save_file(tensors, os.path.join(d, "adapter_model.safetensors"))
        cfg = {
            "peft_type": "LORA",
            "r": args.rank,
            "lora_alpha": 2 * args.rank,
            "target_modules": sorted(set(MODULES.values())),
            "bias": "none",
        }
        json.dump(cfg, open(os.path.join(d, "adapter_config.json"), "w"), indent=1)
        print(f"{d}: {len(mats)} matrices, rank {args.rank}")


if __name__ == "__main__":
    main()
