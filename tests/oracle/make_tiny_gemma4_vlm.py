#!/usr/bin/env python3
"""Media oracle for Gemma 4 (image and audio): a tiny random-weight checkpoint built with
mlx-vlm's own classes (models/gemma4: vision tower, Conformer audio tower, projectors,
the text model), test images and WAV files, and mlx-vlm's reference outputs.

Writes into --out (a directory):
    model/                 the checkpoint as mlx-vlm lays it out (config.json with
                           text_config/vision_config/audio_config, model.safetensors with
                           language_model./vision_tower./embed_vision./audio_tower./
                           embed_audio. tensors, processor_config.json with the image
                           processor's and feature extractor's settings, tokenizer.json +
                           tokenizer_config.json with Gemma 4's media tokens added to the
                           SmolLM2 vocabulary, a Gemma-style template whose image parts
                           render <|image|> and audio parts <|audio|>)
    images/NAME.{png,jpg,webp}  make_tiny_vlm.py's test images and twin_png (odd_png's
                           size, other pixels: the prefix-identity cases)
    audio/NAME.wav         16 kHz clips: PCM 16-bit mono, PCM 16-bit stereo, float 32-bit
    reference.safetensors  per image NAME: pixels.NAME f32 [3, H, W] (mlx-vlm's
                           Gemma4ImageProcessor); per clip NAME: wave.NAME f32 (the samples
                           as soundfile reads them, channels averaged), mel.NAME f32
                           [frames, 128] and mel_valid.NAME (mlx-vlm's
                           Gemma4AudioFeatureExtractor); per case CASE: CASE.prompt_ids,
                           CASE.tokens (greedy), CASE.logits [steps, vocab], CASE.tower
                           [soft tokens, hidden] (the projected tower rows in prompt order)

The forward is mlx-vlm's `get_input_embeddings` + `language_model` with the processor's
mm_token_type_ids (so image tokens attend to each other both ways, as its generate does),
one forward for the prompt, then one token per step; greedy, no EOS stop.

Usage: make_tiny_gemma4_vlm.py --out DIR --gguf SmolLM2.gguf [--steps 8] [--seed 0]
"""
import argparse
import json
import sys
import wave
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_to_mlx  # noqa: E402
import make_tiny_vlm  # noqa: E402

VOCAB = 49152
BOI, EOI, IMAGE = "<|image>", "<image|>", "<|image|>"
BOA, EOA, AUDIO = "<|audio>", "<audio|>", "<|audio|>"
VIDEO = "<|video|>"
MEDIA_TOKENS = [BOI, EOI, IMAGE, BOA, EOA, AUDIO, VIDEO]
ID = {t: VOCAB + i for i, t in enumerate(MEDIA_TOKENS)}
N_VOCAB = VOCAB + len(MEDIA_TOKENS)

CONFIG = dict(
    model_type="gemma4",
    vocab_size=N_VOCAB,
    image_token_id=ID[IMAGE], audio_token_id=ID[AUDIO], video_token_id=ID[VIDEO],
    boi_token_id=ID[BOI], eoi_token_id=ID[EOI], boa_token_id=ID[BOA], eoa_token_id=ID[EOA],
    pad_token_id=0, hidden_size=64,
    text_config=dict(
        model_type="gemma4_text", hidden_size=64, num_hidden_layers=4, intermediate_size=128,
        num_attention_heads=4, head_dim=16, global_head_dim=32, num_key_value_heads=1,
        num_kv_shared_layers=1, hidden_size_per_layer_input=16, vocab_size=N_VOCAB,
        vocab_size_per_layer_input=N_VOCAB, sliding_window=16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        rope_parameters={
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
            "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 10000.0, "rope_type": "default"}},
        max_position_embeddings=8192, final_logit_softcapping=30.0, use_double_wide_mlp=True,
        use_bidirectional_attention="vision", tie_word_embeddings=True),
    vision_config=dict(
        model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=16, patch_size=4,
        position_embedding_size=64, pooling_kernel_size=2, default_output_length=16,
        standardize=True, rope_parameters={"rope_theta": 100.0, "rope_type": "default"}),
    audio_config=dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        subsampling_conv_channels=[8, 4], conv_kernel_size=5, attention_chunk_size=12,
        attention_context_left=13, attention_context_right=0, attention_logit_cap=50.0,
        rms_norm_eps=1e-6, output_proj_dims=48),
)

