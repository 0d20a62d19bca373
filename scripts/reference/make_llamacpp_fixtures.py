#!/usr/bin/env python3
"""Produce llama.cpp reference fixtures for the real small GGUF models.

Drives the `llamacpp-refdump` program (scripts/reference/llamacpp_refdump.cpp, built against
libllama) and writes:

  tests/fixtures/llamacpp/<model>.json    greedy generations + top-k logits per generated position
  tests/fixtures/tokenizer/<model>.json   token ids for a corpus of tricky strings

Usage:
  python3 make_llamacpp_fixtures.py --refdump /path/to/llamacpp-refdump \
      --models models --out tests/fixtures [--commit 0c1e570] [--threads 2]
Only the Python standard library is needed.
"""
import argparse
import hashlib
import json
import os
import subprocess
import tempfile

N_GEN = 64
TOP_K = 5

MODELS = {
    "gemma-3-270m": "gemma-3-270m-q4_k_m.gguf",
    "smollm2-135m-instruct": "SmolLM2-135M-Instruct.Q4_1.gguf",
}


def long_log_prompt():
    """A deterministic English text of well over 512 tokens (a made-up ship's log)."""
    winds = ["north", "north-east", "east", "south-east", "south", "south-west", "west", "north-west"]
    sights = ["a flock of gulls", "a distant sail", "floating timber", "a pod of dolphins", "low grey clouds",
              "a lighthouse on the cliffs", "a fishing boat", "a rainbow over the swell", "an iceberg",
              "the coastline at dawn"]
    moods = ["The crew was cheerful.", "The cook burned the bread again.", "Two sailors fell ill with fever.",
             "We mended the mainsail.", "The captain studied the charts until midnight.",
             "Rations were cut by a quarter.", "A storm seemed to be gathering in the west."]
    lines = ["The following is the log kept aboard the schooner Marigold during her voyage of 1852."]
    for day in range(1, 37):
        w = winds[(day * 3) % len(winds)]
        k = 4 + (day * 7) % 23
        s = sights[(day * 5) % len(sights)]
        m = moods[(day * 2) % len(moods)]
        lines.append(f"Day {day}: wind from the {w} at {k} knots; we sighted {s}. {m}")
    lines.append("Day 37:")
    return "\n".join(lines)


def long_code_prompt():
    """A deterministic Python listing of well over 512 tokens."""
    parts = ["# Utility functions for a small inventory system.\n", "import math\n\n"]
    names = ["apples", "bolts", "cables", "drills", "engines", "filters", "gaskets", "hinges", "inks", "jacks",
             "knobs", "lamps", "motors", "nails", "oils", "pumps"]
    for i, n in enumerate(names):
        parts.append(
            f"def restock_{n}(stock, amount={10 + i}):\n"
            f"    \"\"\"Add {10 + i} {n} unless the shelf already holds more than {100 + 5 * i}.\"\"\"\n"
            f"    if stock.get(\"{n}\", 0) > {100 + 5 * i}:\n"
            f"        return stock\n"
            f"    stock[\"{n}\"] = stock.get(\"{n}\", 0) + amount\n"
            f"    return stock\n\n")
    parts.append("def total_value(stock, prices):\n")
    return "".join(parts)


PROMPTS = {
    "gemma-3-270m": [
        ("short_english", "The capital of France is"),
        ("story", "Once upon a time, in a small village by the sea, there lived an old fisherman who"),
        ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
        ("unicode_digits", "Café, naïve, 東京 and Zürich: 3.14159 × 2 = 6.28318; 12345678901234567890 is large. 🎉 Next:"),
        ("qa", "Question: What is 17 multiplied by 23?\nAnswer:"),
        ("long_log_gt512", long_log_prompt()),
    ],
    "smollm2-135m-instruct": [
        ("short_english", "The capital of France is"),
        ("chat", "<|im_start|>user\nWhat is the tallest mountain in the world?<|im_end|>\n<|im_start|>assistant\n"),
        ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
        ("unicode_digits", "Café, naïve, 東京 and Zürich: 3.14159 × 2 = 6.28318; 12345678901234567890 is large. 🎉 Next:"),
        ("story", "Once upon a time, in a small village by the sea, there lived an old fisherman who"),
        ("long_code_gt512", long_code_prompt()),
    ],
}

