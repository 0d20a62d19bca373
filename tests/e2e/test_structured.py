"""Structured outputs through the `openai` client on SmolLM2: `response_format` (JSON Schema,
JSON object) and vLLM's `guided_*` fields. Every output is checked with Python's `jsonschema`,
`re` or the list of choices, greedy and sampled."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from helpers import assert_api_error, get, post

S = {"type": "string", "maxLength": 24}
# Integers are bounded too: a small model otherwise writes digits until max_tokens.
I = {"type": "integer", "minimum": -1000, "maximum": 1000}

SCHEMAS = {
    "person": {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
               "required": ["name", "age"], "additionalProperties": False},
    "boolean_flag": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    "enum_colour": {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
                    "required": ["colour"]},
    "const_version": {"type": "object", "properties": {"version": {"const": 2}, "tag": S},
                      "required": ["version", "tag"]},
    "bounded_number": {"type": "object", "properties": {"t": {"type": "number", "minimum": -40, "maximum": 60,
                                                             "multipleOf": 0.5}},
                       "required": ["t"]},
    "integer_array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                      "minItems": 2, "maxItems": 5},
    "string_array": {"type": "object", "properties": {"tags": {"type": "array", "items": S, "maxItems": 3}},
                     "required": ["tags"]},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": I, "email": S},
                 "required": ["id", "email"], "additionalProperties": False}},
        "required": ["user"], "additionalProperties": False},
    "array_of_objects": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"sku": S, "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
        "required": ["sku", "qty"], "additionalProperties": False}},
    "any_of": {"type": "object", "properties": {"value": {"anyOf": [I, {"type": "boolean"}]}},
               "required": ["value"]},
    "optional_fields": {"type": "object", "properties": {"a": S, "b": I, "c": {"type": "boolean"}},
                        "required": ["a"], "additionalProperties": False},
    "pattern_date": {"type": "object", "properties": {
        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}}, "required": ["date"]},
    "pattern_code": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"}},
                     "required": ["code"], "additionalProperties": False},
    "null_or_string": {"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 20}},
                       "required": ["note"]},
    "tuple_items": {"type": "array", "prefixItems": [I, S, {"type": "boolean"}],
                    "items": False, "minItems": 3},
    "ref_defs": {"$defs": {"point": {"type": "object", "properties": {"x": I, "y": I},
                                     "required": ["x", "y"], "additionalProperties": False}},
                 "type": "object", "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
                 "required": ["from", "to"], "additionalProperties": False},
    "string_lengths": {"type": "object", "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 8}},
                       "required": ["word"]},
    "exclusive_bounds": {"type": "object", "properties": {"p": {"type": "integer", "exclusiveMinimum": 0,
                                                               "exclusiveMaximum": 10}}, "required": ["p"]},
    "one_of_shapes": {"type": "object", "properties": {"shape": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1}},
         "required": ["kind", "r"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1}},
         "required": ["kind", "side"], "additionalProperties": False}]}}, "required": ["shape"]},
    "all_of": {"allOf": [{"type": "object", "properties": {"a": I, "b": S}, "required": ["a"],
                          "additionalProperties": False}, {"required": ["b"]}]},
    "enum_mixed": {"type": "object", "properties": {"level": {"enum": [1, 2, 3, "max", None]}}, "required": ["level"]},
    "deep_nesting": {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {
        "type": "object", "properties": {"c": {"type": "array", "items": I, "maxItems": 3}},
        "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]},
}



def closed(schema):
    """Objects take only their listed properties (as OpenAI's strict mode requires), so that
    outputs stay short; `allOf` branches are left as written."""
    if isinstance(schema, dict):
        out = {k: (v if k == "allOf" else closed(v)) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out and "allOf" not in schema:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


SCHEMAS = {name: closed(s) for name, s in SCHEMAS.items()}

PROMPT = "Reply with one small JSON value for a test named '{name}'."


def ask(client, name, schema, sampled):
    extra = {"temperature": 0.8, "seed": 7} if sampled else {"temperature": 0}
    r = client.chat.completions.create(
        model=client.model_name, max_tokens=120,
        messages=[{"role": "user", "content": PROMPT.format(name=name)}],
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
        **extra)
    return r.choices[0]


@pytest.fixture(scope="module")
def smol_client(smol):
    from openai import OpenAI

    c = OpenAI(base_url=smol.v1, api_key="unused", max_retries=0, timeout=300)
    c.model_name = smol.model_name
    return c


def test_every_output_validates_against_its_schema(smol_client):
    assert len(SCHEMAS) >= 20
    jobs = [(n, s, sampled) for n, s in SCHEMAS.items() for sampled in (False, True)]
    with ThreadPoolExecutor(8) as pool:
        choices = list(pool.map(lambda j: ask(smol_client, *j), jobs))
    for (name, schema, sampled), choice in zip(jobs, choices):
        text = choice.message.content
        assert choice.finish_reason == "stop", (name, sampled, text)
        jsonschema.validate(json.loads(text), schema)


def test_json_object_choice_regex_and_grammar(smol, smol_client):
    few_shot = 'Objects:\n{"ok": true}\n{"ok": false}\n'
    r = post(smol, "/v1/completions", {"prompt": few_shot, "max_tokens": 60, "temperature": 0,
                                       "response_format": {"type": "json_object"}}).json()
    assert isinstance(json.loads(r["choices"][0]["text"]), dict), r

    base = {"model": smol.model_name, "prompt": "Q: Is the sky blue?\nA:", "max_tokens": 20}
    for extra in ({"temperature": 0}, {"temperature": 1.0, "seed": 3}):
        body = {**base, **extra}
        got = post(smol, "/v1/completions", {**body, "guided_choice": ["yes", "no", "maybe not"]}).json()
        assert got["choices"][0]["text"] in ("yes", "no", "maybe not"), got
        got = post(smol, "/v1/completions", {**body, "guided_regex": r"[0-9]{3}-[a-z]{2,4}"}).json()
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", got["choices"][0]["text"]), got
        grammar = 'start: "The answer is " ANSWER "."\nANSWER: "yes" | "no"'
        got = post(smol, "/v1/completions", {**body, "guided_grammar": grammar}).json()
        assert got["choices"][0]["text"] in ("The answer is yes.", "The answer is no."), got
    # Streamed pieces put together equal the constrained text.
    stream = smol_client.completions.create(model=smol.model_name, prompt=base["prompt"], max_tokens=20,
                                            temperature=0, stream=True,
                                            extra_body={"guided_choice": ["yes", "no", "maybe not"]})
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text in ("yes", "no", "maybe not")


def metric(server, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.eE+-]+)$", get(server, "/metrics").text, re.M)
    assert m, f"{name} is not in /metrics"
    return float(m.group(1))


def test_masks_and_their_host_time_are_counted(smol):
    masks, seconds = (metric(smol, n) for n in ("strata_structured_masks_total",
                                                 "strata_structured_mask_seconds_total"))
    r = post(smol, "/v1/completions", {"prompt": "Q: Is the sky blue?\nA:", "max_tokens": 20,
                                       "temperature": 0, "guided_regex": "[a-z]{4,6}"}).json()
    # A mask a token drawn, the end of sequence after the last letter included.
    drawn = r["usage"]["completion_tokens"]
    assert metric(smol, "strata_structured_masks_total") - masks >= drawn
    assert metric(smol, "strata_structured_mask_seconds_total") > seconds


@pytest.mark.parametrize("extra, field", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"guided_json": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}, "guided_json"),
    ({"guided_regex": "[a-"}, "guided_regex"),
    ({"guided_grammar": "start: ("}, "guided_grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice"),
])
def test_bad_grammars_are_refused_naming_the_field(smol, extra, field):
    r = post(smol, "/v1/completions", {"prompt": "hi", "max_tokens": 4, **extra})
    assert_api_error(r, 400)
    assert r.json()["error"]["param"] == field, r.text


def test_prompt_lookup_drafts_under_a_schema_keep_the_plain_text(smol, log_dir):
    """`--prompt-lookup`: constrained requests take speculative rounds, each checked row
    masked by the grammar after the drafts before it. On a prompt whose answer copies part
    of it, drafts are kept and the text equals the plain server's, greedy and seeded."""
    from conftest import SMOL, start_server

    schema = SCHEMAS["person"]
    prompt = ('Records:\n{"name": "Ada Lovelace", "age": 36}\n{"name": "Alan Turing", "age": 41}\n'
              'Repeat the first record exactly:\n')
    bodies = [{"prompt": prompt, "max_tokens": 40, "guided_json": schema, **extra}
              for extra in ({"temperature": 0}, {"temperature": 0.7, "seed": 5})]
    want = [post(smol, "/v1/completions", {"model": smol.model_name, **b}).json() for b in bodies]
    srv = start_server(log_dir, "--prompt-lookup", "3", "--draft-tokens", "4", name="smol-lookup",
                       model=SMOL)
    try:
        got = [post(srv, "/v1/completions", {"model": srv.model_name, **b}).json() for b in bodies]
        for w, g in zip(want, got):
            text = g["choices"][0]["text"]
            assert text == w["choices"][0]["text"], (w, g)
            jsonschema.validate(json.loads(text), schema)
        assert metric(srv, "strata_spec_accepted_tokens_total") > 0
        assert metric(srv, "strata_structured_masks_total") > 0
    finally:
        srv.stop()
