#!/usr/bin/env python3
"""Summary of a gpu-suite.sh run: one table per model, printed last, with Strata's figures
next to transformers' where both exist and their ratio; also written as summary.json.

    python3 scripts/bench/summarize.py OUT_DIR
"""
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def model_rows(out, m):
    rows = []
    bench = load(os.path.join(out, f"{m}-bench.json"))
    peer = load(os.path.join(out, f"{m}-transformers.json")) or {}
    peer_prefill = {p["tokens"]: p["ms"] for p in peer.get("prefill", [])}
    peer_decode = {(d["batch"], d["depth"]): d["tokens_per_second"] for d in peer.get("decode", [])}
    if bench:
        roof = bench.get("decode_roofline_tok_s_batch1")
        for d in bench.get("decode", []):
            notes = []
            theirs = peer_decode.get((d["batch"], d["depth"]))
            if theirs:
                notes.append(f"{d['tokens_per_second'] / theirs:.2f}x transformers ({peer.get('decode_mode', '')})")
            if d["batch"] == 1 and roof:
                notes.append(f"{100 * d['tokens_per_second'] / roof:.0f}% of the {roof:.0f} tok/s roofline")
            rows.append((f"decode B={d['batch']} D={d['depth']}",
                         f"{d['tokens_per_second']:,.0f} tok/s",
                         f"{theirs:,.0f} tok/s" if theirs else "", "; ".join(notes)))
        for p in bench.get("prefill", []):
            theirs = peer_prefill.get(p["tokens"])
            rows.append((f"prefill {p['tokens']}", f"{p['ms']:.1f} ms",
                         f"{theirs:.1f} ms" if theirs else "",
                         f"{theirs / p['ms']:.2f}x faster" if theirs else ""))
    for c in (1, 100):
        s = load(os.path.join(out, f"{m}-serving-c{c}.json"))
        if s:
            rows.append((f"serving c={c}: output", f"{s['output_throughput']:,.0f} tok/s", "",
                         f"TTFT {s['ttft_ms']['mean']:.0f} ms, TPOT {s['tpot_ms']['mean']:.2f} ms mean"))
    return rows + draft_rows(out, m)


def draft_rows(out, m):
    """With an assistant (DRAFT_<M>): the rounds' costs and the served runs on written
    prompts without and with the drafter."""
    rows = []
    rounds = load(os.path.join(out, f"{m}-draft-bench.json")) or {}
    for r in rounds.get("speculative", []):
        rates = ", ".join(f"{k}: {v:,.0f}" for k, v in enumerate(r["tokens_per_second_by_kept_drafts"]))
        rows.append((f"round of {r['draft_tokens']} drafts, B={r['requests']} D={r['depth']}",
                     f"{r['draft_ms'] + r['verify_ms']:.2f} ms", "",
                     f"decode step {r['decode_step_ms']:.2f} ms; break-even {r['break_even_kept_drafts']:.2f} "
                     f"kept a request; tok/s by kept {rates}"))
    for c in (1, 100):
        plain = load(os.path.join(out, f"{m}-prompts-c{c}.json"))
        drafted = load(os.path.join(out, f"{m}-prompts-draft-c{c}.json"))
        kind = "written prompts" if (plain or drafted or {}).get("prompts") else "random ids"
        if plain:
            rows.append((f"serving c={c}, {kind}: output", f"{plain['output_throughput']:,.0f} tok/s", "", ""))
        if drafted:
            spec = drafted.get("speculative", {})
            notes = [f"kept {spec.get('kept', 0):,.0f} of {spec.get('drafted', 0):,.0f} drafts"]
            if plain:
                notes.insert(0, f"{drafted['output_throughput'] / plain['output_throughput']:.2f}x without")
            rows.append((f"serving c={c}, {kind}, drafter: output", f"{drafted['output_throughput']:,.0f} tok/s", "",
                         "; ".join(notes)))
    return rows


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    models = sorted({f.split("-")[0] for f in os.listdir(out) if f.endswith("-bench.json")})
    summary = {}
    for m in models:
        rows = model_rows(out, m)
        summary[m] = [dict(zip(("figure", "strata", "transformers", "note"), r)) for r in rows]
        print(f"\n## {m}\n")
        print("| figure | Strata | transformers | |")
        print("|---|---:|---:|---|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
