#!/usr/bin/env bash
# Regenerates include/mlxrt.h from src/ffi with cbindgen (via build.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
MLXRT_UPDATE_HEADER=1 cargo build --quiet
echo "include/mlxrt.h updated"
