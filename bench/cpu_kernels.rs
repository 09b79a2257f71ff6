//! CPU kernel microbenchmark: mlxrt's quantized matmul (f32 activations;
//! int8 activations with f32 and f16 scales, and against weights packed into
//! column panels where the CPU runs them) vs MLX's stock
//! `quantized_matmul` (f16 and f32 scales), and MLX's dense f32 matmul with
//! OpenBLAS vs the wheel's reference BLAS, on SmolLM2-135M's linear shapes.
//!
//!   cargo bench --bench cpu_kernels -- [--reps N] [--out PATH] [--quick] [--rows 1,8,..]
//!
//! `--quick` (for tuning) measures mlxrt's kernel and the OpenBLAS matmul only;
//! `--rows` replaces the default row counts M.
//! Every (shape, M) point warms up each variant, then alternates them for N
//! rounds and reports medians. The reference-BLAS figures come from this same
//! binary re-run as a child with the wheel's libblas preloaded (preloaded
//! objects precede OpenBLAS in symbol lookup). Writes JSON (default
//! bench/results/cpu_kernels.json); ratios are stock time / mlxrt time.

use mlxrt::mlx::{
    blas_info, eval, fast_quantized_matmul_isa, fast_quantized_matmul_packed, fast_quantized_matmul_with, pack_panels,
    packable, qmm_threads, quantize, quantized_matmul, Array, Dtype, QmmIsa,
};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::time::Instant;

/// SmolLM2-135M: (name, K, N, bits). Group size 32 throughout.
const SHAPES: [(&str, i32, i32, i32); 5] = [
    ("attn_q_o 576->576", 576, 576, 4),
    ("attn_k_v 576->192", 576, 192, 4),
    ("mlp_gate_up 576->1536", 576, 1536, 4),
    ("mlp_down 1536->576", 1536, 576, 4),
    ("lm_head 576->49152 (8-bit)", 576, 49152, 8),
];
/// Rows of x: decode, batched decode (small batches), prefill.
const ROWS: [i32; 6] = [1, 4, 8, 16, 32, 128];
const GROUP: i32 = 32;
/// A call predicted slower than this is not run (stock kernels at large M).
const SKIP_S: f64 = 12.0;
/// Time spent per variant and point at most, roughly.
const BUDGET_S: f64 = 4.0;
/// One sample lasts at least this long (short calls are repeated).
const MIN_SAMPLE_S: f64 = 0.003;

fn randn(shape: &[i32], seed: u64) -> Array {
    let n: usize = shape.iter().map(|&d| d as usize).product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            // Sum of 4 uniforms: cheap, roughly normal, enough for timing.
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

struct Weights {
    w: Array,
    s32: Array,
    b32: Array,
    s16: Array,
    b16: Array,
    dense: Array,
}

fn weights(k: i32, n: i32, bits: i32) -> Weights {
    let (w, s, b) = quantize(&randn(&[n, k], (k * n) as u64), GROUP, bits).unwrap();
    let s16 = s.astype(Dtype::F16).unwrap();
    let b16 = b.astype(Dtype::F16).unwrap();
    let dense = mlxrt::mlx::dequantize(&w, &s, &b, GROUP, bits).unwrap();
    // Dense weight stored as a model stores it, (N, K); used as x @ W.T.
    let all = [&w, &s, &b, &s16, &b16, &dense];
    eval(&all).unwrap();
    Weights { w, s32: s, b32: b, s16, b16, dense }
}

type Op<'a> = Box<dyn Fn() -> Array + 'a>;

struct Variant<'a> {
    name: &'static str,
    op: Op<'a>,
    /// Weight bytes read per call.
    bytes: f64,
    /// Time grows linearly with M (used to predict and skip huge calls).
    linear_in_m: bool,
}

fn time_call(op: &Op, inner: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..inner {
        op().eval().unwrap();
    }
    t.elapsed().as_secs_f64() / inner as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) }
}

/// Runs the variants alternately; returns name -> raw samples (seconds).
/// `prev` holds (M, median) of the previous M per variant for skip predictions.
fn measure(
    variants: &[Variant],
    m: i32,
    reps: usize,
    prev: &mut BTreeMap<&'static str, (i32, f64)>,
) -> BTreeMap<&'static str, Vec<f64>> {
    let mut plan = Vec::new();
    for v in variants {
        if let Some(&(pm, pt)) = prev.get(v.name) {
            let predicted = pt * m as f64 / pm as f64;
            if v.linear_in_m && predicted > SKIP_S {
                eprintln!("  {:<16} skipped (predicted {:.1} s per call)", v.name, predicted);
                continue;
            }
        }
        let t0 = time_call(&v.op, 1); // warm-up
        let t0 = if t0 < 0.1 { time_call(&v.op, 1) } else { t0 };
        let inner = ((MIN_SAMPLE_S / t0).ceil() as usize).clamp(1, 10_000);
        let n = ((BUDGET_S / (t0 * inner as f64)) as usize).clamp(1, reps);
        plan.push((v, inner, n));
    }
    let mut out: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let rounds = plan.iter().map(|p| p.2).max().unwrap_or(0);
    for r in 0..rounds {
        for (v, inner, n) in &plan {
            if r < *n {
                out.entry(v.name).or_default().push(time_call(&v.op, *inner));
            }
        }
    }
    for (name, s) in &out {
        let mut c = s.clone();
        prev.insert(name, (m, median(&mut c)));
    }
    out
}

