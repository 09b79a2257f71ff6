//! What the mlxrt side of a benchmark ran, printed with its figures so every
//! results file records it (bench/README.md, "Provenance"). Included by the
//! bench examples with `#[path]`.

use mlxrt::cache::scheme::{KvFloat, KvQuant, KvScheme};
use mlxrt::engine::Kernels;
use serde_json::{json, Value};

/// The kernels the driver asked for in `MLXRT_BENCH_KERNELS`: "auto" (the
/// engine's default, also when unset), "stock" or "int8".
pub fn kernels() -> Kernels {
    match std::env::var("MLXRT_BENCH_KERNELS").as_deref() {
        Err(_) | Ok("") | Ok("auto") => Kernels::Auto,
        Ok("stock") => Kernels::Stock,
        Ok("int8") => Kernels::Int8,
        Ok(other) => {
            eprintln!("MLXRT_BENCH_KERNELS={other:?}: expected auto, stock or int8");
            std::process::exit(2);
        }
    }
}

/// The KV storage the driver asked for in `MLXRT_BENCH_KV_BITS`: unset or 0
/// = dense (f32, the engine's default), 4 or 8 = MLX affine quantization in
/// groups of 64 from the first position (the engine's `kv_bits`), 16 =
/// dense f16 (`KvFloat::F16`, `MLXRT_KV_SCHEME_F16`).
pub fn kv() -> KvQuant {
    match std::env::var("MLXRT_BENCH_KV_BITS").as_deref() {
        Err(_) | Ok("") | Ok("0") => KvQuant::default(),
        Ok(b @ ("4" | "8")) => {
            KvQuant { scheme: KvScheme::Affine { bits: b.parse().unwrap(), group_size: 64 }, ..KvQuant::default() }
        }
        Ok("16") => KvQuant { float: KvFloat::F16, ..KvQuant::default() },
        Ok(other) => {
            eprintln!("MLXRT_BENCH_KV_BITS={other:?}: expected 0, 4, 8 or 16");
            std::process::exit(2);
        }
    }
}

/// The provenance object of this side.
pub fn json(kernels: Kernels) -> Value {
    let gpu = mlxrt::mlx::device::default_is_gpu();
    // mlxrt's own qmm/SwiGLU run only with `Kernels::Auto`/`Int8` on the CPU device.
    let own = kernels != Kernels::Stock && !gpu;
    let blas = mlxrt::mlx::blas_info();
    json!({
        "side": "mlxrt",
        "kernels": match kernels { Kernels::Auto => "auto", Kernels::Stock => "stock", Kernels::Int8 => "int8" },
        "qmm": match (own, kernels) {
            (false, _) => "MLX quantized_matmul".into(),
            (true, Kernels::Int8) => format!(
                "mlxrt ({:?}, int8 activations{})",
                mlxrt::mlx::QmmIsa::best(),
                // What `Weights::linear` asks before packing a 4-bit layer.
                if mlxrt::mlx::packable(32, 64, 32, 4) { "; 4-bit layers packed into column panels at load" } else { "" }
            ),
            (true, _) => format!("mlxrt ({:?})", mlxrt::mlx::QmmIsa::best()),
        },
        "swiglu": if own { "mlxrt" } else { "MLX silu * mul" },
        "device": if gpu { "gpu" } else { "cpu" },
        // On the CPU device the engine casts quantization scales/biases to
        // f32 at load for layers MLX's kernels run; mlxrt's quantized matmul
        // reads them as stored (src/model/weights.rs, Weights::scale_dtype).
        "scale_dtype": if gpu || own { "as stored" } else { "f32" },
        "qmm_threads": if own { Some(mlxrt::mlx::qmm_threads()) } else { None },
        "blas": blas.library,
        "openblas_threads": blas.openblas_threads,
        "mlx": mlxrt::mlx::version(),
        // Only where the driver chose it (kv_memory sets its own schemes).
        "kv": std::env::var_os("MLXRT_BENCH_KV_BITS").map(|_| match (kv().scheme, kv().float) {
            (KvScheme::Affine { bits, group_size }, _) => format!("affine {bits}-bit, groups of {group_size}"),
            (_, KvFloat::F16) => "f16".into(),
            _ => "f32".into(),
        }),
    })
}
