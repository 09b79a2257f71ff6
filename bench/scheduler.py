#!/usr/bin/env python3
"""Scheduler benchmark driver (issue 13): shared prefixes, latency under arrival, cache hits.

mlxrt only: each figure compares the engine with itself (with paging vs its private KV
copies, loaded vs unloaded, concurrent vs sequential), so the results' provenance
"reference" is the same engine's baseline run. Deterministic ids from the reference
tokenizer (bench/common.py BENCH_TEXT, no special tokens): a system prefix of
--prefix-tokens ids, and distinct questions of --question-tokens ids ("Question {i}. " then
BENCH_TEXT from a per-question offset). Each scenario is one process per run (model load
and a short warm-up untimed), --rounds rounds:

  * shared_prefix and shared_prefix_paged (bench/mlxrt_scheduler.rs): --requests requests
    (prefix + question i, --max-tokens tokens each) submitted at once, prompt cache off,
    with paged KV off and on (blocks of --kv-block-size; concurrent requests map the
    first one's prefix blocks). `shared_prefix_kv_fraction` (paged run) = peak KV bytes in
    use ÷ the sum of private copies (requests × the peak KV bytes of one request alone on
    the same engine); `shared_prefix_throughput_ratio` = aggregate tok/s with paging ÷
    without; TTFT p50/p95 both ways. Peak KV is at the end of generation, so the fraction
    grows with --max-tokens (every row's own tail) and with the block size (each row's
    tail takes whole blocks): docs/plans/scheduler-v2.md 3.12.
  * itl (bench/mlxrt_batching.rs's itl mode, as bench/batching.py): --itl-background
    requests (--prompt-tokens ids each: prefix + question) decode; once each has
    --itl-after tokens a --long-tokens prompt arrives. `itl_under_arrival_ratio` = p95 of the
    background rows' inter-token gaps while it prefills ÷ their p95 before it arrived.
  * cohort_hit (bench/mlxrt_scheduler.rs): after one request that caches the prefix,
    --hit-requests requests (prefix + distinct questions) one at a time, then as many
    others at once. `cohort_hit_ttft_ratio` = time to the last first token of the
    concurrent ones ÷ the sum of the sequential TTFTs.

All three ratios are better when lower (like kv_memory's), with the issue's targets under
"targets". Writes <results-dir>/<name>.json (format: bench/README.md), rewritten after every
run. --note records the conditions (e.g. a loaded machine, reduced sizes).

Usage:
    scheduler.py --model GGUF [--rounds 1] [--requests 32] [--prefix-tokens 1024]
        [--question-tokens 64] [--max-tokens 32] [--kv-block-size 64] [--itl-background 4]
        [--itl-background-max-tokens 256] [--long-tokens 2048] [--itl-after 16]
        [--prompt-tokens 128] [--hit-requests 4] [--hit-max-tokens 8] [--kernels auto|stock]
        [--note TEXT] [--results-dir DIR] [--name scheduler]
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

REPO = Path(__file__).resolve().parent.parent


def build_ids(args):
    """(prefix, questions, long prompt) ids from the reference tokenizer."""
    _, tok = common.load_mlxlm(args.model, True)

    def encode(s):
        return list(tok.encode(s, add_special_tokens=False))

    chunk = encode(common.BENCH_TEXT)
    n = max(args.prefix_tokens, args.long_tokens) + args.question_tokens
    stream = chunk * (n // len(chunk) + 2)
    prefix = stream[:args.prefix_tokens]
    count = max(args.requests, args.itl_background, 2 * args.hit_requests + 1)
    questions = [(encode(f"Question {i + 1}. ") + stream[(i * 29) % len(chunk):])[:args.question_tokens]
                 for i in range(count)]
    long_prompt = (encode("Long document. ") + stream)[:args.long_tokens]
    return prefix, questions, long_prompt


def ratio(a, b):
    return a / b if a is not None and b else None


def payload(args, raw, cmds, prov):
    def med(kind, key):
        return common.median([r[key] for r in raw[kind] if r.get(key) is not None])

    out = {
        "settings": {k: getattr(args, k) for k in (
            "rounds", "requests", "prefix_tokens", "question_tokens", "max_tokens", "itl_background",
            "itl_background_max_tokens", "long_tokens", "itl_after", "prompt_tokens", "hit_requests",
            "hit_max_tokens", "kv_block_size", "kernels")} | {"sampling": "greedy, EOS ignored"},
        "note": args.note,
        **cmds,
        "provenance": prov,
        "raw": raw,
        "targets": {"shared_prefix_kv_fraction": "<= 0.15", "shared_prefix_throughput_ratio": ">= 1.3",
                    "itl_under_arrival_ratio": "<= 2.0", "cohort_hit_ttft_ratio": "lower is better"},
        "shared_prefix_kv_fraction": med("shared_prefix_paged", "kv_fraction"),
        "shared_prefix_kv_fraction_unpaged": med("shared_prefix", "kv_fraction"),
        "shared_prefix_throughput_tps": med("shared_prefix_paged", "throughput_tps"),
        "shared_prefix_throughput_tps_unpaged": med("shared_prefix", "throughput_tps"),
        "shared_prefix_ttft_p50_ms": med("shared_prefix_paged", "ttft_p50_ms"),
        "shared_prefix_ttft_p95_ms": med("shared_prefix_paged", "ttft_p95_ms"),
        "shared_prefix_ttft_p50_ms_unpaged": med("shared_prefix", "ttft_p50_ms"),
        "shared_prefix_ttft_p95_ms_unpaged": med("shared_prefix", "ttft_p95_ms"),
        "shared_prefix_throughput_ratio": ratio(med("shared_prefix_paged", "throughput_tps"),
                                                med("shared_prefix", "throughput_tps")),
        "itl_p95_unloaded_ms": med("itl", "itl_p95_unloaded_ms"),
        "itl_p95_under_arrival_ms": med("itl", "itl_p95_during_long_ms"),
        "itl_under_arrival_ratio": med("itl", "ratio"),
        "cohort_hit_ttft_ratio": med("cohort_hit", "ratio"),
    }
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the .gguf (or MLX folder)")
    ap.add_argument("--scheduler-cmd", default="target/release/examples/mlxrt_scheduler {model} {scenario}")
    ap.add_argument("--batching-cmd", default="target/release/examples/mlxrt_batching {model} {scenario}")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prefix-tokens", type=int, default=1024)
    ap.add_argument("--question-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32,
                    help="shared_prefix output tokens (the KV fraction grows with it, see above)")
    ap.add_argument("--kv-block-size", type=int, default=64, help="shared_prefix_paged block size")
    ap.add_argument("--itl-background", type=int, default=4)
    ap.add_argument("--itl-background-max-tokens", type=int, default=256)
    ap.add_argument("--long-tokens", type=int, default=2048)
    ap.add_argument("--itl-after", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=128, help="itl background prompt length")
    ap.add_argument("--hit-requests", type=int, default=4)
    ap.add_argument("--hit-max-tokens", type=int, default=8)
    common.add_kernels_arg(ap)
    ap.add_argument("--note", default=None, help="conditions of this run, recorded in the results")
    ap.add_argument("--results-dir", type=Path, default=common.RESULTS)
    ap.add_argument("--name", default="scheduler")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per command")
    args = ap.parse_args()

    prefix, questions, long_prompt = build_ids(args)
    tmp = Path(tempfile.mkdtemp(prefix="mlxrt-scheduler-"))
    background = [(prefix + q)[-args.prompt_tokens:] for q in questions[:args.itl_background]]
    scenarios = {
        "shared_prefix": ("scheduler", {"mode": "shared_prefix", "max_tokens": args.max_tokens,
                                        "prompts": [prefix + q for q in questions[:args.requests]]}),
        "shared_prefix_paged": ("scheduler", {"mode": "shared_prefix", "max_tokens": args.max_tokens,
                                              "prompts": [prefix + q for q in questions[:args.requests]],
                                              "kv_paging": True, "kv_block_size": args.kv_block_size}),
        "itl": ("batching", {"mode": "itl", "background": background,
                             "background_max_tokens": args.itl_background_max_tokens,
                             "long_prompt": long_prompt, "arrive_after_tokens": args.itl_after}),
        "cohort_hit": ("scheduler", {"mode": "cohort_hit", "prefix": prefix, "warm": questions[0],
                                     "questions": questions[1:1 + 2 * args.hit_requests],
                                     "max_tokens": args.hit_max_tokens}),
    }
    cmd_of = {"scheduler": args.scheduler_cmd, "batching": args.batching_cmd}
    cmds = {"scheduler_cmd": args.scheduler_cmd, "batching_cmd": args.batching_cmd}
    raw = {kind: [] for kind in scenarios}
    prov = {}
    t_start = time.perf_counter()

    def summarize(kind, r):
        if kind.startswith("shared_prefix"):
            return {**r, "kv_fraction": r["kv_peak_bytes"] / (r["requests"] * r["private_kv_bytes"]),
                    "ttft_p50_ms": common.percentile(r["ttft_ms"], 50),
                    "ttft_p95_ms": common.percentile(r["ttft_ms"], 95)}
        if kind == "itl":
            un = common.percentile(r["itl_unloaded_ms"], 95)
            dur = common.percentile(r["itl_during_long_ms"], 95)
            return {"itl_p95_unloaded_ms": un, "itl_p95_during_long_ms": dur,
                    "ratio": dur / un if un and dur is not None else None, "long_ttft_ms": r["long_ttft_ms"], **r}
        return {**r, "ratio": r["concurrent_total_ms"] / r["sequential_total_ms"]}

    def save():
        p = dict(prov)
        if "mlxrt" in p:
            # The baselines are the same engine: its own provenance, named as such.
            p["reference"] = {**p["mlxrt"], "side": "mlxrt baseline (same engine: one request alone, "
                                                    "unloaded decode, sequential requests)"}
        return common.write_result(args.name, payload(args, raw, cmds, p), args.results_dir)

    try:
        for i in range(args.rounds):
            for kind, (tool, s) in scenarios.items():
                path = tmp / f"{kind}.json"
                path.write_text(json.dumps(s))
                cmd = cmd_of[tool].replace("{model}", shlex.quote(str(args.model))).replace(
                    "{scenario}", shlex.quote(str(path)))
                t = time.perf_counter()
                r = common.run_json_command(cmd, env=common.kernels_env(args.kernels), timeout=args.timeout)
                r = summarize(kind, common.take_provenance(prov, "mlxrt", r))
                raw[kind].append(r)
                shown = {k: v for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                print(f"[{time.perf_counter() - t_start:6.0f}s] {kind} {i + 1}/{args.rounds} "
                      f"({time.perf_counter() - t:.0f}s): {shown}", file=sys.stderr)
                save()
        out = json.loads(save().read_text())
        print(f"-> {args.results_dir / (args.name + '.json')} ({time.perf_counter() - t_start:.0f}s)",
              file=sys.stderr)
        print(json.dumps({k: v for k, v in out.items() if k.endswith(("_ratio", "_fraction", "_tps", "_ms"))},
                         indent=1), file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
