#!/usr/bin/env python3
"""Image-prompt time to first token, mlxrt vs mlx-vlm 0.7.10 on the same checkpoint.

The checkpoint is tests/oracle/make_tiny_vlm.py --bench: a Gemma 3 vision-language model
built with mlx-vlm's own classes, random weights, f32, whose SigLIP tower has a realistic
shape (224 px, patch 14: 256 patches, 6 layers of width 384, 64 soft tokens) and a tiny
language model, so that the tower dominates an image prompt's TTFT as in real
checkpoints. Each round uses a new picture (odd size, PNG), prompt "<image> Describe this
picture.", one greedy token.

- mlxrt (bench/mlxrt_media.rs, one engine): TTFT from submit to the first token, cold (the
  tower runs), then the same image with other text ("What colour is it?"; prompt cache off,
  so only the encoder cache can help).
- mlx-vlm (in this process, after a warm-up): the same work with its own classes, timed
  from opening the file: transformers' Gemma 3 image processor (as mlx-vlm uses it), the
  model's `get_input_embeddings` (tower, projector, splice) and its language model's
  prefill with a fresh cache, then the argmax. Token ids are precomputed (not timed).

Figures: medians over rounds. `image_ttft_ratio` = mlx-vlm ÷ mlxrt cold TTFT;
`encoder_cache_ttft_fraction` = mlxrt repeated-image TTFT ÷ its cold TTFT. The two sides
use MLX's dense matmuls with different BLAS unless told otherwise: mlxrt links OpenBLAS
(build.rs), the Python process the wheel's reference BLAS (`provenance.*.blas`).

Usage: media.py --mlxrt-cmd CMD [--rounds 3] [--name media]
"""
import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/oracle"))


def make_checkpoint(out, gguf):
    if not (out / "model/model.safetensors").exists():
        import subprocess
        subprocess.run([sys.executable, str(ROOT / "tests/oracle/make_tiny_vlm.py"), "--bench",
                        "--out", str(out), "--gguf", str(gguf)], check=True)
    return out / "model"


def make_images(out, n):
    from PIL import Image
    rng = np.random.default_rng(11)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n + 1):  # one more for the warm-ups
        w, h = 301 + 17 * i, 203 + 11 * i
        y, x = np.mgrid[0:h, 0:w].astype(np.float64)
        img = np.stack([128 + 100 * np.sin(x / (3 + c + i) + y / (5 + c)) for c in range(3)], -1)
        img = np.clip(img + rng.normal(0, 10, img.shape), 0, 255).astype(np.uint8)
        p = out / f"bench_{i}.png"
        Image.fromarray(img).save(p)
        paths.append(p)
    return paths


def mlx_vlm_side(folder, images):
    import mlx.core as mx
    import make_tiny_vlm as mt
    from jinja2 import Environment
    from mlx_vlm.models.gemma3 import Model, ModelConfig, TextConfig, VisionConfig
    from PIL import Image
    from tokenizers import Tokenizer

    mt.use_bench_preset()
    cfg = json.loads((folder / "config.json").read_text())
    config = ModelConfig.from_dict(cfg)
    config.text_config = TextConfig.from_dict(cfg["text_config"])
    config.vision_config = VisionConfig.from_dict(cfg["vision_config"])
    model = Model(config)
    model.load_weights(str(folder / "model.safetensors"))
    mx.eval(model.parameters())
    proc = mt.image_processor()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this picture."}]}]
    text = Environment().from_string(mt.TEMPLATE).render(messages=messages, bos_token=tok_cfg["bos_token"],
                                                          add_generation_prompt=True)
    ids = mx.array([tok.encode(mt.expand(text), add_special_tokens=False).ids])

    def ttft(path):
        t = time.perf_counter()
        px = mx.array(proc(Image.open(path), return_tensors="np")["pixel_values"])
        emb = model.get_input_embeddings(ids, px, mask=mx.ones(ids.shape))
        cache = model.language_model.make_cache()
        logits = model.language_model(ids, inputs_embeds=emb.inputs_embeds, cache=cache).logits[:, -1, :]
        mx.eval(mx.argmax(logits, axis=-1))
        return (time.perf_counter() - t) * 1e3

    ttft(images[0])  # warm-up
    times = [ttft(p) for p in images[1:]]
    blas, threads = common.loaded_blas()
    prov = {"side": "mlx-vlm", "kernels": "stock", "scale_dtype": "as stored (f32 weights)",
            "device": str(mx.default_device()), "blas": blas, "openblas_threads": threads,
            "mlx": mx.__version__, "mlx_vlm": common._version("mlx-vlm")}
    return times, prov


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mlxrt-cmd", required=True, help="command; {model} and {images} are substituted")
    ap.add_argument("--gguf", required=True, type=Path, help="source of the tokenizer (the default model)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="media")
    ap.add_argument("--work", type=Path, default=ROOT / "target/bench/media")
    common.add_kernels_arg(ap)
    args = ap.parse_args()
    folder = make_checkpoint(args.work, args.gguf)
    images = make_images(args.work / "rounds", args.rounds)
    cmd = (args.mlxrt_cmd.replace("{model}", shlex.quote(str(folder)))
           .replace("{images}", " ".join(shlex.quote(str(p)) for p in images)))
    t0 = time.perf_counter()
    r = common.run_json_command(cmd, env=common.kernels_env(args.kernels))
    # Its first image is the warm-up.
    cold, repeat = r["cold_ms"][1:], r["repeat_ms"][1:]
    ref, ref_prov = mlx_vlm_side(folder, images)
    med = {"mlxrt_cold_ttft_ms": common.median(cold), "mlxrt_repeat_ttft_ms": common.median(repeat),
           "mlx_vlm_ttft_ms": common.median(ref)}
    payload = {
        "checkpoint": "tests/oracle/make_tiny_vlm.py --bench (Gemma 3, SigLIP 224 px / patch 14 / "
                      "6 x 384, 64 soft tokens, 2-layer LM of width 64, random f32 weights)",
        "rounds": args.rounds,
        "raw": {"mlxrt": {"cold_ms": cold, "repeat_ms": repeat, "tower_runs": r["tower_runs"],
                          "encoder_cache_hits": r["encoder_cache_hits"]},
                "reference": {"ttft_ms": ref}},
        "medians": med,
        "image_ttft_ratio": common.ratio(med["mlxrt_cold_ttft_ms"], med["mlx_vlm_ttft_ms"], higher_is_better=False),
        "encoder_cache_ttft_fraction": med["mlxrt_repeat_ttft_ms"] / med["mlxrt_cold_ttft_ms"],
        "provenance": {"mlxrt": r["provenance"], "reference": ref_prov},
        "mlxrt_cmd": args.mlxrt_cmd,
    }
    path = common.write_result(args.name, payload)
    print(f"-> {path} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)
    print(json.dumps({k: v for k, v in payload.items() if k.endswith(("_ratio", "_fraction"))}, indent=1),
          file=sys.stderr)


if __name__ == "__main__":
    main()
