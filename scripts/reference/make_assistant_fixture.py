#!/usr/bin/env python3
"""Build a tiny random Gemma-4 assistant (MTP drafter) for the tiny Gemma-4 target and dump
what transformers computes for three draft steps.

Writes <out>/gemma4-tiny-assistant/: the `save_pretrained` output of a
`Gemma4AssistantForCausalLM` (config.json, model.safetensors in float32) and
`reference.safetensors`:

  input_ids       i64 [N]        the prompt given to the target (N = 9)
  bonus           i64 [1]        the target's greedy token after the prompt (position N)
  target_hidden   f32 [64]       the target's final-normed hidden state at position N - 1
  draft_tokens    i64 [K]        the drafter's greedy tokens, K = 3 steps at position N
  draft_logits    f32 [K, V]     the drafter's logits (masked centroid head) at each step
  draft_hidden    f32 [K, 64]    the projected state (post_projection) each step feeds back
  sliding_visible i64 [N]        1 where the drafter's sliding layers see the key (its mask)

Each draft step is the exact drafting step of the reference (`inputs_embeds` = the target's
scaled embedding of the token, then the hidden state; position N for every step; the target's
K/V of its last KV-owning layer of each type, positions 0..N-1).

Usage:  python3 make_assistant_fixture.py --target tests/fixtures/tiny/gemma4-tiny
                                          --out tests/fixtures/tiny
Needs:  torch, transformers==5.17.0, safetensors. CPU is enough.

With --real-shape, writes instead a random assistant at the shape Google ships for E2B and
E4B (width 256, MLP 2048, 4 layers S S S F, 4 heads, 2048 centroids of which 32 are scored)
for the target at --target (a random real-shape checkpoint), in bfloat16, to <out> itself,
with no reference outputs: for speed measurements, where weight values do not matter.
"""
import argparse
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_fixtures import randomise as tiny_randomise  # noqa: E402
from transformers import (  # noqa: E402
    Gemma4AssistantConfig,
    Gemma4AssistantForCausalLM,
    Gemma4ForCausalLM,
)

PROMPT = 9
STEPS = 3
IDS_SEED = 99
WEIGHTS_SEED = 11
S, F = "sliding_attention", "full_attention"


def assistant_config(target_dir, real_shape=False):
    # The target's fields as stored (the loaded config resolves some of them per layer).
    with open(os.path.join(target_dir, "config.json")) as f:
        t = json.load(f)
    t = t.get("text_config", t)
    head_dims = [v["head_dim"] for v in t.get("per_layer_config", {}).values()]
    global_head_dim = max(head_dims) if head_dims else t.get("global_head_dim", 512)
    layers = [S, S, S, F] if real_shape else [S, S, F]
    text = dict(
        vocab_size=t["vocab_size"],
        vocab_size_per_layer_input=0,
        hidden_size=256 if real_shape else 32,
        intermediate_size=2048 if real_shape else 48,
        num_hidden_layers=len(layers),
        num_attention_heads=4,
        num_key_value_heads=t["num_key_value_heads"],
        head_dim=t["head_dim"],
        global_head_dim=global_head_dim,
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=len(layers),
        use_double_wide_mlp=False,
        layer_types=layers,
        sliding_window=t["sliding_window"] if real_shape else 4,
        final_logit_softcapping=None,
        rms_norm_eps=1e-6,
        max_position_embeddings=t["max_position_embeddings"] if real_shape else 256,
        rope_parameters=t["rope_parameters"],
        tie_word_embeddings=True,
    )
    cfg = Gemma4AssistantConfig(
        text_config=text,
        backbone_hidden_size=t["hidden_size"],
        use_ordered_embeddings=True,
        num_centroids=2048 if real_shape else 16,
        centroid_intermediate_top_k=32 if real_shape else 4,
    )
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    return cfg


