#!/usr/bin/env python3
"""Convert a Llama GGUF (e.g. SmolLM2-135M-Instruct.Q4_1.gguf) into a Hugging Face
MLX-format folder that `mlx_lm.load(OUT_DIR)` loads as-is.

Why: the correctness oracle (mlxrt vs Python mlx-lm) needs mlx-lm to run *exactly* the
weights the engine runs. MLX's own GGUF reader already turns Q4_0/Q4_1/Q8_0 into affine
quantized arrays; this script only renames them to HF names, un-permutes the Q/K rows
(GGUF stores them for interleaved RoPE; HF/mlx-lm Llama uses half-split RoPE), and writes
config / tokenizer files from the GGUF metadata. No values are requantized or recast:
scales/biases stay fp16 and the norm weights keep the GGUF's dtype.

Usage:
    gguf_to_mlx.py GGUF OUT_DIR [--verify]

--verify (needs mlx-lm) loads OUT_DIR with mlx_lm.load, checks that the un-permuted
weights with half-split RoPE give the same logits as the raw GGUF rows with traditional
RoPE, checks the tokenizer against the chat template, and prints a short greedy answer.
"""
import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

# GGUF tensor name suffix -> HF module name (per block).
BLOCK_MAP = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def meta_value(v):
    """GGUF metadata scalars come back as 0-d mx.arrays; turn them into Python values."""
    if isinstance(v, mx.array):
        return v.item() if v.ndim == 0 else v.tolist()
    return v


def unpermute_rows(w: mx.array, n_head: int) -> mx.array:
    """Undo llama.cpp's Q/K row permutation (interleaved -> half-split RoPE layout).

    Works on any tensor whose first axis is the output rows: packed weight, scales, biases.
    """
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def quant_params(weights, prefix):
    """(bits, group_size) of an MLX affine-quantized tensor triple, from shapes."""
    packed = weights[f"{prefix}.weight"].shape[-1]
    groups = weights[f"{prefix}.scales"].shape[-1]
    # in_dims = packed * 32 / bits = groups * group_size; MLX GGUF uses group 32 here.
    group_size = 32
    in_dims = groups * group_size
    bits = packed * 32 // in_dims
    return bits, group_size


def convert_weights(weights, n_head, n_kv_head):
    out = {}
    for name, arr in weights.items():
        parts = name.split(".")
        if parts[0] == "token_embd":
            out[f"model.embed_tokens.{parts[1]}"] = arr
        elif parts[0] == "output_norm":
            out[f"model.norm.{parts[1]}"] = arr
        elif parts[0] == "output":
            out[f"lm_head.{parts[1]}"] = arr
        elif parts[0] == "blk":
            layer, kind, leaf = parts[1], parts[2], parts[3]
            if kind == "attn_q":
                arr = unpermute_rows(arr, n_head)
            elif kind == "attn_k":
                arr = unpermute_rows(arr, n_kv_head)
            out[f"model.layers.{layer}.{BLOCK_MAP[kind]}.{leaf}"] = arr
        else:
            raise ValueError(f"unexpected GGUF tensor {name}")
    return out


