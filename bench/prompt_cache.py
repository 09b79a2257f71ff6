#!/usr/bin/env python3
"""Prompt-cache benchmark driver: mlxrt's prompt cache vs mlx-lm's, side by side.

Builds deterministic ids from the reference tokenizer (bench/common.py BENCH_TEXT, no
special tokens): a shared prefix of --prefix-tokens ids, then for `first` the ids of
"First question. " and for `second` those of "Second question. ", each followed by
BENCH_TEXT from a different offset, cut to --suffix-tokens (so the two prompts share
exactly the prefix); and a --restart-tokens prompt ("Long document. " + BENCH_TEXT). It
writes the scenario files of bench/mlxrt_prompt_cache.rs and runs each on both sides, one
process per run (model load and a short warm-up untimed):

  * prefix, --rounds rounds: cold TTFT of `second` on a fresh cache, and its TTFT after
    `first` on a cache (a hit of the shared prefix).
  * restart, --restart-rounds rounds: cold TTFT of the restart prompt, then its TTFT in a
    new engine (mlx-lm: a new process loading the saved prompt cache) from --restart-dir.

The two sides alternate ABBA (the order flips each run pair, counted over all scenarios):
    mlxrt:     --mlxrt-cmd with {model} and {scenario} replaced
    reference: bench/mlxlm_prompt_cache.py MODEL SCENARIO (same JSON line out)

Writes <results-dir>/<name>.json (format: bench/README.md; rewritten after every run, so a
long run that stops keeps what it measured): what each side ran ("provenance": kernels,
scale dtype, BLAS and threads, MLX version), raw per-run figures, medians, and
    prefix_hit_ttft_fraction, restart_ttft_fraction    mlxrt hit ÷ cold TTFT (target ≤ 0.15)
    reference_prefix_hit_ttft_fraction, reference_restart_ttft_fraction   the same, mlx-lm
    prefix_hit_ttft_ratio, restart_ttft_ratio, cold_ttft_ratio (prefix scenario's cold),
    restart_cold_ttft_ratio                            reference ms ÷ mlxrt ms
Fractions are medians of the per-run fractions (hit and cold come from the same process).

Time: mlx-lm prefills ≈ 10 tok/s on the 2-core CPU machine, so one reference prefix run
(1056-token cold + 1056-token first) takes ≈ 3.5–4 min and a 4096-token restart run
≈ 7–8 min; the defaults (3 prefix rounds, 1 restart round) take ≈ 20–25 min in all.
--no-restart-reference skips the reference's restart run.

Usage:
    prompt_cache.py --model GGUF [--mlxrt-cmd CMD] [--rounds 3] [--restart-rounds 1]
        [--prefix-tokens 1024] [--suffix-tokens 32] [--restart-tokens 4096] [--gen-tokens 8]
        [--restart | --no-restart] [--restart-reference | --no-restart-reference]
        [--restart-dir /tmp/...] [--kernels auto|stock] [--f32-scales | --no-f32-scales]
        [--ref-prefill-step-size N]
        [--results-dir DIR] [--name prompt_cache] [--timeout 3600]
"""
import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

REF_SCRIPT = Path(__file__).resolve().parent / "mlxlm_prompt_cache.py"
KEYS = {"prefix": ("cold_ttft_ms", "hit_ttft_ms", "hit_ttft_fraction", "cached_tokens"),
        "restart": ("cold_ttft_ms", "restart_ttft_ms", "restart_ttft_fraction", "cached_tokens")}


