#!/bin/sh
# calibrate-convert-run.sh - the whole FASA pipeline on one model:
#   1. fasa calibrate   rank every head's frequency chunks on a sample text -> a profile
#   2. fasa convert     reorder each KV head's q/k rows by that ranking      -> one .fasa bundle
#   3. fasa run         decode from the bundle with FASA (fasa-c)
#
# usage: examples/calibrate-convert-run.sh [MODEL [WORKDIR]]
#   MODEL    default: the model scripts/setup.sh installs (models/SmolLM2-135M-Instruct.Q4_1.gguf)
#   WORKDIR  where the profile and the bundle go (default: ${TMPDIR:-/tmp}/fasa-example)
# Environment: FASA (the binary; default: fasa on PATH, else this checkout's bin/fasa),
#   TOKENS (calibration sample tokens, default 2048), PROMPT, N (tokens to generate, default 48).
# Needs about 600 MB in WORKDIR (the bundle holds float32 weights) and a few minutes, mostly
# calibration.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
model=${1:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
work=${2:-${TMPDIR:-/tmp}/fasa-example}
tokens=${TOKENS:-2048}
prompt=${PROMPT:-What is the capital of France?}
n=${N:-48}
if [ -z "${FASA:-}" ]; then
    FASA=$(command -v fasa || true)
    [ -n "$FASA" ] || FASA=$root/bin/fasa
fi

# Shows each command before running it.
run() {
    printf '+ %s\n' "$*" >&2
    "$@"
}

[ -x "$FASA" ] || command -v "$FASA" >/dev/null || { echo "$0: no fasa binary (make, or set FASA)" >&2; exit 1; }
[ -r "$model" ] || { echo "$0: no model '$model' (run scripts/setup.sh, or pass MODEL)" >&2; exit 1; }
mkdir -p "$work"
name=$(basename "$model")
name=${name%.gguf}
profile=$work/$name.profile.json
bundle=$work/$name-fasa.fasa

echo "== 1. calibrate: which frequency chunks of each head rank tokens like the whole head" >&2
run "$FASA" calibrate "$model" --tokens "$tokens" -o "$profile"

echo "== 2. convert: dominant key dims first, packed as one .fasa bundle" >&2
rm -f "$bundle"
run "$FASA" convert "$model" -p "$profile" -o "$bundle"

# run uses the bundle's own profile.json (its weight hash matches the reordered weights).
echo "== 3. run from the bundle with FASA" >&2
run "$FASA" run "$bundle" -n "$n" "$prompt"

echo "== done: profile '$profile', bundle '$bundle'" >&2
