#!/usr/bin/env python3
"""Build tiny random models with transformers and dump reference outputs.

Writes, for every model, a directory <out>/<name>/ holding the `save_pretrained`
output (config.json, model.safetensors in float32) and `reference.safetensors`:

  input_ids       i64 [T]            fixed token sequence (T = 24)
  logits          f32 [T, V]         full-sequence forward, use_cache=False
  hidden          f32 [T, H]         final hidden state: the base model's last_hidden_state
                                     (after the final norm, before lm_head)
  hidden_states   f32 [L+1, T, H]    output_hidden_states=True, stacked as transformers returns
                                     them (index 0 = scaled embeddings, i = output of layer i-1;
                                     see the README for what the last entry is)
  prefill_logits  f32 [P, V]         logits of the cached prefill of the first P = 18 tokens
  decode_logits   f32 [D, V]         logits of the D = 6 single-token cached decode steps that
                                     feed input_ids[P..T] one at a time (positions P..T-1)

The safetensors header metadata records versions, model class, seeds and self-check results.

Usage:  python3 make_tiny_fixtures.py --out tests/fixtures/tiny
Needs:  torch, transformers==5.17.0, safetensors. CPU is enough.
"""
import argparse
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Gemma4Config,
    Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

VOCAB = 512
SEQ_LEN = 24
PREFILL = 18
IDS_SEED = 1234

S, F = "sliding_attention", "full_attention"
LAYERS6 = [S, S, F, S, S, F]


def gemma4_config():
    return Gemma4TextConfig(
        vocab_size=VOCAB,
        vocab_size_per_layer_input=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        hidden_size_per_layer_input=8,
        num_kv_shared_layers=3,
        use_double_wide_mlp=True,
        layer_types=list(LAYERS6),
        sliding_window=5,
        final_logit_softcapping=30.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        rope_parameters={
            S: {"rope_type": "default", "rope_theta": 10000.0},
            F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
        },
    )


def gemma3_config():
    return Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=5,
        layer_types=list(LAYERS6),
        query_pre_attn_scalar=16,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        rope_parameters={
            S: {"rope_type": "default", "rope_theta": 10000.0},
            F: {"rope_type": "default", "rope_theta": 1000000.0},
        },
    )


def llama_config():
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def qwen3_config():
    return Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )


def set_eager(cfg):
    cfg._attn_implementation = "eager"
    for sub in ("text_config", "vision_config", "audio_config"):
        sc = getattr(cfg, sub, None)
        if sc is not None and not isinstance(sc, dict):
            sc._attn_implementation = "eager"
    return cfg


def randomise(model, norm_offset, seed):
    """Norm weights -> norm_offset + 0.3*N(0,1); other params -> N(0, 0.08);
    Gemma-4 layer_scalar buffers -> U(0.5, 1.5). Returns the generator, for later draws."""
    g = torch.Generator().manual_seed(seed)
    seen = set()
    with torch.no_grad():
        for n, p in model.named_parameters(remove_duplicate=True):
            if id(p) in seen:
                continue
            seen.add(id(p))
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in n:
                p.copy_(norm_offset + 0.3 * noise)
            else:
                p.copy_(0.08 * noise)
        for n, b in model.named_buffers():
            if n.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g, dtype=torch.float32))
    return g


@torch.no_grad()
def reference(model, ids):
    model.eval()
    T = ids.shape[0]
    out = model(ids[None], use_cache=False, output_hidden_states=True)
    logits = out.logits[0].float().clone()
    hs = torch.stack([h[0] for h in out.hidden_states]).float().clone()
    last = model.model(ids[None], use_cache=False).last_hidden_state[0].float().clone()
    d = maxdiff(last, hs[-1])
    print(f"  hidden_states[-1] vs base last_hidden_state: {d:.3e}; n_hidden_states={hs.shape[0]}", flush=True)
    # cached prefill, then single-token decode steps
    o = model(ids[None, :PREFILL], use_cache=True)
    pkv = o.past_key_values
    prefill_logits = o.logits[0].float().clone()
    dec = []
    for t in range(PREFILL, T):
        o = model(ids[None, t:t + 1], past_key_values=pkv, use_cache=True)
        pkv = o.past_key_values
        dec.append(o.logits[0, -1].float().clone())
    decode_logits = torch.stack(dec)
    return {
        "input_ids": ids.to(torch.int64).clone(),
        "logits": logits.contiguous(),
        "hidden": last.contiguous(),
        "hidden_states": hs.contiguous(),
        "prefill_logits": prefill_logits.contiguous(),
        "decode_logits": decode_logits.contiguous(),
    }


def maxdiff(a, b):
    return float((a.float() - b.float()).abs().max().item())