def build_ids(args):
    """(first, second, restart prompt) ids from the reference tokenizer."""
    _, tok = common.load_mlxlm(args.model, args.f32_scales)

    def encode(s):
        return list(tok.encode(s, add_special_tokens=False))

    chunk = encode(common.BENCH_TEXT)
    n = max(args.prefix_tokens, args.suffix_tokens, args.restart_tokens)
    stream = chunk * (n // len(chunk) + 2)
    prefix = stream[:args.prefix_tokens]
    first = prefix + (encode("First question. ") + stream[11:])[:args.suffix_tokens]
    second = prefix + (encode("Second question. ") + stream[37:])[:args.suffix_tokens]
    assert first[len(prefix)] != second[len(prefix)], "suffixes must differ at their first id"
    restart = (encode("Long document. ") + stream)[:args.restart_tokens]
    return first, second, restart


def summarize(kind, r):
    """A run's figures plus its hit ÷ cold fraction."""
    hit = "hit_ttft_ms" if kind == "prefix" else "restart_ttft_ms"
    return {**r, hit.replace("_ms", "_fraction"): r[hit] / r["cold_ttft_ms"]}


def payload(args, ids, raw, cmds, prov):
    med = {kind: {side: {k: common.median([r[k] for r in runs]) for k in KEYS[kind]}
                  for side, runs in sides.items() if runs}
           for kind, sides in raw.items()}

    def get(kind, side, key):
        return med.get(kind, {}).get(side, {}).get(key)

    return {
        "settings": {"prefix_tokens": args.prefix_tokens, "suffix_tokens": args.suffix_tokens,
                     "restart_tokens": args.restart_tokens, "gen_tokens": args.gen_tokens,
                     "rounds": args.rounds, "restart_rounds": args.restart_rounds if args.restart else 0,
                     "restart_reference": args.restart_reference,
                     "kernels": args.kernels, "f32_scales": args.f32_scales,
                     "ref_prefill_step_size": args.ref_prefill_step_size,
                     "order": "ABBA (mlxrt first in odd-numbered pairs, counted over all scenarios)",
                     "sampling": "greedy, EOS ignored"},
        **cmds,
        "provenance": prov,
        "first_ids": ids[0], "second_ids": ids[1], "restart_ids": ids[2],
        "raw": raw,
        "median": med,
        "targets": {"prefix_hit_ttft_fraction": 0.15, "restart_ttft_fraction": 0.15},
        "prefix_hit_ttft_fraction": get("prefix", "mlxrt", "hit_ttft_fraction"),
        "restart_ttft_fraction": get("restart", "mlxrt", "restart_ttft_fraction"),
        "reference_prefix_hit_ttft_fraction": get("prefix", "reference", "hit_ttft_fraction"),
        "reference_restart_ttft_fraction": get("restart", "reference", "restart_ttft_fraction"),
        "prefix_hit_ttft_ratio": common.ratio(get("prefix", "mlxrt", "hit_ttft_ms"),
                                              get("prefix", "reference", "hit_ttft_ms"), False),
        "cold_ttft_ratio": common.ratio(get("prefix", "mlxrt", "cold_ttft_ms"),
                                        get("prefix", "reference", "cold_ttft_ms"), False),
        "restart_ttft_ratio": common.ratio(get("restart", "mlxrt", "restart_ttft_ms"),
                                           get("restart", "reference", "restart_ttft_ms"), False),
        "restart_cold_ttft_ratio": common.ratio(get("restart", "mlxrt", "cold_ttft_ms"),
                                                get("restart", "reference", "cold_ttft_ms"), False),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the .gguf (or MLX folder) both sides load")
    ap.add_argument("--mlxrt-cmd", default="target/release/examples/mlxrt_prompt_cache {model} {scenario}",
                    help="shell command with {model} and {scenario}")
    ap.add_argument("--rounds", type=int, default=3, help="prefix-scenario rounds")
    ap.add_argument("--restart-rounds", type=int, default=1)
    ap.add_argument("--prefix-tokens", type=int, default=1024)
    ap.add_argument("--suffix-tokens", type=int, default=32)
    ap.add_argument("--restart-tokens", type=int, default=4096)
    ap.add_argument("--gen-tokens", type=int, default=8)
    ap.add_argument("--restart", action=argparse.BooleanOptionalAction, default=True,
                    help="run the restart scenario")
    ap.add_argument("--restart-reference", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the restart scenario on mlx-lm (a slow cold prefill)")
    ap.add_argument("--restart-dir", type=Path, help="cache directory, emptied and removed by each run (default: a new one in /tmp)")
    common.add_kernels_arg(ap)
    ap.add_argument("--f32-scales", action=argparse.BooleanOptionalAction, default=True,
                    help="reference: cast quantization scales to f32 after loading, as the engine "
                         "does on the CPU (the sides must match: checked on their provenance)")
    ap.add_argument("--ref-prefill-step-size", type=int, default=2048)
    ap.add_argument("--python", default=sys.executable, help="Python that runs the reference")
    ap.add_argument("--results-dir", type=Path, default=common.RESULTS)
    ap.add_argument("--name", default="prompt_cache")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per command")
    args = ap.parse_args()

    ids = build_ids(args)
    tmp = Path(tempfile.mkdtemp(prefix="mlxrt-prompt-cache-"))
    restart_dir = args.restart_dir or tmp / "restart-cache"
    scenarios = {
        "prefix": {"mode": "prefix", "first": ids[0], "second": ids[1], "gen_tokens": args.gen_tokens},
        "restart": {"mode": "restart", "prompt": ids[2], "gen_tokens": args.gen_tokens,
                    "dir": str(restart_dir)},
    }
    paths = {}
    for kind, s in scenarios.items():
        paths[kind] = tmp / f"{kind}.json"
        paths[kind].write_text(json.dumps(s))

    ref_flags = (f" {'--f32-scales' if args.f32_scales else '--no-f32-scales'}"
                 f" --prefill-step-size {args.ref_prefill_step_size}")
    commands = {
        "mlxrt": lambda p: args.mlxrt_cmd.replace("{model}", shlex.quote(str(args.model)))
                                         .replace("{scenario}", shlex.quote(str(p))),
        "reference": lambda p: (f"{shlex.quote(args.python)} {shlex.quote(str(REF_SCRIPT))} "
                                f"{shlex.quote(str(args.model))} {shlex.quote(str(p))}{ref_flags}"),
    }
    cmds = {"mlxrt_cmd": args.mlxrt_cmd, "reference_cmd": commands["reference"]("SCENARIO_JSON")}
    raw = {"prefix": {"mlxrt": [], "reference": []}, "restart": {"mlxrt": [], "reference": []}}
    prov = {}
    plan = [("prefix", args.rounds, ["mlxrt", "reference"])]
    if args.restart:
        plan.append(("restart", args.restart_rounds,
                     ["mlxrt", "reference"] if args.restart_reference else ["mlxrt"]))
    t_start = time.perf_counter()
    pairs = 0
    try:
        path = common.write_result(args.name, payload(args, ids, raw, cmds, prov), args.results_dir)
        for kind, rounds, sides in plan:
            for i in range(rounds):
                pairs += 1
                for side in sides if pairs % 2 == 1 else sides[::-1]:
                    t = time.perf_counter()
                    env = common.kernels_env(args.kernels) if side == "mlxrt" else None
                    r = common.run_json_command(commands[side](paths[kind]), env=env, timeout=args.timeout)
                    r = summarize(kind, common.take_provenance(prov, side, r))
                    raw[kind][side].append(r)
                    print(f"[{time.perf_counter() - t_start:6.0f}s] {kind} {i + 1}/{rounds} {side} "
                          f"({time.perf_counter() - t:.0f}s): "
                          + ", ".join(f"{k}={r[k]:.3g}" for k in KEYS[kind]), file=sys.stderr)
                    path = common.write_result(args.name, payload(args, ids, raw, cmds, prov), args.results_dir)
        out = json.loads(path.read_text())
        print(f"-> {path} ({time.perf_counter() - t_start:.0f}s)", file=sys.stderr)
        print(json.dumps({k: v for k, v in out.items() if k.endswith(("_ratio", "_fraction"))}, indent=1),
              file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
