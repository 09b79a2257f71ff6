#!/usr/bin/env python3
"""Model-families benchmark: single-stream prefill and decode of a small Qwen3 and a
Qwen3.5-style hybrid (Gated DeltaNet + gated attention), mlxrt vs Python mlx-lm.

The models have random weights at realistic widths (tests/oracle/make_tiny.py presets
qwen3_bench and qwen3_5_bench: hidden 1024, 4 layers, 4-bit affine quantization, group
64), built once into --models-dir. For each model this runs bench/single_stream.py's
procedure (same prompt ids for both sides, warm-ups, ABBA rounds, medians; see its
CONTRACT) with bench/mlxrt_single_stream.rs as the mlxrt side, then writes
bench/results/families.json (format: bench/README.md): the common header, what each side
ran per model ("provenance"), each model's full single-stream result under "models", and the
ratios `<model>_prefill_ratio`, `<model>_decode_ratio`,
`<model>_ttft_ratio` (> 1.0 = mlxrt better).

Usage (after `cargo build --release --example mlxrt_single_stream`):
    families.py [--rounds 3] [--prompt-tokens 512] [--gen-tokens 128]
        [--models-dir target/bench-models] [--gguf SmolLM2.gguf] [--kernels auto|stock]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MODELS = {"qwen3": "qwen3_bench", "qwen3_5": "qwen3_5_bench"}


def build_model(preset, out, gguf, python):
    if (out / "model.safetensors").exists():
        return
    subprocess.run([python, str(common.REPO / "tests/oracle/make_tiny.py"), "--family", preset,
                    "--out", str(out), "--gguf", str(gguf), "--quantize", "4", "--group", "64"],
                   check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--models-dir", type=Path, default=common.REPO / "target/bench-models")
    home = Path(os.environ.get("MLXRT_CACHE", Path.home() / ".cache/mlxrt"))
    ap.add_argument("--gguf", type=Path, default=Path(os.environ.get(
        "MLXRT_MODEL", home / "models/SmolLM2-135M-Instruct.Q4_1.gguf")),
        help="source of the tokenizer for the random-weight models")
    ap.add_argument("--mlxrt-bin", type=Path,
                    default=common.REPO / "target/release/examples/mlxrt_single_stream")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--only", choices=sorted(MODELS), action="append")
    common.add_kernels_arg(ap)
    ap.add_argument("--results-dir", type=Path, default=common.RESULTS)
    args = ap.parse_args()
    if not args.mlxrt_bin.exists():
        sys.exit(f"{args.mlxrt_bin} is missing: cargo build --release --example mlxrt_single_stream")

    payload = {"settings": {"prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens,
                            "rounds": args.rounds, "kernels": args.kernels, "weights": "random, 4-bit affine, group 64",
                            "presets": {m: p for m, p in MODELS.items()}},
               "provenance": {}, "models": {}}
    with tempfile.TemporaryDirectory(prefix="mlxrt-families-") as tmp:
        for name in args.only or MODELS:
            model = args.models_dir / MODELS[name]
            build_model(MODELS[name], model, args.gguf, args.python)
            cmd = [args.python, str(common.REPO / "bench/single_stream.py"),
                   "--mlxrt-cmd", f"{shlex.quote(str(args.mlxrt_bin))} {shlex.quote(str(model))} "
                                  "{prompt_ids} {gen_tokens}",
                   "--model", str(model), "--rounds", str(args.rounds),
                   "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens),
                   "--kernels", args.kernels,
                   "--python", args.python, "--results-dir", tmp, "--name", name]
            print(f"== {name}: {shlex.join(cmd)}", file=sys.stderr)
            subprocess.run(cmd, check=True)
            result = json.loads((Path(tmp) / f"{name}.json").read_text())
            for k in ("name", "date", "command", "machine"):
                result.pop(k, None)
            payload["provenance"][name] = result.pop("provenance")
            payload["models"][name] = result
            for r in ("prefill", "decode", "ttft"):
                payload[f"{name}_{r}_ratio"] = result[f"{r}_ratio"]
    path = common.write_result("families", payload, args.results_dir)
    print(json.dumps({k: v for k, v in payload.items() if k.endswith("_ratio")}), file=sys.stderr)
    print(f"-> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
