#!/usr/bin/env python3
"""Media oracle for Qwen3-VL: a tiny random-weight checkpoint built with mlx-vlm's own
classes (models/qwen3_vl), test images, and mlx-vlm's reference outputs.

Writes into --out (a directory):
    model/                 the checkpoint as mlx-vlm lays it out (config.json with
                           text_config/vision_config, model.safetensors with
                           language_model./vision_tower. tensors, preprocessor_config.json,
                           tokenizer.json + tokenizer_config.json with Qwen's vision tokens
                           added to the SmolLM2 vocabulary, a ChatML template whose image
                           parts render <|vision_start|><|image_pad|><|vision_end|>)
    images/NAME.{png,jpg,webp}  make_tiny_vlm.py's test images, half_png (36 x 44:
                           smart_resize rounds 4.5 and 5.5 to even) and twin_png (odd_png's
                           size, other pixels: the prefix-identity cases)
    reference.safetensors  per image NAME: pixels.NAME f32 [patches, 3*2*p*p] and
                           grid.NAME int32 [3] (mlx-vlm's Qwen3VLImageProcessor);
                           per case CASE: CASE.prompt_ids, CASE.positions int32 [3, L] and
                           CASE.delta (get_rope_index), CASE.tokens (greedy),
                           CASE.logits [steps, vocab], CASE.tower [tokens, hidden] (merger
                           out), CASE.deepstack [layers, tokens, hidden]

The processor is mlx-vlm's own (processing_qwen3_vl.Qwen3VLProcessor with its numpy
image processor: smart_resize with min/max pixels, PIL bicubic, rescale, normalize,
patchify with the temporal axis duplicated). The forward is mlx-vlm's
`get_input_embeddings` + `language_model` with the mRoPE positions and rope deltas it
returns, one forward for the prompt, then one token per step (decode positions = cache
offset + delta), as its `generate` runs it; greedy, no EOS stop.

Usage: make_tiny_qwen_vl.py --out DIR --gguf SmolLM2.gguf [--steps 8] [--seed 0]
"""
import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_to_mlx  # noqa: E402
import make_tiny_vlm  # noqa: E402

VOCAB = 49152
VSTART, VEND, IMAGE, VIDEO = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
MEDIA_TOKENS = [VSTART, VEND, IMAGE, VIDEO]
PATCH, MERGE, TEMPORAL = 4, 2, 2

CONFIG = dict(
    model_type="qwen3_vl",
    image_token_id=VOCAB + 2,
    video_token_id=VOCAB + 3,
    vision_start_token_id=VOCAB,
    vision_end_token_id=VOCAB + 1,
    text_config=dict(
        model_type="qwen3_vl", hidden_size=64, num_hidden_layers=3, intermediate_size=128,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        vocab_size=VOCAB + len(MEDIA_TOKENS), rope_theta=5000000.0,
        max_position_embeddings=8192, tie_word_embeddings=False,
        # head_dim 16: 8 frequencies, interleaved t h w t h w t t.
        rope_scaling={"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True}),
    vision_config=dict(
        model_type="qwen3_vl", depth=3, hidden_size=32, intermediate_size=64,
        out_hidden_size=64, num_heads=2, patch_size=PATCH, spatial_merge_size=MERGE,
        temporal_patch_size=TEMPORAL, in_channels=3, num_position_embeddings=64,
        deepstack_visual_indexes=[0, 1]),
    tie_word_embeddings=False,
)

PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "processor_class": "Qwen3VLProcessor",
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "merge_size": MERGE,
    "patch_size": PATCH,
    "temporal_patch_size": TEMPORAL,
    "resample": 3,
    "rescale_factor": 0.00392156862745098,
    # Small images are scaled up (ceil), large ones down (floor).
    "size": {"shortest_edge": 32 * 32, "longest_edge": 64 * 64},
}

# Qwen's ChatML template (the real one's image branch).
TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CASES = [
    {"name": "one_png", "images": ["odd_png"], "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}]}]},
    {"name": "two_images", "images": ["big_png", "half_png"], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image"},
                                     {"type": "text", "text": "with"}, {"type": "image"}]}]},
    {"name": "other_png", "images": ["twin_png"], "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}]}]},
]


