#!/usr/bin/env python3
"""Gemma-4 GGUF files made by llama.cpp's own tools, and llama.cpp's outputs on them.

For each model below, with fixed seeds:
  1. a Gemma-4 text checkpoint (transformers, f32) whose tokenizer is a synthetic Gemma-style
     BPE (U+2581 for spaces, byte fallback, merges learned from the repository's docs) of
     exactly the model's vocabulary, trained for a few hundred steps on the same docs so
     that its next-token distributions are peaked (random weights give flat ones, on which
     no greedy comparison means anything);
  2. llama.cpp's converter (`convert_hf_to_gguf.py --outtype bf16`), then `llama-quantize`
     to Q8_0, Q6_K and Q4_K_M;
  3. for each GGUF, llama.cpp's token ids on the tokenizer corpus and its greedy generation
     with teacher-forced top-5 logits (`llamacpp-refdump`, the settings of
     tests/fixtures/llamacpp/README.md), written as tests/fixtures/tokenizer/<name>.json and
     tests/fixtures/llamacpp/<name>.json.

The tiny model's GGUFs (well under a megabyte each) and its checkpoint are written to
tests/fixtures/gguf-gemma4/ and committed; the mid-size model's (hidden 256, every matrix in
whole 256-value blocks, so Q4_K_M is Q4_K where llama.cpp would choose it) go to --work only
and are rebuilt by this script.

Usage:
  python3 scripts/reference/make_gemma4_gguf_fixtures.py --llama-cpp SRC --build BUILD \
      --refdump REFDUMP --work /tmp/g4gguf [--models tiny,mid]
Needs torch, transformers 5.17, tokenizers, numpy, sentencepiece (the converter imports it).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_llamacpp_fixtures as ref  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
S, F = "sliding_attention", "full_attention"
FIRST = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
CONTROLS = ["<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
            "<tool_response|>", '<|"|>', "<|channel>", "<channel|>", "<|think|>"]
QUANTS = ["Q8_0", "Q6_K", "Q4_K_M"]


def rope():
    return {S: {"rope_type": "default", "rope_theta": 10000.0},
            F: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}


# The tiny shape is the tiny fixtures' (tests/fixtures/tiny/gemma4-tiny); the mid shape has
# KV-shared layers, both attention types, per-layer inputs and the double-wide MLP with every
# row a whole number of 256-value blocks. In both, the last layer that owns KV is full
# attention and the one before it sliding, as llama.cpp's KV sharing requires.
MODELS = {
    "tiny": dict(vocab=512, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, global_head_dim=32, hidden_size_per_layer_input=8,
                 num_kv_shared_layers=3, layer_types=[S, S, F, S, S, F], sliding_window=5, steps=300, seq=64),
    "mid": dict(vocab=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=8, num_attention_heads=2,
                num_key_value_heads=1, head_dim=128, global_head_dim=256, hidden_size_per_layer_input=256,
                num_kv_shared_layers=3, layer_types=[S, S, S, S, F, S, S, F], sliding_window=32, steps=200,
                seq=128),
}


def corpus_text() -> str:
    """The repository's docs: English, Markdown, code and tables, the same on every machine."""
    files = sorted(glob.glob(str(REPO / "docs" / "*.md"))) + [str(REPO / "README.md")]
    return "\n\n".join(Path(f).read_text(encoding="utf-8") for f in files)


def make_tokenizer(vocab_size: int, text: str, out: Path) -> Tokenizer:
    """A Gemma-style BPE of exactly `vocab_size` ids: FIRST and CONTROLS, the 256 byte tokens,
    then learned characters and merges (padded with unused tokens if the corpus runs out)."""
    fixed = FIRST + CONTROLS + [f"<0x{b:02X}>" for b in range(256)]
    learn = vocab_size - len(fixed)
    t = Tokenizer(models.BPE(byte_fallback=True))
    t.normalizer = normalizers.Replace(" ", "\u2581")
    t.pre_tokenizer = pre_tokenizers.Split(Regex("\n+"), behavior="isolated")
    trainer = trainers.BpeTrainer(vocab_size=learn, show_progress=False, limit_alphabet=120)
    t.train_from_iterator([text], trainer=trainer)
    learned = json.loads(t.to_str())["model"]
    items = sorted(learned["vocab"].items(), key=lambda kv: kv[1])
    vocab = {tok: i for i, tok in enumerate(fixed)}
    for tok, _ in items:
        if tok not in vocab and len(vocab) < vocab_size:
            vocab[tok] = len(vocab)
    merges = [m for m in learned["merges"]
              if all(p in vocab for p in (m if isinstance(m, list) else m.split(" ")))
              and "".join(m if isinstance(m, list) else m.split(" ")) in vocab]
    while len(vocab) < vocab_size:
        vocab[f"<unused{len(vocab)}>"] = len(vocab)
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, c in enumerate(FIRST + CONTROLS)]
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\n+"}, "behavior": "Isolated", "invert": False},
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    template = (REPO / "tests" / "fixtures" / "templates" / "gemma4.jinja").read_text(encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
        # As in Gemma-4's own file: the turn and tool markers are special (control tokens in the
        # GGUF), so that `<|turn>` in a rendered chat becomes one token.
        "additional_special_tokens": CONTROLS + ["<mask>"],
        "chat_template": template, "model_max_length": 4096}, ensure_ascii=False), encoding="utf-8")
    return Tokenizer.from_str(json.dumps(doc, ensure_ascii=False))


