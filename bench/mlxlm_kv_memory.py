#!/usr/bin/env python3
"""Reference side of the KV-memory benchmark (bench/kv_memory.py): Python mlx-lm.

Two scenarios, each printing ONE JSON object on stdout (the last line):

decode  --model M --prompt-ids FILE --gen-tokens G --schemes f32,affine8,affine4
    Prefills the prompt ONCE with mlx-lm's float cache, then for each scheme copies that
    cache (converted with mlx-lm's own `KVCache.to_quantized(group_size, bits)` for the
    affine schemes, i.e. kv_bits with quantized_kv_start 0 for the decode) and decodes G
    greedy tokens with `generate_step(prompt_cache=...)`. One prefill instead of one per
    scheme keeps the run short (mlx-lm prefills 4k tokens at ~10 tok/s on a small CPU);
    the decode and the bytes are what this scenario measures. Per scheme: decode_tps,
    kv_bytes (sum of the caches' `nbytes` after the decode), kv_positions (the cache
    offset), kv_dtype.

sliding --model M --prompt-ids FILE --lengths 1024,8192
    A Gemma-3-style model whose mlx-lm cache is RotatingKVCache for its sliding layers:
    prefills each length (prefix of the ids) in a fresh cache and reports the bytes of the
    rotating layers and of all layers.

Usage:
    mlxlm_kv_memory.py decode --model DIR_OR_GGUF --prompt-ids FILE [--gen-tokens 64]
        [--schemes f32,affine8,affine4] [--group-size 64] [--f32-scales | --no-f32-scales]
    mlxlm_kv_memory.py sliding --model DIR --prompt-ids FILE [--lengths 1024,8192]
"""
import argparse
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache  # noqa: E402

AFFINE_BITS = {"affine8": 8, "affine4": 4}


def prefill(model, ids, step=2048):
    """A float cache holding all of `ids` (mlx-lm's model called in chunks)."""
    cache = make_prompt_cache(model)
    for i in range(0, len(ids), step):
        model(mx.array(ids[i:i + step])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def decode(model, cache, last_id, gen_tokens):
    """Greedy `gen_tokens` tokens after `last_id` on `cache`; returns (decode_tps, ids)."""
    tokens, t_first = [], None
    gen = generate_step(mx.array([last_id]), model, max_tokens=gen_tokens, prompt_cache=cache)
    for tok, _ in gen:
        tokens.append(tok)
        if t_first is None:
            t_first = time.perf_counter()
    t_end = time.perf_counter()
    gen.close()
    return (len(tokens) - 1) / (t_end - t_first), tokens


def scenario_decode(args):
    model, _ = common.load_mlxlm(args.model, args.f32_scales)
    ids = common.read_prompt_ids(args.prompt_ids)
    t = time.perf_counter()
    base = prefill(model, ids[:-1])
    prefill_s = time.perf_counter() - t
    decode(model, copy.deepcopy(base), ids[-1], 4)  # warm-up
    out = {}
    for scheme in args.schemes.split(","):
        cache = copy.deepcopy(base)
        if scheme in AFFINE_BITS:
            cache = [c.to_quantized(group_size=args.group_size, bits=AFFINE_BITS[scheme]) for c in cache]
        elif scheme != "f32":
            raise SystemExit(f"mlx-lm has no KV scheme {scheme!r}")
        tps, toks = decode(model, cache, ids[-1], args.gen_tokens)
        mx.eval([c.state for c in cache])
        keys = cache[0].state[0]
        dtype = (keys[1] if isinstance(keys, (list, tuple)) else keys).dtype  # quantized: (w, scales, biases)
        out[scheme] = {
            "decode_tps": tps,
            "kv_bytes": sum(c.nbytes for c in cache),
            "kv_positions": cache[0].offset,
            "kv_dtype": ("affine planes, scales " if scheme in AFFINE_BITS else "") + str(dtype).replace("mlx.core.", ""),
            "generated_head": toks[:16],
        }
        print(json.dumps({scheme: out[scheme]}), file=sys.stderr)
        del cache
        mx.clear_cache()
    return {"prefill_s": prefill_s, "schemes": out, "provenance": common.reference_provenance(model)}


def scenario_sliding(args):
    model, _ = common.load_mlxlm(args.model, False)
    ids = common.read_prompt_ids(args.prompt_ids)
    out = {}
    for n in (int(x) for x in args.lengths.split(",")):
        cache = prefill(model, ids[:n])
        rotating = [c for c in cache if isinstance(c, RotatingKVCache)]
        out[str(n)] = {
            "kv_bytes": sum(c.nbytes for c in cache),
            "sliding_kv_bytes": sum(c.nbytes for c in rotating),
            "sliding_layers": len(rotating),
            "full_layers": sum(isinstance(c, KVCache) for c in cache),
        }
        print(json.dumps({n: out[str(n)]}), file=sys.stderr)
        del cache
        mx.clear_cache()
    return {"lengths": out, "provenance": common.reference_provenance(model)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=("decode", "sliding"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", type=Path, required=True)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--schemes", default="f32,affine8,affine4")
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--lengths", default="1024,8192")
    ap.add_argument("--f32-scales", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    result = scenario_decode(args) if args.scenario == "decode" else scenario_sliding(args)
    result.update({"side": "mlx-lm", "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
