"""LoRA adapters through the HTTP API, on the tiny Llama with the random PEFT adapters of
`tests/fixtures/tiny/lora` (prompts as token ids; a byte-level tokenizer for `echo`). Each adapter's
prompt logprobs equal peft's (the fixture's reference), alone and beside other adapters;
prefixes are cached apart per adapter; adapters load and unload at run time; bad adapters
and unknown names are refused."""

from __future__ import annotations

import array
import json
import math
import shutil
import struct
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import assert_api_error, get, post

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "bench"))
import byte_tokenizer  # noqa: E402

ADMIN = "lora-admin"


def reference(path):
    """input_ids (a list) and peft's logits (`logits_base`, `logits_<adapter>`: a list of rows)
    from a safetensors file."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        values = array.array({"F32": "f", "I64": "q"}[t["dtype"]], raw[8 + n + a:8 + n + b])
        assert values.itemsize == {"F32": 4, "I64": 8}[t["dtype"]]
        cols = t["shape"][-1]
        out[name] = list(values) if len(t["shape"]) == 1 else \
            [list(values[r * cols:(r + 1) * cols]) for r in range(len(values) // cols)]
    return out


def argmax(row):
    return max(range(len(row)), key=row.__getitem__)


@pytest.fixture(scope="module")
def tiny(log_dir, tmp_path_factory):
    from conftest import REPO, start_server

    fixtures = REPO / "tests" / "fixtures" / "tiny"
    lora = fixtures / "lora" / "llama-tiny"
    # The tiny Llama with a byte-level tokenizer over its 512 ids, so that `echo` can give
    # the prompt's logprobs.
    model = tmp_path_factory.mktemp("llama-tiny-tokens")
    for f in ("config.json", "model.safetensors"):
        shutil.copy(fixtures / "llama-tiny" / f, model / f)
    tok = byte_tokenizer.tokenizer_json()
    tok["model"]["vocab"].update({f"<unused{i}>": i for i in range(len(tok["model"]["vocab"]), 512)})
    (model / "tokenizer.json").write_text(json.dumps(tok))
    srv = start_server(log_dir, "--served-model-name", "tiny", "--lora", f"attn={lora / 'attn-r4'}",
                       "--lora", f"mlp={lora / 'mlp-r8-rs'}", "--max-cpu-loras", "3", "--max-loras", "1",
                       "--page-size", "4",
                       name="lora", model=model, admin_key=ADMIN)
    srv.lora = lora
    srv.model_dir = model
    srv.ref = reference(lora / "reference.safetensors")
    yield srv
    srv.stop()


def prompt_logprobs(srv, model, ids):
    """Each prompt token's logprob given the ones before it (`echo` with `max_tokens` 0)."""
    r = post(srv, "/v1/completions", {"model": model, "prompt": ids, "max_tokens": 0, "echo": True,
                                      "logprobs": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["token_logprobs"]


def want_logprobs(logits, ids):
    """The same from peft's logits: log_softmax of row p - 1 at token p."""
    out = [None]
    for p in range(1, len(ids)):
        row = logits[p - 1]
        m = max(row)
        out.append(row[ids[p]] - m - math.log(sum(math.exp(x - m) for x in row)))
    return out


def close(got, want, what):
    assert got[0] is None and len(got) == len(want), what
    worst = max(abs(g - w) for g, w in zip(got[1:], want[1:]))
    assert worst < 2e-4, f"{what}: prompt logprobs differ from peft's by {worst}"


def test_models_lists_the_adapters_with_their_base(tiny):
    data = {m["id"]: m for m in get(tiny, "/v1/models").json()["data"]}
    assert set(data) == {"tiny", "attn", "mlp"}
    assert data["attn"]["parent"] == "tiny" and data["attn"]["lora"]["rank"] == 4
    assert data["mlp"]["lora"] == {"rank": 8, "alpha": 16.0, "rslora": True}
    assert get(tiny, "/v1/models/mlp").json()["id"] == "mlp"


def test_each_adapter_matches_peft_alone_and_beside_the_others(tiny):
    ids = list(tiny.ref["input_ids"])
    names = {"tiny": "base", "attn": "attn-r4", "mlp": "mlp-r8-rs"}
    for model, key in names.items():
        close(prompt_logprobs(tiny, model, ids), want_logprobs(tiny.ref[f"logits_{key}"], ids), model)
    # All at once, twice over: with --max-loras 1 a step takes one adapter beside the base
    # model, the others wait, and the adapters take turns on the device.
    jobs = list(names.items()) * 3
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda j: prompt_logprobs(tiny, j[0], ids), jobs))
    for (model, key), g in zip(jobs, got):
        close(g, want_logprobs(tiny.ref[f"logits_{key}"], ids), f"{model} mixed")
    metrics = {line.split()[0]: float(line.split()[1]) for line in get(tiny, "/metrics").text.splitlines()
               if line.startswith("strata_lora_")}
    assert metrics["strata_lora_adapters_resident"] <= 1, metrics
    # The two adapters took turns on the device: each uploaded more than once.
    assert metrics["strata_lora_uploads_total"] >= 3, metrics


