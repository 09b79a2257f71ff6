//! Decode-step attention microbenchmark for the quantized KV cache (issue 11):
//! mlxrt's fused quantized attention (4- and 8-bit) vs MLX's dense f32
//! `fast::scaled_dot_product_attention` (the engine's default KV) vs mlx-lm's
//! `quantized_scaled_dot_product_attention` composition on MLX ops, in one
//! process, on the CPU.
//!
//!   cargo run --release --example qsdpa_bench -- [--t 4096] [--reps 15] [--out PATH]
//!
//! Shapes: B = 1, L = 1 (one decode step), SmolLM2-135M (Hq 9, Hkv 3, D 64)
//! and an 8-KV-head model (Hq 16, Hkv 8, D 128); group size 64 (mlx-lm's
//! default `kv_group_size`), f32 scales and biases. K/V are read as the
//! cache hands them out: a `[:, :, :T]` slice of a buffer with 256 spare
//! positions ("cache_slice"), and as whole arrays ("contiguous"). Each call
//! builds the node and evaluates it; variants alternate for `--reps` rounds
//! and medians are reported; `*_ratio` = dense time / other time (> 1: faster
//! than dense f32). Writes JSON (default bench/results/qsdpa.json).

use mlxrt::mlx::{
    blas_info, eval, fast, qmm_threads, qsdpa_isa_of, quantize, quantized_sdpa, quantized_sdpa_ops, Array, QmmIsa,
};
use serde_json::{json, Value};
use std::time::Instant;

const GROUP: i32 = 64;
const MIN_SAMPLE_S: f64 = 0.005;

fn randn(shape: &[i32], seed: u64) -> Array {
    let n: usize = shape.iter().map(|&d| d as usize).product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            (0..4)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                })
                .sum::<f32>()
        })
        .collect();
    Array::from_f32(&v, shape).unwrap()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

type Op<'a> = Box<dyn Fn() -> Array + 'a>;

fn time_call(op: &Op, inner: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..inner {
        op().eval().unwrap();
    }
    t.elapsed().as_secs_f64() / inner as f64
}