def make_checkpoint(name: str, spec: dict, out: Path) -> None:
    text = corpus_text()
    tok = make_tokenizer(spec["vocab"], text, out)
    ids = torch.tensor([2] + tok.encode(text, add_special_tokens=False).ids)
    cfg = Gemma4TextConfig(
        vocab_size=spec["vocab"], vocab_size_per_layer_input=spec["vocab"],
        hidden_size=spec["hidden_size"], intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"], num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"], head_dim=spec["head_dim"],
        global_head_dim=spec["global_head_dim"], hidden_size_per_layer_input=spec["hidden_size_per_layer_input"],
        num_kv_shared_layers=spec["num_kv_shared_layers"], use_double_wide_mlp=True,
        layer_types=list(spec["layer_types"]), sliding_window=spec["sliding_window"],
        final_logit_softcapping=30.0, rms_norm_eps=1e-6, max_position_embeddings=4096, rope_parameters=rope(),
        bos_token_id=2, eos_token_id=1, pad_token_id=0, tie_word_embeddings=True)
    torch.manual_seed(20261205)
    model = Gemma4ForCausalLM(cfg).float()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(7)
    seq, batch = spec["seq"], 8
    model.train()
    for step in range(spec["steps"]):
        starts = torch.randint(0, len(ids) - seq - 1, (batch,), generator=gen)
        x = torch.stack([ids[s:s + seq] for s in starts])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == spec["steps"] - 1:
            print(f"{name}: step {step} loss {loss.item():.3f}", flush=True)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    (out / "train.json").write_text(json.dumps({"steps": spec["steps"], "final_loss": loss.item(),
                                                "corpus_tokens": len(ids)}))


def hf_reference(ckpt: Path) -> None:
    """`reference.safetensors` beside the checkpoint: 48 token ids of the corpus (BOS first)
    and transformers' f32 logits for them, with the checkpoint's weights as stored
    (`logits`) and with its matrices rounded to bf16 as the BF16 GGUF holds them
    (`logits_bf16_weights`)."""
    from safetensors.torch import save_file
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    ids = torch.tensor([[2] + tok.encode(PROMPTS[1][1] + " " + PROMPTS[0][1], add_special_tokens=False).ids[:47]])
    model = Gemma4ForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        exact = model(input_ids=ids).logits[0]
        # The converter stores matrices in bf16 and vectors (norms, scales) in f32.
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
        rounded = model(input_ids=ids).logits[0]
    save_file({"input_ids": ids[0].to(torch.int64), "logits": exact.contiguous(),
               "logits_bf16_weights": rounded.contiguous()}, str(ckpt / "reference.safetensors"),
              metadata={"transformers": __import__("transformers").__version__, "torch": torch.__version__})


def run(cmd, **kw):
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(list(map(str, cmd)), check=True, **kw)


def convert(llama_cpp: Path, build: Path, ckpt: Path, dest: Path, stem: str) -> list[Path]:
    env = dict(os.environ, PYTHONPATH=str(llama_cpp / "gguf-py"))
    bf16 = dest / f"{stem}-BF16.gguf"
    run([sys.executable, llama_cpp / "convert_hf_to_gguf.py", ckpt, "--outtype", "bf16", "--outfile", bf16],
        env=env, stdout=subprocess.DEVNULL)
    files = [bf16]
    for q in QUANTS:
        path = dest / f"{stem}-{q}.gguf"
        run([build / "bin" / "llama-quantize", bf16, path, q], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        files.append(path)
    return files


def convert_assistant(llama_cpp: Path, tiny_ckpt: Path, work: Path, dest: Path) -> None:
    """The tiny assistant (tests/fixtures/tiny/gemma4-tiny-assistant, whose shapes fit the
    tiny target) converted to `gemma4-assistant` GGUFs in F32 and BF16. llama.cpp's converter
    drops the ordered-embedding (centroid) head, so the checkpoint converted is the fixture's
    with `use_ordered_embeddings` off: both then score the whole vocabulary, and the tests
    compare the GGUF drafter with the checkpoint loaded that way."""
    src = REPO / "tests/fixtures/tiny/gemma4-tiny-assistant"
    hf = work / "gemma4-tiny-assistant-hf"
    hf.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    cfg["use_ordered_embeddings"] = False
    (hf / "config.json").write_text(json.dumps(cfg, indent=1))
    shutil.copy(src / "model.safetensors", hf / "model.safetensors")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_ckpt / f, hf / f)
    env = dict(os.environ, PYTHONPATH=str(llama_cpp / "gguf-py"))
    for outtype in ("f32", "bf16"):
        run([sys.executable, llama_cpp / "convert_hf_to_gguf.py", hf, "--outtype", outtype, "--outfile",
             dest / f"gemma4-tiny-assistant-{outtype.upper()}.gguf"], env=env, stdout=subprocess.DEVNULL)


