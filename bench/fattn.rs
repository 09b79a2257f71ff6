//! Float attention microbenchmark (issue 12): mlxrt's fused CPU attention
//! (`fused_sdpa`) vs MLX's `fast::scaled_dot_product_attention` (on the CPU:
//! matmul, materialized mask, softmax, matmul), one process, SmolLM2-135M's
//! heads (Hq 9, Hkv 3, D 64), B = 1, f32.
//!
//!   cargo run --release --example fattn_bench -- [--reps 5] [--out PATH]
//!
//! Cases: a causal prefill of 512 and 2048 tokens (L = T), a 2048-token
//! prefill under a 512-position sliding window (MLX: its bool mask), and one
//! decode step (L = 1, no mask) at 4096 cached positions read as a cache hands
//! them out (a `[:, :, :T]` slice of a larger buffer). Each sample builds and
//! evaluates the node (repeated to >= 5 ms); the variants alternate for
//! `--reps` rounds and medians are reported with MLX's peak memory of one
//! call. `speedup` = MLX time / fused time. Writes JSON (default
//! bench/results/fattn.json).

use mlxrt::mlx::{fattn_isa_of, fast::Mask, fused_sdpa, memory, qmm_threads, sdpa_stock, Array, QmmIsa};
use serde_json::json;
use std::time::Instant;

fn randn(shape: &[i32], seed: u64) -> Array {
    let n: usize = shape.iter().map(|&d| d as usize).product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut unit = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let v: Vec<f32> = (0..n).map(|_| unit() + unit() + unit() + unit()).collect();
    Array::from_f32(&v, shape).unwrap()
}

/// Seconds per call, averaged over enough calls to last 5 ms.
fn sample(op: &dyn Fn() -> Array, calls: usize) -> f64 {
    let t = Instant::now();
    (0..calls).for_each(|_| op().eval().unwrap());
    t.elapsed().as_secs_f64() / calls as f64
}

/// MLX's peak memory over one call, bytes above what was live before.
fn peak_bytes(op: &dyn Fn() -> Array) -> usize {
    let before = memory::active();
    memory::reset_peak();
    op().eval().unwrap();
    memory::peak().saturating_sub(before)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let reps: usize = arg("--reps").map(|v| v.parse().expect("--reps N")).unwrap_or(5);
    let out_path = arg("--out").unwrap_or_else(|| "bench/results/fattn.json".into());
    let load = || std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split(' ').next()?.parse::<f64>().ok());
    let load_start = load();
    let (hq, hkv, d) = (9, 3, 64);
    let scale = 1.0 / (d as f32).sqrt();

    let mut results = Vec::new();
    for (name, l, t, window) in [
        ("prefill_causal", 512, 512, None),
        ("prefill_causal", 2048, 2048, None),
        ("prefill_window512", 2048, 2048, Some(512)),
        ("decode", 1, 4096, None),
    ] {
        let q = randn(&[1, hq, l, d], 7);
        let spare = if l == 1 { 256 } else { 0 };
        let k = randn(&[1, hkv, t + spare, d], 11).slice_axis(2, 0, t).unwrap();
        let v = randn(&[1, hkv, t + spare, d], 12).slice_axis(2, 0, t).unwrap();
        mlxrt::mlx::eval(&[&q, &k, &v]).unwrap();
        let mask = || if l > 1 { Mask::Causal } else { Mask::None };
        let fused = || fused_sdpa(&q, &k, &v, scale, mask(), window).unwrap();
        let stock = || sdpa_stock(&q, &k, &v, scale, mask(), window).unwrap();
        assert!(fattn_isa_of(&fused()).is_some(), "the fused kernel did not run");
        let ops: [&dyn Fn() -> Array; 2] = [&fused, &stock];
        let calls: Vec<usize> =
            ops.iter().map(|op| ((0.005 / sample(*op, 1)).ceil() as usize).clamp(1, 10_000)).collect();
        let mut times = [Vec::new(), Vec::new()];
        for _ in 0..reps {
            for (i, op) in ops.iter().enumerate() {
                times[i].push(sample(*op, calls[i]));
            }
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        let (tf, ts) = (med(&mut times[0]), med(&mut times[1]));
        let (pf, ps) = (peak_bytes(&fused), peak_bytes(&stock));
        eprintln!(
            "{name} L={l} T={t}: fused {:.3} ms, mlx {:.3} ms, speedup {:.2}x; peak MiB fused {:.1}, mlx {:.1}",
            tf * 1e3,
            ts * 1e3,
            ts / tf,
            pf as f64 / 1048576.0,
            ps as f64 / 1048576.0
        );
        results.push(json!({
            "case": name, "B": 1, "Hq": hq, "Hkv": hkv, "D": d, "L": l, "T": t, "window": window,
            "times_ms": {"fused": tf * 1e3, "mlx_sdpa": ts * 1e3},
            "speedup": ts / tf,
            "peak_mib_one_call": {"fused": pf as f64 / 1048576.0, "mlx_sdpa": ps as f64 / 1048576.0},
        }));
    }

    let doc = json!({
        "benchmark": "fattn",
        "command": format!("cargo run --release --example fattn_bench -- --reps {reps}"),
        "date_unix": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs(),
        "machine": {
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "load_average_1min": {"start": load_start, "end": load()},
            "mlx_version": mlxrt::mlx::version(),
        },
        "provenance": {
            "mlxrt": {
                "kernels": format!("mlxrt fused float attention ({:?})", QmmIsa::best()),
                "scale_dtype": "none (f32 keys and values)",
                "threads": qmm_threads(),
            },
            "reference": {
                "kernels": "MLX fast::scaled_dot_product_attention (CPU: matmul + mask + precise softmax + matmul)",
                "scale_dtype": "none (f32 keys and values)",
            },
        },
        "notes": "f32, SmolLM2-135M heads; median ms per call (node build + eval) over alternating rounds; speedup = mlx / fused; peak = MLX allocator peak above the live inputs over one call",
        "results": results,
    });
    std::fs::write(&out_path, serde_json::to_string_pretty(&doc).unwrap() + "\n").unwrap();
    eprintln!("wrote {out_path}");
}