def test_greedy_tokens_follow_the_adapter_and_prefixes_are_cached_apart(tiny):
    ids = list(tiny.ref["input_ids"])

    def first(model):
        r = post(tiny, "/v1/completions", {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"], r.json()

    def hits():
        return get(tiny, "/v1/cache/status").json()["hit_tokens"]

    post(tiny, "/v1/cache/flush", {})
    first("tiny")
    before = hits()
    # The base model's cached pages are not the adapter's: no hit.
    first("attn")
    assert hits() == before
    # The adapter's own pages are.
    first("attn")
    assert hits() > before
    # Greedy picks are the argmax of peft's last row (each adapter's differs here).
    for model, key in {"tiny": "base", "attn": "attn-r4", "mlp": "mlp-r8-rs"}.items():
        want = argmax(tiny.ref[f"logits_{key}"][-1])
        text = post(tiny, "/detokenize", {"tokens": [want]}).json()["prompt"]
        assert first(model)[0] == text, (model, want)


def test_adapters_load_and_unload_at_run_time(tiny):
    ids = list(tiny.ref["input_ids"])
    body = {"lora_name": "all", "lora_path": str(tiny.lora / "all-r2")}
    r = post(tiny, "/v1/load_lora_adapter", body)
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "all" and r.json()["parent"] == "tiny"
    close(prompt_logprobs(tiny, "all", ids), want_logprobs(tiny.ref["logits_all-r2"], ids), "all")
    # The same name again, and past --max-cpu-loras 3: refused.
    assert_api_error(post(tiny, "/v1/load_lora_adapter", body), 400)
    more = {"lora_name": "more", "lora_path": str(tiny.lora / "attn-r4")}
    r = post(tiny, "/v1/load_lora_adapter", more)
    assert_api_error(r, 400)
    assert "--max-cpu-loras" in r.json()["error"]["message"]
    r = post(tiny, "/v1/unload_lora_adapter", {"lora_name": "all"})
    assert r.status_code == 200, r.text
    assert "all" not in {m["id"] for m in get(tiny, "/v1/models").json()["data"]}
    r = post(tiny, "/v1/completions", {"model": "all", "prompt": ids, "max_tokens": 1})
    assert_api_error(r, 404)
    assert_api_error(post(tiny, "/v1/unload_lora_adapter", {"lora_name": "all"}), 404)


def test_bad_adapters_and_names_are_refused(tiny, tmp_path):
    from conftest import REPO

    other = REPO / "tests" / "fixtures" / "tiny" / "lora" / "qwen3-tiny" / "attn-r4"
    r = post(tiny, "/v1/load_lora_adapter", {"lora_name": "qwen", "lora_path": str(other)})
    assert_api_error(r, 400)
    assert r.json()["error"]["param"] == "lora_path" and "another model" in r.json()["error"]["message"]
    r = post(tiny, "/v1/load_lora_adapter", {"lora_name": "none", "lora_path": str(tmp_path)})
    assert_api_error(r, 400)
    assert "adapter_config.json" in r.json()["error"]["message"]
    # The operator's routes need the admin key.
    r = post(tiny, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(other)},
             headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = post(tiny, "/v1/completions", {"model": "no-such-adapter", "prompt": [1, 2], "max_tokens": 1})
    assert_api_error(r, 404)
    assert "attn" in r.json()["error"]["message"]


def test_a_bad_lora_flag_stops_the_start(log_dir):
    import subprocess

    from conftest import BIN, REPO

    fixtures = REPO / "tests" / "fixtures" / "tiny"
    for flag, needle in [("noequals", "NAME=DIR"),
                         (f"q={fixtures / 'lora' / 'qwen3-tiny' / 'attn-r4'}", "another model")]:
        bad = subprocess.run([str(BIN), "serve", "--model", str(fixtures / "llama-tiny"), "--port", "0",
                              "--lora", flag], capture_output=True, text=True, timeout=120)
        assert bad.returncode != 0
        assert needle in bad.stderr, bad.stderr


def write_scaled(src, dst, factor):
    """A copy of checkpoint `src` in `dst` with every tensor's values times `factor`."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    raw = (src / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body = bytearray(raw[8 + n:])
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        a, b = t["data_offsets"]
        values = array.array("f", bytes(body[a:b]))
        body[a:b] = array.array("f", (v * factor for v in values)).tobytes()
    (dst / "model.safetensors").write_bytes(raw[:8 + n] + bytes(body))


def test_weights_update_under_load_loses_no_request(tiny, log_dir, tmp_path):
    from conftest import REPO, start_server

    ids = list(tiny.ref["input_ids"])
    served = Path(get(tiny, "/v1/weights/version").json()["path"])
    assert get(tiny, "/v1/weights/version").json()["version"] == 0
    new = tmp_path / "scaled"
    write_scaled(served, new, 1.25)

    def greedy(srv, model="tiny"):
        r = post(srv, "/v1/completions", {"model": model, "prompt": ids[:12], "max_tokens": 16, "temperature": 0,
                                          "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    before = greedy(tiny)
    fresh = start_server(log_dir, "--served-model-name", "tiny", name="scaled", model=new)
    try:
        want = greedy(fresh)
    finally:
        fresh.stop()
    assert want != before, "the new weights change nothing"
    # Requests keep arriving while the new copy loads and is swapped in: every one ends
    # whole, with either the old weights' text or the new one's.
    with ThreadPoolExecutor(4) as pool:
        load = [pool.submit(greedy, tiny) for _ in range(24)]
        r = post(tiny, "/v1/weights/update", {"path": str(new)})
        texts = [f.result() for f in load]
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 1 and r.json()["success"] is True
    assert set(texts) <= {before, want}, texts
    assert greedy(tiny) == want
    assert get(tiny, "/v1/weights/version").json() == {"version": 1, "path": str(new)}
    # The adapters stay loaded, and are applied to the new weights.
    assert get(tiny, "/v1/models/attn").status_code == 200
    # Back to the first weights: the first text again, and the adapters still equal peft.
    r = post(tiny, "/v1/weights/update", {"model_path": str(served)})
    assert r.status_code == 200 and r.json()["version"] == 2, r.text
    assert greedy(tiny) == before
    close(prompt_logprobs(tiny, "attn", ids), want_logprobs(tiny.ref["logits_attn-r4"], ids), "attn after updates")
    # Weights of another shape, or no checkpoint: refused, and the served weights stay.
    other = REPO / "tests" / "fixtures" / "tiny" / "qwen3-tiny"
    for body, field in [({"path": str(other)}, "path"), ({"path": str(tmp_path / "none")}, "path"),
                        ({"path": str(new), "model_path": str(new)}, "path"),
                        ({"path": str(new), "load_format": "dummy"}, "load_format")]:
        r = post(tiny, "/v1/weights/update", body)
        assert_api_error(r, 400)
        assert r.json()["error"]["param"] == field, r.text
    assert get(tiny, "/v1/weights/version").json()["version"] == 2
    assert greedy(tiny) == before


def test_prompt_lookup_rounds_check_drafts_under_each_adapter(tiny, log_dir):
    """`--prompt-lookup`: requests on two adapters run speculative rounds (the counters move
    while only they run) whose drafts are checked under each row's adapter, and beside a
    request on none: the greedy tokens equal the plain server's for each model."""
    from conftest import start_server

    # A repeating prompt, so the lookup proposes drafts from the first step.
    ids = [7, 8, 9, 10, 11, 12] * 5
    body = lambda model: {"model": model, "prompt": ids, "max_tokens": 16, "temperature": 0}  # noqa: E731
    models = ["tiny", "attn", "mlp"]
    want = {m: post(tiny, "/v1/completions", body(m)).json()["choices"][0]["text"] for m in models}
    assert len(set(want.values())) > 1, want
    srv = start_server(log_dir, "--served-model-name", "tiny", "--lora", f"attn={tiny.lora / 'attn-r4'}",
                       "--lora", f"mlp={tiny.lora / 'mlp-r8-rs'}", "--max-loras", "2", "--page-size", "4",
                       "--prompt-lookup", "2", "--draft-tokens", "3",
                       name="lora-lookup", model=tiny.model_dir)
    try:
        def rounds():
            return sum(float(line.split()[1]) for line in get(srv, "/metrics").text.splitlines()
                       if line.startswith("strata_spec_rounds_total"))

        # The two adapters alone first: any round counted then had only adapter rows.
        before = rounds()
        with ThreadPoolExecutor(2) as pool:
            got = list(pool.map(lambda m: post(srv, "/v1/completions", body(m)), ["attn", "mlp"]))
        assert rounds() > before
        with ThreadPoolExecutor(len(models)) as pool:
            got += list(pool.map(lambda m: post(srv, "/v1/completions", body(m)), models))
        for m, r in zip(["attn", "mlp"] + models, got):
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == want[m], m
    finally:
        srv.stop()