PROMPTS = [
    ("docs_table", "| test | what it shows |\n|---|---|\n| `strata-structured` |"),
    ("docs_prose", "Strata serves Gemma-4 models over an OpenAI-compatible HTTP API. The engine"),
    ("code", "cargo test --workspace\ncargo xtask serve --model"),
]


def references(refdump: str, gguf: Path, name: str, rel: str, threads: int) -> None:
    common = {"model_file": gguf.name, "model_path": rel, "model_sha256": ref.sha256(gguf),
              "llama_cpp_commit": "0c1e570"}
    info, cases = ref.tokenize_corpus(refdump, str(gguf), ref.TOKENIZER_CORPUS + CONTROL_CASES)
    doc = dict(common, add_bos=bool(info["add_bos"]), bos_id=info["bos"], eos_id=info["eos"],
               n_vocab=info["n_vocab"], cases=cases)
    (REPO / "tests/fixtures/tokenizer" / f"{name}.json").write_text(
        json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")
    prompts = []
    for pname, text in PROMPTS:
        r = ref.gen_one(refdump, str(gguf), text, threads)
        decisive = sum(m >= 0.5 for m in r["tf_margin"])
        print(f"{name}/{pname}: {len(r['prompt_tokens'])} prompt tokens, {decisive} of {ref.N_GEN} "
              f"steps with a margin of 0.5", flush=True)
        prompts.append(dict(name=pname, prompt=text, **r))
    doc = dict(common, n_gen=ref.N_GEN, top_k=ref.TOP_K, prompts=prompts)
    (REPO / "tests/fixtures/llamacpp" / f"{name}.json").write_text(
        json.dumps(doc, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")


CONTROL_CASES = ["<|turn>user\nHello<turn|>\n<|turn>model\n", "<|channel>thought<channel|> <|think|>",
                 '<|tool_call>call:get{city:<|"|>Paris<|"|>}<tool_call|>', "\n\n\n\n  \n\t\n"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp", required=True, type=Path, help="llama.cpp source (the sdist's vendor/llama.cpp)")
    ap.add_argument("--build", required=True, type=Path, help="its cmake build directory (llama-quantize)")
    ap.add_argument("--refdump", required=True, help="llamacpp-refdump (scripts/reference/llamacpp_refdump.cpp)")
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--models", default="tiny,mid")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    for name in args.models.split(","):
        spec = MODELS[name]
        ckpt = args.work / f"gemma4-{name}" / "hf"
        if not (ckpt / "config.json").exists():
            make_checkpoint(name, spec, ckpt)
        else:
            # A checkpoint made before the special-token list: add it, keeping the trained
            # weights and the tokenizer they were trained with (the docs it learned from
            # have changed since).
            tc_path = ckpt / "tokenizer_config.json"
            tc = json.loads(tc_path.read_text(encoding="utf-8"))
            tc.setdefault("additional_special_tokens", CONTROLS + ["<mask>"])
            tc_path.write_text(json.dumps(tc, ensure_ascii=False), encoding="utf-8")
        hf_reference(ckpt)
        committed = name == "tiny"
        dest = REPO / "tests/fixtures/gguf-gemma4" if committed else args.work / f"gemma4-{name}"
        dest.mkdir(parents=True, exist_ok=True)
        if committed:
            # The checkpoint the GGUFs came from, for the BF16-against-HF check.
            shutil.rmtree(dest / "hf", ignore_errors=True)
            shutil.copytree(ckpt, dest / "hf")
        if committed:
            convert_assistant(args.llama_cpp, ckpt, args.work, dest)
        for gguf in convert(args.llama_cpp, args.build, ckpt, dest, f"gemma4-{name}"):
            rel = str(gguf.relative_to(REPO)) if committed else f"$STRATA_GEMMA4_GGUF/{gguf.name}"
            stem = gguf.stem.lower().replace("_", "-")
            references(args.refdump, gguf, stem, rel, args.threads)


if __name__ == "__main__":
    main()
