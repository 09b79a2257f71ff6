"""Shared helpers for mlxrt's benchmarks (bench/*.py): machine info, medians, ratios,
running a command that prints a JSON object, the deterministic benchmark prompt, what each
side ran (provenance), and writing bench/results/<name>.json (format: bench/README.md).

The result JSON always holds: name, date (UTC), command (the driver's command line),
machine {cpu, cores, os, python, mlx, mlx_lm}, then what the benchmark adds (provenance of
both sides, raw figures, medians, and `<metric>_ratio` values where > 1.0 means mlxrt is
better).
"""
import datetime as _dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"

# A fixed English text for benchmark prompts (written for this project; any stable text
# works). It is tokenized without special tokens and repeated to the wanted length.
BENCH_TEXT = (
    "The lighthouse keeper climbed the narrow stairs every evening at dusk, counting the "
    "one hundred and twelve steps as his father had before him. From the lamp room he could "
    "see the fishing boats returning to the harbour, their lanterns swaying like fireflies "
    "over the dark water. He wrote the weather in a leather notebook: wind from the west, "
    "light rain, a long swell from the south. In winter the storms came without warning, and "
    "he would stay awake through the night, polishing the great lens and trimming the wick "
    "so that no ship would mistake the rocks for open sea. "
)


def _version(pkg):
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def cpu_model():
    """CPU model name: /proc/cpuinfo on Linux, sysctl on macOS, else platform."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or platform.machine()


def cpu_generation():
    """/proc/cpuinfo's vendor, family and model numbers: a VM's model name ("AMD EPYC")
    hides the generation, which decides the vector units (Zen 4 runs AVX-512 on 256-bit
    units, Zen 5 on 512-bit ones: family 25 and 26). None where there is no such file."""
    want = {"vendor_id": "vendor", "cpu family": "family", "model": "model"}
    got = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in want and want[key.strip()] not in got:
                got[want[key.strip()]] = value.strip()
            if len(got) == len(want):
                break
    except OSError:
        return None
    return got or None


def machine_info():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu_model(),
        "cpu_generation": cpu_generation(),
        "cores": cores,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "mlx": _version("mlx"),
        "mlx_backend_pkg": next((p for p in ("mlx-metal", "mlx-cpu", "mlx-cuda-13", "mlx-cuda-12")
                                 if _version(p)), None),
        "mlx_lm": _version("mlx-lm"),
    }


KERNELS = ("auto", "stock", "int8")


def add_kernels_arg(ap):
    ap.add_argument("--kernels", choices=KERNELS, default="auto",
                    help="mlxrt's quantized matmul and SwiGLU: auto = mlxrt's own on the CPU (the "
                         "engine's default), stock = MLX's, as mlx-lm uses, int8 = auto with int8 "
                         "activations in the quantized matmul (exported to the mlxrt "
                         "side as MLXRT_BENCH_KERNELS)")


def kernels_env(kernels):
    """Environment that tells the mlxrt bench examples which kernels to use."""
    return {"MLXRT_BENCH_KERNELS": kernels}


def _dtype_name(dtype):
    """mx.float32 -> "f32", mx.float16 -> "f16", mx.bfloat16 -> "bf16"."""
    name = str(dtype).rsplit(".", 1)[-1]
    return {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}.get(name, name)


def loaded_blas():
    """(paths of the BLAS libraries mapped into this process, OpenBLAS thread count or None)."""
    try:
        names = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()}
    except OSError:
        return [], None
    # numpy's scipy_openblas exports only prefixed symbols: MLX cannot be using it.
    paths = sorted(p for p in names
                   if "blas" in p.rsplit("/", 1)[-1].lower() and "scipy_openblas" not in p)
    threads = None
    for p in paths:
        if "openblas" in p.lower():
            import ctypes
            try:
                threads = ctypes.CDLL(p).openblas_get_num_threads()
            except (OSError, AttributeError):
                pass
    return paths, threads


def reference_provenance(model):
    """What the mlx-lm side runs: MLX's stock kernels, and the dtype its quantization
    scales actually have after loading (read from the model, not from the flag)."""
    import mlx.core as mx

    dtypes = sorted({_dtype_name(m.scales.dtype) for _, m in model.named_modules()
                     if isinstance(getattr(m, "scales", None), mx.array)})
    blas, openblas_threads = loaded_blas()
    return {
        "side": "mlx-lm",
        "kernels": "stock",
        "qmm": "MLX quantized_matmul",
        "swiglu": "MLX silu * mul",
        "device": str(mx.default_device()),
        "scale_dtype": dtypes[0] if len(dtypes) == 1 else (dtypes or None),
        "blas": blas,
        "openblas_threads": openblas_threads,
        "mlx": mx.__version__,
        "mlx_lm": _version("mlx-lm"),
    }


def provenance(by_side):
    """{"mlxrt": ..., "reference": ...} from each side's output "provenance" object.
    Fails when the two sides ran different quantization-scale dtypes: their figures would
    not be comparable."""
    missing = [s for s in ("mlxrt", "reference") if not by_side.get(s)]
    if missing:
        raise RuntimeError(f"no provenance from {missing}")
    a, b = by_side["mlxrt"]["scale_dtype"], by_side["reference"]["scale_dtype"]
    if a != "as stored" and a != b:
        raise RuntimeError(
            f"scale dtypes differ: mlxrt {a}, reference {b}. Under stock kernels the engine "
            "casts quantization scales to f32 on the CPU; run the reference with "
            "--f32-scales (the default).")
    return {"mlxrt": by_side["mlxrt"], "reference": by_side["reference"]}


def take_provenance(prov, side, obj):
    """Moves `obj`'s "provenance" into prov[side]; once both sides have one, checks that
    they are comparable (see provenance()). Returns obj."""
    p = obj.pop("provenance", None)
    if p is None:
        raise RuntimeError(f"the {side} side printed no provenance")
    prov[side] = p
    if len(prov) == 2:
        provenance(prov)
    return obj


def median(xs):
    return statistics.median(xs) if xs else None


def percentile(xs, q):
    """q-th percentile (0..100) of xs, linear interpolation between order statistics."""
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def medians(rounds, keys):
    """{key: median over rounds} for a list of per-round dicts."""
    return {k: median([r[k] for r in rounds]) for k in keys}


def ratio(mlxrt, ref, higher_is_better=True):
    """mlxrt/ref for rates, ref/mlxrt for times: > 1.0 always means mlxrt is better."""
    if not mlxrt or not ref:
        return None
    return mlxrt / ref if higher_is_better else ref / mlxrt


def last_json_object(text):
    """The last line of `text` that parses as a JSON object (commands may log before it)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return obj
    # Maybe a pretty-printed object: try the whole output.
    obj = json.loads(text)
    if not isinstance(obj, dict):
        raise ValueError("output is not a JSON object")
    return obj


