#!/usr/bin/env python3
"""mlxrt vs llama.cpp on the same GGUF file, same thread count, same minutes (issue 12).

Run it through `scripts/bench.sh vs_llama_cpp` (it builds llama.cpp's llama-bench,
llama-batched-bench and llama-quantize once, from the llama.cpp vendored in the
llama-cpp-python sdist, under ~/.cache/mlxrt/llama.cpp-<version>). For each model file
(the default Q4_1 GGUF, and the same weights requantized to Q4_0 by llama-quantize, cached
next to it) and each case, the two sides run alternately (ABBA over all pairs), each a
fresh process:

  short    prefill 512 tokens, then decode 128.
           mlxrt: mlxrt_single_stream (prefill_tps, decode_tps after the 512-token prompt).
           llama.cpp: llama-bench -p 512 -n 0 (pp512), then -p 0 -n 128 -d 512 (tg128
           after 512 tokens of context).
  long     prefill 4096 tokens, decode 128 after them, peak RSS of the process.
           mlxrt: mlxrt_single_stream with a 4096-token prompt.
           llama.cpp: llama-batched-bench -npp 4096 -ntg 128 -npl 1 -c 4224 (S_PP, S_TG; one
           process holding the same context, so its peak RSS compares).
  batchC   C concurrent requests of 128 prompt tokens, 128 output tokens each (C = 8, 32):
           aggregate output tokens / wall time.
           mlxrt: mlxrt_batching's throughput scenario (distinct prompts, all submitted at once).
           llama.cpp: llama-batched-bench -npp 128 -ntg 128 -npl C -c C*256; output tokens
           C*128 / (T_PP + T_TG).

Prompts are exactly N tokens on both sides (mlxrt gets the ids of bench/batching.py's
prompts; llama.cpp's tools take a token count). Both sides: greedy/EOS ignored on mlxrt,
--threads on llama.cpp (must equal mlxrt's kernel pool, which is the core count). Peak RSS
is the child's VmHWM (its address space's high-water mark); mlxrt's short/long figures also
carry mlx_peak_memory_bytes, MLX's own peak of live buffers since the start (load, weights,
KV, activations), so that the rest of the RSS (code, heap, mapped files) is measured, not
guessed. Read bandwidth: a numpy sum over a buffer, on 1 and on --threads threads, the best
of 5; over 1 GiB at the start, and right after each pair of the Q4_1 short case (this host's
bandwidth swings by half within minutes) over 1 GiB and over a buffer the size of mlxrt's
parameters, which is what a decode step reads again every token (where the last-level cache
holds that much, the weights come from it, not from DRAM).
decode_bandwidth_share = the median over those pairs of mlxrt's decode tok/s (Q4_1, short)
÷ (the model-sized read bandwidth measured right after it ÷ mlxrt's parameter bytes).

Writes <results-dir>/<name>.json (format: bench/README.md), rewritten after every pair, with
raw figures, medians per model and case, the ratios (mlxrt ÷ llama.cpp, > 1 = mlxrt faster;
peak_rss_4k_vs_llamacpp_ratio = llama.cpp ÷ mlxrt, > 1 = mlxrt smaller) and provenance of
both sides (llama.cpp: version, vendored commit, build flags, CPU features, threads, KV
dtype, flash attention).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import batching  # noqa: E402  (its prompt builder)
import common  # noqa: E402

CASES = ("short", "long", "batch8", "batch32")
SHORT_PROMPT, LONG_PROMPT, GEN = 512, 4096, 128
BATCH_PROMPT, BATCH_GEN = 128, 128


# What llama.cpp's CPU backend runs for these files (ggml, built with
# GGML_NATIVE): weights stay in their GGUF blocks with f16 scales, the
# activations are quantized to 8-bit blocks for the dot products, Q4_0 is
# repacked into interleaved rows at load (GGML_CPU_REPACK), the KV cache is
# f16 (llama-bench's type_k / type_v below).
LLAMA_KERNELS = {
    "side": "llama.cpp",
    "kernels": "ggml CPU: Q4_1 x Q8_1 / Q4_0 x Q8_0 block dot products (Q4_0 repacked), native ISA",
    "scale_dtype": "f16",
}

def _vm_hwm(pid):
    """Peak RSS (bytes) of pid's address space so far (Linux /proc VmHWM), or None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def run_measured(argv, env=None, timeout=None):
    """Runs argv (no shell); returns its stdout, stderr, peak RSS (bytes) and wall time.
    Fails on a non-zero exit. Peak RSS: the last VmHWM polled every 50 ms (the address
    space's high-water mark, monotonic); not wait4's ru_maxrss, which on Linux starts at
    the forking parent's peak (this driver holds mlx-lm's model and a 1 GiB buffer)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen([str(a) for a in argv], stdout=out, stderr=err,
                             env={**os.environ, **(env or {})})
        hwm = None
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            hwm = _vm_hwm(p.pid) or hwm
            if timeout and time.perf_counter() - t0 > timeout:
                p.kill()
            time.sleep(0.05)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {' '.join(map(str, argv))}\n{stderr[-3000:]}")
    if hwm is None:  # no /proc (macOS): ru_maxrss, bytes there, KiB on Linux
        hwm = ru.ru_maxrss if sys.platform == "darwin" else ru.ru_maxrss * 1024
    return {"stdout": stdout, "stderr": stderr, "max_rss_bytes": hwm, "wall_s": wall}


def json_lines(text):
    """Every line of text that parses as a JSON object."""
    objs = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                objs.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return objs


def read_bandwidth_gbs(threads, mib=1024, repeats=5):
    """Best memory read bandwidth (GB/s) of a numpy sum over `mib` MiB, on one thread
    and split over `threads` threads (numpy releases the GIL in the sum)."""
    import numpy as np

    a = np.ones(mib * 1024 * 1024 // 8, dtype=np.float64)
    parts = np.array_split(a, threads)
    best = {"1": 0.0, str(threads): 0.0}
    for _ in range(repeats):
        t = time.perf_counter()
        a.sum()
        best["1"] = max(best["1"], a.nbytes / (time.perf_counter() - t) / 1e9)
        ts = [threading.Thread(target=p.sum) for p in parts]
        t = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        best[str(threads)] = max(best[str(threads)], a.nbytes / (time.perf_counter() - t) / 1e9)
    return {"read_gbs": max(best.values()), "by_threads": best, "buffer_mib": mib}


def llama_build_info(llama_dir):
    """What the llama.cpp side is: sdist version, vendored commit, CMake flags."""
    llama_dir = Path(llama_dir)
    cache = {}
    for line in (llama_dir / "build" / "CMakeCache.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z_]+):[A-Z]+=(.*)$", line)
        if m:
            cache[m.group(1)] = m.group(2)
    keys = ("CMAKE_BUILD_TYPE", "GGML_NATIVE", "GGML_OPENMP", "GGML_CPU_REPACK", "GGML_BLAS",
            "BUILD_SHARED_LIBS", "CMAKE_C_COMPILER", "CMAKE_CXX_COMPILER", "CMAKE_C_FLAGS",
            "CMAKE_CXX_FLAGS")
    commit = llama_dir / "commit"
    return {
        "source": f"llama.cpp vendored in the llama-cpp-python sdist ({llama_dir.name.split('-', 1)[1]})",
        "vendored_commit": commit.read_text().strip() if commit.exists() else None,
        "cmake": {k: cache.get(k) for k in keys},
        "cpu_flags": cpu_flags(),
    }


def cpu_flags():
    """The CPU's SIMD flags (/proc/cpuinfo): what GGML_NATIVE's -march=native builds for."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return sorted(f for f in line.split(":", 1)[1].split()
                              if f.startswith(("avx", "fma", "f16c", "sse4", "amx")))
    except OSError:
        pass
    return None


