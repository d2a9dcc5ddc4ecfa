#!/usr/bin/env bash
# ruler-runs.sh - a RULER table as one run per length, sample and task, resumable.
#
#   scripts/ruler-runs.sh [options] DIR       (options before or after DIR)
#     -m MODEL     the GGUF (default models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf)
#     -c LENGTHS   comma-separated context lengths (default 4096)
#     -s SAMPLES   samples: K, or K-L (default 1)
#     -p POLICIES  as fasa bench --policy (default full,default)
#     -b BUDGETS   as fasa bench --budget (default 256,1024)
#     -t TASKS     comma-separated tasks (default RULER's 13)
#     -n           print the runs still to do and stop
#
# Each run is `fasa bench MODEL --task ruler --context C --first-sample S --samples 1 --tasks T
# --budget B --policy P --show --json`, written to DIR/C-sS-T.json (its --show output beside it,
# .log) through a temporary file, so a run cut off leaves nothing; a second call skips what is
# there. A 32k sample of the 1.5B takes hours on two cores: this is how it survives a machine
# that stops. At the end the table of what DIR holds for these lengths and samples (every policy
# it holds):
#   python3 examples/plot_ruler.py DIR/C-s*-*.json --table
# FASA (environment) names the binary (default bin/fasa).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FASA="${FASA:-$ROOT/bin/fasa}"
MODEL="$ROOT/models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"
LENGTHS=4096 SAMPLES=1 POLICIES=full,default BUDGETS=256,1024 DRY=0
TASKS=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3
TASKS+=,niah_multivalue,niah_multiquery,vt,cwe,fwe,qa_1,qa_2

die() { printf 'ruler-runs: %s\n' "$*" >&2; exit 2; }
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }

# options before or after DIR
operands=()
while [ $# -gt 0 ]; do
    OPTIND=1
    while getopts ":m:c:s:p:b:t:nh" o; do
        case "$o" in
        m) MODEL="$OPTARG" ;; c) LENGTHS="$OPTARG" ;; s) SAMPLES="$OPTARG" ;;
        p) POLICIES="$OPTARG" ;; b) BUDGETS="$OPTARG" ;; t) TASKS="$OPTARG" ;;
        n) DRY=1 ;; h) usage; exit 0 ;;
        :) die "option -$OPTARG needs a value (-h for help)" ;;
        *) die "unknown option -$OPTARG (-h for help)" ;;
        esac
    done
    shift $((OPTIND - 1))
    if [ $# -gt 0 ]; then operands+=("$1"); shift; fi
done
[ ${#operands[@]} -eq 1 ] || die "one DIR expected, got ${#operands[@]} (-h for help)"
DIR="${operands[0]}"
[[ "$SAMPLES" =~ ^([1-9][0-9]*)(-([1-9][0-9]*))?$ ]] || die "samples '$SAMPLES': K or K-L"
S0="${BASH_REMATCH[1]}" S1="${BASH_REMATCH[3]:-${BASH_REMATCH[1]}}"
[ "$S0" -le "$S1" ] || die "samples '$SAMPLES': K after L"
[[ "$LENGTHS" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "lengths '$LENGTHS': numbers, comma-separated"
[[ "$TASKS" =~ ^[a-z0-9_]+(,[a-z0-9_]+)*$ ]] || die "tasks '$TASKS': names, comma-separated"
[ -x "$FASA" ] || die "'$FASA': no such program (make, or FASA=...)"
[ -f "$MODEL" ] || die "'$MODEL': no such file"
mkdir -p "$DIR" || die "'$DIR': cannot create"

# a run is done when its file holds the task's rows
done_run() { [ -s "$1" ] && grep -q '"score"' "$1"; }

todo=() files=()
IFS=, read -r -a lens <<<"$LENGTHS"
IFS=, read -r -a tasks <<<"$TASKS"
for c in "${lens[@]}"; do
    for ((s = S0; s <= S1; s++)); do
        for t in "${tasks[@]}"; do
            files+=("$DIR/$c-s$s-$t.json")
            done_run "$DIR/$c-s$s-$t.json" || todo+=("$c $s $t")
        done
    done
done
if [ "$DRY" = 1 ]; then
    printf '%s\n' "${todo[@]+"${todo[@]}"}" | sed '/^$/d'
    exit 0
fi

n=${#todo[@]} k=0 spent=0
for run in "${todo[@]+"${todo[@]}"}"; do
    read -r c s t <<<"$run"
    k=$((k + 1))
    out="$DIR/$c-s$s-$t.json"
    t0=$(date +%s)
    if ! "$FASA" bench "$MODEL" --task ruler --context "$c" --first-sample "$s" --samples 1 --tasks "$t" \
        --budget "$BUDGETS" --policy "$POLICIES" --show --json >"$out.tmp" 2>"$out.log.tmp"; then
        last="$(tail -n 1 "$out.log.tmp")"
        rm -f "$out.tmp" "$out.log.tmp"
        die "$c tokens, sample $s, $t: $last"
    fi
    mv -f "$out.log.tmp" "$out.log"
    mv -f "$out.tmp" "$out"
    dt=$(($(date +%s) - t0)) spent=$((spent + dt))
    printf 'ruler-runs: [%d/%d] %s tokens, sample %s, %s: %d s (left about %d min)\n' "$k" "$n" "$c" "$s" "$t" \
        "$dt" $(((n - k) * spent / k / 60)) >&2
done

if command -v python3 >/dev/null; then
    python3 "$ROOT/examples/plot_ruler.py" "${files[@]}" --table
else
    printf 'ruler-runs: %d runs in %s; python3 examples/plot_ruler.py merges them\n' "${#files[@]}" "$DIR" >&2
fi
