#!/usr/bin/env python3
"""transformers 5.17's answers to chat requests with audio, for the served end-to-end test
(tests/e2e/test_audio.py): the tiny Gemma-4 audio checkpoint (tests/fixtures/tiny/gemma4-tiny-audio)
with the byte-level tokenizer of scripts/bench/byte_tokenizer.py (Gemma-4's audio markers at ids
503-505, as the checkpoint's config says; the other free ids as `<unusedN>`), Gemma-4's chat
template, and the feature extractor at 16 mel bins (the tiny tower's; the `processor_config.json`
the test writes).

Writes two WAV clips (16 kHz, 16-bit mono) to tests/fixtures/media/clip_{0,1}.wav and clip 0 as
an MP3 (LAME at 64 kb/s, `lameenc`) with libsndfile's decoding of it (`soundfile`;
mp3_reference.safetensors, for strata-media's test), then for
each conversation: its prompt size (each `<|audio|>` expanded as `Gemma4Processor` does: boa,
one placeholder a soft token, eoa) and `generate`'s 8 greedy tokens, with the clips'
`input_features` from `Gemma4AudioFeatureExtractor`. Writes
tests/fixtures/media/audio_chat_reference.json.

Usage:  python3 scripts/reference/make_audio_chat_reference.py
"""
import io
import json
import sys
import wave
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import Gemma4ForConditionalGeneration
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.utils.chat_template_utils import render_jinja_template

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "bench"))
import byte_tokenizer  # noqa: E402

MODEL = REPO / "tests" / "fixtures" / "tiny" / "gemma4-tiny-audio"
MEDIA = REPO / "tests" / "fixtures" / "media"
TEMPLATE = REPO / "tests" / "fixtures" / "templates" / "gemma4.jinja"
AUDIO, BOA, EOA = 503, 504, 505
MARKERS = {AUDIO: "<|audio|>", BOA: "<|audio>", EOA: "<audio|>"}
BINS, RATE, NEW_TOKENS, VOCAB = 16, 16_000, 8, 512


def clip(seconds, seed):
    """A chirp under noise, as 16-bit samples."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    x = 0.4 * np.sin(2 * np.pi * (200 + 900 * t) * t) + 0.05 * rng.standard_normal(t.shape)
    return np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)


def write_wav(path, samples):
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(samples.tobytes())
    path.write_bytes(buf.getvalue())


def audio(name):
    fmt = name.rsplit(".", 1)[1]
    return {"type": "input_audio", "input_audio": {"data": f"fixture:{name}", "format": fmt}}


def write_mp3(wav_path, mp3_path):
    import lameenc
    import soundfile
    from safetensors.numpy import save_file

    with wave.open(str(wav_path)) as w:
        pcm = w.readframes(w.getnframes())
    enc = lameenc.Encoder()
    enc.set_bit_rate(64)
    enc.set_in_sample_rate(RATE)
    enc.set_channels(1)
    enc.set_quality(2)
    mp3_path.write_bytes(enc.encode(pcm) + enc.flush())
    samples, rate = soundfile.read(str(mp3_path), dtype="float32")
    assert rate == RATE
    save_file({"samples": samples}, str(MEDIA / "mp3_reference.safetensors"),
              metadata={"decoder": "libsndfile " + soundfile.__libsndfile_version__})
    return samples


def text(t):
    return {"type": "text", "text": t}


CONVERSATIONS = {
    "one_clip": [{"role": "user", "content": [text("Transcribe: "), audio("clip_0.wav")]}],
    "two_clips": [{"role": "user", "content": [audio("clip_1.wav"), text("then"), audio("clip_0.wav")]}],
    "one_mp3": [{"role": "user", "content": [text("Transcribe: "), audio("clip_0.mp3")]}],
}


def main():
    clips = {"clip_0.wav": clip(0.6, 1), "clip_1.wav": clip(1.1, 2)}
    for name, samples in clips.items():
        write_wav(MEDIA / name, samples)
    # As the server reads each: 16-bit samples over 32768; the MP3 as a decoder gives it.
    waves_of = {name: s.astype(np.float32) / 32768.0 for name, s in clips.items()}
    waves_of["clip_0.mp3"] = write_mp3(MEDIA / "clip_0.wav", MEDIA / "clip_0.mp3")
    tok = Tokenizer.from_str(json.dumps(byte_tokenizer.tokenizer_json(extra=MARKERS, vocab_size=VOCAB)))
    template = TEMPLATE.read_text()
    fe = Gemma4AudioFeatureExtractor(feature_size=BINS, sampling_rate=RATE)
    model = Gemma4ForConditionalGeneration.from_pretrained(MODEL, dtype=torch.float32).eval()
    eos = [1, tok.token_to_id("<turn|>")]
    cases = {}
    for name, messages in CONVERSATIONS.items():
        hf, files = [], []
        for m in messages:
            parts = []
            for p in m["content"]:
                if p["type"] == "text":
                    parts.append(p)
                else:
                    parts.append({"type": "audio"})
                    files.append(p["input_audio"]["data"].removeprefix("fixture:"))
            hf.append({"role": m["role"], "content": parts})
        rendered = render_jinja_template([hf], chat_template=template, add_generation_prompt=True,
                                         bos_token="<bos>", eos_token="<eos>")[0][0]
        ids = tok.encode(rendered, add_special_tokens=False).ids
        assert ids.count(AUDIO) == len(files), (name, ids.count(AUDIO))
        waves = [waves_of[f] for f in files]
        feats = fe(waves, sampling_rate=RATE, return_tensors="pt")
        counts = []
        for mask in feats["input_features_mask"]:
            m = mask.numpy()
            for _ in range(2):
                m = m[::2][: (len(m) + 2 - 3) // 2 + 1]
            counts.append(int(m.sum()))
        expanded, k = [], 0
        for t in ids:
            if t == AUDIO:
                expanded += [BOA] + [AUDIO] * counts[k] + [EOA]
                k += 1
            else:
                expanded.append(t)
        inp = torch.tensor([expanded])
        with torch.no_grad():
            out = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp),
                                 input_features=feats["input_features"],
                                 input_features_mask=feats["input_features_mask"],
                                 max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=0)
        new = out[0, len(expanded):].tolist()
        shown = []
        for t in new:
            if t in eos:
                break
            shown.append(t)
        cases[name] = {"messages": messages, "prompt_tokens": len(expanded), "soft_tokens": counts,
                       "greedy": new, "pieces": [tok.decode([t], skip_special_tokens=True) for t in shown]}
        print(f"{name}: {len(expanded)} prompt ids ({counts} soft tokens), greedy {new}")
    out = {"transformers": __import__("transformers").__version__, "torch": torch.__version__,
           "feature_extractor": {"feature_size": BINS, "sampling_rate": RATE}, "cases": cases}
    (MEDIA / "audio_chat_reference.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
