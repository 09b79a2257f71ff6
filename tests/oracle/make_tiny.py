#!/usr/bin/env python3
"""Build a tiny random-weight model with mlx-lm's own model class and save it
as a Hugging Face MLX-format folder (config.json, model.safetensors, tokenizer
files), optionally affine-quantized. The tokenizer and chat template come from
the default GGUF, so the vocabulary is real (49152 ids).

Tests use these where no small real checkpoint of an architecture exists, or
where speed matters more than the weights (stress tests).

Usage:
    make_tiny.py --family llama --out DIR --gguf SmolLM2.gguf [--quantize BITS] [--group 32] [--seed 0]
        [--dtype float32|bfloat16|float16]
"""
import argparse
import importlib
import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path
from mlx_lm.utils import quantize_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_to_mlx  # noqa: E402

VOCAB = 49152

# Small but not degenerate: several heads, grouped-query attention, a few layers;
# each family's special parts switched on (sliding windows short enough to bite
# within a test prompt, experts sorted at prefill, mixed layer kinds).
PRESETS = {
    "llama": dict(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB,
        rope_theta=10000.0, tie_word_embeddings=True, max_position_embeddings=8192,
    ),
    "qwen2": dict(
        model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=VOCAB,
        rope_theta=1000000.0, tie_word_embeddings=True, max_position_embeddings=8192,
    ),
    "qwen3": dict(
        model_type="qwen3", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
        vocab_size=VOCAB, rope_theta=1000000.0, tie_word_embeddings=False,
        max_position_embeddings=8192,
    ),
    "qwen3_moe": dict(
        model_type="qwen3_moe", hidden_size=64, num_hidden_layers=3, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        vocab_size=VOCAB, rope_theta=1000000.0, tie_word_embeddings=True,
        max_position_embeddings=8192, num_experts=8, num_experts_per_tok=2,
        decoder_sparse_step=1, mlp_only_layers=[1], moe_intermediate_size=32,
        norm_topk_prob=True,
    ),
    "gemma3_text": dict(
        model_type="gemma3_text", hidden_size=64, num_hidden_layers=4, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        vocab_size=VOCAB, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        query_pre_attn_scalar=16, sliding_window=8, sliding_window_pattern=2,
        max_position_embeddings=8192,
    ),
    "qwen3_5": dict(
        model_type="qwen3_5", hidden_size=64, num_hidden_layers=4, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        vocab_size=VOCAB, max_position_embeddings=8192, linear_num_value_heads=4,
        linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, full_attention_interval=2, tie_word_embeddings=False,
        rope_parameters={"type": "default", "rope_theta": 100000.0,
                         "partial_rotary_factor": 0.5},
    ),
    "qwen3_next": dict(
        model_type="qwen3_next", hidden_size=64, num_hidden_layers=4, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        vocab_size=VOCAB, max_position_embeddings=8192, linear_num_value_heads=4,
        linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, full_attention_interval=2, tie_word_embeddings=False,
        rope_theta=10000.0, partial_rotary_factor=0.25, num_experts=4, num_experts_per_tok=2,
        decoder_sparse_step=1, mlp_only_layers=[0], moe_intermediate_size=32,
        shared_expert_intermediate_size=64, norm_topk_prob=False,
    ),
    # A multimodal Gemma 3 checkpoint (text model under `language_model.`).
    "gemma3": dict(
        model_type="gemma3", vocab_size=VOCAB, text_config=dict(
            model_type="gemma3_text", hidden_size=64, num_hidden_layers=2,
            intermediate_size=128, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
            rms_norm_eps=1e-6, query_pre_attn_scalar=16, sliding_window=8,
            sliding_window_pattern=2, max_position_embeddings=8192)),
    # Every Gemma 4 feature at once: wider global heads with K = V and
    # proportional partial RoPE, KV shared by the last two layers (double-wide
    # MLPs there), per-layer input embeddings, an MoE block beside each MLP.
    "gemma4_text": dict(
        model_type="gemma4_text", hidden_size=64, num_hidden_layers=6, intermediate_size=64,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
        num_global_key_value_heads=1, attention_k_eq_v=True, rms_norm_eps=1e-6,
        vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=16,
        num_kv_shared_layers=2, sliding_window=8, sliding_window_pattern=3,
        max_position_embeddings=8192, final_logit_softcapping=30.0, use_double_wide_mlp=True,
        enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
        tie_word_embeddings=True,
    ),
    # KV-memory tests (quantized and rotating KV): MLX quantizes in groups of
    # 32, 64 or 128 along head_dim, so these have head_dim 64; Gemma 3's
    # window is short enough that a test prompt is several windows long.
    "llama_kv": dict(
        model_type="llama", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-5,
        vocab_size=VOCAB, rope_theta=10000.0, tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
    "qwen3_kv": dict(
        model_type="qwen3", hidden_size=128, num_hidden_layers=2, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
        vocab_size=VOCAB, rope_theta=1000000.0, tie_word_embeddings=False,
        max_position_embeddings=8192,
    ),
    "gemma3_kv": dict(
        model_type="gemma3_text", hidden_size=128, num_hidden_layers=4, intermediate_size=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
        vocab_size=VOCAB, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        query_pre_attn_scalar=64, sliding_window=16, sliding_window_pattern=2,
        max_position_embeddings=8192,
    ),
    # Benchmark models (bench/families.py): realistic widths (Qwen3-0.6B-like,
    # and a Qwen3.5-like hybrid), few layers so the CPU runs stay short.
    "qwen3_bench": dict(
        model_type="qwen3", hidden_size=1024, num_hidden_layers=4, intermediate_size=3072,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
        vocab_size=VOCAB, rope_theta=1000000.0, tie_word_embeddings=True,
        max_position_embeddings=40960,
    ),
    "qwen3_5_bench": dict(
        model_type="qwen3_5", hidden_size=1024, num_hidden_layers=4, intermediate_size=3072,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256, rms_norm_eps=1e-6,
        vocab_size=VOCAB, max_position_embeddings=262144, linear_num_value_heads=16,
        linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, full_attention_interval=4, tie_word_embeddings=True,
        rope_parameters={"type": "default", "rope_theta": 10000000.0,
                         "partial_rotary_factor": 0.25},
    ),
    # bench/kv_memory.py's sliding-window model: Gemma 3's attention, three
    # sliding layers and one global layer (mlx-lm needs one at index pattern-1).
    "gemma3_sliding_bench": dict(
        model_type="gemma3_text", hidden_size=256, num_hidden_layers=4, intermediate_size=512,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
        vocab_size=VOCAB, rope_theta=1000000.0, rope_local_base_freq=10000.0,
        query_pre_attn_scalar=64, sliding_window=512, sliding_window_pattern=4,
        max_position_embeddings=32768,
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
    scaled = [(k, v * 4 if v.ndim == 2 or "switch_" in k else v) for k, v in params]
    if family != "llama":
        # Vary the 1-D parameters (norm weights, per-expert and layer scales,
        # gate biases), which start as constants, so that using them matters.
        scaled = [(k, v * mx.random.uniform(0.5, 1.5, v.shape) if v.ndim == 1 else v) for k, v in scaled]
    model.load_weights(scaled)
    mx.eval(model.parameters())
    return model, args


def cast(model, dtype):
    """Floating parameters to `dtype`, except those the model keeps in f32 (as
    mlx_lm.convert does, e.g. Qwen3.5's A_log)."""
    keep = getattr(model, "cast_predicate", lambda _: True)
    dt = getattr(mx, dtype)
    model.update(tree_map_with_path(
        lambda k, v: v.astype(dt) if keep(k) and mx.issubdtype(v.dtype, mx.floating) else v,
        model.parameters()))
    mx.eval(model.parameters())


def save(model, config, out, gguf, bits, group):
    out.mkdir(parents=True, exist_ok=True)
    if bits:
        # mlx-lm's own quantizer: the model's per-layer choices (e.g. 8-bit
        # routers) become per-module overrides in the config.
        model, config = quantize_model(model, config, group_size=group, bits=bits)
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
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    a = ap.parse_args()
    model, config = build(a.family, a.seed)
    if a.dtype != "float32":
        cast(model, a.dtype)
    save(model, config, a.out, a.gguf, a.quantize, a.group)
    print(f"wrote {a.out} ({a.family}, quantize={a.quantize or 'no'})")


if __name__ == "__main__":
    main()
