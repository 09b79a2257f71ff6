#!/usr/bin/env python3
"""Media oracle: a tiny random-weight Gemma 3 vision-language checkpoint built
with mlx-vlm's own classes, test images, and mlx-vlm's reference outputs.

Writes into --out (a directory):
    model/                 the checkpoint as mlx-vlm lays it out (config.json with
                           text_config/vision_config, model.safetensors with
                           language_model./vision_tower./multi_modal_projector.
                           tensors, preprocessor_config.json, processor_config.json,
                           tokenizer.json + tokenizer_config.json with the Gemma 3
                           media tokens added to the SmolLM2 vocabulary)
    images/NAME.{png,jpg,webp}  test images of odd sizes (made here with Pillow;
                           the WebP lossless)
    reference.safetensors  per image NAME:  pixels.NAME f32 [3, S, S] (the image
                           processor's output), decoded.NAME u8 [H, W, 3] (Pillow's
                           decode, converted to RGB as the processor does); per case CASE: CASE.prompt_ids,
                           CASE.tokens (greedy), CASE.logits [steps, vocab]
                           (raw last-position logits of every step),
                           CASE.tower [n_images, mm_tokens, hidden] (projector out)

The image processor is transformers' Gemma3ImageProcessorPil, which mlx-vlm 0.7.10
uses for Gemma 3 (AutoImageProcessor); the prompt is expanded as mlx-vlm's
Gemma3Processor does (each <start_of_image> becomes "\\n\\n<boi>" + <image_soft_token>
x mm_tokens_per_image + "<eoi>\\n\\n"); the forward is mlx-vlm's
`get_input_embeddings` + `language_model` with its own KV cache, as its `generate`
runs it (causal, no 4-D mask), greedy with no EOS stop.

Usage: make_tiny_vlm.py --out DIR --gguf SmolLM2.gguf [--steps 8] [--seed 0]
           [--bench]   (bench/media.py's checkpoint: a SigLIP tower of realistic
                        shape at 224 px, 6 layers of width 384; model/ and images/ only)
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

VOCAB = 49152
# Gemma 3's media tokens, appended to the SmolLM2 vocabulary (ids VOCAB..).
BOI, EOI, SOFT = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
MEDIA_TOKENS = [BOI, EOI, SOFT]
IMAGE_SIZE, PATCH, MM_TOKENS = 32, 4, 16  # 8x8 patches pooled 2x2 to 4x4 = 16 tokens

CONFIG = dict(
    model_type="gemma3",
    vocab_size=VOCAB + len(MEDIA_TOKENS),
    image_token_index=VOCAB + 2,
    boi_token_index=VOCAB,
    eoi_token_index=VOCAB + 1,
    mm_tokens_per_image=MM_TOKENS,
    pad_token_id=0,
    # mlx-vlm divides image features by sqrt(this) (default 2048 when absent).
    hidden_size=64,
    text_config=dict(
        model_type="gemma3_text", hidden_size=64, num_hidden_layers=2,
        intermediate_size=128, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
        rms_norm_eps=1e-6, query_pre_attn_scalar=16, sliding_window=8,
        sliding_window_pattern=2, max_position_embeddings=8192,
        vocab_size=VOCAB + len(MEDIA_TOKENS), mm_tokens_per_image=MM_TOKENS),
    vision_config=dict(
        model_type="siglip_vision_model", hidden_size=32, num_hidden_layers=2,
        intermediate_size=64, num_attention_heads=2, patch_size=PATCH,
        image_size=IMAGE_SIZE, layer_norm_eps=1e-6),
)

PREPROCESSOR = {
    "image_processor_type": "Gemma3ImageProcessor",
    "processor_class": "Gemma3Processor",
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_pan_and_scan": None,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "image_seq_length": MM_TOKENS,
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
}

# A Gemma 3 style chat template (the real one's structure, media branch included).
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# Test prompts: text with images referenced by name (in document order). PNG
# only: JPEG decoders differ (see tests/media.rs), and random weights turn a
# one-level pixel difference into other tokens.
CASES = [
    {"name": "one_png", "images": ["odd_png"], "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}]}]},
    {"name": "two_images", "images": ["big_png", "odd_png"], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image"},
                                     {"type": "text", "text": "with"}, {"type": "image"}]}]},
    {"name": "other_png", "images": ["rgba_png"], "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}]}]},
]


def make_images(out):
    """Smooth gradients with a little noise (JPEG-friendly), odd sizes."""
    rng = np.random.default_rng(7)

    def picture(w, h, channels=3):
        y, x = np.mgrid[0:h, 0:w].astype(np.float64)
        base = [128 + 100 * np.sin(x / (3 + c) + y / (5 + 2 * c)) for c in range(channels)]
        img = np.stack(base, -1) + rng.normal(0, 12, (h, w, channels))
        return np.clip(img, 0, 255).astype(np.uint8)

    out.mkdir(parents=True, exist_ok=True)
    Image.fromarray(picture(37, 23)).save(out / "odd_png.png")
    Image.fromarray(picture(45, 29)).save(out / "odd_jpg.jpg", quality=90)
    Image.fromarray(picture(301, 203)).save(out / "big_png.png")
    Image.fromarray(picture(50, 61, 4), "RGBA").save(out / "rgba_png.png")
    Image.fromarray(picture(123, 77)).save(out / "big_jpg.jpg", quality=85)
    Image.fromarray(picture(41, 27)).save(out / "odd_webp.webp", lossless=True)
    return sorted(out.iterdir())


def save_twin(out):
    """twin_png: odd_png's size (so the same soft-token count under any processor),
    other pixels; the families with dynamic resolution use it as the "other image"."""
    rng = np.random.default_rng(13)
    img = np.clip(90 + rng.normal(0, 50, (23, 37, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(img).save(out / "twin_png.png")


def build_model(seed):
    from mlx_vlm.models.gemma3 import Model, ModelConfig, TextConfig, VisionConfig

    mx.random.seed(seed)
    # As mlx_vlm.utils.load_model: the nested configs become their classes.
    config = ModelConfig.from_dict(CONFIG)
    config.text_config = TextConfig.from_dict(CONFIG["text_config"])
    config.vision_config = VisionConfig.from_dict(CONFIG["vision_config"])
    model = Model(config)
    # As make_tiny.py: scale matrices up so greedy decoding is decisive, vary the
    # 1-D parameters (norm weights, biases) so that using them matters.
    params = tree_flatten(model.parameters())
    scaled = []
    for k, v in params:
        if v.ndim >= 2 and "position_embedding" not in k:
            v = v * 4
        elif v.ndim == 1:
            v = v * mx.random.uniform(0.5, 1.5, v.shape) + mx.random.normal(v.shape) * 0.1
        scaled.append((k, v))
    # Untrained projector weight (all ones): random instead.
    scaled = [(k, mx.random.normal(v.shape) * 0.5 if k.endswith("mm_input_projection_weight") else v)
              for k, v in scaled]
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
    assert [tok.token_to_id(t) for t in MEDIA_TOKENS] == [VOCAB, VOCAB + 1, VOCAB + 2]
    tok.save(str(out / "tokenizer.json"))
    tokens = meta["tokenizer.ggml.tokens"]
    eos_id = gguf_to_mlx.meta_value(meta["tokenizer.ggml.eos_token_id"])
    bos_id = gguf_to_mlx.meta_value(meta["tokenizer.ggml.bos_token_id"])
    config = dict(CONFIG, bos_token_id=bos_id, eos_token_id=eos_id)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokens[bos_id], "eos_token": tokens[eos_id], "pad_token": tokens[eos_id],
        "add_bos_token": False, "chat_template": TEMPLATE,
        "extra_special_tokens": {"boi_token": BOI, "eoi_token": EOI, "image_token": SOFT},
    }, indent=2) + "\n")
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    (out / "processor_config.json").write_text(json.dumps(
        {"processor_class": "Gemma3Processor", "image_seq_length": MM_TOKENS}, indent=2) + "\n")


def image_processor():
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    cfg = {k: v for k, v in PREPROCESSOR.items() if k not in ("image_processor_type", "processor_class")}
    return Gemma3ImageProcessorPil(**cfg)


def expand(text):
    """mlx-vlm's Gemma3Processor: every <start_of_image> becomes the full sequence."""
    full = f"\n\n{BOI}{SOFT * MM_TOKENS}{EOI}\n\n"
    return text.replace(BOI, full)


