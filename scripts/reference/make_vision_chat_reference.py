#!/usr/bin/env python3
"""transformers 5.17's answers to chat requests with images, for the served end-to-end test
(tests/e2e/test_images.py): the tiny Gemma-4 vision checkpoint
(tests/fixtures/tiny/gemma4-tiny-vision) with the byte-level tokenizer of
scripts/bench/byte_tokenizer.py (Gemma-4's image markers at ids 500-502, as the checkpoint's
config says; the other free ids as `<unusedN>` tokens), Gemma-4's chat template (tests/fixtures/templates/gemma4.jinja), and the image
processor at patch 4, pooling 2, 70 soft tokens an image (the `processor_config.json` the test
writes beside the checkpoint).

For each conversation: the template's text (transformers' renderer, images as `{"type":
"image"}` parts), its ids, each `<|image|>` expanded as `Gemma4Processor` does (boi, one
placeholder a soft token, eoi), and `generate`'s 8 greedy tokens with the images'
`pixel_values` from `Gemma4ImageProcessorPil` on tests/fixtures/media/image_{0,1}.png.

Writes tests/fixtures/media/chat_reference.json.

Usage:  python3 scripts/reference/make_vision_chat_reference.py
"""
import json
import sys
from pathlib import Path

import torch
from PIL import Image
from tokenizers import Tokenizer
from transformers import Gemma4ForConditionalGeneration
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
from transformers.utils.chat_template_utils import render_jinja_template

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "bench"))
import byte_tokenizer  # noqa: E402

MODEL = REPO / "tests" / "fixtures" / "tiny" / "gemma4-tiny-vision"
MEDIA = REPO / "tests" / "fixtures" / "media"
TEMPLATE = REPO / "tests" / "fixtures" / "templates" / "gemma4.jinja"
IMAGE, BOI, EOI = 500, 501, 502
PATCH, POOL, SOFT = 4, 2, 70
NEW_TOKENS = 8
MARKERS = {IMAGE: "<|image|>", BOI: "<|image>", EOI: "<image|>"}
VOCAB = 512


def image(name):
    return {"type": "image_url", "image_url": {"url": f"fixture:{name}"}}


def text(t):
    return {"type": "text", "text": t}


# OpenAI-style messages; the test swaps each `fixture:` URL for the file's data: URL.
CONVERSATIONS = {
    "one_image": [{"role": "user", "content": [text("Describe: "), image("image_0.png")]}],
    "two_images": [{"role": "user", "content": [image("image_1.png"), text("and"), image("image_0.png")]}],
    "image_then_text": [{"role": "user", "content": [image("image_0.png"), text("What is it?")]}],
    "second_turn": [
        {"role": "user", "content": [image("image_0.png"), text("What is it?")]},
        {"role": "assistant", "content": "A picture."},
        {"role": "user", "content": [image("image_1.png"), text("And this?")]},
    ],
}


def hf_messages(messages):
    """The template's view: image parts as `{"type": "image"}`; the images in order."""
    out, files = [], []
    for m in messages:
        if isinstance(m["content"], str):
            out.append(m)
            continue
        parts = []
        for p in m["content"]:
            if p["type"] == "text":
                parts.append(p)
            else:
                parts.append({"type": "image"})
                files.append(p["image_url"]["url"].removeprefix("fixture:"))
        out.append({"role": m["role"], "content": parts})
    return out, files


def main():
    tok_json = byte_tokenizer.tokenizer_json(extra=MARKERS, vocab_size=VOCAB)
    tok = Tokenizer.from_str(json.dumps(tok_json))
    template = TEMPLATE.read_text()
    proc = Gemma4ImageProcessorPil(patch_size=PATCH, pooling_kernel_size=POOL, max_soft_tokens=SOFT)
    model = Gemma4ForConditionalGeneration.from_pretrained(MODEL, dtype=torch.float32).eval()
    # The server stops at EOS and at the end of a turn.
    eos = [1, tok.token_to_id("<turn|>")]
    cases = {}
    for name, messages in CONVERSATIONS.items():
        hf, files = hf_messages(messages)
        rendered = render_jinja_template([hf], chat_template=template, add_generation_prompt=True,
                                         bos_token="<bos>", eos_token="<eos>")[0][0]
        ids = tok.encode(rendered, add_special_tokens=False).ids
        assert ids.count(IMAGE) == len(files), (name, ids.count(IMAGE))
        px = proc([Image.open(MEDIA / f) for f in files], return_tensors="pt")
        soft = px["num_soft_tokens_per_image"]
        expanded, k = [], 0
        for t in ids:
            if t == IMAGE:
                expanded += [BOI] + [IMAGE] * int(soft[k]) + [EOI]
                k += 1
            else:
                expanded.append(t)
        inp = torch.tensor([expanded])
        with torch.no_grad():
            out = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp),
                                 pixel_values=px["pixel_values"], image_position_ids=px["image_position_ids"],
                                 max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=0)
        new = out[0, len(expanded):].tolist()
        # What the server returns: the text up to (not including) a stop token.
        shown = []
        for t in new:
            if t in eos:
                break
            shown.append(t)
        cases[name] = {"messages": messages, "rendered": rendered, "prompt_tokens": len(expanded),
                       "soft_tokens": [int(s) for s in soft], "greedy": new,
                       "text": tok.decode(shown, skip_special_tokens=True),
                       # Each token's text alone, control tokens as nothing (a lone byte of a longer
                       # character is U+FFFD).
                       "pieces": [tok.decode([t], skip_special_tokens=True) for t in shown]}
        print(f"{name}: {len(expanded)} prompt ids ({[int(s) for s in soft]} soft tokens), greedy {new}")
    out = {"transformers": __import__("transformers").__version__, "torch": torch.__version__,
           "processor": {"patch_size": PATCH, "pooling_kernel_size": POOL, "max_soft_tokens": SOFT},
           "cases": cases}
    (MEDIA / "chat_reference.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
