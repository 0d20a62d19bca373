"""Evaluation through the completions endpoint: `echo` with prompt logprobs, and
lm-evaluation-harness's `local-completions` model on tasks written here from in-repo text.

Every logprob is checked against `strata score` (teacher-forced logits, itself checked against
transformers and llama.cpp), log-softmaxed here in float64.
"""

from __future__ import annotations

import json
import subprocess
import textwrap

import numpy as np
import pytest

from conftest import BIN, REPO, SMOL
from helpers import assert_api_error, post

TOL = 1e-4


def score_logprobs(ids: list[int], tmp_path) -> np.ndarray:
    """log-softmax of `strata score`'s logits: row p is the distribution after ids[:p+1]."""
    ids_file, out = tmp_path / "ids.json", tmp_path / "logits.f32"
    ids_file.write_text(json.dumps(ids))
    subprocess.run([str(BIN), "score", "--model", str(SMOL), "--ids", str(ids_file), "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    logits = np.fromfile(out, dtype="<f4").astype(np.float64).reshape(len(ids), -1)
    m = logits.max(axis=1, keepdims=True)
    return logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))


def tokenize(server, text: str, special: bool = True) -> list[int]:
    r = post(server, "/tokenize", {"prompt": text, "add_special_tokens": special})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def piece(server, t: int) -> str:
    return post(server, "/detokenize", {"tokens": [t]}).json()["prompt"]


def test_echo_returns_the_prompts_logprobs(smol, tmp_path):
    server = smol
    ids = tokenize(server, "Strata serves Gemma models over an OpenAI-compatible HTTP API.")
    ref = score_logprobs(ids, tmp_path)
    body = {"model": server.model_name, "prompt": ids, "echo": True, "logprobs": 3,
            "max_tokens": 1, "temperature": 0}
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for p in range(1, len(ids)):
        assert abs(lp["token_logprobs"][p] - ref[p - 1, ids[p]]) < TOL, p
        # The top three, most likely first, as the reference ranks them.
        best = np.argsort(-ref[p - 1])[:3]
        got = list(lp["top_logprobs"][p].items())
        assert [k for k, _ in got] == [piece(smol, int(t)) for t in best], p
        assert all(abs(v - ref[p - 1, t]) < TOL for (_, v), t in zip(got, best)), p
    # The one generated token is the greedy one after the prompt, scored the same way.
    nxt = int(np.argmax(ref[-1]))
    assert lp["tokens"][-1] == piece(smol, nxt)
    assert abs(lp["token_logprobs"][-1] - ref[-1, nxt]) < TOL
    assert choice["text"].endswith(piece(smol, nxt))
    assert r.json()["usage"]["prompt_tokens"] == len(ids)

    # Text prompts come back as sent; max_tokens 0 returns the prompt alone.
    text = "The capital of France is"
    r = post(smol, "/v1/completions", {"prompt": [text, text + " Paris"], "echo": True,
                                         "max_tokens": 0, "logprobs": 0})
    assert r.status_code == 200, r.text
    a, b = r.json()["choices"]
    assert (a["text"], b["text"]) == (text, text + " Paris")
    assert a["finish_reason"] == "length" and r.json()["usage"]["completion_tokens"] == 0
    assert b["logprobs"]["token_logprobs"][: len(a["logprobs"]["tokens"])] == a["logprobs"]["token_logprobs"]


@pytest.mark.parametrize("body, field", [
    ({"prompt": "hi", "echo": True, "stream": True}, "echo"),
    ({"prompt": [], "echo": True}, "prompt"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "echo": True, "logprobs": 21}, "logprobs"),
])
def test_bad_echo_requests_name_the_field(smol, body, field):
    r = post(smol, "/v1/completions", body)
    assert_api_error(r, 400)
    assert r.json()["error"]["param"] == field, r.text


MC_DOCS = [
    {"question": "Strata is an engine that serves language models over an",
     "choices": [" OpenAI-compatible HTTP API.", " overhead projector."], "answer": 0},
    {"question": "Layers that share their KV cache own",
     "choices": [" twice the memory.", " no KV of their own."], "answer": 1},
]


def rolling_docs() -> list[str]:
    """Short paragraphs of the repository's own docs."""
    paras = [p.strip() for p in (REPO / "docs" / "STATUS.md").read_text().split("\n\n")]
    return [p for p in paras if 80 < len(p) < 300 and not p.startswith("|")][:2]


def write_tasks(tmp_path) -> None:
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(d) + "\n" for d in MC_DOCS))
    docs = rolling_docs()
    assert len(docs) == 2
    (tmp_path / "roll.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    (tmp_path / "strata_mc.yaml").write_text(textwrap.dedent(f"""\
        task: strata_mc
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {tmp_path / 'mc.jsonl'}
        test_split: test
        output_type: multiple_choice
        doc_to_text: "{{{{question}}}}"
        doc_to_choice: "{{{{choices}}}}"
        doc_to_target: "{{{{answer}}}}"
        metric_list:
          - metric: acc
        """))
    (tmp_path / "strata_roll.yaml").write_text(textwrap.dedent(f"""\
        task: strata_roll
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {tmp_path / 'roll.jsonl'}
        test_split: test
        output_type: loglikelihood_rolling
        doc_to_text: ""
        doc_to_target: "{{{{text}}}}"
        metric_list:
          - metric: word_perplexity
        """))


def test_lm_eval_harness_agrees_with_strata_score(smol, tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_tasks(tmp_path)
    lm = get_model("local-completions")(
        base_url=smol.v1 + "/completions", model=smol.model_name,
        tokenizer_backend="remote", num_concurrent=1, max_retries=1, batch_size=4)
    out = lm_eval.simple_evaluate(model=lm, tasks=["strata_mc", "strata_roll"],
                                  task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
                                  log_samples=True)
    samples = out["samples"]

    # Multiple choice: each choice's logprob is the sum over its tokens given the question.
    assert len(samples["strata_mc"]) == len(MC_DOCS)
    for s in samples["strata_mc"]:
        for (context, continuation), resp in zip(s["arguments"], s["filtered_resps"]):
            ctx, cont = lm._encode_pair(context, continuation)
            ids = ctx + cont
            ref = score_logprobs(ids, tmp_path)
            want = sum(ref[p - 1, ids[p]] for p in range(len(ctx), len(ids)))
            greedy = all(ids[p] == int(np.argmax(ref[p - 1])) for p in range(len(ctx), len(ids)))
            assert abs(resp[0] - want) < TOL, (continuation, resp, want)
            assert resp[1] == greedy

    # Rolling: each document's tokens after the end-of-text token, one window each.
    assert len(samples["strata_roll"]) == 2
    for s in samples["strata_roll"]:
        text = s["arguments"][0][0]
        ids = [lm.prefix_token_id] + lm.tok_encode(text)
        assert len(ids) <= lm.max_length
        ref = score_logprobs(ids, tmp_path)
        want = sum(ref[p - 1, ids[p]] for p in range(1, len(ids)))
        assert abs(s["filtered_resps"][0] - want) < TOL, (s["filtered_resps"], want)
