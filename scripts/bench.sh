#!/usr/bin/env bash
# Heavy benchmarks (not part of the tests): mlxrt vs Python mlx-lm side by
# side, results in bench/results/ (format and fields: bench/README.md).
#   scripts/bench.sh single_stream [--rounds N]   -> single_stream.json
#   scripts/bench.sh batching [options]           -> batching.json
#   scripts/bench.sh cpu_kernels [--reps N]       -> cpu_kernels.json
#   scripts/bench.sh prompt_cache [options]       -> prompt_cache.json
#   scripts/bench.sh families [options]           -> families.json
#   scripts/bench.sh kv_memory [options]          -> kv_memory.json
# All but cpu_kernels take --kernels auto|stock (mlxrt's own CPU kernels, the
# default, or MLX's stock ones as mlx-lm uses); single_stream, batching and
# prompt_cache take --name NAME (-> NAME.json).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
source scripts/env.sh
which="${1:-single_stream}"; shift || true
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
  prompt_cache)
    cargo build --release --quiet --example mlxrt_prompt_cache
    "$VENV/bin/python" bench/prompt_cache.py --model "$MLXRT_MODEL" \
      --mlxrt-cmd "target/release/examples/mlxrt_prompt_cache {model} {scenario}" "$@"
    ;;
  families)
    cargo build --release --quiet --example mlxrt_single_stream
    "$VENV/bin/python" bench/families.py --gguf "$MLXRT_MODEL" "$@"
    ;;
  kv_memory)
    cargo build --release --quiet --example mlxrt_kv_memory
    "$VENV/bin/python" bench/kv_memory.py --model "$MLXRT_MODEL" "$@"
    ;;
  *) echo "unknown benchmark $which (single_stream, batching, cpu_kernels, prompt_cache, families, kv_memory)" >&2; exit 2 ;;
esac
