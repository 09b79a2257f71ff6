#!/usr/bin/env python3
"""Build a tiny random-weight model with mlx-lm's own model class and save it
as a Hugging Face MLX-format folder (config.json, model.safetensors, tokenizer
files), optionally affine-quantized. The tokenizer and chat template come from
the default GGUF, so the vocabulary is real (49152 ids).

Tests use these where no small real checkpoint of an architecture exists, or
where speed matters more than the weights (stress tests).

Usage:
    make_tiny.py --family llama --out DIR --gguf SmolLM2.gguf [--quantize BITS] [--group 32] [--seed 0]
"""
import argparse
import importlib
import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_to_mlx  # noqa: E402

VOCAB = 49152

# Small but not degenerate: several heads, grouped-query attention, a few layers.
PRESETS = {
    "llama": dict(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB,
        rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=8192,
    ),
}


def build(family, seed):
    args = dict(PRESETS[family])
    module = importlib.import_module(f"mlx_lm.models.{args['model_type']}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(args))
    # Default inits give near-uniform logits; scale weights up a little so
    # greedy decoding is decisive rather than a coin toss between ties.
    params = tree_flatten(model.parameters())
    model.load_weights([(k, v * 4 if v.ndim == 2 else v) for k, v in params])
    mx.eval(model.parameters())
    return model, args


def save(model, config, out, gguf, bits, group):
    out.mkdir(parents=True, exist_ok=True)
    if bits:
        nn.quantize(model, group_size=group, bits=bits)
        config["quantization"] = {"group_size": group, "bits": bits, "mode": "affine"}
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    _, meta = mx.load(str(gguf), return_metadata=True)
    tok, specials = gguf_to_mlx.build_tokenizer(meta)
    tok.save(str(out / "tokenizer.json"))
    tokens = meta["tokenizer.ggml.tokens"]
    eos_id = gguf_to_mlx.meta_value(meta["tokenizer.ggml.eos_token_id"])
    bos_id = gguf_to_mlx.meta_value(meta["tokenizer.ggml.bos_token_id"])
    config.update(bos_token_id=bos_id, eos_token_id=eos_id)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokens[bos_id],
        "eos_token": tokens[eos_id],
        "pad_token": tokens[eos_id],
        "add_bos_token": False,
        "chat_template": gguf_to_mlx.meta_value(meta["tokenizer.chat_template"]),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", required=True, choices=sorted(PRESETS))
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--gguf", required=True, type=Path, help="source of the tokenizer and chat template")
    ap.add_argument("--quantize", type=int, default=0, metavar="BITS")
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    model, config = build(a.family, a.seed)
    save(model, config, a.out, a.gguf, a.quantize, a.group)
    print(f"wrote {a.out} ({a.family}, quantize={a.quantize or 'no'})")


if __name__ == "__main__":
    main()