fn rows_arg(rows: &[i32]) -> String {
    rows.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(",")
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The 1-minute load average: other work on a shared machine skews timings.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(-1.0)
}

fn date_utc() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The wheel's reference BLAS next to libmlx (mlx/lib/../../mlx_cpu.libs).
fn reference_blas() -> Option<std::path::PathBuf> {
    let mlx = std::path::PathBuf::from(env!("MLXRT_MLX_DIR"));
    let libs = mlx.parent()?.join("mlx_cpu.libs");
    std::fs::read_dir(libs)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libblas")))
}

/// Child mode: dense matmuls only, printed as one JSON object.
fn dense_child(reps: usize, rows: &[i32]) {
    let mut res = Map::new();
    for (name, k, n, bits) in SHAPES {
        let wt = weights(k, n, bits);
        let mut prev = BTreeMap::new();
        for &m in rows {
            let x = randn(&[m, k], 1000 + m as u64);
            let wd = wt.dense.transpose(&[1, 0]).unwrap();
            let v = [Variant {
                name: "dense",
                op: Box::new(|| x.matmul(&wd).unwrap()),
                bytes: 0.0,
                linear_in_m: true,
            }];
            let s = measure(&v, m, reps, &mut prev);
            res.insert(format!("{name}|{m}"), json!(s.get("dense")));
        }
    }
    println!("{}", json!({"blas": blas_info().to_string(), "samples": res}));
}

