//! Tests of the CPU SwiGLU primitive against MLX's own composition
//! `multiply(multiply(g, sigmoid(g)), u)`.
//!
//! Tolerance: none. The kernels repeat MLX's CPU arithmetic operation for
//! operation (swiglu_kernels.cc), so every output must have the same bits
//! (NaN compares as NaN), for every instruction set.

use super::*;

/// Deterministic 64-bit values (splitmix64).
fn splitmix(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Roughly normal values times `scale`.
fn normal(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut next = splitmix(seed);
    (0..n)
        .map(|_| {
            let s: f32 = (0..4).map(|_| (next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).sum();
            s * scale
        })
        .collect()
}

/// Gate values covering every exponent and both signs (bit patterns spread
/// over the whole f32 range), the edges of MLX's exp and special values.
fn hard_gates(n: usize) -> Vec<f32> {
    let mut next = splitmix(99);
    let mut v: Vec<f32> = (0..n as u64)
        .map(|i| f32::from_bits(((i * (1u64 << 32) / n as u64) as u32) ^ (next() as u32 & 0x7ff)))
        .collect();
    let edges = [
        0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 88.0, -88.0, 88.000_01, -88.000_01, 87.999_99, -87.999_99,
        f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MIN_POSITIVE, -f32::MIN_POSITIVE, 1e-45,
        -1e-45, f32::MAX, f32::MIN, 16_777_216.0, -16_777_216.0, 0.346_573_6, -0.346_573_6,
    ];
    v.extend(edges);
    // Values whose x = |g| * log2(e) sits at or next to a half-integer,
    // where floor(x + 0.5) is decided (MLX adds 0.5 in double).
    for k in -254..=254 {
        let g = (k as f32 * 0.5) / 1.442_695;
        let b = g.to_bits() as i64;
        v.extend((-16..=16).map(|d| f32::from_bits((b + d).max(0) as u32)));
    }
    v
}

fn reference(g: &Array, u: &Array) -> Array {
    g.multiply(&g.sigmoid().unwrap()).unwrap().multiply(u).unwrap()
}

fn isas() -> Vec<QmmIsa> {
    [QmmIsa::Portable, QmmIsa::Avx2, QmmIsa::Avx512].into_iter().filter(|i| i.available()).collect()
}

/// Index of the first output whose bits differ, if any.
fn first_difference(got: &Array, want: &Array) -> Option<(usize, f32, f32)> {
    assert_eq!(got.shape(), want.shape());
    let (g, w) = (got.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
    g.iter()
        .zip(&w)
        .enumerate()
        .find(|(_, (a, b))| !(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())))
        .map(|(i, (a, b))| (i, *a, *b))
}

#[test]
fn bit_identical_to_mlx_on_all_exponents_and_edges() {
    let gates = hard_gates(1 << 21);
    let n = gates.len();
    let mut ups = normal(n, 2.0, 5);
    ups[0] = f32::INFINITY;
    ups[1] = f32::NAN;
    let g = Array::from_f32(&gates, &[n as i32]).unwrap();
    let u = Array::from_f32(&ups, &[n as i32]).unwrap();
    let want = reference(&g, &u);
    for isa in isas() {
        let got = fast_swiglu_isa(&g, &u, isa).unwrap();
        assert_eq!(fast_swiglu_isa_of(&got), Some(isa), "fast path not taken");
        if let Some((i, a, b)) = first_difference(&got, &want) {
            panic!("{isa:?}: g={:e} u={:e}: {a:e} vs MLX {b:e}", gates[i], ups[i]);
        }
    }
}

#[test]
fn bit_identical_on_activation_like_values_and_every_tail_length() {
    for (scale, seed) in [(0.1, 1), (3.0, 2), (30.0, 3), (300.0, 4)] {
        let (g, u) = (normal(1 << 18, scale, seed), normal(1 << 18, 1.0, seed + 10));
        let (ga, ua) = (Array::from_f32(&g, &[512, 512]).unwrap(), Array::from_f32(&u, &[512, 512]).unwrap());
        let want = reference(&ga, &ua);
        for isa in isas() {
            assert_eq!(first_difference(&fast_swiglu_isa(&ga, &ua, isa).unwrap(), &want), None, "{isa:?}");
        }
    }
    // Every length up to two vectors and a bit (masked / scalar tails).
    for n in 1..40 {
        let (g, u) = (normal(n, 4.0, n as u64), normal(n, 1.0, 100 + n as u64));
        let (g, u) = (Array::from_f32(&g, &[n as i32]).unwrap(), Array::from_f32(&u, &[n as i32]).unwrap());
        let want = reference(&g, &u);
        for isa in isas() {
            assert_eq!(first_difference(&fast_swiglu_isa(&g, &u, isa).unwrap(), &want), None, "{isa:?} n={n}");
        }
    }
}

#[test]
fn packed_halves_and_strided_views() {
    // [2, 3, 2F]: gate and up are the two halves of the last axis.
    let f = 37;
    let gu = Array::from_f32(&normal(2 * 3 * 2 * f, 5.0, 7), &[2, 3, 2 * f as i32]).unwrap();
    let gate = gu.slice_axis(-1, 0, f as i32).unwrap();
    let up = gu.slice_axis(-1, f as i32, 2 * f as i32).unwrap();
    let want = reference(&gate, &up);
    for isa in isas() {
        let got = fast_swiglu_packed_isa(&gu, isa).unwrap();
        assert_eq!(fast_swiglu_isa_of(&got), Some(isa));
        assert_eq!(got.shape(), vec![2, 3, f as i32]);
        assert_eq!(first_difference(&got, &want), None, "{isa:?} packed");
        // The same halves as two strided (sliced) inputs.
        let got = fast_swiglu_isa(&gate, &up, isa).unwrap();
        assert_eq!(first_difference(&got, &want), None, "{isa:?} sliced");
    }
    // Prefill-sized packed rows ([600, 2 x 64]), split over the thread pool.
    let gu = Array::from_f32(&normal(600 * 128, 5.0, 12), &[600, 128]).unwrap();
    let want = reference(&gu.slice_axis(1, 0, 64).unwrap(), &gu.slice_axis(1, 64, 128).unwrap());
    for isa in isas() {
        assert_eq!(first_difference(&fast_swiglu_packed_isa(&gu, isa).unwrap(), &want), None, "{isa:?} 600 packed rows");
    }
    // A packed input that is itself a view (columns of a wider array) and
    // transposed inputs (last axis not contiguous).
    let wide = Array::from_f32(&normal(4 * 100, 5.0, 8), &[4, 100]).unwrap();
    let view = wide.slice_axis(1, 10, 10 + 2 * 30).unwrap();
    let want = reference(&view.slice_axis(1, 0, 30).unwrap(), &view.slice_axis(1, 30, 60).unwrap());
    assert_eq!(first_difference(&fast_swiglu_packed(&view).unwrap(), &want), None, "packed view");
    let gt = Array::from_f32(&normal(6 * 9, 5.0, 9), &[6, 9]).unwrap().transpose(&[1, 0]).unwrap();
    let ut = Array::from_f32(&normal(6 * 9, 1.0, 10), &[6, 9]).unwrap().transpose(&[1, 0]).unwrap();
    let got = fast_swiglu(&gt, &ut).unwrap();
    assert!(fast_swiglu_isa_of(&got).is_some());
    assert_eq!(first_difference(&got, &reference(&gt, &ut)), None, "transposed");
    let tt = Array::from_f32(&normal(6 * 10, 5.0, 11), &[6, 10]).unwrap().transpose(&[1, 0]).unwrap();
    assert_eq!(
        first_difference(&fast_swiglu_packed(&tt).unwrap(), &reference(&tt.slice_axis(1, 0, 3).unwrap(), &tt.slice_axis(1, 3, 6).unwrap())),
        None,
        "packed transposed"
    );
}

#[test]
fn other_dtypes_and_shapes_use_mlx_ops() {
    let g = Array::from_f32(&normal(8, 3.0, 12), &[2, 4]).unwrap();
    let u = Array::from_f32(&normal(8, 1.0, 13), &[2, 4]).unwrap();
    // f16: MLX's ops, same numbers.
    let (gh, uh) = (g.astype(Dtype::F16).unwrap(), u.astype(Dtype::F16).unwrap());
    let out = fast_swiglu(&gh, &uh).unwrap();
    assert_eq!(fast_swiglu_isa_of(&out), None);
    assert_eq!(out.dtype(), Dtype::F16);
    assert_eq!(out.to_bytes().unwrap(), reference(&gh, &uh).to_bytes().unwrap());
    let packed = Array::concatenate(&[&gh, &uh], 1).unwrap();
    let out = fast_swiglu_packed(&packed).unwrap();
    assert_eq!(fast_swiglu_isa_of(&out), None);
    assert_eq!(out.to_bytes().unwrap(), reference(&gh, &uh).to_bytes().unwrap());
    // Broadcasting shapes: MLX's ops.
    let row = u.slice_axis(0, 0, 1).unwrap();
    let out = fast_swiglu(&g, &row).unwrap();
    assert_eq!(fast_swiglu_isa_of(&out), None);
    assert_eq!(out.shape(), vec![2, 4]);
    assert_eq!(first_difference(&out, &reference(&g, &row)), None);
    // Errors are errors: an odd packed axis, shapes that do not broadcast.
    assert!(fast_swiglu_packed(&Array::from_f32(&[1.0, 2.0, 3.0], &[3]).unwrap()).is_err());
    assert!(fast_swiglu(&g, &Array::from_f32(&[1.0, 2.0, 3.0], &[3]).unwrap()).is_err());
}

/// Every f32 gate value (2^32 of them, u = 1.5), against MLX's ops: about
/// a minute per instruction set. `cargo test --release --lib -- --ignored
/// swiglu_exhaustive`.
#[test]
#[ignore]
fn swiglu_exhaustive_over_all_f32_gates() {
    const CHUNK: u64 = 1 << 24;
    let u = Array::from_f32(&[1.5], &[1]).unwrap().broadcast_to(&[CHUNK as i32]).unwrap();
    let u = Array::concatenate(&[&u], 0).unwrap();
    for start in (0..1u64 << 32).step_by(CHUNK as usize) {
        let bits: Vec<f32> = (start..start + CHUNK).map(|b| f32::from_bits(b as u32)).collect();
        let g = Array::from_f32(&bits, &[CHUNK as i32]).unwrap();
        let want = reference(&g, &u);
        for isa in isas() {
            if let Some((i, a, b)) = first_difference(&fast_swiglu_isa(&g, &u, isa).unwrap(), &want) {
                panic!("{isa:?}: g={:e}: {a:e} vs MLX {b:e}", bits[i]);
            }
        }
    }
}