TOKENIZER_CORPUS = [
    "",
    " ",
    "Hello world",
    " hello",
    "Hello, World! How are you today?",
    "HELLO hello Hello hElLo",
    "Don't you're I'll we've they'd it's",
    "a  b   c    d     e",
    "trailing spaces   ",
    "\ttab\tseparated\tvalues\t",
    "line one\nline two\n\nline four\n\n\n",
    "windows\r\nline\r\nendings",
    "   leading spaces and\n   indented lines",
    "café naïve résumé Ångström façade",
    "e\u0301 (e + combining acute) vs é",
    "Привет, мир! Καλημέρα κόσμε.",
    "你好，世界！这是一个测试。",
    "東京は日本の首都です。カタカナ、ひらがな。",
    "안녕하세요 세계",
    "مرحبا بالعالم",
    "שלום עולם",
    "नमस्ते दुनिया",
    "👍 🎉🎉 😀😃😄",
    "👍🏽 family: 👨\u200d👩\u200d👧\u200d👦 flag: 🇫🇷",
    "non\u00a0breaking\u00a0space and zero\u200bwidth",
    "0 1 12 123 1234 12345 123456",
    "1234567890123456789012345678901234567890",
    "3.14159265358979323846 -42 +7 1e-10 6.02e23",
    "1,000,000.00 and 1 000 000 and 1_000_000",
    "2024-01-15T10:30:00Z 12:34:56",
    "0x1F 0b1010 0o777 #ff00aa",
    "def add(a, b):\n    return a + b\n\n\nclass Foo:\n    def bar(self):\n        pass\n",
    "int main(void) {\n\tfor (int i = 0; i < 10; ++i) {\n\t\tprintf(\"%d\\n\", i);\n\t}\n\treturn 0;\n}\n",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "<div class=\"x\">&amp; &lt;tag&gt;</div>",
    "https://example.com/path?query=1&other=two#frag user@example.org",
    "∀x∈ℝ: x² ≥ 0, ∑ᵢ aᵢ ≠ ∞, α+β=γ",
    "!!!???... --- *** ___ ~~~ ``` ''' \"\"\"",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after bos<eos>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|endoftext|> <pad> <unk> [INST] </s>",
    "<start_of_image> <mask> <unused0>",
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run(cmd):
    r = subprocess.run(cmd, capture_output=True)
    if r.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {r.stderr.decode(errors='replace')[-2000:]}")
    return r.stdout.decode()


def parse_topk(fields):
    ids, logits = [], []
    for p in fields:
        i, v = p.split(":")
        ids.append(int(i))
        logits.append(float(v))
    return ids, logits


def gen_one(refdump, model_path, text, threads):
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(text.encode("utf-8"))
        fname = f.name
    try:
        out = run([refdump, "gen", model_path, fname, str(N_GEN), str(TOP_K), str(threads)])
    finally:
        os.unlink(fname)
    res = {"prompt_tokens": None, "greedy_tokens": [], "top5_ids": [], "top5_logits": [], "margin": [],
           "tf_top5_ids": [], "tf_top5_logits": [], "tf_margin": []}
    for line in out.splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == "prompt":
            res["prompt_tokens"] = [int(x) for x in f[2:]]
            assert len(res["prompt_tokens"]) == int(f[1])
        elif f[0] in ("step", "tf"):
            ids, logits = parse_topk(f[3:])
            pre = "" if f[0] == "step" else "tf_"
            if f[0] == "step":
                res["greedy_tokens"].append(int(f[2]))
            res[pre + "top5_ids"].append(ids)
            res[pre + "top5_logits"].append(logits)
            res[pre + "margin"].append(logits[0] - logits[1])
    assert len(res["greedy_tokens"]) == N_GEN and len(res["tf_top5_ids"]) == N_GEN
    res["tf_argmax_agrees"] = [a == b[0] for a, b in zip(res["greedy_tokens"], res["tf_top5_ids"])]
    return res


def tokenize_corpus(refdump, model_path, corpus):
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        for t in corpus:
            b = t.encode("utf-8")
            f.write(f"{len(b)}\n".encode() + b + b"\n")
        fname = f.name
    try:
        out = run([refdump, "tokenize", model_path, fname])
    finally:
        os.unlink(fname)
    lines = out.splitlines()
    head = lines[0].split()
    info = {head[i]: int(head[i + 1]) for i in range(0, len(head), 2)}
    plain = [l for l in lines[1:] if l.startswith("plain ")]
    special = [l for l in lines[1:] if l.startswith("special ")]
    assert len(plain) == len(corpus) == len(special)
    cases = []
    for t, p, s in zip(corpus, plain, special):
        pi = [int(x) for x in p.split()[2:]]
        si = [int(x) for x in s.split()[2:]]
        cases.append({"text": t, "ids": pi, "ids_parse_special": si})
    return info, cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--refdump", required=True)
    ap.add_argument("--models", default="models")
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--commit", default="0c1e570")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated subset: tokenizer,gen")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else {"tokenizer", "gen"}
    os.makedirs(os.path.join(args.out, "llamacpp"), exist_ok=True)
    os.makedirs(os.path.join(args.out, "tokenizer"), exist_ok=True)
    settings = {
        "flash_attn": "disabled", "type_k": "f32", "type_v": "f32", "use_extra_bufts (repack)": False,
        "n_gpu_layers": 0, "n_threads": args.threads, "n_threads_batch": args.threads,
        "n_ctx": 4096, "n_batch": 4096, "n_ubatch": 512,
        "tokenize": "llama_tokenize(add_special=true, parse_special=true)",
        "sampling": "argmax over raw logits (lowest id on ties); no penalties; end-of-generation tokens do not stop",
    }
    for key, fname in MODELS.items():
        path = os.path.join(args.models, fname)
        common = {"model_file": fname, "model_sha256": sha256(path), "llama_cpp_commit": args.commit}
        if "tokenizer" in only:
            info, cases = tokenize_corpus(args.refdump, path, TOKENIZER_CORPUS)
            doc = dict(common)
            doc.update({
                "add_bos": bool(info["add_bos"]), "bos_id": info["bos"], "eos_id": info["eos"],
                "n_vocab": info["n_vocab"],
                "fields": {"ids": "llama_tokenize(add_special=true, parse_special=false)",
                           "ids_parse_special": "llama_tokenize(add_special=true, parse_special=true)"},
                "cases": cases,
            })
            p = os.path.join(args.out, "tokenizer", key + ".json")
            with open(p, "w", encoding="utf-8") as f:
                json.dump(doc, f, ensure_ascii=False, indent=1)
            print("wrote", p, os.path.getsize(p), flush=True)
        if "gen" in only:
            prompts = []
            for name, text in PROMPTS[key]:
                r = gen_one(args.refdump, path, text, args.threads)
                entry = {"name": name, "prompt": text}
                entry.update(r)
                prompts.append(entry)
                ok = sum(r["tf_argmax_agrees"])
                print(f"{key}/{name}: {len(r['prompt_tokens'])} prompt tokens, min margin {min(r['margin']):.4g}, "
                      f"batched argmax agrees {ok}/{N_GEN}", flush=True)
            doc = dict(common)
            doc.update({"n_gen": N_GEN, "top_k": TOP_K, "settings": settings, "prompts": prompts})
            p = os.path.join(args.out, "llamacpp", key + ".json")
            with open(p, "w", encoding="utf-8") as f:
                json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
            print("wrote", p, os.path.getsize(p), flush=True)


if __name__ == "__main__":
    main()
