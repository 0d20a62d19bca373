#!/usr/bin/env python3
"""Per-kernel times of one decode step from an ncu CSV (docs/perf-notes.md).

    ncu --clock-control none --cache-control none --graph-profiling node \
        --metrics gpu__time_duration.sum --csv strata bench ... --steps 1 --warmup 1 > step.csv
    scripts/bench/ncu_step.py step.csv [TOP]

The step is the kernels after the second-to-last argmax up to the last one (one replayed
decode graph); kernels are grouped by name with their count, total and mean time.
"""
import collections
import csv
import sys


def main():
    rows = list(csv.reader(open(sys.argv[1])))
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    head_at = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    head = rows[head_at]
    name_i, value_i = head.index("Kernel Name"), head.index("Metric Value")
    kernels = [
        (r[name_i].split("(")[0].split("<")[0][:40], float(r[value_i].replace(",", "")))
        for r in rows[head_at + 1:]
        if len(r) > value_i
    ]
    ends = [i for i, (n, _) in enumerate(kernels) if n.startswith("argmax")]
    step = kernels[ends[-2] + 1:ends[-1] + 1]
    totals = collections.defaultdict(lambda: [0, 0.0])
    for n, ns in step:
        totals[n][0] += 1
        totals[n][1] += ns
    print(f"step: {len(step)} kernels, {sum(ns for _, ns in step) / 1e6:.3f} ms")
    for n, (count, ns) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{n:42s} {count:5d} {ns / 1e3:9.1f} us {ns / count / 1e3:8.1f} us")


if __name__ == "__main__":
    main()