def make_images(out):
    make_tiny_vlm.make_images(out)
    rng = np.random.default_rng(9)
    img = np.clip(128 + rng.normal(0, 40, (44, 36, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(img).save(out / "half_png.png")
    make_tiny_vlm.save_twin(out)
    return sorted(out.iterdir())


def build_model(seed):
    from mlx_vlm.models.qwen3_vl import Model, ModelConfig

    mx.random.seed(seed)
    model = Model(ModelConfig.from_dict(CONFIG))
    # As make_tiny_vlm.py: scale matrices up so greedy decoding is decisive, vary
    # the 1-D parameters so that using them matters.
    scaled = []
    for k, v in tree_flatten(model.parameters()):
        if v.ndim >= 2 and "pos_embed" not in k:
            v = v * 4
        elif v.ndim == 1:
            v = v * mx.random.uniform(0.5, 1.5, v.shape) + mx.random.normal(v.shape) * 0.1
        scaled.append((k, v))
    model.load_weights(scaled)
    mx.eval(model.parameters())
    return model


def save_checkpoint(model, out, gguf):
    out.mkdir(parents=True, exist_ok=True)
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    _, meta = mx.load(str(gguf), return_metadata=True)
    tok, _ = gguf_to_mlx.build_tokenizer(meta)
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in MEDIA_TOKENS])
    assert [tok.token_to_id(t) for t in MEDIA_TOKENS] == [VOCAB + i for i in range(len(MEDIA_TOKENS))]
    tok.save(str(out / "tokenizer.json"))
    tokens = meta["tokenizer.ggml.tokens"]
    eos_id = gguf_to_mlx.meta_value(meta["tokenizer.ggml.eos_token_id"])
    config = dict(CONFIG, eos_token_id=eos_id)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": tokens[eos_id], "pad_token": tokens[eos_id],
        "add_bos_token": False, "chat_template": TEMPLATE,
    }, indent=2) + "\n")
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")


def processor(folder):
    from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    return Qwen3VLProcessor.from_pretrained(str(folder))


def reference(model, folder, images, steps):
    from jinja2 import Environment

    proc = processor(folder)
    template = Environment().from_string(TEMPLATE)
    out, texts = {}, {}
    by_name = {p.stem: p for p in images}
    for name, p in by_name.items():
        px = proc.image_processor([Image.open(p)])
        out[f"pixels.{name}"] = mx.array(px["pixel_values"].astype(np.float32))
        out[f"grid.{name}"] = mx.array(px["image_grid_thw"][0].astype(np.int32))
    for case in CASES:
        name = case["name"]
        text = template.render(messages=case["messages"], add_generation_prompt=True)
        pics = [Image.open(by_name[i]) for i in case["images"]]
        inputs = proc(images=pics, text=[text])
        texts[name] = text
        input_ids = inputs["input_ids"]
        pv, grid = inputs["pixel_values"], inputs["image_grid_thw"]
        out[f"{name}.prompt_ids"] = input_ids[0].astype(mx.int32)
        feats, deepstack = model.vision_tower(pv, grid)
        out[f"{name}.tower"] = feats
        out[f"{name}.deepstack"] = mx.stack(deepstack)
        emb = model.get_input_embeddings(input_ids, pv, image_grid_thw=grid)
        out[f"{name}.positions"] = emb.position_ids[:, 0, :].astype(mx.int32)
        out[f"{name}.delta"] = emb.rope_deltas.reshape(-1).astype(mx.int32)
        cache = model.language_model.make_cache() if hasattr(model.language_model, "make_cache") else None
        if cache is None:
            from mlx_vlm.models import cache as vlm_cache
            cache = vlm_cache.make_prompt_cache(model.language_model)
        extra = {k: v for k, v in emb.to_dict().items() if k != "inputs_embeds" and v is not None}
        logits = model.language_model(input_ids, inputs_embeds=emb.inputs_embeds, cache=cache, **extra).logits[:, -1, :]
        tokens, steps_logits = [], []
        for _ in range(steps):
            steps_logits.append(logits[0])
            y = mx.argmax(logits, axis=-1)
            tokens.append(int(y.item()))
            logits = model.language_model(y[None], cache=cache).logits[:, -1, :]
        out[f"{name}.tokens"] = mx.array(tokens, dtype=mx.int32)
        out[f"{name}.logits"] = mx.stack(steps_logits).astype(mx.float32)
    return out, texts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--gguf", required=True, type=Path, help="source of the tokenizer")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import mlx_vlm
    images = make_images(a.out / "images")
    model = build_model(a.seed)
    save_checkpoint(model, a.out / "model", a.gguf)
    out, texts = reference(model, a.out / "model", images, a.steps)
    mx.eval(out)
    import os
    meta = {"mlx_vlm_version": mlx_vlm.__version__, "mlx_version": mx.__version__,
            "steps": str(a.steps), "cases": json.dumps(CASES), "texts": json.dumps(texts),
            "ld_preload": os.environ.get("LD_PRELOAD", "").split(":")[0]}
    mx.save_safetensors(str(a.out / "reference.safetensors"), out, metadata=meta)
    print(f"wrote {a.out} (mlx-vlm {mlx_vlm.__version__})")


if __name__ == "__main__":
    main()
