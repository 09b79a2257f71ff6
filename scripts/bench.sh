#!/usr/bin/env bash
# Heavy benchmarks (not part of the tests): mlxrt vs Python mlx-lm side by
# side, results in bench/results/ (format and fields: bench/README.md).
#   scripts/bench.sh single_stream [--rounds N]   -> single_stream.json
#   scripts/bench.sh batching [options]           -> batching.json
#   scripts/bench.sh cpu_kernels [--reps N]       -> cpu_kernels.json
#   scripts/bench.sh qmm_kernel [--rounds N] [--isa avx512|avx2|portable]
#                                                 -> qmm_kernel.json (the
#     quantized-matmul kernel alone: narrow vs wide decode tiles, from DRAM)
#   scripts/bench.sh prefetch_pattern [--rounds N] -> prefetch_pattern.json (the
#     decode tiles' memory access pattern alone: prefetch into L1, L2 or none)
#   scripts/bench.sh prompt_cache [options]       -> prompt_cache.json
#   scripts/bench.sh families [options]           -> families.json
#   scripts/bench.sh kv_memory [options]          -> kv_memory.json
#   scripts/bench.sh scheduler [options]          -> scheduler.json (mlxrt only)
#   scripts/bench.sh structured [options]         -> structured.json (mlxrt only;
#     --rounds N, --max-tokens N, --out FILE)
#   scripts/bench.sh speculative [ROUNDS [N]]     -> speculative.json (mlxrt only;
#     the draft model is $MLXRT_DRAFT_MODEL, default the default GGUF requantized
#     to Q4_0 by llama.cpp's llama-quantize, made here once)
#   scripts/bench.sh media [--rounds N]           -> media.json (mlxrt vs mlx-vlm)
#   scripts/bench.sh vs_llama_cpp [options]       -> vs_llama_cpp.json
#     (mlxrt vs llama.cpp; --rounds N, --no-4k, --cases, --models, --llama-env;
#      --build-only: just build llama.cpp's tools, cached, and exit)
# All but cpu_kernels take --kernels auto|stock|int8 (mlxrt's own CPU kernels, the
# default, MLX's stock ones as mlx-lm uses, or auto with int8 activations in the
# quantized matmul); single_stream, batching,
# prompt_cache and vs_llama_cpp take --name NAME (-> NAME.json).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
source scripts/env.sh
which="${1:-single_stream}"; shift || true

