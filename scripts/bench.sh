#!/usr/bin/env bash
# Heavy benchmarks (not part of the tests): mlxrt vs Python mlx-lm side by
# side, results in bench/results/. Usage: scripts/bench.sh [single_stream] [--rounds N]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
source scripts/env.sh
cargo build --release --quiet --example mlxrt_single_stream
which="${1:-single_stream}"; shift || true
case "$which" in
  single_stream)
    "$VENV/bin/python" bench/single_stream.py \
      --mlxrt-cmd "target/release/examples/mlxrt_single_stream $MLXRT_MODEL {prompt_ids} {gen_tokens}" \
      --model "$MLXRT_MODEL" "$@"
    ;;
  *) echo "unknown benchmark $which" >&2; exit 2 ;;
esac