class Runner:
    """Runs one side of one case and returns its figures (+ extras kept once per side)."""

    def __init__(self, args, exe_dir, llama_bin, ids):
        self.args, self.exe_dir, self.bin, self.ids = args, Path(exe_dir), Path(llama_bin), ids
        self.env = {**common.kernels_env(args.kernels), "MLXRT_BENCH_KV_BITS": str(args.kv_bits)}
        self.llama_env = dict(e.split("=", 1) for e in args.llama_env)
        self.info = {"mlxrt": {}, "llama.cpp": {}}

    def mlxrt(self, model, case):
        if case in ("short", "long"):
            f = self.ids["short" if case == "short" else "long"]
            r = run_measured([self.exe_dir / "mlxrt_single_stream", model, f, GEN], self.env,
                             self.args.timeout)
            o = common.last_json_object(r["stdout"])
            self.info["mlxrt"].update(provenance=o["provenance"],
                                      command_example=f"mlxrt_single_stream MODEL {case}_ids.json {GEN}")
            # Per file: Q4_0 keeps fewer bytes (no stored biases) than Q4_1.
            self.info["mlxrt"].setdefault("parameter_bytes", {})[str(model)] = o["parameter_bytes"]
            return {"prefill_tps": o["prefill_tps"], "decode_tps": o["decode_tps"],
                    "ttft_ms": o["ttft_ms"], "peak_rss_bytes": r["max_rss_bytes"],
                    "mlx_peak_memory_bytes": o["mlx_peak_memory_bytes"],
                    "prompt_tokens": len(common.read_prompt_ids(f)), "gen_tokens": GEN}
        c = int(case[len("batch"):])
        r = run_measured([self.exe_dir / "mlxrt_batching", model, self.ids[case]], self.env,
                         self.args.timeout)
        o = common.last_json_object(r["stdout"])
        self.info["mlxrt"]["provenance"] = o["provenance"]
        assert o["output_tokens"] == c * BATCH_GEN, o["output_tokens"]
        return {"throughput_tps": o["throughput_tps"], "wall_s": o["wall_s"],
                "output_tokens": o["output_tokens"], "peak_rss_bytes": r["max_rss_bytes"]}

    def _bench(self, model, extra):
        argv = [self.bin / "llama-bench", "-m", model, "-t", self.args.threads,
                "-r", self.args.llama_reps, "-o", "json", *extra]
        r = run_measured(argv, self.llama_env, self.args.timeout)
        rows = json.loads(r["stdout"])
        assert len(rows) == 1, rows
        return rows[0], r, argv

    def _batched(self, model, npp, ntg, npl):
        argv = [self.bin / "llama-batched-bench", "-m", model, "-t", self.args.threads,
                "-c", npl * (npp + ntg), "-npp", npp, "-ntg", ntg, "-npl", npl,
                "--output-format", "jsonl"]
        r = run_measured(argv, self.llama_env, self.args.timeout)
        rows = [o for o in json_lines(r["stdout"] + "\n" + r["stderr"]) if "speed_tg" in o]
        assert len(rows) == 1 and rows[0]["pp"] == npp and rows[0]["pl"] == npl, rows
        self.info["llama.cpp"]["batched_bench"] = {
            k: rows[0][k] for k in ("n_batch", "n_ubatch", "flash_attn", "n_threads", "n_threads_batch")}
        return rows[0], r, argv

    def llama(self, model, case):
        if case == "short":
            pp, r1, a1 = self._bench(model, ["-p", SHORT_PROMPT, "-n", 0])
            tg, r2, a2 = self._bench(model, ["-p", 0, "-n", GEN, "-d", SHORT_PROMPT])
            assert pp["n_prompt"] == SHORT_PROMPT and tg["n_gen"] == GEN and tg["n_depth"] == SHORT_PROMPT
            keep = ("build_commit", "build_number", "cpu_info", "backends", "model_type",
                    "model_size", "model_n_params", "n_threads", "n_batch", "n_ubatch",
                    "type_k", "type_v", "flash_attn", "use_mmap", "poll")
            self.info["llama.cpp"]["llama_bench"] = {k: pp.get(k) for k in keep}
            self.info["llama.cpp"]["commands_example"] = [" ".join(map(str, a1)), " ".join(map(str, a2))]
            return {"prefill_tps": pp["avg_ts"], "decode_tps": tg["avg_ts"],
                    "prefill_samples_ts": pp["samples_ts"], "decode_samples_ts": tg["samples_ts"],
                    "peak_rss_bytes": max(r1["max_rss_bytes"], r2["max_rss_bytes"]),
                    "prompt_tokens": pp["n_prompt"], "gen_tokens": tg["n_gen"]}
        if case == "long":
            o, r, _ = self._batched(model, LONG_PROMPT, GEN, 1)
            return {"prefill_tps": o["speed_pp"], "decode_tps": o["speed_tg"],
                    "peak_rss_bytes": r["max_rss_bytes"], "n_kv_max": o["n_kv_max"],
                    "prompt_tokens": o["pp"], "gen_tokens": o["tg"]}
        c = int(case[len("batch"):])
        o, r, _ = self._batched(model, BATCH_PROMPT, BATCH_GEN, c)
        return {"throughput_tps": c * BATCH_GEN / o["t"], "wall_s": o["t"],
                "output_tokens": c * BATCH_GEN, "speed_pp": o["speed_pp"],
                "speed_tg": o["speed_tg"], "peak_rss_bytes": r["max_rss_bytes"]}


