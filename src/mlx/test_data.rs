//! Deterministic test data and checks shared by the kernel tests (qmm,
//! qsdpa, tqsdpa, fattn, and the TurboQuant codec's).

use super::fast::Mask;
use super::{Array, Dtype, QmmIsa};

/// Deterministic normal(0, 1) samples (splitmix64 + Box-Muller).
fn normal(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (next().max(1e-300), next());
            ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
        })
        .collect()
}

pub fn randn(shape: &[i32], seed: u64) -> Array {
    let n = shape.iter().map(|&d| d as usize).product();
    Array::from_f32(&normal(n, seed), shape).unwrap()
}

/// Largest |got - want| / bound over all outputs (inf if any is not finite).
pub fn worst_error(got: &Array, want: &Array, bound: &Array) -> f32 {
    assert_eq!(got.shape(), want.shape());
    let (g, w, b) = (got.to_vec_f32().unwrap(), want.to_vec_f32().unwrap(), bound.to_vec_f32().unwrap());
    g.iter()
        .zip(&w)
        .zip(&b)
        .map(|((g, w), b)| if g.is_finite() && w.is_finite() { (g - w).abs() / b.max(1e-30) } else { f32::INFINITY })
        .fold(0.0, f32::max)
}

/// Every kernel variant this CPU runs.
pub fn isas() -> Vec<QmmIsa> {
    [QmmIsa::Portable, QmmIsa::Avx2, QmmIsa::Avx512].into_iter().filter(|i| i.available()).collect()
}

/// `softmax(mask(scale * q @ keys.T)) @ x` with dense ops, query heads
/// grouped as `[B, H, rep, L, ·]`, a bool mask setting scores to `f32::MIN`
/// and any other mask added: with `x` the magnitudes of the summed terms,
/// the error bound of the attention kernel tests.
pub fn attention_bound(q: &Array, keys: &Array, x: &Array, scale: f32, mask: &Mask) -> Array {
    let s = q.shape();
    let (b, hq, l, d) = (s[0], s[1], s[2], s[3]);
    let (h, t) = (keys.dim(1), keys.dim(2));
    let rep = hq / h;
    let q5 = q.mul_scalar(scale).unwrap().reshape(&[b, h, rep, l, d]).unwrap();
    let mut scores = q5.matmul(&keys.expand_dims(2).unwrap().swapaxes(-1, -2).unwrap()).unwrap();
    let min = Array::scalar_f32(f32::MIN).unwrap();
    match mask {
        Mask::None => {}
        Mask::Causal => {
            let qi = Array::arange(t - l, t).unwrap().reshape(&[l, 1]).unwrap();
            let ki = Array::arange(0, t).unwrap().reshape(&[1, t]).unwrap();
            scores = Array::select(&qi.greater_equal(&ki).unwrap(), &scores, &min).unwrap();
        }
        Mask::Array(m) => {
            let m = m.expand_dims(2).unwrap();
            scores = if m.dtype() == Dtype::Bool { Array::select(&m, &scores, &min).unwrap() } else { scores.add(&m).unwrap() };
        }
    }
    let out = scores.softmax(-1, true).unwrap().matmul(&x.expand_dims(2).unwrap()).unwrap();
    let dv = out.dim(-1);
    out.reshape(&[b, hq, l, dv]).unwrap()
}
