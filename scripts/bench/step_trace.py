#!/usr/bin/env python3
"""Sums a `strata serve --step-trace` CSV by kind of step: where a served run's time went.

Usage: step_trace.py TRACE.csv [--from MS] [--to MS]

Kinds: `overlapped` (a decode step queued behind the one before it; the call's time is
mostly the wait for that one), `decode` (one-token rows only, read at once), `mixed`
(prompt chunks, with or without one-token rows), `read` (the call only read a queued
step); `launch_ms` is the part of a call the host spent queueing its step. `gap` is the
time between calls (the engine thread's own work: client updates,
commands). Prints one line a kind and a JSON summary last.

`--runs` first splits the trace where no step ran for 500 ms (the warm-up, then each
benchmark run against the server) and prints a line a part: its span, steps, one-token
rows (the decode tokens it made) over the span, and how the decode calls' rows spread
(a client that keeps fewer requests in flight than its concurrency shows up here).
"""
import argparse
import csv
import json


def print_runs(rows, idle_ms=500.0):
    parts, prev_end = [], None
    for r in rows:
        start = float(r["start_ms"])
        if prev_end is None or start - prev_end >= idle_ms:
            parts.append([])
        parts[-1].append(r)
        prev_end = start + float(r["step_ms"])
    for i, part in enumerate(parts):
        t0 = float(part[0]["start_ms"])
        span = float(part[-1]["start_ms"]) + float(part[-1]["step_ms"]) - t0
        decode = [int(r["single_rows"]) for r in part if int(r["chunk_tokens"]) == 0 and int(r["single_rows"]) > 0]
        mixed = sum(1 for r in part if int(r["chunk_tokens"]) > 0)
        made = sum(int(r["single_rows"]) for r in part)
        top = max(decode, default=0)
        spread = {f">={f:.0%} of {top}": sum(1 for x in decode if x >= f * top) for f in (1.0, 0.9, 0.5)}
        print(f"part {i}: from {t0:.0f} ms, span {span:.1f} ms, {len(decode)} decode + {mixed} mixed calls, "
              f"{made} one-token rows ({made / span * 1e3 if span else 0:.0f} a second), "
              f"decode calls {spread}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--from", dest="lo", type=float, default=0.0, help="skip steps before this ms")
    ap.add_argument("--to", dest="hi", type=float, default=float("inf"), help="skip steps from this ms")
    ap.add_argument("--runs", action="store_true", help="a line for each part between idle spells")
    a = ap.parse_args()
    with open(a.trace, newline="") as f:
        rows = [r for r in csv.DictReader(f) if a.lo <= float(r["start_ms"]) < a.hi]
    if a.runs:
        print_runs(rows)
    kinds = {}
    gap = 0.0
    prev_end = None
    for r in rows:
        start, ms = float(r["start_ms"]), float(r["step_ms"])
        single, chunk = int(r["single_rows"]), int(r["chunk_tokens"])
        if chunk > 0:
            kind = "mixed"
        elif single == 0:
            kind = "read"
        elif r["overlapped"] == "1":
            kind = "overlapped"
        else:
            kind = "decode"
        k = kinds.setdefault(kind, {"steps": 0, "ms": 0.0, "launch_ms": 0.0, "rows": 0, "chunk_tokens": 0})
        k["steps"] += 1
        k["ms"] += ms
        k["launch_ms"] += float(r["launch_ms"])
        k["rows"] += single
        k["chunk_tokens"] += chunk
        if prev_end is not None and start - prev_end < 50:  # a wait for work is not a gap
            gap += start - prev_end
        prev_end = start + ms
    span = (prev_end - float(rows[0]["start_ms"])) if rows else 0.0
    for name, k in sorted(kinds.items(), key=lambda kv: -kv[1]["ms"]):
        mean_rows = k["rows"] / k["steps"]
        print(f"{name:>10}: {k['steps']:6d} calls {k['ms']:10.1f} ms ({k['ms'] / k['steps']:.2f} ms a call, "
              f"{k['launch_ms'] / k['steps']:.2f} queueing), "
              f"{mean_rows:.1f} one-token rows a call, {k['chunk_tokens']} prompt tokens")
    print(f"{'gaps':>10}: {gap:.1f} ms; span {span:.1f} ms")
    print(json.dumps({"span_ms": span, "gap_ms": gap, "kinds": kinds}))


if __name__ == "__main__":
    main()