PROCESSOR = {
    "processor_class": "Gemma4Processor",
    "image_processor": {"image_processor_type": "Gemma4ImageProcessor", "patch_size": 4,
                        "max_soft_tokens": 16, "pooling_kernel_size": 2},
    "feature_extractor": {"feature_extractor_type": "Gemma4AudioFeatureExtractor",
                          "sampling_rate": 16000, "feature_size": 128},
    "audio_seq_length": 750, "audio_ms_per_token": 40,
}

TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<|image|>' }}"
    "{% elif item['type'] == 'audio' %}{{ '<|audio|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

CASES = [
    {"name": "one_png", "images": ["odd_png"], "audio": [], "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}]}]},
    {"name": "two_images", "images": ["big_png", "rgba_png"], "audio": [], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Compare"}, {"type": "image"},
                                     {"type": "text", "text": "with"}, {"type": "image"}]}]},
    {"name": "other_png", "images": ["twin_png"], "audio": [], "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}]}]},
    {"name": "one_wav", "images": [], "audio": ["tone_wav"], "messages": [
        {"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What is this sound?"}]}]},
    {"name": "image_and_audio", "images": ["odd_png"], "audio": ["stereo_wav"], "messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Does it sound like"},
                                     {"type": "audio"}, {"type": "text", "text": "?"}]}]},
]


