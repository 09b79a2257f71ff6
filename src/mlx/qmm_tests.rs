//! Tests of the CPU quantized-matmul primitive against MLX's own
//! `quantized_matmul`.
//!
//! Tolerance: |fast - stock| <= TOL * sum_k |x_mk| * |w_nk| for every output,
//! with w the dequantized weight and TOL = 1e-6 (about 8 f32 ulps; measured
//! worst cases here are 2.5e-7 to 3e-7). Both
//! kernels compute the same products in f32 but round the dequantized weight
//! differently (one fused multiply-add vs a multiply then an add) and sum in
//! different orders (16 or 8 lanes plus a tree here, 8 lanes there), so each
//! output may differ by a few ulps of its absolute-value sum; a wrong nibble,
//! group, scale or row moves an output by ~1e-2 of that sum or more.

use super::test_data::randn;
use super::*;

const TOL: f32 = 1e-6;

struct Quantized {
    w: Array,
    scales: Array,
    biases: Array,
    /// The dequantized weight in f32, for the error bound.
    dense: Array,
}

fn quantized(n: i32, k: i32, group: i32, bits: i32, scale_dtype: Dtype, seed: u64) -> Quantized {
    let (w, s, b) = quantize(&randn(&[n, k], seed), group, bits).unwrap();
    let (s, b) = (s.astype(scale_dtype).unwrap(), b.astype(scale_dtype).unwrap());
    let dense = dequantize(&w, &s, &b, group, bits).unwrap().astype(Dtype::F32).unwrap();
    Quantized { w, scales: s, biases: b, dense }
}

/// Largest |got - want| / bound over all outputs (bound = sum |x||w|).
fn worst_error(got: &Array, want: &Array, x: &Array, q: &Quantized) -> f32 {
    assert_eq!(got.shape(), want.shape());
    let bound = x.astype(Dtype::F32).unwrap().abs().unwrap();
    let bound = bound.matmul(&q.dense.abs().unwrap().transpose(&[1, 0]).unwrap()).unwrap();
    let (g, w, b) = (got.to_vec_f32().unwrap(), want.to_vec_f32().unwrap(), bound.to_vec_f32().unwrap());
    g.iter()
        .zip(&w)
        .zip(&b)
        .map(|((g, w), b)| if g.is_finite() { (g - w).abs() / b.max(1e-30) } else { f32::INFINITY })
        .fold(0.0, f32::max)
}

fn isas() -> Vec<QmmIsa> {
    [QmmIsa::Portable, QmmIsa::Avx2, QmmIsa::Avx512].into_iter().filter(|i| i.available()).collect()
}

/// Runs both kernels on one case and returns the worst relative error.
fn compare(x: &Array, q: &Quantized, group: i32, bits: i32, isa: QmmIsa) -> f32 {
    let fast = fast_quantized_matmul_isa(x, &q.w, &q.scales, &q.biases, group, bits, isa).unwrap();
    assert_eq!(fast_qmm_isa_of(&fast), Some(isa), "fast path not taken");
    let stock = quantized_matmul(x, &q.w, &q.scales, &q.biases, true, group, bits).unwrap();
    worst_error(&fast, &stock, x, q)
}