fn run_dense_child(reps: usize, rows: &[i32]) -> (String, Map<String, Value>) {
    let Some(lib) = reference_blas() else {
        eprintln!("reference BLAS not found next to libmlx; skipping");
        return (String::new(), Map::new());
    };
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--dense-child", "--reps", &reps.to_string(), "--rows", &rows_arg(rows)])
        .env("LD_PRELOAD", &lib)
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("running the reference-BLAS child");
    let v: Value = serde_json::from_slice(&out.stdout).expect("child JSON");
    let blas = v["blas"].as_str().unwrap_or_default().to_string();
    (blas, v["samples"].as_object().cloned().unwrap_or_default())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1));
    let reps: usize = arg("--reps").and_then(|s| s.parse().ok()).unwrap_or(7);
    let out_path = arg("--out").cloned().unwrap_or_else(|| "bench/results/cpu_kernels.json".into());
    let rows: Vec<i32> = match arg("--rows") {
        Some(v) => v.split(',').map(|r| r.trim().parse().expect("--rows: comma-separated integers")).collect(),
        None => ROWS.to_vec(),
    };
    if args.iter().any(|a| a == "--dense-child") {
        return dense_child(reps, &rows);
    }
    if args.iter().any(|a| a == "--interleave") {
        return interleave();
    }

    let quick = args.iter().any(|a| a == "--quick");
    let load_before = load_average();
    let blas = blas_info();
    let isa = QmmIsa::best();
    eprintln!("mlxrt qmm: {isa:?}, {} threads; BLAS: {blas}", qmm_threads());
    let (ref_blas, ref_samples) = if quick {
        (String::new(), Map::new())
    } else {
        eprintln!("reference-BLAS child run first (dense matmul only)...");
        run_dense_child(reps, &rows)
    };
    eprintln!("child BLAS: {ref_blas}");

    let mut results = Vec::new();
    for (name, k, n, bits) in SHAPES {
        eprintln!("{name}");
        let wt = weights(k, n, bits);
        // The layers as the int8 mode loads them where the CPU runs packed
        // panels (mlx::pack_panels), with f16 scales as in GGUF files (compare
        // mlxrt_int8_f16).
        let packed = packable(n, k, GROUP, bits).then(|| {
            let (w, s, b) = pack_panels(&wt.w, &wt.s16, Some(&wt.b16), bits).unwrap();
            let b = b.expect("stored biases stay stored");
            eval(&[&w, &s, &b]).unwrap();
            (w, s, b)
        });
        let qbytes = |sbytes: f64| (n as f64 * k as f64 * bits as f64 / 8.0) + 2.0 * sbytes * (n * k / GROUP) as f64;
        let mut prev = BTreeMap::new();
        for &m in &rows {
            let x = randn(&[m, k], 1000 + m as u64);
            eval(&[&x]).unwrap();
            let wd = wt.dense.transpose(&[1, 0]).unwrap();
            let mut variants = vec![
                Variant {
                    name: "mlxrt_f16",
                    op: Box::new(|| {
                        fast_quantized_matmul_isa(&x, &wt.w, &wt.s16, Some(&wt.b16), GROUP, bits, isa).unwrap()
                    }),
                    bytes: qbytes(2.0),
                    linear_in_m: false,
                },
                Variant {
                    name: "stock_f16",
                    op: Box::new(|| {
                        quantized_matmul(&x, &wt.w, &wt.s16, &wt.b16, true, GROUP, bits).unwrap()
                    }),
                    bytes: qbytes(2.0),
                    linear_in_m: true,
                },
                Variant {
                    name: "mlxrt_f32",
                    op: Box::new(|| {
                        fast_quantized_matmul_isa(&x, &wt.w, &wt.s32, Some(&wt.b32), GROUP, bits, isa).unwrap()
                    }),
                    bytes: qbytes(4.0),
                    linear_in_m: false,
                },
                Variant {
                    name: "mlxrt_int8_f32",
                    op: Box::new(|| {
                        fast_quantized_matmul_with(&x, &wt.w, &wt.s32, Some(&wt.b32), GROUP, bits, isa, true)
                            .unwrap()
                    }),
                    bytes: qbytes(4.0),
                    linear_in_m: false,
                },
                Variant {
                    name: "mlxrt_int8_f16",
                    op: Box::new(|| {
                        fast_quantized_matmul_with(&x, &wt.w, &wt.s16, Some(&wt.b16), GROUP, bits, isa, true)
                            .unwrap()
                    }),
                    bytes: qbytes(2.0),
                    linear_in_m: false,
                },
                Variant {
                    name: "stock_f32",
                    op: Box::new(|| {
                        quantized_matmul(&x, &wt.w, &wt.s32, &wt.b32, true, GROUP, bits).unwrap()
                    }),
                    bytes: qbytes(4.0),
                    linear_in_m: true,
                },
                Variant {
                    name: "dense_openblas",
                    op: Box::new(|| x.matmul(&wd).unwrap()),
                    bytes: 4.0 * n as f64 * k as f64,
                    linear_in_m: false,
                },
            ];
            if let Some((pw, ps, pb)) = &packed {
                variants.push(Variant {
                    name: "mlxrt_int8_packed_f16",
                    op: Box::new(|| fast_quantized_matmul_packed(&x, pw, ps, Some(pb), GROUP).unwrap()),
                    bytes: qbytes(2.0),
                    linear_in_m: false,
                });
            }
            let variants: Vec<Variant> = if quick {
                variants.into_iter().filter(|v| !v.name.starts_with("stock")).collect()
            } else {
                variants
            };
            let samples = measure(&variants, m, reps, &mut prev);
            results.push(point(name, k, n, bits, m, &variants, samples, &ref_samples));
        }
    }

    let doc = json!({
        "benchmark": "cpu_kernels",
        "machine": {
            "cpu": cpu_model(),
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "mlx_version": mlxrt::mlx::version(),
            "qmm_isa": format!("{isa:?}"),
            "qmm_threads": qmm_threads(),
            "blas": blas.to_string(),
            "reference_blas_child": ref_blas,
            "load_average_1min": {"start": load_before, "end": load_average()},
        },
        "date": date_utc(),
        "command": format!("cargo bench --bench cpu_kernels -- --reps {reps} --rows {}", rows_arg(&rows)),
        "notes": "times are medians in ms of alternating runs (x f32; group 32); \
                  gbps = weight bytes read (packed weights + scales + biases, or f32 dense \
                  weights) / time; *_time_ratio = stock time / mlxrt time (> 1: mlxrt faster), \
                  int8_vs_f32_activations_time_ratio = mlxrt_f32 time / mlxrt_int8_f32 time; \
                  dense_reference is MLX's matmul on the wheel's bundled reference BLAS, \
                  measured in a child process; a missing entry was skipped as too slow",
        "results": results,
    });
    if quick {
        return;
    }
    let text = serde_json::to_string_pretty(&doc).unwrap();
    std::fs::write(&out_path, text + "\n").expect("writing results");
    eprintln!("wrote {out_path}");
}

