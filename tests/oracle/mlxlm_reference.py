#!/usr/bin/env python3
"""Correctness oracle: greedy generation with Python mlx-lm, recording tokens and logits.

For every prompt, mlx-lm's own `generate_step` (its model, KV cache and prefill: the
prompt minus its last token in chunks of --prefill-step-size, then the last token) decodes
exactly --steps tokens greedily, with NO EOS stop. The raw last-position logits (before
log-softmax) are captured at the requested steps: step 0 = the logits after the prompt
(they produced generated token 0), step s = the logits that produced generated token s.

Usage:
    mlxlm_reference.py --model DIR_OR_GGUF --prompts PROMPTS.json --out OUT.safetensors
        [--steps 64] [--logit-steps 0,1,8,31,63] [--f32-scales | --no-f32-scales]
        [--prefill-step-size 2048] [--kv-bits B --kv-group-size G --quantized-kv-start S]
        [--no-rotating-quant] [--json]

--model is an MLX-format folder (see gguf_to_mlx.py) or a .gguf file (converted into a
temporary folder first). --f32-scales (default ON) casts quantization scales/biases to
float32 after loading, as the engine does on CPU (lossless; fp16 scales are ~30x slower on
MLX's CPU backend). Both sides of a comparison must use the same setting.

--kv-bits/--kv-group-size/--quantized-kv-start are passed to generate_step (mlx-lm's
quantized KV cache: the cache converts after the forward that reaches the start).
--no-rotating-quant keeps RotatingKVCache layers (sliding windows) float, as mlxrt does
(mlx-lm's RotatingKVCache.to_quantized raises NotImplementedError).

PROMPTS.json: {"prompts": [{"name": "...", "ids": [...]} |
                           {"name": "...", "messages": [{"role": ..., "content": ...}]}]}
Messages are rendered with the tokenizer's chat template (add_generation_prompt=True) and
tokenized with special tokens parsed and none added; the ids used are recorded.

BLAS: MLX's dense CPU matmul calls `cblas_sgemm`, which mlxrt binds to OpenBLAS (build.rs)
while this process gets the wheel's reference BLAS; they round differently (~1e-7), and
quantized KV can turn that into a whole level of a K/V element. The Rust tests therefore
run this script with mlxrt's OpenBLAS in LD_PRELOAD (tests/common: `py`), which is
recorded in the metadata (`ld_preload`) so that a reference made on another BLAS is
rebuilt.

Output (mx.save_safetensors), per prompt NAME:
    NAME.prompt_ids  int32 [n_prompt]
    NAME.tokens      int32 [steps]
    NAME.logits      float32 [len(logit_steps), vocab]
    NAME.logit_steps int32 [len(logit_steps)]
and string metadata: mlx_version, mlx_lm_version, f32_scales, steps, prefill_step_size,
model, prompts (JSON: name -> rendered text or null), ld_preload.
--json prints a summary (versions, per-prompt ids, tokens, decoded text) to stdout.

Importable: `run_reference(model, tokenizer, prompts, steps, logit_steps)` returns the
arrays; `load_reference_model(path, f32_scales)` loads and optionally casts scales.
"""
import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
from mlx_lm.generate import generate_step


def cast_scales_f32(model: nn.Module) -> int:
    """Cast every quantized module's scales/biases to float32 in place; returns the count."""
    n = 0
    for _, m in model.named_modules():
        if isinstance(getattr(m, "scales", None), mx.array) and m.scales.dtype != mx.float32:
            m.scales = m.scales.astype(mx.float32)
            if isinstance(getattr(m, "biases", None), mx.array):
                m.biases = m.biases.astype(mx.float32)
            n += 1
    mx.eval(model.parameters())
    return n


def load_reference_model(path, f32_scales=True):
    """mlx_lm.load on an MLX folder, or on a .gguf converted to a temporary folder."""
    path = Path(path)
    if path.suffix == ".gguf":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from gguf_to_mlx import write_folder

        with tempfile.TemporaryDirectory(prefix="mlxrt-oracle-") as tmp:
            write_folder(path, Path(tmp))
            model, tokenizer = mlx_lm.load(tmp)  # not lazy: weights are read before cleanup
    else:
        model, tokenizer = mlx_lm.load(str(path))
    if f32_scales:
        cast_scales_f32(model)
    return model, tokenizer


def prompt_ids(tokenizer, prompt):
    """(ids, rendered text or None) for one prompt entry of PROMPTS.json."""
    if "ids" in prompt:
        return [int(i) for i in prompt["ids"]], None
    text = tokenizer.apply_chat_template(prompt["messages"], add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False), text


