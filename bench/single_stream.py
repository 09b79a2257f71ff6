#!/usr/bin/env python3
"""Single-stream benchmark driver: mlxrt vs Python mlx-lm, side by side, alternating.

After one warm-up run of each side, runs N rounds; each round runs both sides, in the
order mlxrt, ref, ref, mlxrt, mlxrt, ref, ... (ABBA, so slow drifts of a shared machine
hit both sides alike). It then writes bench/results/single_stream.json (bench/README.md):
machine, date, command line, what each side ran ("provenance": kernels, scale dtype, BLAS
and threads, MLX version), raw per-round figures of both sides, medians, and
    decode_ratio  = mlxrt decode tok/s  / ref decode tok/s
    prefill_ratio = mlxrt prefill tok/s / ref prefill tok/s
    ttft_ratio    = ref TTFT ms / mlxrt TTFT ms           (> 1.0 = mlxrt better)

Both sides get the same prompt ids: --prompt-ids FILE, or the ids the reference builds
(bench/common.py BENCH_TEXT, repeated to --prompt-tokens), written to a JSON file first.

CONTRACT for the mlxrt side (--mlxrt-cmd, a shell command run once per round):
  * Placeholders in the command are replaced before it runs, and also exported:
        {prompt_ids}    MLXRT_BENCH_PROMPT_IDS    path of a JSON file {"ids": [int, ...]}
        {prompt_tokens} MLXRT_BENCH_PROMPT_TOKENS number of prompt ids
        {gen_tokens}    MLXRT_BENCH_GEN_TOKENS    tokens to generate
        {f32_scales}    MLXRT_BENCH_F32_SCALES    "true"/"false": cast quantization
                                                  scales/biases to f32 at load (the ref does;
                                                  mlxrt_single_stream ignores it: the engine
                                                  always does on the CPU)
        {kernels}       MLXRT_BENCH_KERNELS       "auto"/"stock": --kernels (the engine's
                                                  EngineConfig::kernels)
  * The command loads the model (untimed), runs one short untimed warm-up generation (the
    reference uses the first 32 prompt ids and generates 8 tokens), then ONE timed request:
    exactly those prompt ids (no chat template, nothing prepended), greedy sampling,
    EOS/stop disabled, exactly gen_tokens generated tokens, a single request in flight.
  * It prints, as the LAST line of stdout, one JSON object
        {"prefill_tps": float, "ttft_ms": float, "decode_tps": float}
    (extra keys are allowed and recorded once per side, e.g. "load_s", versions; an optional
    "generated_head" = the first 16 generated ids is compared with the reference's;
    "provenance" {kernels, scale_dtype, ...} is required and its scale_dtype must equal the
    reference's, else the benchmark stops);
    logs go to stderr or earlier stdout lines.
        ttft_ms     = time from submitting the request to token 0 being sampled
        prefill_tps = prompt_tokens / ttft (seconds)
        decode_tps  = (gen_tokens - 1) / time from token 0 to the last token
  * Exit status 0 on success; anything else fails the benchmark.

Usage:
    single_stream.py --mlxrt-cmd CMD --model DIR_OR_GGUF [--rounds 5] [--prompt-tokens 512]
        [--gen-tokens 256] [--kernels auto|stock] [--f32-scales | --no-f32-scales] [--prompt-ids FILE]
        [--results-dir DIR] [--timeout 1800]
"""
import argparse
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

KEYS = ("prefill_tps", "ttft_ms", "decode_tps")
REF_SCRIPT = Path(__file__).resolve().parent / "mlxlm_single_stream.py"


def split_result(obj):
    """(figures of one round, descriptive extras) from a side's JSON object."""
    missing = [k for k in KEYS if not isinstance(obj.get(k), (int, float))]
    if missing:
        raise RuntimeError(f"result lacks numeric {missing}: {obj}")
    figures = {k: obj[k] for k in KEYS}
    extras = {k: v for k, v in obj.items()
              if k not in KEYS and k not in ("prompt_ids", "rounds", "provenance")}
    return figures, extras