def run_json_command(cmd, env=None, timeout=None):
    """Run a shell command; return the JSON object it prints on stdout (stderr passes through)."""
    proc = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"command failed with status {proc.returncode}: {cmd}\n{proc.stdout[-2000:]}")
    try:
        return last_json_object(proc.stdout)
    except ValueError as e:
        raise RuntimeError(f"no JSON object in the output of: {cmd}\n{proc.stdout[-2000:]}") from e


def bench_prompt_ids(encode, n_tokens):
    """Deterministic n-token prompt: BENCH_TEXT tokenized (no special tokens), repeated, cut."""
    chunk = list(encode(BENCH_TEXT))
    return (chunk * (n_tokens // len(chunk) + 1))[:n_tokens]


def read_prompt_ids(path):
    """Prompt ids from a JSON file: a plain list, or an object with an "ids" list."""
    data = json.loads(Path(path).read_text())
    ids = data["ids"] if isinstance(data, dict) else data
    return [int(i) for i in ids]


def write_prompt_ids(path, ids, **extra):
    Path(path).write_text(json.dumps({"ids": ids, **extra}) + "\n")


def load_mlxlm(model, f32_scales=True):
    """mlx-lm model + tokenizer exactly as the correctness oracle loads them."""
    sys.path.insert(0, str(REPO / "tests" / "oracle"))
    from mlxlm_reference import load_reference_model

    return load_reference_model(model, f32_scales)


def read_bandwidth_gbs(mib=1024, repeats=5):
    """Best-of-N memory read bandwidth (GB/s): summing a buffer far larger
    than the caches. The ceiling for bandwidth-bound decode."""
    import time

    import numpy as np

    a = np.ones(mib * 1024 * 1024 // 8, dtype=np.float64)
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        a.sum()
        best = max(best, a.nbytes / (time.perf_counter() - t) / 1e9)
    return best


def write_result(name, payload, results_dir=RESULTS):
    """Write results_dir/<name>.json with the common header; returns the path."""
    out = {
        "name": name,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable] + sys.argv),
        "machine": machine_info(),
        **payload,
    }
    results_dir = Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    return path
