# Shared settings for the scripts; sourced, not run.
export MLX_VERSION=0.32.4
export MLX_LM_VERSION=0.32.2
export MLX_VLM_VERSION=0.7.10
export SMOLLM2_VERSION=0.1.2
ROOT="${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
export VENV="${MLXRT_VENV:-$ROOT/.venv}"
export MLXRT_CACHE="${MLXRT_CACHE:-$HOME/.cache/mlxrt}"
export MLXRT_MODEL="${MLXRT_MODEL:-$MLXRT_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
export MLX_DIR="${MLX_DIR:-$("$VENV/bin/python" -c 'import mlx; print(list(mlx.__path__)[0])' 2>/dev/null || true)}"
[ -n "$MLX_DIR" ] || unset MLX_DIR