def make_audio(out):
    """Tones with noise at 16 kHz: 0.5 s PCM16 mono, 1.3 s PCM16 stereo, 0.7 s float32."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    sr = 16000

    def tone(seconds, f):
        t = np.arange(int(sr * seconds)) / sr
        return 0.4 * np.sin(2 * np.pi * f * t) + 0.05 * rng.normal(size=t.shape)

    def pcm16(path, channels):
        with wave.open(str(path), "wb") as w:
            w.setnchannels(channels.shape[1])
            w.setsampwidth(2)
            w.setframerate(sr)
            w.writeframes((np.clip(channels, -1, 1) * 32767).astype("<i2").tobytes())

    pcm16(out / "tone_wav.wav", tone(0.5, 440)[:, None])
    pcm16(out / "stereo_wav.wav", np.stack([tone(1.3, 300), tone(1.3, 500)], -1))
    # WAVE_FORMAT_IEEE_FLOAT, written by hand (the wave module writes PCM only).
    x = tone(0.7, 660).astype("<f4")
    fmt = np.array([3, 1], "<u2").tobytes() + np.array([sr, sr * 4], "<u4").tobytes() + np.array([4, 32], "<u2").tobytes()
    data = x.tobytes()
    riff = b"WAVE" + b"fmt " + np.uint32(len(fmt)).tobytes() + fmt + b"data" + np.uint32(len(data)).tobytes() + data
    (out / "float_wav.wav").write_bytes(b"RIFF" + np.uint32(len(riff)).tobytes() + riff)
    return sorted(out.iterdir())


def read_wav(path):
    """The samples as soundfile reads them (PCM16 / 32768, float as is), channels averaged."""
    raw = path.read_bytes()
    fmt = raw.find(b"fmt ") + 8
    tag, channels = np.frombuffer(raw[fmt:fmt + 4], "<u2")
    data = raw.find(b"data") + 8
    n = int(np.frombuffer(raw[data - 4:data], "<u4")[0])
    if tag == 3:
        x = np.frombuffer(raw[data:data + n], "<f4").astype(np.float32)
    else:
        x = np.frombuffer(raw[data:data + n], "<i2").astype(np.float32) / np.float32(32768)
    x = x.reshape(-1, channels)
    return x.mean(axis=1) if channels > 1 else x[:, 0]


def build_model(seed):
    from mlx_vlm.models.gemma4 import Model
    from mlx_vlm.models.gemma4.config import AudioConfig, ModelConfig, TextConfig, VisionConfig

    mx.random.seed(seed)
    config = ModelConfig.from_dict(CONFIG)
    config.text_config = TextConfig.from_dict(CONFIG["text_config"])
    config.vision_config = VisionConfig.from_dict(CONFIG["vision_config"])
    config.audio_config = AudioConfig.from_dict(CONFIG["audio_config"])
    model = Model(config)
    scaled = []
    for k, v in tree_flatten(model.parameters()):
        if k.endswith(("input_min", "output_min", "input_max", "output_max")):
            pass  # clipping bounds stay +-inf
        elif v.ndim >= 2 and "position_embedding_table" not in k:
            v = v * 4
        elif v.ndim >= 2:
            v = mx.random.normal(v.shape) * 0.5
        elif v.ndim == 1:
            v = v * mx.random.uniform(0.5, 1.5, v.shape) + mx.random.normal(v.shape) * 0.1
        scaled.append((k, v))
    # Untrained depthwise convolutions are zero: random instead.
    scaled = [(k, mx.random.normal(v.shape) * 0.5 if k.endswith("depthwise_conv1d.weight") else v) for k, v in scaled]
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
    assert [tok.token_to_id(t) for t in MEDIA_TOKENS] == [ID[t] for t in MEDIA_TOKENS]
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
        "extra_special_tokens": {"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE,
                                 "boa_token": BOA, "eoa_token": EOA, "audio_token": AUDIO,
                                 "video_token": VIDEO},
    }, indent=2) + "\n")
    (out / "processor_config.json").write_text(json.dumps(PROCESSOR, indent=2) + "\n")


def reference(model, folder, images, clips, steps):
    from jinja2 import Environment
    from mlx_vlm.models.gemma4.processing_gemma4 import Gemma4Processor

    proc = Gemma4Processor.from_pretrained(str(folder))
    assert proc.image_token_id == ID[IMAGE] and proc.audio_token_id == ID[AUDIO], (proc.image_token_id, proc.audio_token_id)
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    template = Environment().from_string(TEMPLATE)
    out, texts = {}, {}
    pics = {p.stem: p for p in images}
    waves = {p.stem: read_wav(p) for p in clips}
    for name, p in pics.items():
        px, _ = proc.image_processor([Image.open(p)])
        out[f"pixels.{name}"] = mx.array(np.asarray(px["pixel_values"][0], dtype=np.float32))
    for name, w in waves.items():
        out[f"wave.{name}"] = mx.array(w)
        fe = proc.feature_extractor([w], sampling_rate=16000, return_attention_mask=True)
        out[f"mel.{name}"] = mx.array(fe["input_features"][0].astype(np.float32))
        out[f"mel_valid.{name}"] = mx.array(np.asarray(fe["input_features_mask"][0], dtype=np.int32))
    for case in CASES:
        name = case["name"]
        text = template.render(messages=case["messages"], bos_token=tok_cfg["bos_token"], add_generation_prompt=True)
        texts[name] = text
        kw = {}
        if case["images"]:
            kw["images"] = [Image.open(pics[i]) for i in case["images"]]
        if case["audio"]:
            kw["audio"] = [(waves[a], 16000) for a in case["audio"]]
        inputs = proc(text=[text], **kw)
        input_ids = inputs["input_ids"]
        out[f"{name}.prompt_ids"] = input_ids[0].astype(mx.int32)
        extra = {k: inputs[k] for k in ("pixel_values", "input_features", "input_features_mask") if k in inputs}
        emb = model.get_input_embeddings(input_ids, **extra)
        ids = np.array(input_ids[0])
        soft = np.isin(ids, [ID[IMAGE], ID[AUDIO]])
        out[f"{name}.tower"] = (emb.inputs_embeds[0][mx.array(np.nonzero(soft)[0])]).astype(mx.float32)
        cache = model.language_model.make_cache()
        logits = model.language_model(inputs=input_ids, inputs_embeds=emb.inputs_embeds, cache=cache,
                                      per_layer_inputs=emb.per_layer_inputs,
                                      mm_token_type_ids=inputs["mm_token_type_ids"]).logits[:, -1, :]
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
    import os

    import mlx_vlm
    make_tiny_vlm.make_images(a.out / "images")
    make_tiny_vlm.save_twin(a.out / "images")
    images = sorted((a.out / "images").iterdir())
    clips = make_audio(a.out / "audio")
    model = build_model(a.seed)
    save_checkpoint(model, a.out / "model", a.gguf)
    out, texts = reference(model, a.out / "model", images, clips, a.steps)
    mx.eval(out)
    meta = {"mlx_vlm_version": mlx_vlm.__version__, "mlx_version": mx.__version__,
            "steps": str(a.steps), "cases": json.dumps(CASES), "texts": json.dumps(texts),
            "ld_preload": os.environ.get("LD_PRELOAD", "").split(":")[0]}
    mx.save_safetensors(str(a.out / "reference.safetensors"), out, metadata=meta)
    print(f"wrote {a.out} (mlx-vlm {mlx_vlm.__version__})")


if __name__ == "__main__":
    main()