def run_all(args, ids_file, run_mlxrt, run_ref, ref_cmd):
    """Warm-ups, ABBA rounds, medians, ratios; writes the result JSON."""
    sides = {"mlxrt": run_mlxrt, "reference": run_ref}
    print("warm-up: reference", file=sys.stderr)
    warm, info, prov = {}, {}, {}
    out = {"reference": run_ref(first=True)}
    print("warm-up: mlxrt", file=sys.stderr)
    out["mlxrt"] = run_mlxrt()
    for side, obj in out.items():
        warm[side], info[side] = split_result(obj)
        prov[side] = obj.get("provenance")
    prov = common.provenance(prov)  # stops here if the sides' scale dtypes differ
    raw = {"mlxrt": [], "reference": []}
    for i in range(args.rounds):
        order = ("mlxrt", "reference") if i % 2 == 0 else ("reference", "mlxrt")
        for side in order:
            r, info[side] = split_result(sides[side]())
            raw[side].append(r)
            print(f"round {i + 1}/{args.rounds} {side}: "
                  + ", ".join(f"{k}={r[k]:.2f}" for k in KEYS), file=sys.stderr)
    heads = [info[s].get("generated_head") for s in ("mlxrt", "reference")]
    n = min(len(h) for h in heads) if all(heads) else 0
    same_tokens = heads[0][:n] == heads[1][:n] if n else None

    med = {side: common.medians(rs, KEYS) for side, rs in raw.items()}
    ids = common.read_prompt_ids(ids_file)
    payload = {
        "settings": {"prompt_tokens": len(ids), "gen_tokens": args.gen_tokens, "rounds": args.rounds,
                     "kernels": args.kernels, "f32_scales": args.f32_scales,
                     "order": "ABBA (mlxrt first in odd rounds)",
                     "sampling": "greedy, EOS disabled"},
        "mlxrt_cmd": args.mlxrt_cmd,
        "reference_cmd": ref_cmd(f"--prompt-ids {shlex.quote(str(ids_file))}"),
        "provenance": prov,
        "prompt_ids": ids,
        "info": info,
        "same_generated_head": same_tokens,
        "warmup": warm,
        "raw": raw,
        "median": med,
        "decode_ratio": common.ratio(med["mlxrt"]["decode_tps"], med["reference"]["decode_tps"]),
        "prefill_ratio": common.ratio(med["mlxrt"]["prefill_tps"], med["reference"]["prefill_tps"]),
        "ttft_ratio": common.ratio(med["mlxrt"]["ttft_ms"], med["reference"]["ttft_ms"],
                                   higher_is_better=False),
    }
    # Decode is bandwidth-bound: each token reads every weight once.
    param_bytes = info["mlxrt"].get("parameter_bytes")
    if param_bytes:
        bw = common.read_bandwidth_gbs()
        limit = bw * 1e9 / param_bytes
        payload["bandwidth"] = {
            "read_gbs": bw,
            "parameter_bytes": param_bytes,
            "decode_limit_tps": limit,
            "mlxrt_decode_fraction_of_limit": med["mlxrt"]["decode_tps"] / limit,
            "reference_decode_fraction_of_limit": med["reference"]["decode_tps"] / limit,
        }
    path = common.write_result(args.name, payload, args.results_dir)
    print(f"medians: {med}", file=sys.stderr)
    print(f"decode_ratio={payload['decode_ratio']:.3f} prefill_ratio={payload['prefill_ratio']:.3f} "
          f"ttft_ratio={payload['ttft_ratio']:.3f} same_generated_head={same_tokens} -> {path}",
          file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mlxrt-cmd", required=True, help="shell command for one mlxrt round (see CONTRACT)")
    ap.add_argument("--model", required=True, help="model for the mlx-lm reference (MLX folder or .gguf)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=256)
    common.add_kernels_arg(ap)
    ap.add_argument("--f32-scales", action=argparse.BooleanOptionalAction, default=True,
                    help="reference: cast quantization scales to f32 after loading, as the engine "
                         "does on the CPU (--no-f32-scales stops at the provenance check there)")
    ap.add_argument("--prompt-ids", type=Path)
    ap.add_argument("--python", default=sys.executable, help="Python that runs the reference")
    ap.add_argument("--results-dir", type=Path, default=common.RESULTS)
    ap.add_argument("--name", default="single_stream")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per command")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="mlxrt-bench-"))
    ids_file = args.prompt_ids or tmp / "prompt_ids.json"
    f32 = "true" if args.f32_scales else "false"

    def ref_cmd(ids_flag):
        return " ".join([shlex.quote(args.python), shlex.quote(str(REF_SCRIPT)),
                         "--model", shlex.quote(str(args.model)),
                         "--gen-tokens", str(args.gen_tokens), "--rounds", "1",
                         "--f32-scales" if args.f32_scales else "--no-f32-scales",
                         ids_flag])

    def run_ref(first=False):
        if first and not args.prompt_ids:
            flag = f"--prompt-tokens {args.prompt_tokens} --write-prompt-ids {shlex.quote(str(ids_file))}"
        else:
            flag = f"--prompt-ids {shlex.quote(str(ids_file))}"
        return common.run_json_command(ref_cmd(flag), timeout=args.timeout)

    def mlxrt_cmd():
        n = len(common.read_prompt_ids(ids_file))
        subs = {"prompt_ids": str(ids_file), "prompt_tokens": str(n),
                "gen_tokens": str(args.gen_tokens), "f32_scales": f32, "kernels": args.kernels}
        cmd = args.mlxrt_cmd
        for k, v in subs.items():
            cmd = cmd.replace("{" + k + "}", shlex.quote(v) if k == "prompt_ids" else v)
        env = {f"MLXRT_BENCH_{k.upper()}": v for k, v in subs.items()}
        return cmd, env

    def run_mlxrt():
        cmd, env = mlxrt_cmd()
        return common.run_json_command(cmd, env=env, timeout=args.timeout)

    try:
        run_all(args, ids_file, run_mlxrt, run_ref, ref_cmd)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