# (ratio key suffix, case, figure, higher is better)
RATIO_SPECS = (
    ("decode", "short", "decode_tps", True),
    ("prefill", "short", "prefill_tps", True),
    ("prefill_4k", "long", "prefill_tps", True),
    ("decode_at_4k", "long", "decode_tps", True),
    ("batch8", "batch8", "throughput_tps", True),
    ("batch32", "batch32", "throughput_tps", True),
    ("peak_rss_4k", "long", "peak_rss_bytes", False),
)


def medians(raw):
    """{model: {case: {side: {figure: median}}}} over the rounds of raw[model][case][side]."""
    out = {}
    for model, cases in raw.items():
        for case, sides in cases.items():
            for side, runs in sides.items():
                keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))] if runs else []
                out.setdefault(model, {}).setdefault(case, {})[side] = common.medians(runs, keys)
    return out


def ratios(med):
    """Ratios mlxrt vs llama.cpp (> 1 = mlxrt better) per model, and the headline keys:
    Q4_1 ones unsuffixed, Q4_0's decode and prefill with `_q4_0`. None where a side is
    missing.

    >>> med = {"q4_1": {"short": {"mlxrt": {"decode_tps": 20.0, "prefill_tps": 150.0},
    ...                           "llama.cpp": {"decode_tps": 80.0, "prefill_tps": 300.0}},
    ...                 "long": {"mlxrt": {"peak_rss_bytes": 400}, "llama.cpp": {"peak_rss_bytes": 200}}},
    ...        "q4_0": {"short": {"mlxrt": {"decode_tps": 30.0}, "llama.cpp": {"decode_tps": 60.0}}}}
    >>> r = ratios(med)
    >>> r["decode_vs_llamacpp_ratio"], r["prefill_vs_llamacpp_ratio"], r["peak_rss_4k_vs_llamacpp_ratio"]
    (0.25, 0.5, 0.5)
    >>> r["decode_q4_0_vs_llamacpp_ratio"], r["prefill_q4_0_vs_llamacpp_ratio"], r["batch8_vs_llamacpp_ratio"]
    (0.5, None, None)
    """
    def one(model, case, key, higher):
        sides = med.get(model, {}).get(case, {})
        a = sides.get("mlxrt", {}).get(key)
        b = sides.get("llama.cpp", {}).get(key)
        return common.ratio(a, b, higher_is_better=higher)

    per_model = {m: {f"{name}_vs_llamacpp_ratio": one(m, case, key, hi)
                     for name, case, key, hi in RATIO_SPECS} for m in ("q4_1", "q4_0")}
    out = {}
    for name, _, _, _ in RATIO_SPECS:
        out[f"{name}_vs_llamacpp_ratio"] = per_model["q4_1"][f"{name}_vs_llamacpp_ratio"]
        if name in ("decode", "prefill"):
            out[f"{name}_q4_0_vs_llamacpp_ratio"] = per_model["q4_0"][f"{name}_vs_llamacpp_ratio"]
    out["by_model"] = per_model
    return out