#[allow(clippy::too_many_arguments)]
fn point(
    name: &str,
    k: i32,
    n: i32,
    bits: i32,
    m: i32,
    variants: &[Variant],
    samples: BTreeMap<&'static str, Vec<f64>>,
    ref_samples: &Map<String, Value>,
) -> Value {
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    let mut times = Map::new();
    let mut raw = Map::new();
    let mut gflops = Map::new();
    let mut gbps = Map::new();
    let mut med = BTreeMap::new();
    let mut add = |key: &str, s: &[f64], bytes: f64| {
        let t = median(&mut s.to_vec());
        med.insert(key.to_string(), t);
        times.insert(key.into(), json!(t * 1e3));
        raw.insert(key.into(), json!(s.iter().map(|t| t * 1e3).collect::<Vec<_>>()));
        gflops.insert(key.into(), json!(flops / t / 1e9));
        gbps.insert(key.into(), json!(bytes / t / 1e9));
    };
    for v in variants {
        if let Some(s) = samples.get(v.name) {
            add(v.name, s, v.bytes);
        }
    }
    if let Some(Value::Array(a)) = ref_samples.get(&format!("{name}|{m}")) {
        let s: Vec<f64> = a.iter().filter_map(|v| v.as_f64()).collect();
        if !s.is_empty() {
            add("dense_reference", &s, 4.0 * n as f64 * k as f64);
        }
    }
    let ratio = |a: &str, b: &str| match (med.get(a), med.get(b)) {
        (Some(x), Some(y)) => json!(x / y),
        _ => Value::Null,
    };
    let line = |key: &str| {
        med.get(key).map(|t| format!("{key} {:.3} ms ({:.1} GFLOP/s)", t * 1e3, flops / t / 1e9))
    };
    eprintln!(
        "  M={m:<4} {}",
        ["mlxrt_f16", "stock_f16", "mlxrt_f32", "mlxrt_int8_f32", "mlxrt_int8_f16", "mlxrt_int8_packed_f16", "stock_f32", "dense_openblas", "dense_reference"]
            .iter()
            .filter_map(|k| line(k))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    json!({
        "shape": name, "K": k, "N": n, "bits": bits, "group": GROUP, "M": m,
        "times_ms": times, "gflops": gflops, "gbps": gbps, "samples_ms": raw,
        "ratios": {
            "qmm_f16_time_ratio": ratio("stock_f16", "mlxrt_f16"),
            "qmm_f32_time_ratio": ratio("stock_f32", "mlxrt_f32"),
            "qmm_f16_vs_stock_f32_time_ratio": ratio("stock_f32", "mlxrt_f16"),
            "int8_vs_f32_activations_time_ratio": ratio("mlxrt_f32", "mlxrt_int8_f32"),
            "int8_packed_vs_int8_time_ratio": ratio("mlxrt_int8_f16", "mlxrt_int8_packed_f16"),
            "dense_openblas_time_ratio": ratio("dense_reference", "dense_openblas"),
        },
    })
}

/// Does an OpenBLAS call just before slow down the quantized matmul (OpenBLAS's
/// idle threads spin for a while and compete with the kernel's pool)?
fn interleave() {
    let (k, n, m) = (576, 1536, 32);
    let wt = weights(k, n, 4);
    let x = randn(&[m, k], 5);
    let a = randn(&[256, 576], 6);
    let b = randn(&[576, 576], 7);
    eval(&[&x, &a, &b]).unwrap();
    let q = || fast_quantized_matmul_isa(&x, &wt.w, &wt.s32, Some(&wt.b32), GROUP, 4, QmmIsa::Auto).unwrap();
    let d = || a.matmul(&b).unwrap();
    let min = |v: &[f64]| v.iter().cloned().fold(f64::MAX, f64::min) * 1e3;
    for _ in 0..3 {
        let (mut q_alone, mut q_after, mut d_alone, mut d_after) = (vec![], vec![], vec![], vec![]);
        for _ in 0..200 {
            // Each op timed after ~1 ms of idling (pool threads asleep, BLAS
            // threads parked) and right after the other op.
            std::thread::sleep(std::time::Duration::from_millis(1));
            let t = Instant::now();
            q().eval().unwrap();
            q_alone.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            d().eval().unwrap();
            d_after.push(t.elapsed().as_secs_f64());
            std::thread::sleep(std::time::Duration::from_millis(1));
            let t = Instant::now();
            d().eval().unwrap();
            d_alone.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            q().eval().unwrap();
            q_after.push(t.elapsed().as_secs_f64());
        }
        eprintln!(
            "qmm: after idle {:.3} ms (min {:.3}), after BLAS {:.3} (min {:.3}) | BLAS: after idle {:.3} (min {:.3}), after qmm {:.3} (min {:.3})",
            median(&mut q_alone) * 1e3, min(&q_alone), median(&mut q_after) * 1e3, min(&q_after),
            median(&mut d_alone) * 1e3, min(&d_alone), median(&mut d_after) * 1e3, min(&d_after),
        );
    }
}