def randomise(model, seed):
    """The tiny fixtures' randomisation (norms 1 + 0.3 N(0,1), the rest 0.08 N(0,1), layer
    scalars U(0.5, 1.5)), then the token ordering as a random permutation."""
    g = tiny_randomise(model, 1.0, seed)
    with torch.no_grad():
        order = torch.randperm(model.masked_embedding.token_ordering.numel(), generator=g)
        model.masked_embedding.token_ordering.copy_(order)


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--real-shape", action="store_true")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)
    if args.real_shape:
        asst = Gemma4AssistantForCausalLM(assistant_config(args.target, True)).eval()
        randomise(asst, WEIGHTS_SEED)
        asst.to(torch.bfloat16).save_pretrained(args.out)
        print("files", sorted(os.listdir(args.out)), flush=True)
        return

    target = Gemma4ForCausalLM.from_pretrained(args.target, attn_implementation="eager",
                                               dtype=torch.float32).eval()
    vocab = target.config.vocab_size
    cfg = assistant_config(args.target)
    asst = Gemma4AssistantForCausalLM(cfg).to(torch.float32).eval()
    randomise(asst, WEIGHTS_SEED)

    ids = torch.randint(0, vocab, (PROMPT,),
                        generator=torch.Generator().manual_seed(IDS_SEED))
    out = target.model(ids[None], use_cache=False, return_shared_kv_states=True)
    last = out.last_hidden_state  # [1, N, H], after the final norm
    logits = target.lm_head(last[:, -1])
    bonus = int(logits[0].argmax())
    shared = {k: (kv[0][:, :, :PROMPT], kv[1][:, :, :PROMPT])
              for k, kv in out.shared_kv_states.items()}
    print({k: tuple(v[0].shape) for k, v in shared.items()}, flush=True)

    h = last[:, -1:]
    tok = bonus
    pos = torch.tensor([[PROMPT]])
    toks, lg, hs = [], [], []
    for _ in range(STEPS):
        e = target.model.embed_tokens(torch.tensor([[tok]]))  # scaled, as the target embeds
        inp = torch.cat([e, h], dim=-1)
        o = asst(inputs_embeds=inp, position_ids=pos, shared_kv_states=shared)
        step_logits = o.logits[0, 0].float()
        tok = int(step_logits.argmax())
        h = o.last_hidden_state
        toks.append(tok)
        lg.append(step_logits.clone())
        hs.append(h[0, 0].float().clone())

    masks = asst.create_attention_masks(asst.pre_projection(inp), None, shared)
    sw = masks["sliding_attention"]
    print("sliding mask:", None if sw is None else sw.shape, flush=True)
    if sw is None:
        visible = torch.ones(PROMPT, dtype=torch.int64)
    else:
        m = sw.reshape(-1, sw.shape[-1])[0]
        visible = (m if m.dtype == torch.bool else m == 0).to(torch.int64)
    full = masks["full_attention"]
    if full is not None:
        fm = full.reshape(-1, full.shape[-1])[0]
        assert bool((fm if fm.dtype == torch.bool else fm == 0).all()), "full layers see every key"

    d = os.path.join(args.out, "gemma4-tiny-assistant")
    os.makedirs(d, exist_ok=True)
    asst.save_pretrained(d)
    ref = {
        "input_ids": ids.to(torch.int64).contiguous(),
        "bonus": torch.tensor([bonus], dtype=torch.int64),
        "target_hidden": last[0, -1].float().contiguous(),
        "draft_tokens": torch.tensor(toks, dtype=torch.int64),
        "draft_logits": torch.stack(lg).contiguous(),
        "draft_hidden": torch.stack(hs).contiguous(),
        "sliding_visible": visible.contiguous(),
    }
    meta = {
        "model": "gemma4-tiny-assistant",
        "class": "Gemma4AssistantForCausalLM",
        "target": "gemma4-tiny",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "weights_seed": str(WEIGHTS_SEED),
        "input_ids_seed": str(IDS_SEED),
        "prompt_len": str(PROMPT),
        "draft_steps": str(STEPS),
    }
    save_file(ref, os.path.join(d, "reference.safetensors"), metadata=meta)
    print("bonus", bonus, "drafts", toks, "sliding visible", visible.tolist(), flush=True)
    print("files", sorted(os.listdir(d)), flush=True)


if __name__ == "__main__":
    main()