# llama.cpp's llama-bench, llama-batched-bench and llama-quantize, built once
# (CPU, native, Release) from the llama.cpp vendored in the llama-cpp-python
# sdist, into $LLAMA_CPP_DIR/bin. cmake comes from PyPI into the venv if absent.
LLAMA_CPP_PY_VERSION=0.3.36
LLAMA_CPP_DIR="$MLXRT_CACHE/llama.cpp-$LLAMA_CPP_PY_VERSION"
# On CPUs with AMX, -march=native turns on ggml's AMX matmul, which crashed
# (SIGSEGV in ggml_backend_amx_mul_mat) on every prompt batch on a Sapphire
# Rapids VM; there the build keeps the native ISA minus AMX (the explicit
# -mno-* flags win over -march=native in GCC, whatever their order).
LLAMA_CPP_CFLAGS=""
grep -qw amx_int8 /proc/cpuinfo 2>/dev/null && LLAMA_CPP_CFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
build_llama_cpp() {
  local tools=(llama-bench llama-batched-bench llama-quantize) t ok=1
  for t in "${tools[@]}"; do [ -x "$LLAMA_CPP_DIR/bin/$t" ] || ok=0; done
  [ "$(cat "$LLAMA_CPP_DIR/cflags" 2>/dev/null)" = "$LLAMA_CPP_CFLAGS" ] || ok=0
  [ "$ok" = 0 ] || return 0
  local cmake; cmake="$(command -v cmake || true)"
  if [ -z "$cmake" ]; then
    [ -x "$VENV/bin/cmake" ] || PIP_CACHE_DIR="$MLXRT_CACHE/pip" "$VENV/bin/pip" install -q \
      --disable-pip-version-check --only-binary cmake cmake
    cmake="$VENV/bin/cmake"
  fi
  local sdist="$MLXRT_CACHE/sdist/llama_cpp_python-$LLAMA_CPP_PY_VERSION.tar.gz"
  if [ ! -s "$sdist" ]; then
    # --no-binary for this package only: its build deps (cmake, scikit-build-core,
    # needed to prepare its metadata) come as wheels rather than being compiled.
    PIP_CACHE_DIR="$MLXRT_CACHE/pip" "$VENV/bin/pip" download -q --disable-pip-version-check \
      --no-deps --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_PY_VERSION" \
      -d "$MLXRT_CACHE/sdist"
  fi
  if [ ! -f "$LLAMA_CPP_DIR/src/CMakeLists.txt" ]; then
    local tmp="$LLAMA_CPP_DIR/unpack.$$"
    rm -rf "$tmp" "$LLAMA_CPP_DIR/src"; mkdir -p "$tmp"
    tar xzf "$sdist" -C "$tmp"
    mv "$tmp/llama_cpp_python-$LLAMA_CPP_PY_VERSION/vendor/llama.cpp" "$LLAMA_CPP_DIR/src"
    # The vendored commit, for provenance (the sdist has no .git).
    grep -o -m1 'update llama.cpp to ggml-org/llama.cpp@[0-9a-f]*' \
      "$tmp/llama_cpp_python-$LLAMA_CPP_PY_VERSION/CHANGELOG.md" | sed 's/.*@//' \
      > "$LLAMA_CPP_DIR/commit"
    rm -rf "$tmp"
  fi
  echo "[bench] building llama.cpp ($(cat "$LLAMA_CPP_DIR/commit")) in $LLAMA_CPP_DIR/build" >&2
  local t0=$SECONDS
  nice "$cmake" -S "$LLAMA_CPP_DIR/src" -B "$LLAMA_CPP_DIR/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DCMAKE_C_FLAGS="$LLAMA_CPP_CFLAGS" -DCMAKE_CXX_FLAGS="$LLAMA_CPP_CFLAGS" >/dev/null
  nice "$cmake" --build "$LLAMA_CPP_DIR/build" -j "$(nproc)" --target "${tools[@]}"
  mkdir -p "$LLAMA_CPP_DIR/bin"
  for t in "${tools[@]}"; do cp "$LLAMA_CPP_DIR/build/bin/$t" "$LLAMA_CPP_DIR/bin/"; done
  printf '%s' "$LLAMA_CPP_CFLAGS" > "$LLAMA_CPP_DIR/cflags"
  echo "[bench] llama.cpp built in $((SECONDS - t0)) s" >&2
}
case "$which" in
  single_stream)
    cargo build --release --quiet --example mlxrt_single_stream
    "$VENV/bin/python" bench/single_stream.py \
      --mlxrt-cmd "target/release/examples/mlxrt_single_stream $MLXRT_MODEL {prompt_ids} {gen_tokens}" \
      --model "$MLXRT_MODEL" "$@"
    ;;
  batching)
    cargo build --release --quiet --example mlxrt_batching
    "$VENV/bin/python" bench/batching.py --model "$MLXRT_MODEL" \
      --mlxrt-cmd "target/release/examples/mlxrt_batching {model} {scenario}" "$@"
    ;;
  cpu_kernels)
    cargo bench --bench cpu_kernels -- "$@"
    ;;
  qmm_kernel)
    # The kernel files alone, built with the system C++ compiler (they
    # include "mlxrt/src/mlx/...": an include directory whose `mlxrt` is
    # this tree).
    out="$ROOT/target/qmm_kernel"
    mkdir -p "$out/inc"
    ln -sfn "$ROOT" "$out/inc/mlxrt"
    objs=() pids=()
    for f in bench/qmm_kernel.cc src/mlx/qmm_avx512.cc src/mlx/qmm_avx2.cc src/mlx/qmm_portable.cc; do
      objs+=("$out/$(basename "$f" .cc).o")
      "${CXX:-g++}" -std=c++20 -O2 -Wno-unused-parameter -I "$out/inc" -c "$f" -o "${objs[-1]}" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    "${CXX:-g++}" -o "$out/qmm_kernel" "${objs[@]}" -lpthread
    "$out/qmm_kernel" "$@" > bench/results/qmm_kernel.json
    cat bench/results/qmm_kernel.json
    ;;
  prefetch_pattern)
    out="$ROOT/target/prefetch_pattern"
    mkdir -p "$out"
    "${CXX:-g++}" -std=c++20 -O2 -o "$out/prefetch_pattern" bench/prefetch_pattern.cc -lpthread
    "$out/prefetch_pattern" "$@" > bench/results/prefetch_pattern.json
    cat bench/results/prefetch_pattern.json
    ;;
  prompt_cache)
    cargo build --release --quiet --example mlxrt_prompt_cache
    "$VENV/bin/python" bench/prompt_cache.py --model "$MLXRT_MODEL" \
      --mlxrt-cmd "target/release/examples/mlxrt_prompt_cache {model} {scenario}" "$@"
    ;;
  media)
    cargo build --release --quiet --example mlxrt_media
    "$VENV/bin/python" bench/media.py --gguf "$MLXRT_MODEL" \
      --mlxrt-cmd "target/release/examples/mlxrt_media {model} {images}" "$@"
    ;;
  families)
    cargo build --release --quiet --example mlxrt_single_stream
    "$VENV/bin/python" bench/families.py --gguf "$MLXRT_MODEL" "$@"
    ;;
  kv_memory)
    cargo build --release --quiet --example mlxrt_kv_memory
    "$VENV/bin/python" bench/kv_memory.py --model "$MLXRT_MODEL" "$@"
    ;;
  scheduler)
    cargo build --release --quiet --example mlxrt_scheduler --example mlxrt_batching
    "$VENV/bin/python" bench/scheduler.py --model "$MLXRT_MODEL" "$@"
    ;;
  structured)
    cargo build --release --quiet --example mlxrt_structured
    target/release/examples/mlxrt_structured "$MLXRT_MODEL" "$@"
    ;;
  vs_llama_cpp)
    build_llama_cpp
    [ "${1:-}" != --build-only ] || exit 0
    cargo build --release --quiet --example mlxrt_single_stream --example mlxrt_batching
    "$VENV/bin/python" bench/vs_llama_cpp.py --model "$MLXRT_MODEL" --llama-cpp "$LLAMA_CPP_DIR" "$@"
    ;;
  speculative)
    # Prompt lookup vs plain decoding (greedy, same tokens asserted); optional
    # ROUNDS (default 3) and drafted tokens per step (default 10).
    # Then the draft model (default: SmolLM2 Q4_0, no smaller sibling is
    # installable) against plain decoding on a chat task: draft_speedup.
    DRAFT="${MLXRT_DRAFT_MODEL:-${MLXRT_MODEL/Q4_1/Q4_0}}"
    if [ ! -s "$DRAFT" ]; then
      build_llama_cpp
      "$VENV/bin/python" -c 'import sys; sys.path.insert(0, "bench"); import vs_llama_cpp as v; v.requantize(*sys.argv[1:])' \
        "$LLAMA_CPP_DIR/bin" "$MLXRT_MODEL" "$DRAFT"
    fi
    cargo build --release --quiet --example mlxrt_speculative
    MLXRT_DRAFT_MODEL="$DRAFT" target/release/examples/mlxrt_speculative "$MLXRT_MODEL" bench/results/speculative.json "$@"
    ;;
  *) echo "unknown benchmark $which (single_stream, batching, cpu_kernels, qmm_kernel, prefetch_pattern, prompt_cache, families, kv_memory, scheduler, structured, speculative, media, vs_llama_cpp)" >&2; exit 2 ;;
esac
