#!/usr/bin/env python3
"""Continuous-batching benchmark driver: mlxrt vs mlx-lm's BatchGenerator, side by side.

Builds deterministic prompts (the same ids for both sides): request i is the reference
tokenizer's ids of "Request {i+1}. " followed by bench/common.py BENCH_TEXT (tokenized,
repeated) starting at a per-request offset, cut to --prompt-tokens ids; the long prompt
of the itl scenario is "Long document. " + BENCH_TEXT cut to --long-tokens ids. It writes
scenario files (see bench/mlxrt_batching.rs) and runs each one on both sides:

  * throughput, for each concurrency C in --concurrency: the first C prompts submitted at
    once, --max-tokens tokens each (greedy, EOS ignored). --rounds rounds per C, the two
    sides alternating ABBA (the order flips each round, counted over all scenarios).
  * itl: --itl-background requests (--itl-background-max-tokens tokens each) decode; once
    each has --itl-after tokens, a --long-tokens prompt arrives. Inter-token gaps of the
    background rows before it arrived vs while it prefills (until its first token).

Each side is one process per run (model load and a short warm-up are untimed):
    mlxrt:     --mlxrt-cmd, with {scenario} (and {model}) replaced, e.g.
               "target/release/examples/mlxrt_batching {model} {scenario}"
    reference: bench/mlxlm_batching.py MODEL SCENARIO (same JSON line out)

Writes <results-dir>/<name>.json (format: bench/README.md; rewritten after every run, so a
long run that stops keeps what it measured): what each side ran ("provenance": kernels,
scale dtype, BLAS and threads, MLX version), per run raw figures (throughput, TTFT per request,
inter-token p50/p95), medians over rounds, and
    throughput_<C>_ratio  mlxrt tok/s ÷ reference tok/s, for each C both sides ran
    ttft_p50_ratio, ttft_p95_ratio  reference ms ÷ mlxrt ms at the highest C both ran
                          (per-C values under "ttft_ratios")
    itl_p95_unloaded_ms, itl_p95_during_long_ms, itl_p95_loaded_over_unloaded  (mlxrt)
    reference_itl_p95_loaded_over_unloaded, long_ttft_ratio  (when the reference ran it)

Usage:
    batching.py --model GGUF --mlxrt-cmd CMD [--concurrency 1,4,8,32] [--rounds 1]
        [--prompt-tokens 128] [--max-tokens 128] [--skip-reference-above N]
        [--itl | --no-itl] [--itl-reference | --no-itl-reference] [--itl-rounds 1]
        [--itl-background 4] [--itl-background-max-tokens 256] [--long-tokens 2048]
        [--itl-after 16] [--max-rows N] [--step-token-budget N] [--ref-prefill-step-size N]
        [--kernels auto|stock] [--f32-scales | --no-f32-scales] [--results-dir DIR] [--name batching]
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

REF_SCRIPT = Path(__file__).resolve().parent / "mlxlm_batching.py"
TP_KEYS = ("throughput_tps", "ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms", "itl_p95_ms")
ITL_KEYS = ("itl_p95_unloaded_ms", "itl_p95_during_long_ms", "itl_p95_loaded_over_unloaded",
            "long_ttft_ms")


def build_prompts(model, f32_scales, n, prompt_tokens, long_tokens):
    """n distinct prompt id lists and one long prompt, from the reference tokenizer."""
    _, tok = common.load_mlxlm(model, f32_scales)

    def encode(s):
        return list(tok.encode(s, add_special_tokens=False))

    chunk = encode(common.BENCH_TEXT)
    stream = chunk * ((prompt_tokens + long_tokens) // len(chunk) + 2)
    prompts = []
    for i in range(n):
        head = encode(f"Request {i + 1}. ")
        off = (i * 17) % len(chunk)
        prompts.append((head + stream[off:off + prompt_tokens])[:prompt_tokens])
    long_prompt = (encode("Long document. ") + stream)[:long_tokens]
    return prompts, long_prompt


def summarize_throughput(r):
    return {"throughput_tps": r["throughput_tps"], "wall_s": r["wall_s"],
            "output_tokens": r["output_tokens"],
            "ttft_p50_ms": common.percentile(r["ttft_ms"], 50),
            "ttft_p95_ms": common.percentile(r["ttft_ms"], 95),
            "itl_p50_ms": common.percentile(r["itl_ms"], 50),
            "itl_p95_ms": common.percentile(r["itl_ms"], 95),
            "itl_count": len(r["itl_ms"]),
            "ttft_ms": r["ttft_ms"]}


def summarize_itl(r):
    un = common.percentile(r["itl_unloaded_ms"], 95)
    dur = common.percentile(r["itl_during_long_ms"], 95)
    return {"itl_p95_unloaded_ms": un, "itl_p95_during_long_ms": dur,
            "itl_p95_loaded_over_unloaded": dur / un if un and dur is not None else None,
            "long_ttft_ms": r["long_ttft_ms"], **r}


def median_of(runs, keys):
    return {k: common.median([r[k] for r in runs if r.get(k) is not None]) for k in keys}


def payload(args, prompts, long_prompt, raw, itl_raw, cmds, prov):
    out = {
        "settings": {"concurrency": args.concurrency, "rounds": args.rounds,
                     "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
                     "skip_reference_above": args.skip_reference_above,
                     "itl": {"background": args.itl_background,
                             "background_max_tokens": args.itl_background_max_tokens,
                             "long_tokens": len(long_prompt), "arrive_after_tokens": args.itl_after,
                             "rounds": args.itl_rounds} if args.itl else None,
                     "max_rows": args.max_rows, "step_token_budget": args.step_token_budget,
                     "ref_prefill_step_size": args.ref_prefill_step_size,
                     "kernels": args.kernels, "f32_scales": args.f32_scales,
                     "order": "ABBA (mlxrt first in odd-numbered pairs, counted over all scenarios)",
                     "sampling": "greedy, EOS ignored"},
        **cmds,
        "provenance": prov,
        "prompt_ids": prompts,
        "long_prompt_ids": long_prompt,
        "raw": raw,
    }
    med = {str(c): {side: median_of(runs, TP_KEYS) for side, runs in sides.items() if runs}
           for c, sides in raw.items()}
    out["median"] = med
    both = [c for c in args.concurrency if len(med.get(str(c), {})) == 2]
    for c in args.concurrency:
        m = med.get(str(c), {})
        out[f"throughput_{c}_ratio"] = (common.ratio(m["mlxrt"]["throughput_tps"], m["reference"]["throughput_tps"])
                                        if c in both else None)
    out["ttft_ratios"] = {str(c): {q: common.ratio(med[str(c)]["mlxrt"][f"ttft_{q}_ms"],
                                                   med[str(c)]["reference"][f"ttft_{q}_ms"], False)
                                   for q in ("p50", "p95")} for c in both}
    load_c = max(both) if both else None
    out["ttft_load_concurrency"] = load_c
    out["ttft_p50_ratio"] = out["ttft_ratios"][str(load_c)]["p50"] if load_c else None
    out["ttft_p95_ratio"] = out["ttft_ratios"][str(load_c)]["p95"] if load_c else None
    if itl_raw["mlxrt"] or itl_raw["reference"]:
        out["itl_raw"] = itl_raw
        im = {side: median_of(runs, ITL_KEYS) for side, runs in itl_raw.items() if runs}
        out["itl_median"] = im
        m = im.get("mlxrt", {})
        for k in ("itl_p95_unloaded_ms", "itl_p95_during_long_ms", "itl_p95_loaded_over_unloaded"):
            out[k] = m.get(k)
        r = im.get("reference", {})
        out["reference_itl_p95_loaded_over_unloaded"] = r.get("itl_p95_loaded_over_unloaded")
        out["long_ttft_ratio"] = common.ratio(m.get("long_ttft_ms"), r.get("long_ttft_ms"), False)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the .gguf (or MLX folder) both sides load")
    ap.add_argument("--mlxrt-cmd", required=True, help="shell command with {scenario} (and {model})")
    ap.add_argument("--concurrency", default="1,4,8,32",
                    type=lambda s: [int(x) for x in s.split(",") if x])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--skip-reference-above", type=int, default=None,
                    help="run the reference only for concurrencies <= N")
    ap.add_argument("--itl", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--itl-reference", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the itl scenario on mlx-lm")
    ap.add_argument("--itl-rounds", type=int, default=1)
    ap.add_argument("--itl-background", type=int, default=4)
    ap.add_argument("--itl-background-max-tokens", type=int, default=256)
    ap.add_argument("--long-tokens", type=int, default=2048)
    ap.add_argument("--itl-after", type=int, default=16)
    ap.add_argument("--max-rows", type=int, help="scenario max_rows (mlxrt rows; mlx-lm completion_batch_size)")
    ap.add_argument("--step-token-budget", type=int, help="scenario step_token_budget (mlxrt only)")
    ap.add_argument("--ref-prefill-step-size", type=int, default=2048,
                    help="mlx-lm prefill_step_size (its default: 2048)")
    common.add_kernels_arg(ap)
    ap.add_argument("--f32-scales", action=argparse.BooleanOptionalAction, default=True,
                    help="reference: cast quantization scales to f32 after loading, as the engine "
                         "does on the CPU (the sides must match: checked on their provenance)")
    ap.add_argument("--python", default=sys.executable, help="Python that runs the reference")
    ap.add_argument("--results-dir", type=Path, default=common.RESULTS)
    ap.add_argument("--name", default="batching")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per command")
    args = ap.parse_args()

    n = max(args.concurrency + ([args.itl_background] if args.itl else []))
    prompts, long_prompt = build_prompts(args.model, args.f32_scales, n, args.prompt_tokens,
                                         args.long_tokens)
    tmp = Path(tempfile.mkdtemp(prefix="mlxrt-batching-"))
    extra = {k: v for k, v in (("max_rows", args.max_rows), ("step_token_budget", args.step_token_budget)) if v}

    def scenario(name, s):
        path = tmp / f"{name}.json"
        path.write_text(json.dumps({**s, **extra}))
        return path

    ref_flags = (f" {'--f32-scales' if args.f32_scales else '--no-f32-scales'}"
                 f" --prefill-step-size {args.ref_prefill_step_size}")
    commands = {
        "mlxrt": lambda p: args.mlxrt_cmd.replace("{model}", shlex.quote(str(args.model)))
                                         .replace("{scenario}", shlex.quote(str(p))),
        "reference": lambda p: (f"{shlex.quote(args.python)} {shlex.quote(str(REF_SCRIPT))} "
                                f"{shlex.quote(str(args.model))} {shlex.quote(str(p))}{ref_flags}"),
    }
    cmds = {"mlxrt_cmd": args.mlxrt_cmd, "reference_cmd": commands["reference"]("SCENARIO_JSON")}
    raw = {str(c): {"mlxrt": [], "reference": []} for c in args.concurrency}
    itl_raw = {"mlxrt": [], "reference": []}
    prov = {}
    t_start = time.perf_counter()

    def run(side, path, label):
        t = time.perf_counter()
        env = common.kernels_env(args.kernels) if side == "mlxrt" else None
        r = common.take_provenance(prov, side, common.run_json_command(commands[side](path), env=env,
                                                                       timeout=args.timeout))
        print(f"[{time.perf_counter() - t_start:7.0f}s] {label} {side}: {time.perf_counter() - t:.0f}s",
              file=sys.stderr)
        return r

    pairs = 0

    def order(sides):
        """mlxrt first, then reference first, ... across all rounds of all scenarios (ABBA)."""
        nonlocal pairs
        pairs += 1
        return sides if pairs % 2 == 1 else sides[::-1]

    def save():
        return common.write_result(args.name, payload(args, prompts, long_prompt, raw, itl_raw, cmds, prov),
                                   args.results_dir)

    try:
        for c in args.concurrency:
            path = scenario(f"throughput_{c}", {"mode": "throughput", "prompts": prompts[:c],
                                                "max_tokens": args.max_tokens})
            ref_ok = args.skip_reference_above is None or c <= args.skip_reference_above
            for i in range(args.rounds):
                for side in order(["mlxrt", "reference"] if ref_ok else ["mlxrt"]):
                    s = summarize_throughput(run(side, path, f"C={c} round {i + 1}/{args.rounds}"))
                    raw[str(c)][side].append(s)
                    print(f"    {s['throughput_tps']:.2f} tok/s, TTFT p50 {s['ttft_p50_ms']:.0f} ms "
                          f"p95 {s['ttft_p95_ms']:.0f} ms, ITL p95 {s['itl_p95_ms'] or 0:.0f} ms", file=sys.stderr)
                    save()
        if args.itl:
            path = scenario("itl", {"mode": "itl", "background": prompts[:args.itl_background],
                                    "background_max_tokens": args.itl_background_max_tokens,
                                    "long_prompt": long_prompt, "arrive_after_tokens": args.itl_after})
            for i in range(args.itl_rounds):
                for side in order(["mlxrt", "reference"] if args.itl_reference else ["mlxrt"]):
                    s = summarize_itl(run(side, path, f"itl round {i + 1}/{args.itl_rounds}"))
                    itl_raw[side].append(s)
                    print(f"    ITL p95 unloaded {s['itl_p95_unloaded_ms']} ms, during long "
                          f"{s['itl_p95_during_long_ms']} ms, long TTFT {s['long_ttft_ms']:.0f} ms",
                          file=sys.stderr)
                    save()
        out = json.loads(save().read_text())
        print(f"-> {args.results_dir / (args.name + '.json')} ({time.perf_counter() - t_start:.0f}s)",
              file=sys.stderr)
        print(json.dumps({k: v for k, v in out.items() if k.endswith("_ratio") or k.startswith("itl_p95")
                          or k == "reference_itl_p95_loaded_over_unloaded"}, indent=1), file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
