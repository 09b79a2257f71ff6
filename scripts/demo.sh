#!/usr/bin/env bash
# The main job: set up, build the library, compile examples/chat.c with the
# system C compiler and stream a chat answer from the default model.
#   scripts/demo.sh ["question"]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
source scripts/env.sh
cargo build --release --quiet
mkdir -p build
cc -std=c11 -O2 -Wall -Wextra -Iinclude examples/chat.c -Ltarget/release -lmlxrt \
  -Wl,-rpath,"$ROOT/target/release" -lpthread -o build/chat
exec build/chat "$MLXRT_MODEL" "$@"
