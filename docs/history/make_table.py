#!/usr/bin/env python3
"""Print docs/history/benchmarks.csv as Markdown: one table per figure, newest first.

Usage: python3 docs/history/make_table.py [--csv FILE] [--figure TEXT] [--list]

Rows are ordered by date (newest first; rows without a date last, in file order), then by
their order in the file. --figure keeps the figures whose name contains TEXT
(case-insensitive); --list prints the figure names only. Python 3 standard library only.
"""
import argparse
import csv
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def cell(text):
    return (text or "").replace("|", "\\|")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=os.path.join(HERE, "benchmarks.csv"))
    ap.add_argument("--figure", default="")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)

    rows = load(args.csv)
    figures = {}
    for i, r in enumerate(rows):
        if args.figure.lower() in r["figure"].lower():
            figures.setdefault(r["figure"], []).append((i, r))

    if args.list:
        for name in figures:
            print(name)
        return 0

    for name, items in figures.items():
        # Newest first: dated rows by date descending, then undated rows in file order
        # (the docs list undated history oldest first, so reverse it).
        dated = sorted((x for x in items if x[1]["date"]), key=lambda x: (x[1]["date"], -x[0]),
                       reverse=True)
        undated = [x for x in items if not x[1]["date"]][::-1]
        unit = items[0][1]["unit"]
        print(f"### {name} ({unit})\n")
        print("| value | commit | date | machine | command | note |")
        print("|---:|---|---|---|---|---|")
        for _, r in dated + undated:
            commit = f"`{r['commit']}`" if r["commit"] else ""
            command = f"`{r['command']}`" if r["command"] else ""
            print(f"| {cell(r['value'])} | {commit} | {r['date']} | {cell(r['machine'])} | "
                  f"{cell(command)} | {cell(r['note'])} |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
