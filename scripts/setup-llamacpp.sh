#!/usr/bin/env bash
# llama.cpp for `make bench-compare`: llama-cpp-python, built from its source distribution into
# the project's .venv as a CPU-only build for this machine (-march=native: AVX2, FMA, F16C where
# the processor has them; OpenMP threads; no BLAS, no CUDA, no libcurl).
#
# Not part of scripts/setup.sh: compiling llama.cpp takes about 13 minutes on two busy cores. The
# Makefile target bench-compare calls this script first.
#
# Idempotent: when `import llama_cpp` works in .venv at the pinned version, it touches nothing.
# Needs .venv (scripts/setup-reference.sh makes it); without one it makes a plain venv of
# Debian's python3 with --system-site-packages, the same shape setup-reference.sh makes.
#
#   FASA_LLAMACPP_JOBS=N   parallel compile jobs (default: nproc)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
PY=/usr/bin/python3
LLAMACPP_VERSION=0.3.36
PKG="llama-cpp-python==$LLAMACPP_VERSION"

log() { printf 'setup-llamacpp: %s\n' "$*" >&2; }

check_import() {
    "$VENV/bin/python" - "$LLAMACPP_VERSION" <<'PY'
import sys
import llama_cpp
assert llama_cpp.__version__ == sys.argv[1], (llama_cpp.__version__, sys.argv[1])
info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
assert "AMX_INT8 = 1" not in info, "built with AMX (below): build again"
print("llama_cpp", llama_cpp.__version__, "|", info)
PY
}

if [ -x "$VENV/bin/python" ] && have="$(check_import 2>/dev/null)"; then
    log "present: $have"
    exit 0
fi

# Debian build dependencies, only those missing.
need=()
for p in cmake g++ make ninja-build python3-venv python3-dev; do
    st="$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)"
    [ "$st" = "installed" ] || need+=("$p")
done
if [ "${#need[@]}" -gt 0 ]; then
    log "installing Debian packages: ${need[*]}"
    SUDO=()
    [ "$(id -u)" = 0 ] || SUDO=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

if ! [ -x "$VENV/bin/python" ]; then
    log "no $VENV; creating it (Debian python3, --system-site-packages)"
    "$PY" -m venv --system-site-packages "$VENV"
fi

# CPU build for this machine. GGML_NATIVE compiles with -march=native; the explicit AVX2/FMA/F16C
# switches document the intent (and apply if native detection is off). LLAVA_BUILD=OFF skips the
# multimodal library (a third of the build), which llama_cpp imports only for image chat handlers.
export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_OPENMP=ON \
-DGGML_CUDA=OFF -DGGML_BLAS=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF \
-DCMAKE_BUILD_TYPE=Release"
# Without AMX: ggml's AMX matrix product, which -march=native compiles in on a CPU that has it,
# crashed (SIGSEGV in ggml_backend_amx_mul_mat, the first prompt) on an Intel Xeon with AMX on
# 2026-12-07, and the AMD EPYCs this project measures on have none. GCC keeps explicit -mno-
# switches over -march=native, so these hold whatever ggml's CMake adds.
export CFLAGS="${CFLAGS:-} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
export CXXFLAGS="${CXXFLAGS:-} -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
export CMAKE_BUILD_PARALLEL_LEVEL="${FASA_LLAMACPP_JOBS:-$(nproc)}"
export FORCE_CMAKE=1

# numpy stays Debian's 1.x, which the reference venv's torch is built against.
CONS="$(mktemp)"
trap 'rm -f "$CONS"' EXIT
printf 'numpy<2\n' >"$CONS"

# a build that failed the check above (another version, or with AMX) goes first: pip would keep it
"$VENV/bin/python" -m pip uninstall -y -q llama-cpp-python >/dev/null 2>&1 || true
log "building $PKG from source (CPU, native; about 13 minutes on two busy cores)"
start=$(date +%s)
"$VENV/bin/python" -m pip install --disable-pip-version-check -q --no-cache-dir \
    --no-binary llama-cpp-python -c "$CONS" "$PKG"
log "built in $(( $(date +%s) - start )) s"

have="$(check_import)"
log "ready: $have"
