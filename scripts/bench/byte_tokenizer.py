#!/usr/bin/env python3
"""Writes a byte-level `tokenizer.json` laid out as Gemma's (`<pad>`, `<eos>`, `<bos>` at 0, 1, 2,
the 256 bytes after them, then Gemma-4's control tokens) into a checkpoint directory that has
none, such as a random-weight checkpoint at a real shape: enough for chat templates, stop ids
and grammars (the model's rows past these ids are never drawn under a grammar).

    python3 scripts/bench/byte_tokenizer.py CHECKPOINT_DIR

Only the standard library is used.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

FIRST = ["<pad>", "<eos>", "<bos>"]
CONTROLS = ["<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
            "<tool_response|>", '<|"|>', "<|channel>", "<channel|>", "<|think|>"]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as a printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tokenizer_json(extra: dict[int, str] | None = None, vocab_size: int = 0) -> dict:
    """The tokenizer; `extra` adds control tokens at given ids (a checkpoint's image markers),
    and the ids below `vocab_size` left free become plain `<unusedN>` tokens, so that any id a
    random model draws decodes to a text that names it."""
    vocab = {ch: 3 + b for b, ch in bytes_to_unicode().items()}
    ids = list(enumerate(FIRST)) + [(259 + i, c) for i, c in enumerate(CONTROLS)] + sorted((extra or {}).items())
    taken = set(vocab.values()) | {i for i, _ in ids}
    vocab.update({f"<unused{i}>": i for i in range(vocab_size) if i not in taken})
    # As in real files, the added tokens are in the model's vocabulary too.
    vocab.update({c: i for i, c in ids})
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, c in ids]
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": level, "post_processor": None, "decoder": level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": False, "vocab": vocab, "merges": []}}


def servable_dir(fixture: Path, out: Path, markers: dict[int, str], processor: dict) -> Path:
    """`fixture`'s config and weights copied into `out`, with this tokenizer carrying
    `markers` (ids within a 512-id vocabulary), Gemma's BOS and EOS names (the chat
    template writes them) and `processor` as its `processor_config.json`: a tiny multimodal
    checkpoint made servable."""
    for f in ("config.json", "generation_config.json", "model.safetensors"):
        if (fixture / f).exists():
            shutil.copy(fixture / f, out / f)
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(extra=markers, vocab_size=512)))
    (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    (out / "processor_config.json").write_text(json.dumps(processor))
    return out


if __name__ == "__main__":
    out = Path(sys.argv[1]) / "tokenizer.json"
    out.write_text(json.dumps(tokenizer_json()))
    print(f"wrote {out}")
