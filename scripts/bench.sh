#!/usr/bin/env bash
# Heavy benchmarks (not part of the tests): mlxrt vs Python mlx-lm side by
# side, results in bench/results/.
#   scripts/bench.sh single_stream [--rounds N]   -> single_stream.json
#   scripts/bench.sh batching [options]           -> batching.json
#   scripts/bench.sh cpu_kernels [--reps N]       -> cpu_kernels.json
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
  *) echo "unknown benchmark $which (single_stream, batching, cpu_kernels)" >&2; exit 2 ;;
esac
