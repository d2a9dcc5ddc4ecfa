#!/usr/bin/env python3
"""Score against length per policy from `fasa bench --task ruler` output.

    fasa bench MODEL --task ruler --json > ruler.json
    python3 examples/plot_ruler.py ruler.json [-o ruler.png] [--tasks]

Reads the JSON rows {"task","length","policy","budget","score","samples"} (or the CSV that
--csv writes). Draws the mean over the tasks ("mean" rows) against length, one line per
policy and budget; --tasks adds one panel per task. With matplotlib it writes a PNG (-o);
without it, it prints the same numbers as a table.
"""
import argparse
import csv
import json
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("["):
        return json.loads(text)
    rows = []
    for r in csv.DictReader(text.splitlines()):   # bench's CSV: task,policy,budget,context,...,value,...,extra
        rows.append({"task": r["task"], "policy": r["policy"], "budget": int(r["budget"]),
                     "length": int(r["context"]), "score": float(r["value"]), "samples": float(r["extra"])})
    return rows


def series(rows, task):
    s = defaultdict(dict)
    for r in rows:
        if r["task"] == task:
            label = r["policy"] if r["budget"] == 0 else f'{r["policy"]} N={r["budget"]}'
            s[label][r["length"]] = r["score"]
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows")
    ap.add_argument("-o", "--output", default="ruler.png")
    ap.add_argument("--tasks", action="store_true", help="a panel per task as well")
    a = ap.parse_args()
    rows = load(a.rows)
    tasks = sorted({r["task"] for r in rows if r["task"] != "mean"})
    panels = ["mean"] + (tasks if a.tasks else [])
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        for t in panels:
            print(f"== {t}")
            for label, pts in sorted(series(rows, t).items()):
                print(f"  {label:28s}" + "".join(f"  {L}: {100 * v:5.1f}" for L, v in sorted(pts.items())))
        return 0
    cols = min(len(panels), 4)
    fig, axes = plt.subplots((len(panels) + cols - 1) // cols, cols, figsize=(4.5 * cols, 3.4 * ((len(panels) + cols - 1) // cols)),
                             squeeze=False)
    for ax, t in zip(axes.flat, panels):
        for label, pts in sorted(series(rows, t).items()):
            xs = sorted(pts)
            ax.plot(xs, [100 * pts[x] for x in xs], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_title(t)
        ax.set_xlabel("length (tokens)")
        ax.set_ylabel("score, %")
        ax.set_ylim(-2, 102)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)
    print(f"wrote {a.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
