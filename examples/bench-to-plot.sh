#!/bin/sh
# bench-to-plot.sh - run `fasa bench`, keep its rows as CSV and JSON, and draw them as a PNG.
#
# usage: examples/bench-to-plot.sh [ca|ppl] [MODEL [WORKDIR]]
#   ca   compound contextual agreement of each policy against K (default)
#   ppl  perplexity of each policy against the budget N, full attention as a dashed line
#   MODEL    default: models/SmolLM2-135M-Instruct.Q4_1.gguf (with its profile beside it)
#   WORKDIR  default: ${TMPDIR:-/tmp}/fasa-example
# Writes WORKDIR/bench-TASK.csv, bench-TASK.json and bench-TASK.png.
#
# Plotting needs gnuplot (Debian: apt-get install gnuplot-nox) or, failing that, python3 with
# matplotlib (apt-get install python3-matplotlib); PLOTTER=gnuplot or PLOTTER=python picks one.
# The settings are small so that a run takes under a minute or two on two cores; pass more with
# BENCH_ARGS, e.g. BENCH_ARGS="--tokens 4096 --steps 256" (those given later win).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
task=${1:-ca}
model=${2:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
work=${3:-${TMPDIR:-/tmp}/fasa-example}
if [ -z "${FASA:-}" ]; then
    FASA=$(command -v fasa || true)
    [ -n "$FASA" ] || FASA=$root/bin/fasa
fi

run() {
    printf '+ %s\n' "$*" >&2
    "$@"
}

case $task in
ca)  small="--tokens 1024 --steps 32 --k 32,64,128,256,512" ;;
ppl) small="--context 1024 --steps 32 --budget 64,128,256 --policy full,fasa-1/4,fasa-1/8,oracle,stream,quest" ;;
*)   echo "usage: $0 [ca|ppl] [MODEL [WORKDIR]]" >&2; exit 2 ;;
esac

# Pick the plotter before the (slow) benchmark.
plotter=${PLOTTER:-}
if [ -z "$plotter" ]; then
    if command -v gnuplot >/dev/null 2>&1; then plotter=gnuplot
    elif python3 -c 'import matplotlib' >/dev/null 2>&1; then plotter=python
    else
        echo "$0: plotting needs gnuplot (apt-get install gnuplot-nox) or python3 with matplotlib" \
             "(apt-get install python3-matplotlib)" >&2
        exit 1
    fi
fi

mkdir -p "$work"
csv=$work/bench-$task.csv
json=$work/bench-$task.json
png=$work/bench-$task.png

# shellcheck disable=SC2086 # the settings are words
run "$FASA" bench "$model" --task "$task" $small ${BENCH_ARGS:-} --csv "$csv" --json > "$json"
echo "rows: $csv, $json" >&2

# The CSV's columns: task,policy,budget,context,depth,value,layer (for ca, budget holds K; ca also
# writes "mass" rows, the attention probability each selection holds: only the "ca" rows of all
# layers are plotted).
if [ "$task" = ca ]; then
    xlabel="K (top-K tokens compared)"; ylabel="compound contextual agreement (%)"; scale=100
    title="contextual agreement with the head's own top-K"
else
    xlabel="budget N (tokens attended per query)"; ylabel="perplexity"; scale=1
    title="perplexity after a dense prefill, decoding under each policy"
fi

if [ "$plotter" = gnuplot ]; then
    # full attention has one row (budget 0): a horizontal line at its value
    full=$(awk -F, 'NR > 1 && $2 == "full" { print $6 }' "$csv" | head -n 1)
    policies=$(awk -F, 'NR > 1 && $2 != "full" && !seen[$2]++ { printf "%s ", $2 }' "$csv")
    run gnuplot <<EOF
set terminal pngcairo size 900,560 noenhanced
set output '$png'
set datafile separator ','
set key outside right
set grid
set offsets graph 0, 0, 0.05, 0.05
set logscale x 2
set title "$title"
set xlabel "$xlabel"
set ylabel "$ylabel"
plot for [p in "$policies"] '$csv' every ::1 using 3:(strcol(2) eq p && strcol(1) eq "$task" && strcol(7) eq "" ? \$6 * $scale : NaN) \
        with linespoints title p${full:+, $full * $scale with lines dashtype 2 linecolor rgb 'black' title 'full'}
EOF
else
    run python3 - "$json" "$png" "$task" "$xlabel" "$ylabel" "$title" <<'EOF'
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

path, png, task, xlabel, ylabel, title = sys.argv[1:7]
rows = json.load(open(path))
series, full = {}, None
for r in rows:
    if task == "ca":
        if "ca" in r and "layer" not in r:
            series.setdefault(r["method"], []).append((r["k"], 100 * r["ca"]))
    elif r["policy"] == "full":
        full = r["value"]
    else:
        series.setdefault(r["policy"], []).append((r["budget"], r["value"]))
fig, ax = plt.subplots(figsize=(9, 5.6))
for name, pts in series.items():
    pts.sort()
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
if full is not None:
    ax.axhline(full, color="black", linestyle="--", label="full")
ax.set_xscale("log", base=2)
xs = sorted({x for pts in series.values() for x, _ in pts})
ax.set_xticks(xs, [str(x) for x in xs])
ax.minorticks_off()
ax.set_xlabel(xlabel)
ax.set_ylabel(ylabel)
ax.set_title(title)
ax.grid(True, alpha=0.3)
ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
fig.tight_layout()
fig.savefig(png, dpi=100)
EOF
fi
echo "plot: $png ($plotter)" >&2