def skip_rotating_quant():
    """Make mlx-lm's KV quantization leave RotatingKVCache layers float."""
    import importlib

    from mlx_lm.models.cache import RotatingKVCache

    # The module, not the `generate` function the package exports by that name.
    gen = importlib.import_module("mlx_lm.generate")

    original = gen.maybe_quantize_kv_cache

    def patched(prompt_cache, quantized_kv_start, kv_group_size, kv_bits):
        if kv_bits is None:
            return
        for e, c in enumerate(prompt_cache):
            if isinstance(c, RotatingKVCache):
                continue
            if hasattr(c, "to_quantized") and c.offset >= quantized_kv_start:
                prompt_cache[e] = c.to_quantized(group_size=kv_group_size, bits=kv_bits)

    gen.maybe_quantize_kv_cache = patched
    return original


def greedy_with_logits(model, ids, steps, logit_steps, prefill_step_size=2048, kv=None):
    """Greedy-decode `steps` tokens after `ids`; return (tokens, logits[len(logit_steps), V])."""
    captured = []

    def capture(_tokens, logits):  # called once per step with the raw logits, in order
        captured.append(logits)
        if len(captured) - 1 not in wanted:
            captured[-1] = None  # keep only what we need
        return logits

    wanted = set(logit_steps)
    tokens = []
    for tok, _ in generate_step(mx.array(ids), model, max_tokens=steps,
                                logits_processors=[capture], prefill_step_size=prefill_step_size,
                                **(kv or {})):
        tokens.append(tok)
    rows = [captured[s].reshape(-1).astype(mx.float32) for s in logit_steps]
    logits = mx.stack(rows)
    mx.eval(logits)
    return tokens, logits


def run_reference(model, tokenizer, prompts, steps, logit_steps, prefill_step_size=2048, kv=None):
    """Run every prompt; returns ({tensor name: mx.array}, {name: rendered text}, summary)."""
    if any(s < 0 or s >= steps for s in logit_steps):
        raise ValueError(f"logit steps must lie in [0, {steps})")
    tensors, texts, summary = {}, {}, []
    for p in prompts:
        name = p["name"]
        if "." in name or f"{name}.tokens" in tensors:
            raise ValueError(f"prompt names must be unique and contain no '.': {name!r}")
        ids, text = prompt_ids(tokenizer, p)
        tokens, logits = greedy_with_logits(model, ids, steps, logit_steps, prefill_step_size, kv)
        argmax = mx.argmax(logits, axis=-1).tolist()
        if argmax != [tokens[s] for s in logit_steps]:
            raise RuntimeError(f"{name}: captured logits do not match the sampled tokens")
        tensors[f"{name}.prompt_ids"] = mx.array(ids, dtype=mx.int32)
        tensors[f"{name}.tokens"] = mx.array(tokens, dtype=mx.int32)
        tensors[f"{name}.logits"] = logits
        tensors[f"{name}.logit_steps"] = mx.array(logit_steps, dtype=mx.int32)
        texts[name] = text
        summary.append({"name": name, "prompt_ids": ids, "tokens": tokens,
                        "text": tokenizer.decode(tokens)})
    return tensors, texts, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--f32-scales", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--prompts", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--logit-steps", default="0,1,8,31,63")
    ap.add_argument("--prefill-step-size", type=int, default=2048)
    ap.add_argument("--kv-bits", type=int, default=None)
    ap.add_argument("--kv-group-size", type=int, default=64)
    ap.add_argument("--quantized-kv-start", type=int, default=0)
    ap.add_argument("--no-rotating-quant", action="store_true")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--json", action="store_true", help="print a JSON summary to stdout")
    args = ap.parse_args()

    logit_steps = [int(s) for s in args.logit_steps.split(",") if s.strip()]
    prompts = json.loads(args.prompts.read_text())["prompts"]
    model, tokenizer = load_reference_model(args.model, args.f32_scales)
    kv = None
    if args.kv_bits is not None:
        kv = {"kv_bits": args.kv_bits, "kv_group_size": args.kv_group_size,
              "quantized_kv_start": args.quantized_kv_start}
    if args.no_rotating_quant:
        skip_rotating_quant()
    tensors, texts, summary = run_reference(model, tokenizer, prompts, args.steps, logit_steps,
                                            args.prefill_step_size, kv)
    meta = {
        "mlx_version": mx.__version__,
        "mlx_lm_version": mlx_lm.__version__,
        "f32_scales": str(args.f32_scales).lower(),
        "steps": str(args.steps),
        "prefill_step_size": str(args.prefill_step_size),
        "kv": json.dumps(kv),
        "model": str(args.model),
        "prompts": json.dumps(texts, ensure_ascii=False),
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(args.out), tensors, metadata=meta)
    if args.json:
        print(json.dumps({**meta, "prompts": summary, "out": str(args.out),
                          "logit_steps": logit_steps}, ensure_ascii=False))
    else:
        for s in summary:
            print(f"{s['name']}: {len(s['prompt_ids'])} prompt ids -> {s['text']!r}", file=sys.stderr)
        print(f"wrote {args.out} (f32_scales={args.f32_scales})", file=sys.stderr)


if __name__ == "__main__":
    main()
