#!/usr/bin/env python3
"""Random PEFT LoRA adapters for the tiny fixtures, and peft's logits with each.

For every model in MODELS, writes under <out>/<model>/:

  <adapter>/adapter_config.json, adapter_model.safetensors   `save_pretrained` output
  reference.safetensors
      input_ids         i64 [T]       the model fixture's own input_ids (T = 24)
      logits_base       f32 [T, V]    the model without an adapter
      logits_<adapter>  f32 [T, V]    full-sequence forward with that adapter, use_cache=False,
                                      computed in f64 (the exact values, rounded to f32)

The adapters differ in rank, alpha, targets and scaling (one uses rsLoRA). peft initialises
B to zero (a no-op adapter), so every lora_A / lora_B weight is redrawn from a seeded
normal distribution instead.

Usage:  python3 make_lora_fixtures.py --tiny tests/fixtures/tiny --out tests/fixtures/tiny/lora
Needs:  torch, transformers==5.17.0, peft, safetensors. CPU is enough.
"""
import argparse
import json
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

MODELS = ["gemma4-tiny", "qwen3-tiny", "llama-tiny"]
ATTN = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
# name: (rank, alpha, targets, rslora)
ADAPTERS = {
    "attn-r4": (4, 8, ["q_proj", "v_proj"], False),
    "mlp-r8-rs": (8, 16, ["o_proj"] + MLP, True),
    "all-r2": (2, 5, ATTN + MLP, False),
}


def adapter(base, name, spec, seed):
    from peft import LoraConfig, get_peft_model

    rank, alpha, targets, rslora = spec
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, use_rslora=rslora,
                     lora_dropout=0.0, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(base, cfg, adapter_name=name)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "lora_A" in pname or "lora_B" in pname:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.manual_seed(0)
    for m in MODELS:
        src = os.path.join(args.tiny, m)
        ids = load_file(os.path.join(src, "reference.safetensors"))["input_ids"]
        out = {"input_ids": ids}
        for i, (name, spec) in enumerate(ADAPTERS.items()):
            base = AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float32).eval()
            if i == 0:
                with torch.no_grad():
                    base.to(torch.float64)
                    out["logits_base"] = base(ids[None], use_cache=False).logits[0].float()
                    base.to(torch.float32)
            model = adapter(base, name, spec, seed=1000 + i).eval()
            with torch.no_grad():
                f32 = model(ids[None], use_cache=False).logits[0].float()
            dst = os.path.join(args.out, m)
            model.save_pretrained(dst)
            # The reference is the same model in f64 (rounded to f32 at the end): the
            # adapters' random weights make the models sensitive enough that f32 summation
            # order alone moves some logits by 1e-4.
            with torch.no_grad():
                model.to(torch.float64)
                out[f"logits_{name}"] = model(ids[None], use_cache=False).logits[0].float()
                model.to(torch.float32)
            f32_err = (f32 - out[f"logits_{name}"]).abs().max().item()
            for card in (os.path.join(dst, "README.md"), os.path.join(dst, name, "README.md")):
                if os.path.exists(card):
                    os.remove(card)
            # Reload the saved adapter and check it reproduces the logits.
            from peft import PeftModel

            again = AutoModelForCausalLM.from_pretrained(src, torch_dtype=torch.float32).eval()
            again = PeftModel.from_pretrained(again, os.path.join(dst, name)).eval()
            with torch.no_grad():
                check = again(ids[None], use_cache=False).logits[0].float()
            diff = (check - f32).abs().max().item()
            assert diff < 1e-5, (m, name, diff)
            moved = (out[f"logits_{name}"] - out["logits_base"]).abs().max().item()
            print(f"{m} {name}: reload diff {diff:.2e}, peft f32 vs f64 {f32_err:.2e}, "
                  f"max change from base {moved:.3f}")
        meta = {"peft": __import__("peft").__version__, "torch": torch.__version__,
                "transformers": __import__("transformers").__version__,
                "adapters": json.dumps({k: list(v[:2]) + [v[2], v[3]] for k, v in ADAPTERS.items()})}
        save_file({k: v.contiguous() for k, v in out.items()},
                  os.path.join(args.out, m, "reference.safetensors"), metadata=meta)


if __name__ == "__main__":
    main()