def requantize(llama_bin, src, dst):
    """dst = src's weights requantized to Q4_0 (token embedding kept Q8_0 as in the Q4_1
    file: MLX's GGUF loader takes Q4_0/Q4_1/Q8_0 only). Built once."""
    if Path(dst).exists():
        return
    tmp = f"{dst}.tmp.{os.getpid()}"
    subprocess.run([str(Path(llama_bin) / "llama-quantize"), "--allow-requantize",
                    "--token-embedding-type", "q8_0", "--output-tensor-type", "q8_0",
                    str(src), tmp, "Q4_0"], check=True, stdout=subprocess.DEVNULL)
    os.replace(tmp, dst)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path, help="the Q4_1 GGUF (default model)")
    ap.add_argument("--llama-cpp", required=True, type=Path,
                    help="llama.cpp folder from scripts/bench.sh (bin/, build/, commit)")
    ap.add_argument("--exe-dir", type=Path, default=common.REPO / "target" / "release" / "examples")
    ap.add_argument("--rounds", type=int, default=2, help="pairs per model and case (ABBA)")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma list of {', '.join(CASES)} (long = the 4096-token prompt)")
    ap.add_argument("--no-4k", action="store_true", help="skip the 4096-token case (long)")
    ap.add_argument("--models", default="q4_1,q4_0", help="q4_1 and/or q4_0")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="llama.cpp threads; must equal mlxrt's kernel pool (the core count)")
    ap.add_argument("--llama-reps", type=int, default=1, help="llama-bench -r per round")
    ap.add_argument("--llama-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment of the llama.cpp tools (repeatable), e.g. "
                         "OMP_WAIT_POLICY=passive: its OpenMP workers spin at barriers by "
                         "default, which collapses on an oversubscribed machine")
    common.add_kernels_arg(ap)
    ap.add_argument("--kv-bits", type=int, choices=(0, 4, 8, 16), default=0,
                    help="mlxrt's KV storage: 0 = f32 (the default, logit parity with mlx-lm), "
                         "4/8 = affine-quantized from the first position, 16 = dense f16 "
                         "(MLXRT_KV_SCHEME_F16, llama.cpp's own KV type)")
    ap.add_argument("--note", default="", help="recorded in the results (e.g. machine load)")
    ap.add_argument("--results-dir", type=Path, default=common.RESULTS)
    ap.add_argument("--name", default="vs_llama_cpp")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per command")
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    if args.no_4k:
        cases = [c for c in cases if c != "long"]
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error(f"unknown cases {bad}")

    llama_bin = args.llama_cpp / "bin"
    models = {"q4_1": args.model}
    q4_0 = args.model.with_name(args.model.name.replace("Q4_1", "Q4_0"))
    if "q4_0" in args.models:
        assert q4_0 != args.model, "model file name has no Q4_1 to replace"
        requantize(llama_bin, args.model, q4_0)
        models["q4_0"] = q4_0
    models = {m: p for m, p in models.items() if m in args.models.split(",")}

    # Prompts: exactly N ids, from the tokenizer (bench/batching.py's prompts).
    prompts, long_prompt = batching.build_prompts(args.model, True, 32, BATCH_PROMPT, LONG_PROMPT)
    tmp = Path(tempfile.mkdtemp(prefix="mlxrt-vs-llama-"))
    ids = {"short": tmp / "short.json", "long": tmp / "long.json"}
    common.write_prompt_ids(ids["short"], long_prompt[:SHORT_PROMPT])
    common.write_prompt_ids(ids["long"], long_prompt)
    for c in (8, 32):
        ids[f"batch{c}"] = tmp / f"batch{c}.json"
        ids[f"batch{c}"].write_text(json.dumps(
            {"mode": "throughput", "prompts": prompts[:c], "max_tokens": BATCH_GEN}))
    assert all(len(p) == BATCH_PROMPT for p in prompts) and len(long_prompt) == LONG_PROMPT

    runner = Runner(args, args.exe_dir, llama_bin, ids)
    bandwidth = read_bandwidth_gbs(args.threads)
    print(f"read bandwidth: {bandwidth}", file=sys.stderr)
    pair_bandwidth = []  # after each pair of the Q4_1 short case
    raw = {m: {c: {"mlxrt": [], "llama.cpp": []} for c in cases} for m in models}
    load = {"start": os.getloadavg()}
    build = llama_build_info(args.llama_cpp)
    sides = {"mlxrt": runner.mlxrt, "llama.cpp": runner.llama}

    def write():
        med = medians(raw)
        out = ratios(med)
        prov_m = runner.info["mlxrt"].get("provenance")
        # The bandwidth share is the Q4_1 file's; absent when only Q4_0 ran.
        pb = runner.info["mlxrt"].get("parameter_bytes", {}).get(str(models.get("q4_1")))
        pairs = raw.get("q4_1", {}).get("short", {})
        share = {}

        def shares(side, nbytes, key="model_sized"):
            # Each pair's decode against the bandwidth measured right after it.
            return [r["decode_tps"] * nbytes / (bw[key]["read_gbs"] * 1e9)
                    for r, bw in zip(pairs.get(side, []), pair_bandwidth) if r.get("decode_tps")]

        if pb and shares("mlxrt", pb):
            fb = os.path.getsize(models["q4_1"])
            share = {"mlxrt_parameter_bytes": pb, "gguf_file_bytes": fb,
                     "after_each_pair_gbs": [bw["model_sized"]["read_gbs"] for bw in pair_bandwidth],
                     "after_each_pair_buffer_mib": [bw["model_sized"]["buffer_mib"] for bw in pair_bandwidth],
                     "after_each_pair_1gib_gbs": [bw["1gib"]["read_gbs"] for bw in pair_bandwidth],
                     "mlxrt_by_pair": shares("mlxrt", pb), "llamacpp_by_pair": shares("llama.cpp", fb),
                     "mlxrt_by_pair_1gib": shares("mlxrt", pb, "1gib")}
            share["mlxrt"] = statistics.median(share["mlxrt_by_pair"])
            if share["llamacpp_by_pair"]:
                share["llamacpp"] = statistics.median(share["llamacpp_by_pair"])
        payload = {
            "settings": {"rounds": args.rounds, "cases": cases, "models": {m: str(p) for m, p in models.items()},
                         "threads": args.threads, "llama_reps": args.llama_reps, "kernels": args.kernels,
                         "kv_bits": args.kv_bits,
                         "short": {"prompt_tokens": SHORT_PROMPT, "gen_tokens": GEN},
                         "long": {"prompt_tokens": LONG_PROMPT, "gen_tokens": GEN},
                         "batch": {"concurrency": [8, 32], "prompt_tokens": BATCH_PROMPT,
                                   "max_tokens": BATCH_GEN},
                         "order": "ABBA (mlxrt first in even-numbered pairs, counted over all pairs)",
                         "sampling": "mlxrt greedy, EOS ignored; llama.cpp tools decode random tokens",
                         "note": args.note},
            "load_average": {**load, "now": os.getloadavg()},
            "provenance": {"mlxrt": prov_m, "reference": {**LLAMA_KERNELS, **build,
                                                          **runner.info["llama.cpp"],
                                                          "threads": args.threads,
                                                          "env": runner.llama_env}},
            "prompt_ids": {"short": long_prompt[:SHORT_PROMPT], "long": long_prompt,
                           "batch": prompts},
            **{k: v for k, v in out.items() if k != "by_model"},
            "decode_bandwidth_share": share.get("mlxrt"),
            "ratios_by_model": out["by_model"],
            "bandwidth": {**bandwidth, **share},
            "median": med,
            "raw": raw,
        }
        return common.write_result(args.name, payload, args.results_dir)

    k = 0
    for rnd in range(args.rounds):
        for m, path in models.items():
            for case in cases:
                order = ("mlxrt", "llama.cpp") if k % 2 == 0 else ("llama.cpp", "mlxrt")
                k += 1
                for side in order:
                    t = time.perf_counter()
                    r = sides[side](path, case)
                    raw[m][case][side].append(r)
                    shown = {x: round(v, 2) for x, v in r.items() if isinstance(v, float)}
                    print(f"round {rnd + 1}/{args.rounds} {m} {case} {side} ({time.perf_counter() - t:.0f} s): "
                          f"{shown}", file=sys.stderr)
                if m == "q4_1" and case == "short":
                    pb = runner.info["mlxrt"].get("parameter_bytes", {}).get(str(path), 2**30)
                    pair_bandwidth.append({"model_sized": read_bandwidth_gbs(args.threads, -(-pb // 2**20)),
                                           "1gib": read_bandwidth_gbs(args.threads)})
                    print(f"read bandwidth: {pair_bandwidth[-1]}", file=sys.stderr)
                path_out = write()
    pq = runner.info["mlxrt"].get("provenance", {}).get("qmm_threads")
    if pq is not None and pq != args.threads:
        print(f"warning: mlxrt's kernel pool has {pq} threads, llama.cpp ran {args.threads}", file=sys.stderr)
    result = json.loads(Path(path_out).read_text())
    for key in [k for k in result if k.endswith("_ratio") or k == "decode_bandwidth_share"]:
        v = result[key]
        print(f"{key:40s} {v:.3f}" if v is not None else f"{key:40s} -", file=sys.stderr)
    print(f"-> {path_out}", file=sys.stderr)


if __name__ == "__main__":
    main()
