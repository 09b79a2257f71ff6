#!/usr/bin/env python3
"""KV-memory benchmark driver: mlxrt's KV schemes, with Python mlx-lm's kv_bits beside them.

Writes bench/results/kv_memory.json (bench/README.md). Four measurements:

1. Bytes and decode at --context positions (default 4096), SmolLM2 GGUF: for each scheme
   (the engine's default dense f32 cache, affine8, affine4, turboquant k8v3) mlxrt prefills
   context - gen_tokens prompt ids and decodes gen_tokens greedy tokens (quantized_kv_start
   0; so the whole cache is in the scheme), --rounds times, fresh process per run.
       kv_bytes_per_token_<scheme> = peak engine KV bytes / positions held (the context
                                     is a multiple of the cache's 256-position growth
                                     step, so capacity = positions)
       kv_bytes_ratio_<scheme>     = that / an f16 cache of the same shape (half the f32
                                     dense figure: the CPU engine keeps KV in f32 and has
                                     no f16 cache; kv_bytes_ratio_f32 = 2.0 is reported)
       decode_ratio_<scheme>       = median decode tok/s / the dense f32 cache's (the
                                     engine's default; there is no f16 cache on the CPU)
   The mlx-lm side prefills once (float cache), converts copies with mlx-lm's own
   KVCache.to_quantized for kv_bits 8 and 4 (group 64), decodes, and reports the same
   figures for its f32/affine8/affine4 (bench/mlxlm_kv_memory.py).
2. Capacity: rows admitted at once under a fixed kv_budget = --budget-rows dense f32 rows
   of --capacity-positions positions each (prompt + max_tokens), 4 * budget-rows requests
   submitted: capacity_ratio_<scheme> = rows admitted / rows admitted with the f32 cache;
   capacity_ratio_vs_f16_<scheme> = that / 2 (an f16 cache admits twice the f32 rows).
3. Sliding windows: a Gemma-3-style random-weight model (make_tiny preset
   gemma3_sliding_bench: 3 sliding layers of window 512 + 1 global layer, f32) prefilled
   with 1000 and 8000 tokens: sliding_kv_growth = sliding layers' KV bytes at 8000 / at
   1000 (~1.0 = flat). mlxrt reports total bytes; its global layer is a dense f32 cache of
   exactly 1024 / 8192 positions at these lengths (256-position steps, 2048-token prefill
   chunks), subtracted to get the sliding layers' bytes. mlx-lm's RotatingKVCache reports
   its own (it keeps window - 1 + chunk positions after a chunked prefill, so it grows).

CONTRACT of the mlxrt side (--mlxrt-bin, bench/mlxrt_kv_memory.rs), each printing one JSON
object as its last stdout line, with "provenance":
    BIN decode MODEL IDS_JSON GEN SCHEME         -> decode_tps, kv_bytes_peak, kv_positions,
                                                    kv_bytes_per_token_dense_f32, generated_head
    BIN capacity MODEL SCHEME POSITIONS BUDGET_ROWS -> admitted, submitted, kv_budget
    BIN sliding MODEL IDS_JSON LEN               -> kv_bytes_peak, global_kv_bytes
SCHEME is f32 | affine8 | affine4 | turboquant.

Usage:
    kv_memory.py --model GGUF [--context 4096] [--gen-tokens 64] [--rounds 2]
        [--schemes affine8,affine4,turboquant] [--budget-rows 4] [--capacity-positions 1024]
        [--no-reference | --reference-decode SAVED.json] [--kernels auto|stock] [--results-dir DIR]
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

SLIDING_PRESET = "gemma3_sliding_bench"
SLIDING_LENGTHS = (1000, 8000)


def run(cmd, env, timeout=7200):
    print("$ " + shlex.join(cmd), file=sys.stderr)
    return common.run_json_command(shlex.join(cmd), env=env, timeout=timeout)


def build_sliding_model(out, gguf, python):
    if not (out / "model.safetensors").exists():
        subprocess.run([python, str(common.REPO / "tests/oracle/make_tiny.py"), "--family", SLIDING_PRESET,
                        "--out", str(out), "--gguf", str(gguf)], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--mlxrt-bin", type=Path, default=common.REPO / "target/release/examples/mlxrt_kv_memory")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--schemes", default="affine8,affine4,turboquant")
    ap.add_argument("--budget-rows", type=int, default=4)
    ap.add_argument("--capacity-positions", type=int, default=1024)
    ap.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--reference-decode", type=Path,
                    help="reuse this saved output of `mlxlm_kv_memory.py decode` (same model, "
                         "context and gen tokens; mlx-lm's 4k prefill takes minutes)")
    ap.add_argument("--models-dir", type=Path, default=common.REPO / "target/bench-models")
    ap.add_argument("--python", default=sys.executable)
    common.add_kernels_arg(ap)
    ap.add_argument("--results-dir", type=Path, default=common.RESULTS)
    args = ap.parse_args()
    if not args.mlxrt_bin.exists():
        sys.exit(f"{args.mlxrt_bin} is missing: cargo build --release --example mlxrt_kv_memory")
    if args.context % 256:
        sys.exit("--context must be a multiple of 256 (the cache's growth step)")
    env = {**os.environ, **common.kernels_env(args.kernels)}
    schemes = ["f32"] + [s for s in args.schemes.split(",") if s and s != "f32"]
    bin_ = str(args.mlxrt_bin)
    payload = {"settings": {"context": args.context, "gen_tokens": args.gen_tokens, "rounds": args.rounds,
                            "schemes": schemes, "kernels": args.kernels, "quantized_kv_start": 0,
                            "affine_group_size": 64, "turboquant": "k8v3", "budget_rows": args.budget_rows,
                            "capacity_positions": args.capacity_positions, "f32_scales": True,
                            "sliding_preset": SLIDING_PRESET, "sliding_lengths": list(SLIDING_LENGTHS)},
               "provenance": {}}

    with tempfile.TemporaryDirectory(prefix="mlxrt-kv-") as tmp:
        ids_file = Path(tmp) / "ids.json"
        model, tok = common.load_mlxlm(args.model)
        del model
        ids = common.bench_prompt_ids(lambda s: tok.encode(s, add_special_tokens=False),
                                      args.context - args.gen_tokens)
        common.write_prompt_ids(ids_file, ids)

        # 1. bytes and decode
        mlxrt = {s: [] for s in schemes}
        for r in range(args.rounds):
            for s in (schemes if r % 2 == 0 else schemes[::-1]):
                out = run([bin_, "decode", str(args.model), str(ids_file), str(args.gen_tokens), s], env)
                payload["provenance"]["mlxrt"] = out.pop("provenance")
                mlxrt[s].append(out)
        side = {}
        for s, runs in mlxrt.items():
            last = runs[-1]
            side[s] = {"decode_tps": common.median([x["decode_tps"] for x in runs]),
                       "decode_tps_rounds": [x["decode_tps"] for x in runs],
                       "kv_bytes_peak": last["kv_bytes_peak"], "kv_positions": last["kv_positions"],
                       "kv_bytes_per_token": last["kv_bytes_peak"] / args.context,
                       "generated_head": last.get("generated_head")}
        f16_per_token = mlxrt["f32"][-1]["kv_bytes_per_token_dense_f32"] / 2
        payload["kv_dtype_default"] = "f32"
        payload["kv_bytes_per_token_f16_baseline"] = f16_per_token
        for s in schemes:
            key = "f32" if s == "f32" else s
            payload[f"kv_bytes_per_token_{key}"] = side[s]["kv_bytes_per_token"]
            payload[f"kv_bytes_ratio_{key}"] = side[s]["kv_bytes_per_token"] / f16_per_token
            if s != "f32":
                payload[f"decode_ratio_{key}"] = side[s]["decode_tps"] / side["f32"]["decode_tps"]
        payload["mlxrt"] = side

        # 2. capacity
        cap = {}
        for s in schemes:
            cap[s] = run([bin_, "capacity", str(args.model), s, str(args.capacity_positions),
                          str(args.budget_rows)], env)
            cap[s].pop("provenance", None)
        for s in schemes[1:]:
            payload[f"capacity_ratio_{s}"] = cap[s]["admitted"] / cap["f32"]["admitted"]
            payload[f"capacity_ratio_vs_f16_{s}"] = payload[f"capacity_ratio_{s}"] / 2
        payload["capacity"] = cap

        # 3. sliding windows
        sliding_model = args.models_dir / SLIDING_PRESET
        build_sliding_model(sliding_model, args.model, args.python)
        sliding_ids = Path(tmp) / "sliding_ids.json"
        common.write_prompt_ids(sliding_ids, common.bench_prompt_ids(
            lambda s: tok.encode(s, add_special_tokens=False), max(SLIDING_LENGTHS)))
        sl = {}
        for n in SLIDING_LENGTHS:
            out = run([bin_, "sliding", str(sliding_model), str(sliding_ids), str(n)], env)
            out.pop("provenance", None)
            out["sliding_kv_bytes"] = out["kv_bytes_peak"] - out["global_kv_bytes"]
            sl[str(n)] = out
        lo, hi = (sl[str(n)]["sliding_kv_bytes"] for n in SLIDING_LENGTHS)
        payload["sliding_kv_growth"] = hi / lo
        payload["sliding"] = {"mlxrt": sl}

        # the reference
        if args.reference:
            ref_cmd = [args.python, str(common.REPO / "bench/mlxlm_kv_memory.py"), "decode", "--model",
                       str(args.model), "--prompt-ids", str(ids_file), "--gen-tokens", str(args.gen_tokens),
                       "--schemes", ",".join(s for s in schemes if s in ("f32", "affine8", "affine4"))]
            if args.reference_decode:
                ref = common.last_json_object(args.reference_decode.read_text())
                # mlx-lm's generate_step computes one token ahead: its cache
                # ends at exactly the context.
                positions = {v["kv_positions"] for v in ref["schemes"].values()}
                if positions != {args.context}:
                    sys.exit(f"{args.reference_decode} holds {positions} positions, not {args.context}")
                payload["reference_decode_from"] = str(args.reference_decode)
            else:
                ref = run(ref_cmd, env)
            payload["reference_cmd"] = shlex.join(ref_cmd)
            payload["provenance"]["reference"] = ref.pop("provenance")
            rs = ref["schemes"]
            for s, v in rs.items():
                v["kv_bytes_per_token"] = v["kv_bytes"] / v["kv_positions"]
                if s != "f32":
                    payload[f"reference_decode_ratio_{s}"] = v["decode_tps"] / rs["f32"]["decode_tps"]
                    payload[f"reference_kv_bytes_ratio_{s}"] = v["kv_bytes"] / rs["f32"]["kv_bytes"] * 2
            payload["reference"] = ref
            sref = run([args.python, str(common.REPO / "bench/mlxlm_kv_memory.py"), "sliding", "--model",
                        str(sliding_model), "--prompt-ids", str(sliding_ids),
                        "--lengths", ",".join(map(str, SLIDING_LENGTHS))], env)
            sref.pop("provenance", None)
            lo, hi = (sref["lengths"][str(n)]["sliding_kv_bytes"] for n in SLIDING_LENGTHS)
            payload["reference_sliding_kv_growth"] = hi / lo
            payload["sliding"]["reference"] = sref

    path = common.write_result("kv_memory", payload, args.results_dir)
    print(json.dumps({k: v for k, v in payload.items() if "ratio" in k or "growth" in k}, indent=1),
          file=sys.stderr)
    print(f"-> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
