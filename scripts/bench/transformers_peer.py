#!/usr/bin/env python3
"""The peer on the GPU host: transformers with a static cache and torch.compile (--compile
default: torch.compile of the forward; --compile auto: generate()'s own compilation, CUDA
graphs; --compile none: eager), on the same checkpoint and shapes as `strata bench`. Prints
one JSON object. Compiling takes minutes per batch shape on Gemma-4 E2B.

  decode: greedy generation of --new tokens at batch sizes --batches after a --depth token
          prompt; tokens/s = batch * new / (time(prompt + new) - time(prompt + 1)).
  prefill: one forward pass over N tokens (bf16, sdpa, no cache), best of three.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, Gemma4ForConditionalGeneration


def timed(fn):
    torch.cuda.synchronize()
    t = time.time()
    fn()
    torch.cuda.synchronize()
    return time.time() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--depth", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prefill", default="512,4096")
    ap.add_argument("--out", default=None)
    ap.add_argument("--compile", choices=["default", "auto", "none"], default="default",
                    help="decode with torch.compile's default mode; with generate()'s own "
                         "compilation (its CompileConfig, which compiles the forward for a "
                         "static cache); or eager")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    try:
        m = Gemma4ForConditionalGeneration.from_pretrained(args.model, dtype=torch.bfloat16, device_map="cuda")
    except Exception:
        m = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, device_map="cuda")
    m.eval()
    vocab = m.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(3)
    report = {"model": args.model, "gpu": torch.cuda.get_device_name(0), "prefill": [], "decode": [],
              "decode_mode": "static cache, " + {"default": "torch.compile",
                                                 "auto": "generate()'s own torch.compile",
                                                 "none": "eager"}[args.compile]}
    for n in [int(x) for x in args.prefill.split(",") if x]:
        ids = torch.randint(3, vocab, (1, n), generator=g).cuda()
        m(input_ids=ids, use_cache=False)
        best = min(timed(lambda: m(input_ids=ids, use_cache=False, logits_to_keep=1)) for _ in range(3))
        report["prefill"].append({"tokens": n, "ms": best * 1e3, "tokens_per_second": n / best})
        print(json.dumps(report["prefill"][-1]), flush=True)
        if args.out:
            json.dump(report, open(args.out, "w"), indent=1)
    try:
        m.generation_config.cache_implementation = "static"
        # "default": our own torch.compile in inductor's default mode (no CUDA graphs);
        # "auto": generate()'s, mode reduce-overhead (CUDA graphs). Wrapping the forward in
        # reduce-overhead here while generate() compiled it too crashed inside inductor
        # (transformers 5.17 / torch 2.11), so only one of the two compiles.
        if args.compile == "default":
            m.forward = torch.compile(m.forward, fullgraph=False)
        for b in [int(x) for x in args.batches.split(",") if x]:
            ids = torch.randint(3, vocab, (b, args.depth), generator=g).cuda()
            kw = dict(do_sample=False, pad_token_id=0)
            if args.compile != "auto":
                # generate() compiles the forward by itself for a static cache (a run cut
                # off mid-compile, 2026-11-30, 215 s limit, showed it); "auto" lets it, the
                # other modes opt out so that only their own choice applies.
                kw["disable_compile"] = True
            for _ in range(2):  # compile and warm up for this shape
                m.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new, **kw)
            one = min(timed(lambda: m.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)) for _ in range(2))
            full = min(timed(lambda: m.generate(ids, max_new_tokens=args.new + 1, min_new_tokens=args.new + 1, **kw))
                       for _ in range(2))
            tps = b * args.new / (full - one)
            report["decode"].append({"batch": b, "depth": args.depth, "tokens_per_second": tps})
            print(json.dumps(report["decode"][-1]), flush=True)
            if args.out:  # kept if a later shape's compile runs out of time
                json.dump(report, open(args.out, "w"), indent=1)
    except Exception as e:
        report["decode_error"] = repr(e)[:2000]
    print(json.dumps(report))
    if args.out:
        json.dump(report, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