/// Median seconds per call of each op, measured in alternating rounds.
fn measure(ops: &[(&'static str, Op)], reps: usize) -> Vec<f64> {
    let inner: Vec<usize> = ops
        .iter()
        .map(|(_, op)| {
            time_call(op, 2);
            ((MIN_SAMPLE_S / time_call(op, 1)).ceil() as usize).clamp(1, 10_000)
        })
        .collect();
    let mut samples = vec![Vec::new(); ops.len()];
    for _ in 0..reps {
        for (i, (_, op)) in ops.iter().enumerate() {
            samples[i].push(time_call(op, inner[i]));
        }
    }
    samples.iter_mut().map(|s| median(s)).collect()
}

/// One layout's K/V: dense f32 and the 4- and 8-bit planes.
struct Kv {
    k: Array,
    v: Array,
    q4: [[Array; 3]; 2],
    q8: [[Array; 3]; 2],
}

fn kv(h: i32, t: i32, d: i32, spare: i32, seed: u64) -> Kv {
    let cut = |a: Array| if spare > 0 { a.slice_axis(2, 0, t).unwrap() } else { a };
    let k = randn(&[1, h, t + spare, d], seed);
    let v = randn(&[1, h, t + spare, d], seed + 1);
    let planes = |x: &Array, bits: i32| {
        let (w, s, b) = quantize(x, GROUP, bits).unwrap();
        eval(&[&w, &s, &b]).unwrap();
        [cut(w), cut(s), cut(b)]
    };
    let out = Kv { q4: [planes(&k, 4), planes(&v, 4)], q8: [planes(&k, 8), planes(&v, 8)], k: cut(k), v: cut(v) };
    eval(&[&out.k, &out.v]).unwrap();
    out
}

fn refs(p: &[Array; 3]) -> [&Array; 3] {
    [&p[0], &p[1], &p[2]]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let t: i32 = arg("--t").map(|v| v.parse().expect("--t N")).unwrap_or(4096);
    let reps: usize = arg("--reps").map(|v| v.parse().expect("--reps N")).unwrap_or(15);
    let out_path = arg("--out").unwrap_or_else(|| "bench/results/qsdpa.json".into());
    let load = || std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split(' ').next()?.parse::<f64>().ok());
    let load_start = load();

    let mut results = Vec::new();
    for (model, hq, hkv, d) in [("SmolLM2-135M", 9, 3, 64), ("Hq16-Hkv8-D128", 16, 8, 128)] {
        for (layout, spare) in [("cache_slice", 256), ("contiguous", 0)] {
            let q = randn(&[1, hq, 1, d], 7);
            q.eval().unwrap();
            let c = kv(hkv, t, d, spare, 11);
            let scale = 1.0 / (d as f32).sqrt();
            let none = || fast::Mask::None;
            let fused4 = || quantized_sdpa(&q, refs(&c.q4[0]), refs(&c.q4[1]), scale, none(), GROUP, 4).unwrap();
            assert!(qsdpa_isa_of(&fused4()).is_some(), "the fused kernel did not run");
            let ops: Vec<(&'static str, Op)> = vec![
                ("dense_f32_sdpa", Box::new(|| fast::scaled_dot_product_attention(&q, &c.k, &c.v, scale, none()).unwrap())),
                ("fused_4bit", Box::new(fused4)),
                ("fused_8bit", Box::new(|| quantized_sdpa(&q, refs(&c.q8[0]), refs(&c.q8[1]), scale, none(), GROUP, 8).unwrap())),
                ("mlx_ops_4bit", Box::new(|| quantized_sdpa_ops(&q, refs(&c.q4[0]), refs(&c.q4[1]), scale, none(), GROUP, 4).unwrap())),
                ("mlx_ops_8bit", Box::new(|| quantized_sdpa_ops(&q, refs(&c.q8[0]), refs(&c.q8[1]), scale, none(), GROUP, 8).unwrap())),
            ];
            let times = measure(&ops, reps);
            let dense = times[0];
            let mut ms = serde_json::Map::new();
            let mut ratios = serde_json::Map::new();
            for ((name, _), s) in ops.iter().zip(&times) {
                ms.insert((*name).into(), json!(s * 1e3));
                if *name != "dense_f32_sdpa" {
                    ratios.insert(format!("{name}_ratio"), json!(dense / s));
                }
            }
            eprintln!("{model} {layout} T={t}: times_ms {ms:?}\n  ratios (dense / x) {ratios:?}");
            results.push(json!({
                "model": model, "layout": layout, "B": 1, "L": 1, "Hq": hq, "Hkv": hkv, "D": d, "T": t,
                "group": GROUP, "times_ms": ms, "ratios_vs_dense_f32": ratios,
            }));
        }
    }

    let blas = blas_info();
    let isa = format!("{:?}", QmmIsa::best());
    let doc: Value = json!({
        "benchmark": "qsdpa",
        "command": format!("cargo run --release --example qsdpa_bench -- --t {t} --reps {reps}"),
        "date_unix": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs(),
        "machine": {
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "load_average_1min": {"start": load_start, "end": load()},
            "mlx_version": mlxrt::mlx::version(),
        },
        "provenance": {
            "mlxrt": {
                "kernels": format!("auto: mlxrt fused quantized attention ({isa})"),
                "kv_dtype": "uint32 packed 4/8-bit", "scale_dtype": "f32",
                "threads": qmm_threads(),
            },
            "reference": {
                "kernels": "MLX fast::scaled_dot_product_attention on dense f32 K/V; mlx-lm quantized_scaled_dot_product_attention as MLX ops (quantized_matmul, softmax precise)",
                "kv_dtype": "f32 (dense) / uint32 packed (ops)", "scale_dtype": "f32",
                "blas": blas.library, "openblas_threads": blas.openblas_threads,
            },
        },
        "notes": "one decode step (B=1, L=1, no mask); median ms per call (node build + eval) over alternating rounds; *_ratio = dense f32 sdpa time / variant time (issue 11 asks >= 0.9 for quantized KV at 4k)",
        "results": results,
    });
    std::fs::write(&out_path, serde_json::to_string_pretty(&doc).unwrap() + "\n").unwrap();
    eprintln!("wrote {out_path}");
}
