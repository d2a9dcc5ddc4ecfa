#!/usr/bin/env bash
# The independent Python reference, in .venv at the repo root (never used by fasa at run time):
#   Hugging Face tokenizers (token ids), gguf (reads + dequantises the model), transformers on a
#   CPU torch (logits).
#
# CPU torch: PyPI's default torch wheel pulls multi-GB CUDA packages, so we use Debian's
# python3-torch (1.13.1, CPU-only, built for /usr/bin/python3 = 3.11) through a venv made with
# --system-site-packages. transformers 4.45.2 is the newest release that works with torch 1.13
# on Python 3.11: 4.46-4.48 import torch.distributed.fsdp inside generate(), which fails on this
# torch under 3.11 (dataclass "mutable default" error); 4.50+ needs torch.distributed.tensor;
# later releases refuse torch < 2. numpy stays Debian's 1.24 (torch 1.13 is built against
# numpy 1.x), hence the numpy<2 constraint. libopenblas0-pthread replaces Debian's reference
# libblas behind torch (and numpy) through the alternatives system: without it a 300-token
# forward pass takes over a minute instead of about two seconds.
#
# Idempotent: when the stamp matches and the imports work, no network is touched.
# Called by `scripts/setup.sh --reference`; can also be run alone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PY=/usr/bin/python3
REQS=(transformers==4.45.2 tokenizers==0.20.3 gguf==0.19.0 "huggingface-hub<1.0")
STAMP_TEXT="fasa-ref-v1 ${REQS[*]} python3-torch libopenblas0-pthread"
STAMP="$VENV/.fasa-reference"

log() { printf 'setup-reference: %s\n' "$*" >&2; }

check_imports() {
    TRANSFORMERS_VERBOSITY=error "$VENV/bin/python" - <<'PY'
import numpy, torch, tokenizers, gguf, transformers
from transformers import LlamaConfig, LlamaForCausalLM
assert numpy.__version__.startswith("1."), numpy.__version__
cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
cfg._attn_implementation = "eager"
m = LlamaForCausalLM(cfg).eval()
with torch.no_grad():
    assert m(torch.tensor([[1, 2, 3]])).logits.shape == (1, 3, 32)
print("torch", torch.__version__, "transformers", transformers.__version__,
      "tokenizers", tokenizers.__version__, "numpy", numpy.__version__)
PY
}

# Debian's CPU torch and the Python it is built for.
need=()
for p in python3-torch python3-venv libopenblas0-pthread; do
    st="$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)"
    [ "$st" = "installed" ] || need+=("$p")
done
if [ "${#need[@]}" = 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ] && have="$(check_imports 2>/dev/null)"; then
    log "present: $have"
    exit 0
fi

if [ "${#need[@]}" -gt 0 ]; then
    log "installing Debian packages: ${need[*]}"
    SUDO=()
    [ "$(id -u)" = 0 ] || SUDO=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# (Re)make the venv if it is missing, is not Debian's python, or cannot see system packages.
if ! [ -x "$VENV/bin/python" ] || ! grep -qx 'include-system-site-packages = true' "$VENV/pyvenv.cfg" 2>/dev/null \
   || [ "$("$VENV/bin/python" -c 'import sys; print(sys.base_prefix)' 2>/dev/null)" != /usr ]; then
    log "creating $VENV (Debian python3, --system-site-packages)"
    rm -rf "$VENV"
    "$PY" -m venv --system-site-packages "$VENV"
fi

log "installing ${REQS[*]}"
CONS="$(mktemp)"
trap 'rm -f "$CONS"' EXIT
printf 'numpy<2\n' >"$CONS"
"$VENV/bin/python" -m pip install --disable-pip-version-check -q -c "$CONS" "${REQS[@]}"

check_imports
printf '%s\n' "$STAMP_TEXT" >"$STAMP"
log "ready: $VENV"
