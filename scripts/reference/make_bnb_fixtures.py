#!/usr/bin/env python3
"""bitsandbytes 4-bit checkpoints of the tiny fixtures, saved by transformers as unsloth's
bnb-4bit models are, and the references Strata is checked against.

For each variant, writes <out>/<variant>/ with the `save_pretrained` output (config.json with
`quantization_config`, model.safetensors holding the packed codes and quantization states)
and reference.safetensors:

  input_ids              i64 [T]     the model fixture's own input_ids
  dequantized.<name>     f32 [o, i]  bitsandbytes' reference dequantization of a few matrices
                                     (its `default` backend, blocks over the flattened matrix as
                                     on CUDA; exact: their dtype's values widened to f32)
  logits                 f32 [T, V]  transformers in f32 on a dense copy of the model whose
                                     matrices are those dequantized values (what a dequantizing
                                     engine computes), use_cache=False
  logits_lora_<adapter>  f32 [T, V]  the same with a LoRA adapter of `lora/<model>/` applied by
                                     peft (QLoRA serving), for the Llama variants

Usage:  python3 make_bnb_fixtures.py --tiny tests/fixtures/tiny --out tests/fixtures/tiny/bnb
Needs:  torch, transformers==5.17.0, bitsandbytes (0.50, which runs on the CPU), safetensors.

bitsandbytes 0.50's CPU kernel (`cdequantize_blockwise_cpu_*`) takes blocks within each row, so
for rows that are not a multiple of the block size (the tiny models' 96-wide down projections)
it disagrees with its own reference implementation and with the quantizer (it reconstructs
the original weights 3x worse); the references here use the reference implementation.
"""
import argparse
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

# name: (model, quant_type, double quantization, dtype)
VARIANTS = {
    "llama-tiny-nf4-dq": ("llama-tiny", "nf4", True, torch.float32),
    "llama-tiny-fp4": ("llama-tiny", "fp4", False, torch.float32),
    "gemma4-tiny-nf4-dq-bf16": ("gemma4-tiny", "nf4", True, torch.bfloat16),
}
CHECKED = ["layers.0.self_attn.q_proj", "layers.0.mlp.down_proj", "layers.3.mlp.gate_proj"]


def main():
    import bitsandbytes
    import bitsandbytes.functional as F
    from bitsandbytes.backends.default.ops import _dequantize_4bit_compute
    from bitsandbytes.backends.utils import _get_4bit_code

    def dequantize(weight):
        st = weight.quant_state
        absmax = st.absmax
        if st.nested:
            absmax = F.dequantize_blockwise(st.absmax, st.state2) + st.offset
        code = _get_4bit_code(st.quant_type, "cpu")
        return _dequantize_4bit_compute(weight.data.reshape(-1), absmax.float(), code, st.blocksize,
                                        st.shape, st.dtype)

    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    for variant, (model, qtype, dq, dtype) in VARIANTS.items():
        src = os.path.join(args.tiny, model)
        ids = load_file(os.path.join(src, "reference.safetensors"))["input_ids"]
        cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=qtype, bnb_4bit_use_double_quant=dq,
                                 bnb_4bit_compute_dtype=dtype)
        q = AutoModelForCausalLM.from_pretrained(src, quantization_config=cfg, device_map="cpu", dtype=dtype)
        dst = os.path.join(args.out, variant)
        q.save_pretrained(dst)
        out = {"input_ids": ids}
        dense = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
        state = dense.state_dict()
        for name, mod in q.named_modules():
            if isinstance(mod, bitsandbytes.nn.Linear4bit):
                w = dequantize(mod.weight).float()
                state[f"{name}.weight"] = w
                short = name.split("model.", 1)[-1]
                if short in CHECKED:
                    out[f"dequantized.{short}"] = w.contiguous()
        # Every other tensor in the variant's dtype, as the checkpoint stores it.
        for key, value in q.state_dict().items():
            if key in state and value.is_floating_point() and value.shape == state[key].shape:
                state[key] = value.float()
        dense.load_state_dict(state)
        # transformers casts the embedding scales to the weights' dtype: with bf16 weights
        # the scale is sqrt(H) rounded to bf16, as an engine reading this checkpoint uses it.
        for mod in dense.modules():
            scale = getattr(mod, "embed_scale", None)
            if isinstance(scale, torch.Tensor):
                mod.embed_scale = scale.to(dtype).float()
        with torch.no_grad():
            out["logits"] = dense(ids[None], use_cache=False).logits[0].float().contiguous()
        if model == "llama-tiny":
            from peft import PeftModel

            lora = os.path.join(args.tiny, "lora", model, "attn-r4")
            with torch.no_grad():
                adapted = PeftModel.from_pretrained(dense, lora).eval()
                logits = adapted(ids[None], use_cache=False).logits[0].float()
                out["logits_lora_attn-r4"] = logits.contiguous()
        save_file(out, os.path.join(dst, "reference.safetensors"),
                  metadata={"bitsandbytes": bitsandbytes.__version__, "torch": torch.__version__,
                            "quant_type": qtype, "double_quant": str(dq), "dtype": str(dtype)})
        print(variant, sorted(k for k in out if k.startswith("dequantized")))


if __name__ == "__main__":
    main()
