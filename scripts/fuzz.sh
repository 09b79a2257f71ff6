#!/usr/bin/env bash
# Fuzzes one target for a bounded time:
#
#   scripts/fuzz.sh [TARGET] [SECONDS]    (TARGET: request (default), gguf or media;
#                                          SECONDS: default 600)
#   scripts/fuzz.sh [SECONDS]             (the request target)
#
# request: the request parser (options JSON + chat-message JSON through the
#   chat template; fuzz/fuzz_targets/request.rs).
# gguf: the GGUF model-file check, and MLX's GGUF reader on every file the
#   check accepts (fuzz/fuzz_targets/gguf.rs).
# media: image decoding (JPEG, PNG, WebP), raw pixel buffers and the image
#   processor (fuzz/fuzz_targets/media.rs).
#
# Uses cargo-fuzz (libFuzzer + AddressSanitizer) on a nightly toolchain and
# installs both when missing. New inputs go to fuzz/target/corpus/TARGET
# (ignored by git); the seeds in fuzz/corpus/TARGET are only read. A crash
# leaves its input under fuzz/artifacts/TARGET/ and makes this exit non-zero.
# Not part of scripts/test.sh / CI: it is slow by design.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TARGET=request
if [[ $# -gt 0 && ! "$1" =~ ^[0-9]+$ ]]; then
  TARGET="$1"
  shift
fi
SECS="${1:-600}"
[[ -f "fuzz/fuzz_targets/$TARGET.rs" ]] || { echo "no fuzz target '$TARGET' (see fuzz/fuzz_targets/)" >&2; exit 2; }
bash scripts/setup.sh
source scripts/env.sh

log() { printf '[fuzz] %s\n' "$*" >&2; }
rustup toolchain list | grep -q '^nightly' || {
  log "installing a nightly toolchain (cargo-fuzz needs -Z sanitizer flags)"
  rustup toolchain install nightly --profile minimal
}
command -v cargo-fuzz >/dev/null || {
  log "installing cargo-fuzz"
  cargo install cargo-fuzz --locked
}

# The fuzz binary links libmlx.so (through mlxrt), but link args with its rpath
# apply only to mlxrt's own targets; point the loader at it.
export LD_LIBRARY_PATH="$MLX_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "fuzz/target/corpus/$TARGET"
log "running the $TARGET target for ${SECS}s"
cargo +nightly fuzz run "$TARGET" "fuzz/target/corpus/$TARGET" "fuzz/corpus/$TARGET" -- \
  -max_total_time="$SECS" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1
log "no crash in ${SECS}s"
