#!/usr/bin/env python3
"""Per-kernel times of one decode step from an ncu CSV (docs/perf-notes.md).

    ncu --clock-control none --cache-control none --graph-profiling node \
        --metrics gpu__time_duration.sum --csv strata bench ... --steps 1 --warmup 1 > step.csv
    scripts/bench/ncu_step.py step.csv [TOP] [--runs N]

The step is the kernels after the second-to-last argmax up to the last one (one replayed
decode graph); kernels are grouped by name with their count, total and mean time. With
`--runs N` every kernel of the CSV counts and the totals are divided by N (a prefill
profiled over N identical passes: `strata bench --max-kv-tokens 0 --prefill 4096`).
"""
import collections
import csv
import sys


def main():
    args = sys.argv[1:]
    runs = None
    if "--runs" in args:
        at = args.index("--runs")
        runs = int(args[at + 1])
        del args[at:at + 2]
    rows = list(csv.reader(open(args[0])))
    top = int(args[1]) if len(args) > 1 else 20
    head_at = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    head = rows[head_at]
    name_i, value_i = head.index("Kernel Name"), head.index("Metric Value")
    metric_i = head.index("Metric Name")
    # Other metrics may share the CSV (one row per kernel and metric); time the step by
    # the duration rows.
    kernels = [
        (r[name_i].split("(")[0].split("<")[0][:40], float(r[value_i].replace(",", "")))
        for r in rows[head_at + 1:]
        if len(r) > value_i and r[metric_i] == "gpu__time_duration.sum"
    ]
    if runs is None:
        ends = [i for i, (n, _) in enumerate(kernels) if n.startswith("argmax")]
        step, runs = kernels[ends[-2] + 1:ends[-1] + 1], 1
    else:
        step = kernels
    totals = collections.defaultdict(lambda: [0, 0.0])
    for n, ns in step:
        totals[n][0] += 1
        totals[n][1] += ns / runs
    print(f"step: {len(step) / runs:.0f} kernels, {sum(ns for _, ns in step) / runs / 1e6:.3f} ms")
    for n, (count, ns) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        count /= runs
        print(f"{n:42s} {count:7.1f} {ns / 1e3:9.1f} us {ns / count / 1e3:8.1f} us")


if __name__ == "__main__":
    main()
