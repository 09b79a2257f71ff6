#!/usr/bin/env bash
# Sets everything up and runs all tests: Rust unit and integration tests,
# parity with Python mlx-lm, the C ABI tests (plain, ASan, valgrind), the
# C++ and Objective-C wrappers, and the Swift package's tests when `swift` is
# on PATH. Cargo builds offline, from the crates committed in vendor/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
source scripts/env.sh
cargo build --offline --release
cargo test --offline --release "$@"

# The Swift package, against the library built above.
if command -v swift >/dev/null 2>&1; then
    (cd bindings/swift && MLXRT_MODEL="$MLXRT_MODEL" swift test \
        -Xlinker -L"$ROOT/target/release" -Xlinker -rpath -Xlinker "$ROOT/target/release")
else
    echo "Swift tests skipped: swift not on PATH"
fi