#[test]
fn matches_stock_across_shapes_bits_groups_and_isas() {
    let scale_types = [Dtype::F32, Dtype::F16, Dtype::BF16];
    let mut cases = 0;
    let mut worst = 0f32;
    for isa in isas() {
        for bits in [4, 8] {
            for group in [32, 64, 128] {
                for (i, n) in [1, 7, 130].into_iter().enumerate() {
                    for (j, st) in scale_types.into_iter().enumerate() {
                        let k = group * (2 + i as i32);
                        let q = quantized(n, k, group, bits, st, (bits * 1000 + group + n) as u64);
                        // Direct tiles (one, or near-equal row groups up to
                        // 16 rows on AVX-512) and panels.
                        for m in [1, 2, 3, 5, 6, 7, 8, 12, 16, 17, 33] {
                            let x = randn(&[m, k], (m * 31 + j as i32) as u64);
                            let err = compare(&x, &q, group, bits, isa);
                            worst = worst.max(err);
                            assert!(
                                err <= TOL,
                                "{isa:?} bits={bits} group={group} M={m} N={n} K={k} scales={st:?}: {err:e}"
                            );
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(cases >= 2 * 3 * 3 * 3 * 11);
    eprintln!("worst error / sum|x||w| over {cases} cases: {worst:e}");
}

#[test]
fn matches_stock_on_large_blocked_and_threaded_shapes() {
    // M = 128 exercises panels (several m-blocks), M = 11 row groups of
    // direct tiles, K = 2304 > kBlockK the k-blocking, and the sizes the
    // thread pool.
    for isa in isas() {
        for bits in [4, 8] {
            for (m, n, k, group) in
                [(128, 130, 2304, 64), (1, 1030, 2304, 128), (3, 515, 576, 32), (11, 1030, 2304, 32)]
            {
                let q = quantized(n, k, group, bits, Dtype::F16, (m + n + k) as u64);
                let x = randn(&[m, k], 7);
                let err = compare(&x, &q, group, bits, isa);
                eprintln!("{isa:?} bits={bits} M={m} N={n} K={k}: {err:e}");
                assert!(err <= TOL, "{isa:?} bits={bits} M={m} N={n} K={k}: {err:e}");
            }
        }
    }
}

#[test]
fn batch_dims_strided_x_and_half_inputs() {
    let (group, bits, k, n) = (32, 4, 96, 37);
    let q = quantized(n, k, group, bits, Dtype::F32, 11);
    // Leading batch dimensions.
    let x = randn(&[2, 3, k], 12);
    let fast = fast_quantized_matmul(&x, &q.w, &q.scales, &q.biases, group, bits).unwrap();
    assert!(fast_qmm_isa_of(&fast).is_some());
    assert_eq!(fast.shape(), vec![2, 3, n]);
    let stock = quantized_matmul(&x, &q.w, &q.scales, &q.biases, true, group, bits).unwrap();
    let flat = |a: &Array| a.reshape(&[6, n]).unwrap();
    assert!(worst_error(&flat(&fast), &flat(&stock), &x.reshape(&[6, k]).unwrap(), &q) <= TOL);

    // A transposed (non-contiguous) x is read through its strides.
    let xt = randn(&[k, 5], 13).transpose(&[1, 0]).unwrap();
    assert!(compare(&xt, &q, group, bits, QmmIsa::best()) <= TOL);

    // f16 / bf16 x: computed in f32, returned in the stock op's dtype.
    for dt in [Dtype::F16, Dtype::BF16] {
        let xh = randn(&[4, k], 14).astype(dt).unwrap();
        let (s, b) = (q.scales.astype(dt).unwrap(), q.biases.astype(dt).unwrap());
        let fast = fast_quantized_matmul(&xh, &q.w, &s, &b, group, bits).unwrap();
        assert_eq!(fast.dtype(), dt);
        let want = quantized_matmul(&xh.astype(Dtype::F32).unwrap(), &q.w, &s, &b, true, group, bits)
            .unwrap();
        let (f, w) = (fast.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
        let ulp = if dt == Dtype::F16 { 1.0 / 1024.0 } else { 1.0 / 128.0 };
        for (a, b) in f.iter().zip(&w) {
            assert!((a - b).abs() <= ulp * b.abs() + 1e-3, "{dt:?}: {a} vs {b}");
        }
    }
}

#[test]
fn unsupported_cases_fall_back_to_stock_and_errors_are_errors() {
    let x = randn(&[2, 64], 21);
    // 3-bit weights: MLX's op, same numbers.
    let (w, s, b) = quantize(&randn(&[8, 64], 22), 32, 3).unwrap();
    let out = fast_quantized_matmul(&x, &w, &s, &b, 32, 3).unwrap();
    assert_eq!(fast_qmm_isa_of(&out), None);
    let want = quantized_matmul(&x, &w, &s, &b, true, 32, 3).unwrap();
    assert_eq!(out.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());

    // Bad shapes and dtypes are MLX errors, never aborts.
    let (w, s, b) = quantize(&randn(&[8, 64], 23), 32, 4).unwrap();
    let bad_x = randn(&[2, 48], 24);
    assert!(fast_quantized_matmul(&bad_x, &w, &s, &b, 32, 4).is_err());
    assert!(fast_quantized_matmul(&x, &w, &s, &b, 64, 4).is_err());
    let float_w = w.astype(Dtype::F32).unwrap();
    assert!(fast_quantized_matmul(&x, &float_w, &s, &b, 32, 4).is_err());
    let short_b = b.slice_axis(0, 0, 4).unwrap();
    assert!(fast_quantized_matmul(&x, &w, &s, &short_b, 32, 4).is_err());
}

#[test]
fn the_tolerance_catches_a_wrong_weight() {
    // One scale off by 1%: the check must notice, or it checks nothing.
    let (group, bits, k, n) = (32, 4, 128, 16);
    let q = quantized(n, k, group, bits, Dtype::F32, 31);
    let mut s = q.scales.to_vec_f32().unwrap();
    s[5] *= 1.01;
    let bad = Quantized {
        w: q.w.share(),
        scales: Array::from_f32(&s, &q.scales.shape()).unwrap(),
        biases: q.biases.share(),
        dense: q.dense.share(),
    };
    let x = randn(&[1, k], 32);
    let fast = fast_quantized_matmul(&x, &bad.w, &bad.scales, &bad.biases, group, bits).unwrap();
    let stock = quantized_matmul(&x, &q.w, &q.scales, &q.biases, true, group, bits).unwrap();
    assert!(worst_error(&fast, &stock, &x, &q) > 100.0 * TOL);
}

#[test]
fn reports_isa_threads_and_blas() {
    assert!(QmmIsa::Portable.available());
    assert!(QmmIsa::best().available());
    assert!(qmm_threads() >= 1);
    let blas = blas_info();
    if !option_env!("MLXRT_BUILD_OPENBLAS").unwrap_or("").is_empty() {
        assert!(blas.is_openblas(), "linked OpenBLAS but cblas_sgemm is {blas}");
    }
}