def build_config(meta, weights):
    arch = meta_value(meta["general.architecture"])
    if arch != "llama":
        raise SystemExit(f"only llama GGUFs are supported, got {arch}")
    g = lambda k: meta_value(meta[f"llama.{k}"])
    hidden = g("embedding_length")
    n_head = g("attention.head_count")
    head_dim = meta_value(meta.get("llama.rope.dimension_count", hidden // n_head))
    vocab = len(meta["tokenizer.ggml.tokens"])
    tied = "output.weight" not in weights
    bits, group = quant_params(weights, "blk.0.attn_q")
    quantization = {"group_size": group, "bits": bits, "mode": "affine"}
    # Per-module overrides: mlx-lm's load_model class_predicate returns
    # config["quantization"][module_path] when the path is a key of that dict.
    emb_bits, emb_group = quant_params(weights, "token_embd")
    if (emb_bits, emb_group) != (bits, group):
        quantization["model.embed_tokens"] = {"group_size": emb_group, "bits": emb_bits}
    if not tied:
        ob, og = quant_params(weights, "output")
        if (ob, og) != (bits, group):
            quantization["lm_head"] = {"group_size": og, "bits": ob}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": g("feed_forward_length"),
        "num_hidden_layers": g("block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": g("attention.head_count_kv"),
        "head_dim": head_dim,
        "max_position_embeddings": g("context_length"),
        "rms_norm_eps": float(np.float32(g("attention.layer_norm_rms_epsilon"))),
        "rope_theta": float(np.float32(g("rope.freq_base"))),
        "rope_traditional": False,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": meta_value(meta["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": meta_value(meta["tokenizer.ggml.eos_token_id"]),
        "quantization": quantization,
        "quantization_config": quantization,
    }


def build_tokenizer(meta):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    if meta_value(meta["tokenizer.ggml.model"]) != "gpt2":
        raise SystemExit("only GPT-2 style BPE vocabularies are supported")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta_value(meta["tokenizer.ggml.token_type"])
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    # token_type 3 = CONTROL: the special tokens (<|endoftext|>, <|im_start|>, ...).
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(types) if t == 3]
    tok.add_special_tokens(special)
    return tok, [tokens[i] for i, t in enumerate(types) if t == 3]


def write_folder(gguf, out_dir):
    weights, meta = mx.load(str(gguf), return_metadata=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = build_config(meta, weights)
    hf = convert_weights(weights, config["num_attention_heads"], config["num_key_value_heads"])
    mx.save_safetensors(str(out_dir / "model.safetensors"), hf, metadata={"format": "mlx"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    tok, specials = build_tokenizer(meta)
    tok.save(str(out_dir / "tokenizer.json"))
    tokens = meta["tokenizer.ggml.tokens"]
    bos = tokens[meta_value(meta["tokenizer.ggml.bos_token_id"])]
    eos = tokens[meta_value(meta["tokenizer.ggml.eos_token_id"])]
    pad = tokens[meta_value(meta.get("tokenizer.ggml.padding_token_id", meta["tokenizer.ggml.eos_token_id"]))]
    unk = tokens[meta_value(meta.get("tokenizer.ggml.unknown_token_id", 0))]
    add_bos = bool(meta_value(meta.get("tokenizer.ggml.add_bos_token", False)))
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "unk_token": unk,
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "additional_special_tokens": [t for t in specials if t not in (bos, eos, pad, unk)],
        "chat_template": meta_value(meta["tokenizer.chat_template"]),
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
    special_map = {k: tok_config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token",
                                              "additional_special_tokens")}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    gen = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
           "pad_token_id": tokens.index(pad)}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return weights, config


def verify(out_dir, gguf_weights, config):
    """Load OUT_DIR with mlx-lm and sanity-check it (see module docstring)."""
    import mlx_lm
    from mlx_lm.utils import load_model

    model, tokenizer = mlx_lm.load(str(out_dir))
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    print(f"prompt ids ({len(ids)}): {ids}")
    assert ids[0] == 1 and tokenizer.decode(ids) == text, "tokenizer round trip failed"

    # Same weights with the raw (permuted) GGUF Q/K rows and traditional RoPE.
    trad, _ = load_model(Path(out_dir), model_config={"rope_traditional": True})
    raw = []
    for i in range(config["num_hidden_layers"]):
        for g, h in (("attn_q", "q_proj"), ("attn_k", "k_proj")):
            for leaf in ("weight", "scales", "biases"):
                raw.append((f"model.layers.{i}.self_attn.{h}.{leaf}", gguf_weights[f"blk.{i}.{g}.{leaf}"]))
    trad.load_weights(raw, strict=False)
    x = mx.array(ids)[None]
    a = model(x).astype(mx.float32)
    b = trad(x).astype(mx.float32)
    diff = mx.abs(a - b).max().item()
    print(f"half-split(unpermuted) vs traditional(permuted) RoPE: max |dlogit| = {diff:.3g} "
          f"(logit range {mx.abs(a).max().item():.1f})")

    answer = mlx_lm.generate(model, tokenizer, text, max_tokens=40, verbose=False)
    print(f"greedy answer: {answer!r}")
    return diff


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--verify", action="store_true", help="load the folder with mlx-lm and check it")
    args = ap.parse_args()
    weights, config = write_folder(args.gguf, args.out_dir)
    print(f"wrote {args.out_dir} ({len(weights)} tensors, quantization {config['quantization']})")
    if args.verify:
        diff = verify(args.out_dir, weights, config)
        if diff > 1e-2:
            sys.exit("RoPE permutation check failed")


if __name__ == "__main__":
    main()
