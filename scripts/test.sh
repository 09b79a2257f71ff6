#!/usr/bin/env bash
# Sets everything up and runs all tests: Rust unit and integration tests,
# parity with Python mlx-lm, and the C ABI tests (plain, ASan, valgrind).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
source scripts/env.sh
cargo test --release "$@"
