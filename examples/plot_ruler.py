#!/usr/bin/env python3
"""Score against length per policy from `fasa bench --task ruler` output.

    fasa bench MODEL --task ruler --json > ruler.json
    python3 examples/plot_ruler.py ruler.json [-o ruler.png] [--tasks]
    python3 examples/plot_ruler.py part1.json part2.csv --table

Reads the JSON rows {"task","length","policy","budget","score","samples"} (or the CSV that
--csv writes). Several files are runs of the same table over other samples (`--first-sample`):
each task's score is their mean weighted by samples, and the mean over the tasks is taken again
from those. Draws the mean over the tasks against length, one line per policy and budget;
--tasks adds one panel per task. With matplotlib it writes a PNG (-o); without it, it prints the
same numbers. --table prints a Markdown table per length instead (tasks by policies).
"""
import argparse
import csv
import json
import os
import signal
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("["):
        rows = json.loads(text)
        for r in rows:
            if not all(isinstance(r.get(k), str) for k in ("task", "policy")) or \
               not all(isinstance(r.get(k), (int, float)) for k in ("length", "budget", "score", "samples")):
                raise ValueError(f"a row without task, length, policy, budget, score and samples: {r}")
        return rows
    rows = []
    for r in csv.DictReader(text.splitlines()):   # bench's CSV: task,policy,budget,context,...,value,...,extra
        rows.append({"task": r["task"], "policy": r["policy"], "budget": int(r["budget"]),
                     "length": int(r["context"]), "score": float(r["value"]), "samples": float(r["extra"])})
    return rows


def merge(rows):
    """Per (task, length, policy, budget): the sample-weighted mean over the files; then the
    mean over the tasks, again, from those (a task missing somewhere makes it a mean of fewer)."""
    acc = defaultdict(lambda: [0.0, 0.0])
    for r in rows:
        if r["task"] != "mean":
            a = acc[(r["task"], r["length"], r["policy"], r["budget"])]
            a[0] += r["score"] * r["samples"]
            a[1] += r["samples"]
    out = [{"task": t, "length": L, "policy": p, "budget": b, "score": s / n, "samples": n}
           for (t, L, p, b), (s, n) in acc.items() if n > 0]
    means = defaultdict(list)
    for r in out:
        means[(r["length"], r["policy"], r["budget"])].append(r)
    for (L, p, b), rs in means.items():
        out.append({"task": "mean", "length": L, "policy": p, "budget": b,
                    "score": sum(r["score"] for r in rs) / len(rs), "samples": min(r["samples"] for r in rs)})
    return out


def label(r):
    return r["policy"] if r["budget"] == 0 else f'{r["policy"]} N={r["budget"]}'


def series(rows, task):
    s = defaultdict(dict)
    for r in rows:
        if r["task"] == task:
            s[label(r)][r["length"]] = r["score"]
    return s


def table(rows):
    """A Markdown table per length: a row per task (in the files' order) and the mean; a column
    per policy and budget; the sample counts (least to most, when the cells differ) in the corner."""
    for L in sorted({r["length"] for r in rows}):
        at = [r for r in rows if r["length"] == L]
        cols = list(dict.fromkeys(label(r) for r in at))
        tasks = [t for t in dict.fromkeys(r["task"] for r in at) if t != "mean"] + ["mean"]
        cell = {(r["task"], label(r)): r for r in at}
        n = [r["samples"] for r in at if r["task"] != "mean"]
        count = f"{min(n):g}" if min(n) == max(n) else f"{min(n):g} to {max(n):g}"
        print(f"| {L:,} tokens, {count} samples | " + " | ".join(cols) + " |")
        print("|---" * (len(cols) + 1) + "|")
        for t in tasks:
            print(f"| {t} | " + " | ".join(f'{cell[(t, c)]["score"]:.3f}' if (t, c) in cell else "-" for c in cols) + " |")
        print()


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # `| head` ends it quietly, as a shell tool
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", nargs="+", help="JSON or CSV of fasa bench --task ruler, one or more runs")
    ap.add_argument("-o", "--output", default="ruler.png")
    ap.add_argument("--tasks", action="store_true", help="a panel per task as well")
    ap.add_argument("--table", action="store_true", help="print Markdown tables instead of plotting")
    a = ap.parse_args()
    rows = []
    for path in a.rows:
        try:
            got = load(path)
        except OSError as e:
            sys.exit(f"plot_ruler: '{path}': cannot read: {e.strerror}")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            sys.exit(f"plot_ruler: '{path}': not fasa bench --task ruler output ({e.__class__.__name__}: {e})")
        if not got:
            sys.exit(f"plot_ruler: '{path}': no rows")
        rows += got
    rows = merge(rows)
    if a.table:
        table(rows)
        return 0
    tasks = sorted({r["task"] for r in rows if r["task"] != "mean"})
    panels = ["mean"] + (tasks if a.tasks else [])
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        for t in panels:
            print(f"== {t}")
            for lab, pts in sorted(series(rows, t).items()):
                print(f"  {lab:28s}" + "".join(f"  {L}: {100 * v:5.1f}" for L, v in sorted(pts.items())))
        return 0
    cols = min(len(panels), 4)
    fig, axes = plt.subplots((len(panels) + cols - 1) // cols, cols, figsize=(4.5 * cols, 3.4 * ((len(panels) + cols - 1) // cols)),
                             squeeze=False)
    for ax, t in zip(axes.flat, panels):
        for lab, pts in sorted(series(rows, t).items()):
            xs = sorted(pts)
            ax.plot(xs, [100 * pts[x] for x in xs], marker="o", label=lab)
        ax.set_xscale("log", base=2)
        ax.set_title(t)
        ax.set_xlabel("length (tokens)")
        ax.set_ylabel("score, %")
        ax.set_ylim(-2, 102)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    tmp = a.output + ".tmp.png"   # written whole, then renamed: no half-written PNG
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, a.output)
    print(f"wrote {a.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