def reference(model, folder, images, steps):
    from jinja2 import Environment
    from mlx_vlm.models import cache as vlm_cache
    from tokenizers import Tokenizer
    from transformers.image_transforms import convert_to_rgb

    proc = image_processor()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    template = Environment().from_string(TEMPLATE)
    out, texts = {}, {}
    pixels = {}
    for p in images:
        name = p.stem
        img = Image.open(p)
        # As the processor converts (transparency composited onto white).
        rgb = np.asarray(convert_to_rgb(img, return_numpy=True))
        out[f"decoded.{name}"] = mx.array(rgb)
        px = proc(img, return_tensors="np")["pixel_values"][0]  # [3, S, S] f32
        assert px.dtype == np.float32 and px.shape == (3, IMAGE_SIZE, IMAGE_SIZE), (px.dtype, px.shape)
        pixels[name] = px
        out[f"pixels.{name}"] = mx.array(px)
    for case in CASES:
        name = case["name"]
        text = template.render(messages=case["messages"], bos_token=tok_cfg["bos_token"],
                               add_generation_prompt=True)
        text = expand(text)
        texts[name] = text
        ids = tok.encode(text, add_special_tokens=False).ids
        out[f"{name}.prompt_ids"] = mx.array(ids, dtype=mx.int32)
        pv = mx.array(np.stack([pixels[i] for i in case["images"]]))
        input_ids = mx.array([ids])
        # The tower alone (projector output, before the LM's scaling).
        hidden, _, _ = model.vision_tower(pv.transpose(0, 2, 3, 1), output_hidden_states=True)
        out[f"{name}.tower"] = model.multi_modal_projector(hidden)
        emb = model.get_input_embeddings(input_ids, pv, mask=mx.ones(input_ids.shape))
        cache = model.language_model.make_cache()
        logits = model.language_model(input_ids, inputs_embeds=emb.inputs_embeds, cache=cache).logits[:, -1, :]
        tokens, steps_logits = [], []
        for _ in range(steps):
            steps_logits.append(logits[0])
            y = mx.argmax(logits, axis=-1)
            tokens.append(int(y.item()))
            logits = model.language_model(y[None], cache=cache).logits[:, -1, :]
        out[f"{name}.tokens"] = mx.array(tokens, dtype=mx.int32)
        out[f"{name}.logits"] = mx.stack(steps_logits).astype(mx.float32)
    return out, texts


def use_bench_preset():
    """A tower whose cost dominates an image prompt's TTFT, as in real checkpoints:
    224 px, patch 14 (256 patches), 6 layers of width 384, 64 soft tokens."""
    global IMAGE_SIZE, PATCH, MM_TOKENS
    IMAGE_SIZE, PATCH, MM_TOKENS = 224, 14, 64
    CONFIG.update(mm_tokens_per_image=MM_TOKENS)
    CONFIG["text_config"].update(mm_tokens_per_image=MM_TOKENS)
    CONFIG["vision_config"].update(hidden_size=384, num_hidden_layers=6, intermediate_size=1536,
                                   num_attention_heads=6, patch_size=PATCH, image_size=IMAGE_SIZE)
    PREPROCESSOR.update(image_seq_length=MM_TOKENS, size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--gguf", required=True, type=Path, help="source of the tokenizer")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bench", action="store_true")
    a = ap.parse_args()
    import mlx_vlm
    if a.bench:
        use_bench_preset()
    images = make_images(a.out / "images")
    model = build_model(a.seed)
    save_checkpoint(model, a.out / "model", a.gguf)
    if a.bench:
        print(f"wrote {a.out} (bench preset, mlx-vlm {mlx_vlm.__version__})")
        return
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