def save_model(model, cls, ref, out_dir, name, extra_meta):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d)
    # self-checks: cache path vs full forward; reload round trip
    ids = ref["input_ids"]
    checks = {
        "max_abs_prefill_vs_full": maxdiff(ref["prefill_logits"], ref["logits"][:PREFILL]),
        "max_abs_decode_vs_full": maxdiff(ref["decode_logits"], ref["logits"][PREFILL:]),
    }
    re = cls.from_pretrained(d, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        rl = re(ids[None], use_cache=False).logits[0]
    checks["max_abs_reload_vs_saved"] = maxdiff(rl, ref["logits"])
    meta = {
        "model": name,
        "class": cls.__name__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "dtype": "float32",
        "attn_implementation": "eager",
        "seq_len": str(SEQ_LEN),
        "prefill_len": str(PREFILL),
        "decode_steps": str(SEQ_LEN - PREFILL),
        "input_ids_seed": str(IDS_SEED),
    }
    meta.update({k: str(v) for k, v in extra_meta.items()})
    meta.update({k: f"{v:.3e}" for k, v in checks.items()})
    save_file(ref, os.path.join(d, "reference.safetensors"), metadata=meta)
    files = sorted(os.listdir(d))
    size = sum(os.path.getsize(os.path.join(d, f)) for f in files)
    print(f"[{name}] {checks} files={files} bytes={size}", flush=True)
    for k, v in checks.items():
        limit = 0.0 if k == "max_abs_reload_vs_saved" else 1e-4
        assert v <= limit, f"{name}: self-check {k} = {v} > {limit}"
    return meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "tiny"))
    args = ap.parse_args()
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)
    torch.set_grad_enabled(False)
    print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)
    ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(IDS_SEED))
    summary = {}

    # 1. gemma4-tiny (text-only, keys model.*)
    m4 = ref4 = cfg4 = None
    try:
        cfg4 = set_eager(gemma4_config())
        m4 = Gemma4ForCausalLM(cfg4).to(torch.float32).eval()
        randomise(m4, 1.0, seed=4)
        ref4 = reference(m4, ids)
        summary["gemma4-tiny"] = save_model(m4, Gemma4ForCausalLM, ref4, out_dir, "gemma4-tiny", {"weights_seed": 4})
    except Exception as e:
        import traceback
        traceback.print_exc()
        summary["gemma4-tiny"] = {"error": repr(e)}

    # 2. gemma4-tiny-mm: identical text weights under the multimodal wrapper (model.language_model.*)
    try:
        assert ref4 is not None, "gemma4-tiny failed"
        mmcfg = Gemma4Config(text_config=cfg4.to_dict(), vision_config=None, audio_config=None)
        set_eager(mmcfg)
        mm = Gemma4ForConditionalGeneration(mmcfg).to(torch.float32).eval()
        missing = mm.model.language_model.load_state_dict(m4.model.state_dict(), strict=True)
        print("gemma4-tiny-mm load:", missing, flush=True)
        mm.tie_weights()
        assert mm.lm_head.weight.data_ptr() == mm.model.language_model.embed_tokens.weight.data_ptr() or \
            torch.equal(mm.lm_head.weight, mm.model.language_model.embed_tokens.weight)
        refmm = reference(mm, ids)
        d = maxdiff(refmm["logits"], ref4["logits"])
        print(f"gemma4-tiny-mm vs gemma4-tiny logits max diff {d:.3e}", flush=True)
        assert d <= 1e-6, d
        summary["gemma4-tiny-mm"] = save_model(mm, Gemma4ForConditionalGeneration, refmm, out_dir, "gemma4-tiny-mm",
                                               {"weights_seed": 4, "same_weights_as": "gemma4-tiny",
                                                "max_abs_logits_vs_gemma4_tiny": f"{d:.3e}"})
    except Exception as e:  # report, keep going
        import traceback
        traceback.print_exc()
        summary["gemma4-tiny-mm"] = {"error": repr(e)}

    # 3. gemma3-tiny ((1 + w) norms: w ~ 0.3*N(0,1)), 4. llama-tiny, 5. qwen3-tiny
    for name, cls, mkcfg, norm_offset, seed in [
        ("gemma3-tiny", Gemma3ForCausalLM, gemma3_config, 0.0, 3),
        ("llama-tiny", LlamaForCausalLM, llama_config, 1.0, 5),
        ("qwen3-tiny", Qwen3ForCausalLM, qwen3_config, 1.0, 6),
    ]:
        try:
            m = cls(set_eager(mkcfg())).to(torch.float32).eval()
            randomise(m, norm_offset, seed=seed)
            summary[name] = save_model(m, cls, reference(m, ids), out_dir, name, {"weights_seed": seed})
        except Exception as e:
            import traceback
            traceback.print_exc()
            summary[name] = {"error": repr(e)}

    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
    print(json.dumps(summary, indent=1), flush=True)
    bad = [k for k, v in summary.items() if "error" in v]
    if bad:
        print("FAILED:", bad, file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
