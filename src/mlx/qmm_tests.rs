//! Tests of the CPU quantized-matmul primitive against MLX's own
//! `quantized_matmul`.
//!
//! Tolerance: |fast - stock| <= TOL * sum_k |x_mk| * |w_nk| for every output,
//! with w the dequantized weight and TOL = 1e-6 (about 8 f32 ulps; measured
//! worst cases here are 2.5e-7 to 3e-7). Both
//! kernels compute the same products in f32 but round the dequantized weight
//! differently (one fused multiply-add vs a multiply then an add) and sum in
//! different orders (here 16, 8 or 4 lane sums plus a tree on either path,
//! 8 lanes in MLX's), so each output may differ by a few ulps of its absolute-value sum; a wrong nibble,
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
    let fast = fast_quantized_matmul_isa(x, &q.w, &q.scales, Some(&q.biases), group, bits, isa).unwrap();
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
                        // 32 rows on AVX-512, 16 on AVX2) and the GEMM path.
                        for m in [1, 2, 3, 5, 6, 7, 8, 12, 16, 17, 23, 32, 33] {
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
    assert!(cases >= 2 * 3 * 3 * 3 * 13);
    eprintln!("worst error / sum|x||w| over {cases} cases: {worst:e}");
}

#[test]
fn matches_stock_on_large_blocked_and_threaded_shapes() {
    // M = 128 exercises the GEMM path (row tiles, the last one partial; a
    // partial column tile at N = 130), M = 11 row groups of direct tiles (the
    // GEMM path on AVX2 and portable), K = 2304 > kBlockK both paths'
    // k-blocking, M = 2 at K = 576 AVX-512's wide decode tiles split over
    // threads, and the sizes the thread pool.
    for isa in isas() {
        for bits in [4, 8] {
            for (m, n, k, group) in
                [(128, 130, 2304, 64), (1, 1030, 2304, 128), (3, 515, 576, 32), (11, 1030, 2304, 32), (2, 1030, 576, 32)]
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

/// `quantized` with the biases a symmetric format stores: `-2^(bits-1)`
/// times each scale, in the scales' dtype.
fn symmetric(n: i32, k: i32, group: i32, bits: i32, scale_dtype: Dtype, seed: u64) -> Quantized {
    let (w, s, _) = quantize(&randn(&[n, k], seed), group, bits).unwrap();
    let s = s.astype(scale_dtype).unwrap();
    let b = s.multiply(&s.scalar_like(-((1 << (bits - 1)) as f32)).unwrap()).unwrap();
    let dense = dequantize(&w, &s, &b, group, bits).unwrap().astype(Dtype::F32).unwrap();
    Quantized { w, scales: s, biases: b, dense }
}

#[test]
fn symmetric_weights_without_biases_give_the_bits_of_stored_ones() {
    // GGUF's Q4_0 and Q8_0 load without biases (src/model/weights.rs): the
    // kernel derives them from the scales, exactly, so every path (direct
    // and wide tiles, a partial last tile, the GEMM path, k-blocking, int8
    // activations) and variant gives the bits of the stored biases.
    let bits_of = |a: &Array| a.to_vec_f32().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for isa in isas() {
        for bits in [4, 8] {
            for st in [Dtype::F32, Dtype::F16, Dtype::BF16] {
                for (m, n, k, group) in [(1, 130, 576, 32), (2, 77, 576, 32), (5, 64, 2304, 64), (40, 130, 640, 128)] {
                    let q = symmetric(n, k, group, bits, st, (m * 5 + n + k) as u64);
                    let x = randn(&[m, k], (m + n) as u64);
                    let implied = fast_quantized_matmul_isa(&x, &q.w, &q.scales, None, group, bits, isa).unwrap();
                    let stored = fast_quantized_matmul_isa(&x, &q.w, &q.scales, Some(&q.biases), group, bits, isa).unwrap();
                    assert_eq!(fast_qmm_isa_of(&implied), Some(isa), "fast path not taken");
                    let case = format!("{isa:?} bits={bits} {st:?} M={m} N={n} K={k} group={group}");
                    assert_eq!(bits_of(&implied), bits_of(&stored), "{case}");
                    let stock = quantized_matmul(&x, &q.w, &q.scales, &q.biases, true, group, bits).unwrap();
                    assert!(worst_error(&implied, &stock, &x, &q) <= TOL, "{case}");
                    let q8 = fast_quantized_matmul_with(&x, &q.w, &q.scales, None, group, bits, isa, true).unwrap();
                    assert!(fast_qmm_is_int8(&q8), "int8 path not taken");
                    assert_eq!(bits_of(&q8), bits_of(&run_q8(&x, &q, group, bits, isa)), "int8 {case}");
                }
            }
        }
    }
    // A case the kernel does not take (3 bits) runs MLX's op with the
    // implied biases.
    let q = symmetric(7, 128, 32, 3, Dtype::F32, 3);
    let x = randn(&[2, 128], 4);
    let out = fast_quantized_matmul(&x, &q.w, &q.scales, None, 32, 3).unwrap();
    assert_eq!(fast_qmm_isa_of(&out), None);
    let stock = quantized_matmul(&x, &q.w, &q.scales, &q.biases, true, 32, 3).unwrap();
    assert_eq!(bits_of(&out), bits_of(&stock));
}

#[test]
fn f16_scales_give_the_bits_of_the_same_scales_in_f32() {
    // Models keep GGUF's f16 scales for this kernel (src/model/weights.rs):
    // it widens them exactly, so the results are those of the f32 scales the
    // engine used to cast them to, bit for bit, on every path (direct tiles,
    // the GEMM path, k-blocking) and variant, int8 activations included.
    for isa in isas() {
        for bits in [4, 8] {
            for (m, n, k, group) in [(1, 130, 576, 32), (8, 77, 576, 64), (40, 130, 2304, 32), (300, 64, 640, 128)] {
                let q = quantized(n, k, group, bits, Dtype::F16, (m * 7 + n + k) as u64);
                let (s32, b32) = (q.scales.astype(Dtype::F32).unwrap(), q.biases.astype(Dtype::F32).unwrap());
                let x = randn(&[m, k], (m + k) as u64);
                let half = fast_quantized_matmul_isa(&x, &q.w, &q.scales, Some(&q.biases), group, bits, isa).unwrap();
                let full = fast_quantized_matmul_isa(&x, &q.w, &s32, Some(&b32), group, bits, isa).unwrap();
                assert_eq!(fast_qmm_isa_of(&half), Some(isa));
                let bits_of = |a: &Array| a.to_vec_f32().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits_of(&half), bits_of(&full), "{isa:?} bits={bits} M={m} N={n} K={k} group={group}");
                let h8 = run_q8(&x, &q, group, bits, isa);
                let q32 = Quantized { w: q.w.share(), scales: s32, biases: b32, dense: q.dense.share() };
                assert_eq!(bits_of(&h8), bits_of(&run_q8(&x, &q32, group, bits, isa)), "int8 {isa:?} bits={bits} M={m}");
            }
        }
    }
}

#[test]
fn a_row_gets_the_same_bits_in_any_batch() {
    // Batch invariance: each output row is the same bits whether its row of
    // x is computed alone or beside one other (direct path, AVX-512's wide
    // tiles at K <= 1024), with a few others (direct on
    // AVX-512 and AVX2, GEMM on portable) or inside a large M (GEMM tiles,
    // the last one partial), on every variant, format and k-blocking (K =
    // 2304: blocks of 2048 + 256; K = 2080: 2048 + 32), with several threads.
    // The engine relies on it: a request decodes the same tokens alone and
    // batched (tests/batching.rs, kv_quant.rs, kv_turbo.rs).
    let bits_of = |a: &Array| a.to_vec_f32().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let mut cases = 0;
    for isa in isas() {
        for bits in [4, 8] {
            for (n, k, group, st) in [
                (130, 576, 32, Dtype::F16),
                (77, 1536, 64, Dtype::F32),
                (40, 2304, 128, Dtype::BF16),
                (33, 2080, 32, Dtype::F32),
            ] {
                let q = quantized(n, k, group, bits, st, (n * 3 + k + bits) as u64);
                let mm = |x: &Array| {
                    let y = fast_quantized_matmul_isa(x, &q.w, &q.scales, Some(&q.biases), group, bits, isa).unwrap();
                    assert_eq!(fast_qmm_isa_of(&y), Some(isa));
                    bits_of(&y)
                };
                let m = 37;
                let x = randn(&[m, k], (k + n) as u64);
                let all = mm(&x);
                let row_bits = |r: i32| all[(r * n) as usize..((r + 1) * n) as usize].to_vec();
                for r in [0, 5, 13, 14, 36] {
                    let alone = mm(&x.slice_axis(0, r, r + 1).unwrap());
                    assert_eq!(alone, row_bits(r), "{isa:?} bits={bits} K={k} group={group}: row {r} alone vs in M={m}");
                    cases += 1;
                }
                // M = 2: AVX-512's wide decode tiles at K <= 1024; M = 5: direct.
                for (from, to) in [(20, 22), (20, 25)] {
                    let few = mm(&x.slice_axis(0, from, to).unwrap());
                    for r in 0..to - from {
                        let got = few[(r * n) as usize..((r + 1) * n) as usize].to_vec();
                        let (row, rows) = (from + r, to - from);
                        assert_eq!(got, row_bits(row), "{isa:?} bits={bits} K={k}: row {row} in M={rows} vs M={m}");
                    }
                }
            }
        }
    }
    assert!(cases >= 2 * 4 * 5);
}

#[test]
fn gemm_tiles_read_strided_rows_like_dense_ones() {
    // GEMM sizes pack x into tiles: rows contiguous but not the whole array
    // (a column slice, vector packing through row pointers) and rows with a
    // stride between values (a transpose, the scalar packing) give the bits
    // of the same x made dense, on every variant, 4- and 8-bit weights.
    let bits_of = |a: &Array| a.to_vec_f32().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let (m, k, n, group) = (41, 576, 70, 32);
    let sliced = randn(&[m, k + 64], 21).slice_axis(1, 32, 32 + k).unwrap();
    let transposed = randn(&[k, m], 22).transpose(&[1, 0]).unwrap();
    for bits in [4, 8] {
        let q = quantized(n, k, group, bits, Dtype::F16, 23 + bits as u64);
        for isa in isas() {
            let mm = |x: &Array| {
                bits_of(&fast_quantized_matmul_isa(x, &q.w, &q.scales, Some(&q.biases), group, bits, isa).unwrap())
            };
            for (name, x) in [("column slice", &sliced), ("transpose", &transposed)] {
                assert_eq!(mm(x), mm(&x.contiguous().unwrap()), "{isa:?} bits={bits}: {name}");
            }
            assert!(compare(&sliced, &q, group, bits, isa) <= TOL, "{isa:?} bits={bits}");
        }
    }
}

#[test]
fn batch_dims_strided_x_and_half_inputs() {
    let (group, bits, k, n) = (32, 4, 96, 37);
    let q = quantized(n, k, group, bits, Dtype::F32, 11);
    // Leading batch dimensions.
    let x = randn(&[2, 3, k], 12);
    let fast = fast_quantized_matmul(&x, &q.w, &q.scales, Some(&q.biases), group, bits).unwrap();
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
        let fast = fast_quantized_matmul(&xh, &q.w, &s, Some(&b), group, bits).unwrap();
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
    let out = fast_quantized_matmul(&x, &w, &s, Some(&b), 32, 3).unwrap();
    assert_eq!(fast_qmm_isa_of(&out), None);
    let want = quantized_matmul(&x, &w, &s, &b, true, 32, 3).unwrap();
    assert_eq!(out.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());

    // Bad shapes and dtypes are MLX errors, never aborts.
    let (w, s, b) = quantize(&randn(&[8, 64], 23), 32, 4).unwrap();
    let bad_x = randn(&[2, 48], 24);
    assert!(fast_quantized_matmul(&bad_x, &w, &s, Some(&b), 32, 4).is_err());
    assert!(fast_quantized_matmul(&x, &w, &s, Some(&b), 64, 4).is_err());
    let float_w = w.astype(Dtype::F32).unwrap();
    assert!(fast_quantized_matmul(&x, &float_w, &s, Some(&b), 32, 4).is_err());
    let short_b = b.slice_axis(0, 0, 4).unwrap();
    assert!(fast_quantized_matmul(&x, &w, &s, Some(&short_b), 32, 4).is_err());
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
    let fast = fast_quantized_matmul(&x, &bad.w, &bad.scales, Some(&bad.biases), group, bits).unwrap();
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

// ---- int8 activations ----
//
// The int8 path is checked two ways. Exactly: against a scalar reference of
// the same arithmetic (same quantization of x, integer block sums, f64
// accumulation), within Q8_TOL of the sum of the absolute terms, for every
// instruction-set variant; the integer sums are exact, so only the f32
// scaling and accumulation differ (a wrong nibble, lane or block scale is off
// by ~1e-2 of that sum). Loosely: against MLX's f32 `quantized_matmul`,
// within the rounding of x (|x - d xq| <= d / 2 per value).

const Q8_TOL: f64 = 1e-6;

/// x quantized as the kernel does: per block of 32, d = max|x| / 127,
/// xq = round(x / d) (half away from zero).
fn quantize_x(x: &[f32]) -> (Vec<i32>, Vec<f32>) {
    let mut xq = Vec::with_capacity(x.len());
    let mut d = Vec::with_capacity(x.len() / 32);
    for block in x.chunks(32) {
        let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
        let db = amax / 127.0;
        let id = if db != 0.0 { 1.0 / db } else { 0.0 };
        xq.extend(block.iter().map(|v| (v * id).round() as i32));
        d.push(db);
    }
    (xq, d)
}

/// Unsigned weight values q[n][k] from MLX's packed layout.
fn weight_values(w: &Array, n: usize, k: usize, bits: i32) -> Vec<i32> {
    let bytes = w.to_bytes().unwrap();
    let row = k * bits as usize / 8;
    (0..n * k)
        .map(|i| {
            let (r, c) = (i / k, i % k);
            let b = bytes[r * row + c * bits as usize / 8] as i32;
            if bits == 8 { b } else if c % 2 == 0 { b & 15 } else { b >> 4 }
        })
        .collect()
}

/// The int8 arithmetic in f64 over exact integer sums: (result, sum of the
/// absolute values of its terms).
fn q8_reference(x: &Array, q: &Quantized, group: i32, bits: i32) -> (Vec<f64>, Vec<f64>) {
    let (n, k) = (q.w.dim(0) as usize, x.dim(-1) as usize);
    let xv = x.astype(Dtype::F32).unwrap().to_vec_f32().unwrap();
    let m = xv.len() / k;
    let wq = weight_values(&q.w, n, k, bits);
    let s = q.scales.astype(Dtype::F32).unwrap().to_vec_f32().unwrap();
    let b = q.biases.astype(Dtype::F32).unwrap().to_vec_f32().unwrap();
    let (g, nb) = (group as usize, k / 32);
    let (mut out, mut mag) = (vec![0f64; m * n], vec![0f64; m * n]);
    for mi in 0..m {
        let (xq, d) = quantize_x(&xv[mi * k..(mi + 1) * k]);
        for ni in 0..n {
            let (mut acc, mut abs) = (0f64, 0f64);
            for bi in 0..nb {
                let (mut dot, mut dot_abs, mut sum) = (0i64, 0i64, 0i64);
                for i in bi * 32..(bi + 1) * 32 {
                    let p = (wq[ni * k + i] * xq[i]) as i64;
                    dot += p;
                    dot_abs += p.abs();
                    sum += xq[i] as i64;
                }
                let gi = ni * (k / g) + bi * 32 / g;
                let (sw, bw, db) = (s[gi] as f64, b[gi] as f64, d[bi] as f64);
                acc += sw * db * dot as f64 + bw * db * sum as f64;
                abs += (sw * db).abs() * dot_abs as f64 + (bw * db * sum as f64).abs();
            }
            out[mi * n + ni] = acc;
            mag[mi * n + ni] = abs;
        }
    }
    (out, mag)
}

fn run_q8(x: &Array, q: &Quantized, group: i32, bits: i32, isa: QmmIsa) -> Array {
    let out = fast_quantized_matmul_with(x, &q.w, &q.scales, Some(&q.biases), group, bits, isa, true).unwrap();
    assert!(fast_qmm_is_int8(&out), "int8 path not taken");
    out
}

/// Worst |got - reference| / sum of |terms| over all outputs.
fn q8_error(got: &Array, want: &(Vec<f64>, Vec<f64>)) -> f64 {
    let g = got.astype(Dtype::F32).unwrap().to_vec_f32().unwrap();
    assert_eq!(g.len(), want.0.len());
    g.iter()
        .zip(want.0.iter().zip(&want.1))
        .map(|(g, (w, a))| if g.is_finite() { (*g as f64 - w).abs() / a.max(1e-30) } else { f64::INFINITY })
        .fold(0.0, f64::max)
}

#[test]
fn int8_matches_exact_reference_across_shapes_bits_groups_and_isas() {
    let scale_types = [Dtype::F32, Dtype::F16, Dtype::BF16];
    let (mut cases, mut worst) = (0, 0f64);
    for isa in isas() {
        for bits in [4, 8] {
            for group in [32, 64, 128] {
                // K = 3 groups of 32 leaves a single-block tail on AVX-512.
                for (i, n) in [1, 7, 130].into_iter().enumerate() {
                    let st = scale_types[i];
                    let k = group * (3 + i as i32);
                    let q = quantized(n, k, group, bits, st, (bits * 1000 + group + n + 7) as u64);
                    for m in [1, 2, 3, 4, 5, 8, 9, 17, 31, 70] {
                        let x = randn(&[m, k], (m * 17 + i as i32) as u64);
                        let err = q8_error(&run_q8(&x, &q, group, bits, isa), &q8_reference(&x, &q, group, bits));
                        worst = worst.max(err);
                        assert!(err <= Q8_TOL, "{isa:?} bits={bits} group={group} M={m} N={n} K={k} scales={st:?}: {err:e}");
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases >= 2 * 3 * 3 * 9);
    eprintln!("int8: worst error / sum|terms| over {cases} cases: {worst:e}");
}

#[test]
fn int8_matches_exact_reference_on_blocked_threaded_and_strided_shapes() {
    for isa in isas() {
        for bits in [4, 8] {
            // K = 2304 > kBlockK (k-blocks), M = 70 > kBlockM (m-blocks),
            // N = 1030 (threads, a partial tile).
            for (m, n, k, group) in [(70, 130, 2304, 64), (1, 1030, 2304, 128), (11, 1030, 576, 32)] {
                let q = quantized(n, k, group, bits, Dtype::F32, (m + n + k) as u64);
                let x = randn(&[m, k], 9);
                let err = q8_error(&run_q8(&x, &q, group, bits, isa), &q8_reference(&x, &q, group, bits));
                assert!(err <= Q8_TOL, "{isa:?} bits={bits} M={m} N={n} K={k}: {err:e}");
            }
        }
    }
    // A transposed x and batch dimensions give the same bits as dense rows.
    let (group, bits, k, n) = (32, 4, 96, 37);
    let q = quantized(n, k, group, bits, Dtype::F32, 41);
    let xt = randn(&[k, 5], 42).transpose(&[1, 0]).unwrap();
    let dense = xt.contiguous().unwrap();
    let a = run_q8(&xt, &q, group, bits, QmmIsa::best()).to_vec_f32().unwrap();
    let b = run_q8(&dense, &q, group, bits, QmmIsa::best()).to_vec_f32().unwrap();
    assert_eq!(a, b);
    let x3 = randn(&[2, 3, k], 43);
    let out = run_q8(&x3, &q, group, bits, QmmIsa::best());
    assert_eq!(out.shape(), vec![2, 3, n]);
    let flat = run_q8(&x3.reshape(&[6, k]).unwrap(), &q, group, bits, QmmIsa::best());
    assert_eq!(out.to_vec_f32().unwrap(), flat.to_vec_f32().unwrap());
}

#[test]
fn int8_is_within_the_rounding_of_x_of_mlx() {
    // |int8 - f32| <= sum_k |w_nk| * d(k) / 2 (each x moves by at most half a
    // step) plus f32 rounding; report how much of that bound is used.
    let (mut worst_bound, mut worst_rel) = (0f64, 0f64);
    for bits in [4, 8] {
        let (m, n, k, group) = (9, 130, 576, 32);
        let q = quantized(n, k, group, bits, Dtype::F32, 51 + bits as u64);
        let x = randn(&[m, k], 52);
        let got = fast_quantized_matmul_int8(&x, &q.w, &q.scales, Some(&q.biases), group, bits).unwrap();
        assert!(fast_qmm_is_int8(&got));
        let want = quantized_matmul(&x, &q.w, &q.scales, &q.biases, true, group, bits).unwrap();
        let (g, w) = (got.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
        let xv = x.to_vec_f32().unwrap();
        let dense = q.dense.to_vec_f32().unwrap();
        for mi in 0..m as usize {
            let (_, d) = quantize_x(&xv[mi * k as usize..(mi + 1) * k as usize]);
            for ni in 0..n as usize {
                let row = &dense[ni * k as usize..(ni + 1) * k as usize];
                let bound: f64 = row.iter().enumerate().map(|(i, w)| w.abs() as f64 * d[i / 32] as f64 / 2.0).sum();
                let abs: f64 = row.iter().zip(&xv[mi * k as usize..]).map(|(w, x)| (w * x).abs() as f64).sum();
                let err = (g[mi * n as usize + ni] - w[mi * n as usize + ni]).abs() as f64;
                assert!(err <= bound + 1e-5 * abs, "bits={bits} m={mi} n={ni}: {err} > {bound}");
                worst_bound = worst_bound.max(err / bound);
                worst_rel = worst_rel.max(err / abs);
            }
        }
    }
    eprintln!("int8 vs MLX f32: worst error / rounding bound {worst_bound:.3}, / sum|x||w| {worst_rel:e}");
}

#[test]
fn int8_tolerance_catches_a_wrong_weight() {
    let (group, bits, k, n) = (32, 4, 128, 16);
    let q = quantized(n, k, group, bits, Dtype::F32, 61);
    let x = randn(&[3, k], 62);
    let want = q8_reference(&x, &q, group, bits);
    let mut s = q.scales.to_vec_f32().unwrap();
    s[5] *= 1.01;
    let bad = Quantized {
        w: q.w.share(),
        scales: Array::from_f32(&s, &q.scales.shape()).unwrap(),
        biases: q.biases.share(),
        dense: q.dense.share(),
    };
    assert!(q8_error(&run_q8(&x, &bad, group, bits, QmmIsa::best()), &want) > 100.0 * Q8_TOL);
}

#[test]
fn int8_entry_point_keeps_the_f32_kernel_where_it_is_faster() {
    let x = |m: i32| randn(&[m, 64], 71);
    let max4 = INT8_MAX_ROWS_4BIT as i32;
    // Above max4 rows, 4-bit weights take int8 only where its GEMM exists;
    // 8-bit weights take it at every M.
    let gemm = int8_gemm_available();
    for (bits, m, int8) in [(4, 1, true), (4, max4, true), (4, max4 + 1, gemm), (8, 1, true), (8, 2, true), (8, 70, true)] {
        let q = quantized(8, 64, 32, bits, Dtype::F32, 72);
        let out = fast_quantized_matmul_int8(&x(m), &q.w, &q.scales, Some(&q.biases), 32, bits).unwrap();
        assert!(fast_qmm_isa_of(&out).is_some());
        assert_eq!(fast_qmm_is_int8(&out), int8, "bits={bits} M={m}");
    }
}

/// `x` against `q` packed by `pack_panels` (stored biases, or none: symmetric).
fn run_packed(x: &Array, q: &Quantized, group: i32, bits: i32, stored_biases: bool) -> Array {
    let biases = stored_biases.then_some(&q.biases);
    let (w, s, b) = pack_panels(&q.w, &q.scales, biases, bits).unwrap();
    fast_quantized_matmul_packed(x, &w, &s, b.as_ref(), group).unwrap()
}

#[test]
fn packed_panels_match_exact_reference_across_bits_shapes_groups_and_scales() {
    // The packed kernel where the CPU has it (AVX-512 VNNI), else the same
    // product on the unpacked layer: within Q8_TOL of the exact int8 sum
    // either way, and the int8 path's kernel.
    let usable = packable(32, 64, 32, 4);
    eprintln!("packed panels {}", if usable { "run" } else { "not available here: the fallback runs" });
    let scale_types = [Dtype::F32, Dtype::F16, Dtype::BF16];
    let mut cases = 0;
    for bits in [4, 8] {
        for group in [32, 64, 128] {
            // K = 3 groups, 576 (1,152 for groups of 128) and > kBlockK; N =
            // one panel, three, many.
            for (i, (n, k)) in [(32, group * 3), (96, group.max(64) * 9), (1056, 2304)].into_iter().enumerate() {
                let st = scale_types[i];
                for stored in [true, false] {
                    let seed = (bits * 1000 + group + n + stored as i32) as u64;
                    let q = if stored { quantized(n, k, group, bits, st, seed) } else { symmetric(n, k, group, bits, st, seed) };
                    for m in [1, 2, 3, 4, 5, 8, 9, 17, 31, 70] {
                        if n == 1056 && m > 9 {
                            continue; // the reference is slow; the small shapes cover M
                        }
                        let x = randn(&[m, k], (m * 13 + i as i32) as u64);
                        let got = run_packed(&x, &q, group, bits, stored);
                        let what = format!("bits={bits} group={group} N={n} K={k} M={m} scales={st:?} stored={stored}");
                        assert!(fast_qmm_is_int8(&got), "{what}: not the int8 path");
                        let err = q8_error(&got, &q8_reference(&x, &q, group, bits));
                        assert!(err <= Q8_TOL, "{what}: {err:e}");
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases >= 2 * 3 * 2 * (2 * 10 + 6));
}

#[test]
fn packed_panels_give_a_row_the_same_bits_in_any_batch() {
    // The packed tiles read 4-bit weights as nibbles below 32 rows of x and
    // unpacked to bytes from 32 rows on (unpack_tile4); both make the same
    // exact integer sums, so a row has the same bits alone, beside a few
    // others and inside a prefill-sized M (the engine's batch invariance).
    let bits_of = |a: &Array| a.to_vec_f32().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for bits in [4, 8] {
        for (n, k, group, st, stored) in
            [(96, 576, 32, Dtype::F16, true), (64, 1536, 64, Dtype::F32, false), (32, 2304, 128, Dtype::BF16, true)]
        {
            let q = if stored { quantized(n, k, group, bits, st, 91) } else { symmetric(n, k, group, bits, st, 92) };
            let m = 40;
            let x = randn(&[m, k], (k + n + bits) as u64);
            let all = bits_of(&run_packed(&x, &q, group, bits, stored));
            for (from, to) in [(0, 1), (7, 8), (39, 40), (20, 22), (20, 25)] {
                let few = bits_of(&run_packed(&x.slice_axis(0, from, to).unwrap(), &q, group, bits, stored));
                let want = &all[(from * n) as usize..(to * n) as usize];
                assert_eq!(few, want, "bits={bits} K={k} group={group}: rows {from}..{to} vs inside M={m}");
            }
        }
    }
}

#[test]
fn packed_layout_round_trips_and_rejects_partial_panels() {
    for bits in [4, 8] {
        let q = quantized(64, 96, 32, bits, Dtype::F16, 81);
        let (w, s, b) = pack_panels(&q.w, &q.scales, Some(&q.biases), bits).unwrap();
        assert_eq!((w.shape(), s.shape()), (vec![2, 3, bits, 32], vec![2, 3, 32]));
        let f32s = |a: &Array| a.astype(Dtype::F32).unwrap().to_vec_f32().unwrap();
        let (w2, s2, b2) = unpack_panels(&w, &s, b.as_ref()).unwrap();
        assert_eq!(f32s(&w2), f32s(&q.w));
        assert_eq!(f32s(&s2), f32s(&q.scales));
        assert_eq!(f32s(&b2.unwrap()), f32s(&q.biases));
        // 33 outputs are not whole panels; a 3-D weight is no layer.
        let odd = quantized(33, 96, 32, bits, Dtype::F32, 82);
        assert!(pack_panels(&odd.w, &odd.scales, None, bits).is_err());
        assert!(pack_panels(&w, &s, None, bits).is_err());
        assert!(pack_panels(&q.w, &q.scales, None, 3).is_err());
        // A wrong x width is an error, not a crash.
        let x = randn(&[2, 64], 83);
        assert!(fast_quantized_matmul_packed(&x, &w, &s, b.as_ref(), 32).and_then(|o| eval(&[&o])).is_err());
    }
    assert!(!packable(33, 96, 32, 4) && !packable(64, 96, 32, 8) && !packable(64, 100, 32, 4));
}

#[test]
fn packed_tolerance_catches_a_wrong_scale() {
    let (group, k, n) = (32, 128, 64);
    for bits in [4, 8] {
        let q = quantized(n, k, group, bits, Dtype::F32, 91);
        let x = randn(&[3, k], 92);
        let want = q8_reference(&x, &q, group, bits);
        let mut s = q.scales.to_vec_f32().unwrap();
        s[5 * (k / group) as usize + 2] *= 1.01;
        let bad = Quantized {
            w: q.w.share(),
            scales: Array::from_f32(&s, &q.scales.shape()).unwrap(),
            biases: q.biases.share(),
            dense: q.dense.share(),
        };
        assert!(q8_error(&run_packed(&x, &bad, group, bits, true), &want) > 100.0 * Q8_TOL);
    }
}

#[test]
fn packed_half_x_runs_on_an_f32_copy() {
    // bf16 x: the f32 result cast to MLX's output type for these inputs.
    let q = quantized(64, 96, 32, 4, Dtype::F16, 84);
    let x = randn(&[3, 96], 85).astype(Dtype::BF16).unwrap();
    let got = run_packed(&x, &q, 32, 4, true);
    let want_dtype = quantized_matmul(&x, &q.w, &q.scales, &q.biases, true, 32, 4).unwrap().dtype();
    assert_eq!(got.dtype(), want_dtype);
    let full = run_packed(&x.astype(Dtype::F32).unwrap(), &q, 32, 4, true).astype(want_dtype).unwrap();
    let f32s = |a: &Array| a.astype(Dtype::F32).unwrap().to_vec_f32().unwrap();
    assert_eq!(f32s(&got), f32s(&full));
}
