#!/usr/bin/env python3
"""Reference side of the prompt-cache benchmark: Python mlx-lm's own prompt-cache machinery.

    mlxlm_prompt_cache.py MODEL SCENARIO_JSON [--no-f32-scales] [--prefill-step-size N]

Same scenario files and the same JSON line out as bench/mlxrt_prompt_cache.rs (see there and
bench/prompt_cache.py). MODEL is an MLX folder or a .gguf, loaded as the correctness oracle
loads it (tests/oracle/mlxlm_reference.py; quantization scales cast to f32 by default).
Every generation is mlx-lm's `generate_step` (greedy, EOS ignored, `gen_tokens` tokens);
TTFT = from the start of the request until generated token 0 is evaluated. One untimed
warm-up request (ids 100..131, 4 tokens, as the mlxrt side) follows the model load.

- prefix `{"first", "second", "gen_tokens"}`:
    cold_ttft_ms  `second` on a fresh KV cache (make_prompt_cache).
    hit_ttft_ms   `first` is generated into a fresh cache, which goes into mlx-lm's server
                  cache `LRUPromptCache` keyed by first + its generated tokens (as the
                  server inserts it after a request). Then, timed: `fetch_nearest_cache`
                  for `second` (a deep copy of that entry trimmed to the common prefix with
                  `trim_prompt_cache`) and `generate_step(rest, prompt_cache=cache)`.
    cached_tokens len(second) - len(rest).
- restart `{"prompt", "gen_tokens", "dir"}`:
    cold_ttft_ms    the prompt on a fresh cache. That cache, trimmed to the prompt minus its
                    last token (as the server keeps one token to process), is written with
                    `save_prompt_cache(DIR/mlxlm_prompt_cache.safetensors, cache, metadata)`
                    (metadata: model path and the cached token ids), then dropped.
    restart_ttft_ms measured in a NEW Python process (this script with --restore FILE):
                    after its model load and warm-up (untimed), from the start of
                    `load_prompt_cache(FILE)` to token 0 of `generate_step(rest, cache)`.
    cached_tokens   ids restored from the file; load_s: the new process's model load.

Prints ONE JSON object on stdout (the keys above plus versions and token checks:
hit_same_tokens / restart_same_tokens = generated ids equal to the cold run's).
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models.cache import (LRUPromptCache, load_prompt_cache, make_prompt_cache,  # noqa: E402
                                 save_prompt_cache, trim_prompt_cache)

MODEL_KEY = "model"


def generate(model, ids, gen_tokens, args, cache=None, t0=None):
    """Greedy generation of `ids` into `cache`: (ttft_ms from t0, generated ids, cache)."""
    cache = make_prompt_cache(model) if cache is None else cache
    t0 = time.perf_counter() if t0 is None else t0
    tokens, ttft = [], None
    gen = generate_step(mx.array(ids), model, max_tokens=gen_tokens, prompt_cache=cache,
                        prefill_step_size=args.prefill_step_size)
    for tok, _ in gen:  # generate_step evaluates each token before yielding it
        if ttft is None:
            ttft = (time.perf_counter() - t0) * 1e3
        tokens.append(tok)
    gen.close()
    mx.synchronize()
    return ttft, tokens, cache


def load(args):
    t = time.perf_counter()
    model, _ = common.load_mlxlm(args.model, args.f32_scales)
    load_s = time.perf_counter() - t
    generate(model, list(range(100, 132)), 4, args)  # warm-up
    return model, load_s


def prefix(model, s, args):
    first, second, gen = s["first"], s["second"], s.get("gen_tokens", 8)
    cold, cold_tokens, _ = generate(model, second, gen, args)
    mx.clear_cache()

    lru = LRUPromptCache()
    first_ttft, first_tokens, cache = generate(model, first, gen, args)
    key = first + first_tokens
    assert cache[0].offset == len(key), (cache[0].offset, len(key))
    lru.insert_cache(MODEL_KEY, key, cache)
    del cache
    mx.clear_cache()

    t0 = time.perf_counter()
    cache, rest = lru.fetch_nearest_cache(MODEL_KEY, second)
    fetch_ms = (time.perf_counter() - t0) * 1e3
    if cache is None:
        cache = make_prompt_cache(model)
    hit, hit_tokens, _ = generate(model, rest, gen, args, cache, t0)
    return {"cold_ttft_ms": cold, "hit_ttft_ms": hit, "cached_tokens": len(second) - len(rest),
            "first_ttft_ms": first_ttft, "fetch_ms": fetch_ms,
            "hit_same_tokens": hit_tokens == cold_tokens}


def restore(model, s, file, args):
    """The timed part of a restart, run in a fresh process."""
    prompt, gen = s["prompt"], s.get("gen_tokens", 8)
    t0 = time.perf_counter()
    cache, meta = load_prompt_cache(file, return_metadata=True)
    cached = json.loads(meta["tokens"])
    if meta.get("model") != str(args.model) or prompt[:len(cached)] != cached:
        raise SystemExit(f"{file} does not hold a prefix of this prompt for this model")
    ttft, tokens, _ = generate(model, prompt[len(cached):], gen, args, cache, t0)
    return {"restart_ttft_ms": ttft, "cached_tokens": len(cached), "tokens": tokens}


def restart(model, s, args):
    prompt, gen = s["prompt"], s.get("gen_tokens", 8)
    cold, cold_tokens, cache = generate(model, prompt, gen, args)
    trim_prompt_cache(cache, cache[0].offset - (len(prompt) - 1))
    os.makedirs(s["dir"], exist_ok=True)
    file = Path(s["dir"]) / "mlxlm_prompt_cache.safetensors"
    t = time.perf_counter()
    save_prompt_cache(str(file), cache, {"model": str(args.model), "tokens": json.dumps(prompt[:-1])})
    save_s = time.perf_counter() - t
    del cache
    gc.collect()
    mx.clear_cache()
    try:
        child = [sys.executable, __file__, str(args.model), str(args.scenario), "--restore", str(file),
                 "--prefill-step-size", str(args.prefill_step_size),
                 "--f32-scales" if args.f32_scales else "--no-f32-scales"]
        r = common.last_json_object(subprocess.run(child, stdout=subprocess.PIPE, text=True,
                                                   check=True).stdout)
        file_bytes = file.stat().st_size
    finally:
        file.unlink(missing_ok=True)
    return {"cold_ttft_ms": cold, "restart_ttft_ms": r["restart_ttft_ms"],
            "cached_tokens": r["cached_tokens"], "load_s": r["load_s"], "save_s": save_s,
            "cache_file_bytes": file_bytes, "restart_same_tokens": r["tokens"] == cold_tokens,
            "restart_measured": "new process: load_prompt_cache start -> token 0"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("scenario", type=Path)
    ap.add_argument("--f32-scales", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--prefill-step-size", type=int, default=2048)
    ap.add_argument("--restore", type=Path, help=argparse.SUPPRESS)  # internal: restart child
    args = ap.parse_args()
    s = json.loads(args.scenario.read_text())
    model, load_s = load(args)
    if args.restore:
        out = {**restore(model, s, args.restore, args), "load_s": load_s}
    elif s["mode"] == "prefix":
        out = prefix(model, s, args)
    elif s["mode"] == "restart":
        out = restart(model, s, args)
    else:
        raise SystemExit(f"unknown mode {s['mode']!r}")
    print(json.dumps({**out, "side": "mlx-lm", "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__,
                      "f32_scales": args.f32_scales, "prefill_step_size": args.prefill_step_size,
                      "provenance": common.reference_provenance(model)}))


if __name__ == "__main__":
    main()
