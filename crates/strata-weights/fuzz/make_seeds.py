#!/usr/bin/env python3
"""Writes the seed corpus for the fuzz targets (needs `pip install gguf numpy`).

    python3 crates/strata-weights/fuzz/make_seeds.py

Seeds are small valid files covering every tensor type and metadata value type, plus a few
hand-made corrupt ones; tests/corrupt.rs replays everything under corpus/.
"""
import json
import os
import struct

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(7)


def gguf_seed(path, types):
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint8("a.u8", 1)
    w.add_int16("a.i16", -2)
    w.add_float64("a.f64", 0.5)
    w.add_bool("a.bool", False)
    w.add_array("a.arr", [1.0, 2.0])
    w.add_array("a.strs", ["x"])
    for qtype in types:
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, size=(2, type_size), dtype=np.uint8)
        if qtype == T.F32:
            w.add_tensor(f"t.{qtype.name}", rng.standard_normal((2, 4)).astype(np.float32))
        else:
            w.add_tensor(f"t.{qtype.name}", raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def safetensors_seed(path, tensors, metadata=None):
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    js = json.dumps(header).encode()
    js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js + data)


def main():
    g = os.path.join(HERE, "corpus", "gguf_header")
    s = os.path.join(HERE, "corpus", "safetensors_header")
    os.makedirs(g, exist_ok=True)
    os.makedirs(s, exist_ok=True)
    all_types = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1,
                 T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
    gguf_seed(os.path.join(g, "valid_small_types"), all_types[:8])
    gguf_seed(os.path.join(g, "valid_k_quants"), all_types[8:])
    valid = open(os.path.join(g, "valid_small_types"), "rb").read()
    open(os.path.join(g, "truncated_in_tensor_info"), "wb").write(valid[: len(valid) // 3])
    open(os.path.join(g, "bad_magic"), "wb").write(b"GGUG" + valid[4:])
    # tensor count 2^62
    open(os.path.join(g, "absurd_tensor_count"), "wb").write(valid[:8] + struct.pack("<Q", 1 << 62) + valid[16:])

    f32 = np.arange(6, dtype=np.float32).tobytes()
    bf16 = (np.arange(6, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    f16 = np.arange(6, dtype=np.float16).tobytes()
    safetensors_seed(os.path.join(s, "valid"), [("a", "F32", [2, 3], f32), ("b", "BF16", [6], bf16),
                                                 ("c", "F16", [3, 2], f16), ("d", "U8", [2], b"\x01\x02")],
                     {"format": "pt"})
    open(os.path.join(s, "absurd_header_len"), "wb").write(struct.pack("<Q", (1 << 64) - 1) + b"{}")
    open(os.path.join(s, "json_garbage"), "wb").write(struct.pack("<Q", 6) + b"{\"a\":[")
    open(os.path.join(s, "non_utf8_key"), "wb").write(struct.pack("<Q", 8) + b"{\"\xff\xfe\":1}")
    safetensors_seed(os.path.join(s, "offsets_out_of_range"), [("a", "F32", [2], f32[:8])])
    bad = open(os.path.join(s, "offsets_out_of_range"), "rb").read().replace(b"[0, 8]", b"[0, 9]")
    open(os.path.join(s, "offsets_out_of_range"), "wb").write(bad)
    safetensors_seed(os.path.join(s, "shape_size_mismatch"), [("a", "F32", [3], f32[:8])])
    safetensors_seed(os.path.join(s, "shape_overflow"), [("a", "F32", [2**62, 2**62], b"")])


if __name__ == "__main__":
    main()
