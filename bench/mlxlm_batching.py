#!/usr/bin/env python3
"""Reference side of the batching benchmark: Python mlx-lm's own continuous batching.

    mlxlm_batching.py MODEL SCENARIO_JSON [--no-f32-scales] [--prefill-step-size N]
                      [--prefill-batch-size N] [--completion-batch-size N]

Same scenario files and the same JSON line out as bench/mlxrt_batching.rs (see there and
bench/batching.py). MODEL is an MLX folder or a .gguf, loaded as the correctness oracle
loads it (tests/oracle/mlxlm_reference.py; quantization scales cast to f32 by default).

Requests run on `mlx_lm.generate.BatchGenerator` (mlx-lm 0.32.x): `insert(prompts,
max_tokens)`, then `next()` until done. Each `next()` runs one decode step of the running
rows and then one prefill chunk (≤ prefill_step_size tokens per row) of up to
prefill_batch_size admitted prompts. Sampling is greedy (its default sampler). EOS does
not stop generation: the generator is built WITHOUT `stop_tokens` (only batch_generate adds
the tokenizer's EOS ids), so every request generates exactly max_tokens tokens.
Settings default to mlx-lm's own defaults (prefill_step_size 2048, prefill_batch_size 8,
completion_batch_size 32); a scenario's "max_rows" sets completion_batch_size (and caps
prefill_batch_size), "step_token_budget" is mlxrt-only and ignored here.

Timing: one short untimed warm-up request (ids 100..131, 8 tokens, as the mlxrt side),
then a fresh generator; the clock starts just before `insert`. A token's time is the
wall-clock time at which the `next()` call that returned it finished (BatchGenerator
evaluates a step's token one call later, so this is when the token is available to a
caller, as on the mlxrt side where it is when the event arrives).

- throughput: wall_s = start → last token; throughput_tps = output tokens / wall_s;
  ttft_ms per request = start → its first token; itl_ms = every gap between consecutive
  tokens of a request (all requests).
- itl: the background prompts are inserted; once every background row has
  arrive_after_tokens tokens the long prompt (max_tokens 1) is inserted ("arrived");
  itl_unloaded_ms = background gaps ending at or before arrival, itl_during_long_ms =
  background gaps ending after arrival and at or before the long prompt's first token
  (so the gap in which the long prompt is admitted and prefilled counts; a gap that
  merely *starts* after arrival would miss it, since the arrival is right after a
  step returns), long_ttft_ms = arrival → its first token. Stepping stops at that first
  token (later gaps are not counted by either side). With the default prefill_step_size
  (2048) mlx-lm prefills a 2048-token prompt in one chunk between two decode steps.
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import mlx.core as mx  # noqa: E402
from mlx_lm.generate import BatchGenerator  # noqa: E402


class Runner:
    """A BatchGenerator (no stop tokens, greedy) plus per-uid token arrival times."""

    def __init__(self, model, args, max_rows=None):
        completion = max_rows or args.completion_batch_size
        self.gen = BatchGenerator(model, stop_tokens=None,
                                  prefill_step_size=args.prefill_step_size,
                                  prefill_batch_size=min(args.prefill_batch_size, completion),
                                  completion_batch_size=completion)
        self.times = {}  # uid -> [arrival time of each token]
        self.running = set()

    def insert(self, prompts, max_tokens):
        uids = self.gen.insert(prompts, [max_tokens] * len(prompts))
        for u in uids:
            self.times[u] = []
            self.running.add(u)
        return uids

    def step(self):
        _, responses = self.gen.next()
        t = time.perf_counter()
        for r in responses:
            self.times[r.uid].append(t)
            if r.finish_reason is not None:
                self.running.discard(r.uid)

    def close(self):
        self.gen.close()


def gaps(ts, after=float("-inf"), end=float("inf")):
    """Gaps (ms) between consecutive distinct times of ts that end in (after, end]."""
    return [(b - a) * 1e3 for a, b in zip(ts, ts[1:]) if b > a and after < b <= end]


def throughput(model, args, s):
    run = Runner(model, args, s.get("max_rows"))
    t0 = time.perf_counter()
    uids = run.insert(s["prompts"], s["max_tokens"])
    while run.running:
        run.step()
    run.close()
    ts = [run.times[u] for u in uids]
    wall = max(t[-1] for t in ts) - t0
    total = sum(len(t) for t in ts)
    return {"wall_s": wall, "output_tokens": total, "throughput_tps": total / wall,
            "ttft_ms": [(t[0] - t0) * 1e3 for t in ts],
            "itl_ms": [g for t in ts for g in gaps(t)]}


def itl(model, args, s):
    run = Runner(model, args, s.get("max_rows"))
    bg = run.insert(s["background"], s["background_max_tokens"])
    after = s["arrive_after_tokens"]
    while any(len(run.times[u]) < after for u in bg):
        if not run.running:
            raise RuntimeError("background requests finished before arrive_after_tokens")
        run.step()
    arrived = time.perf_counter()
    (long_uid,) = run.insert([s["long_prompt"]], 1)
    while not run.times[long_uid]:
        run.step()
    run.close()
    first = run.times[long_uid][0]
    return {"itl_unloaded_ms": [g for u in bg for g in gaps(run.times[u], end=arrived)],
            "itl_during_long_ms": [g for u in bg for g in gaps(run.times[u], arrived, first)],
            "long_ttft_ms": (first - arrived) * 1e3}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--f32-scales", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--prefill-step-size", type=int, default=2048)
    ap.add_argument("--prefill-batch-size", type=int, default=8)
    ap.add_argument("--completion-batch-size", type=int, default=32)
    args = ap.parse_args()

    s = json.loads(args.scenario.read_text())
    model, _ = common.load_mlxlm(args.model, args.f32_scales)
    warm = Runner(model, args)
    warm.insert([list(range(100, 132))], 8)
    while warm.running:
        warm.step()
    warm.close()
    mx.synchronize()
    mx.clear_cache()

    modes = {"throughput": throughput, "itl": itl}
    if s.get("mode") not in modes:
        raise SystemExit(f"unknown mode {s.get('mode')!r}")
    print(json.dumps({**modes[s["mode"]](model, args, s),
                      "provenance": common.reference_provenance(model)}))


if __name__ == "__main__":
    main()
