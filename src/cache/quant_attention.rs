//! Attention over an affine-quantized KV cache, with exactly the semantics
//! of mlx-lm 0.32.2's `quantized_scaled_dot_product_attention`
//! (models/base.py): the scale multiplies the queries (not the scores);
//! grouped heads attend as `[B, kv_heads, repeats, L, D]`; a boolean mask
//! sets the scores it excludes to the smallest finite f32 (so a fully masked
//! row, a padding query, stays finite); the softmax is in full precision.
//! `Kernels::Auto` runs mlxrt's fused CPU kernel (src/mlx/qsdpa.rs, which
//! itself falls back to MLX ops off the CPU); `Kernels::Stock` runs mlx-lm's
//! composition of MLX ops.

use super::AttnMask;
use crate::error::Result;
use crate::mlx::{quantized_sdpa, quantized_sdpa_ops, Array};
use crate::model::Kernels;

/// `softmax(scale·q·Kᵀ masked)·V` with K and V given as `[w, scales,
/// biases]` planes (`[B, kv_heads, T, ·]`, `mx.quantize` along the head
/// dimension). `queries` is `[B, heads, L, D]`; the result `[B, heads, L, Dv]`.
#[allow(clippy::too_many_arguments)]
pub fn quantized_attention(
    queries: &Array,
    keys: &[Array; 3],
    values: &[Array; 3],
    scale: f32,
    mask: &AttnMask,
    group_size: i32,
    bits: i32,
    kernels: Kernels,
) -> Result<Array> {
    let (k, v) = (keys.each_ref(), values.each_ref());
    let run = match kernels {
        Kernels::Auto | Kernels::Int8 => quantized_sdpa,
        Kernels::Stock => quantized_sdpa_ops,
    };
    Ok(run(queries, k, v, scale, mask.as_mask(), group_size, bits)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx::{dequantize, fast, quantize};

    /// Deterministic values in [-2, 2) (a linear congruential generator).
    fn noise(shape: &[i32], seed: u64) -> Array {
        let n: i32 = shape.iter().product();
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let v: Vec<f32> = (0..n)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect();
        Array::from_f32(&v, shape).unwrap()
    }

    /// Quantized attention equals float attention over the dequantized keys
    /// and values (the same math, up to f32 rounding), with grouped heads,
    /// causal and boolean masks.
    #[test]
    fn matches_sdpa_over_dequantized_kv() {
        let (b, heads, kvh, l, t, d) = (2, 6, 3, 4, 9, 64);
        let q = noise(&[b, heads, l, d], 1);
        let k = noise(&[b, kvh, t, d], 2);
        let v = noise(&[b, kvh, t, d], 3);
        for bits in [4, 8] {
            let (kw, ks, kb) = quantize(&k, 64, bits).unwrap();
            let (vw, vs, vb) = quantize(&v, 64, bits).unwrap();
            let kd = dequantize(&kw, &ks, &kb, 64, bits).unwrap();
            let vd = dequantize(&vw, &vs, &vb, 64, bits).unwrap();
            let keep: Vec<i32> = (0..b * l * t).map(|i| (i % 7 != 3) as i32).collect();
            let m = Array::from_i32(&keep, &[b, 1, l, t]).unwrap().astype(crate::mlx::Dtype::Bool).unwrap();
            let cases = [Kernels::Auto, Kernels::Stock]
                .map(|k| [(AttnMask::None, k), (AttnMask::Causal, k), (AttnMask::Array(m.share()), k)]);
            for (mask, kernels) in cases.into_iter().flatten() {
                let (kp, vp) = ([kw.share(), ks.share(), kb.share()], [vw.share(), vs.share(), vb.share()]);
                let got = quantized_attention(&q, &kp, &vp, 0.125, &mask, 64, bits, kernels).unwrap();
                let want = fast::scaled_dot_product_attention(&q, &kd, &vd, 0.125, mask.as_mask()).unwrap();
                assert_eq!(got.shape(), want.shape());
                let (g, w) = (got.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
                let err = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(err < 1e-4, "bits {bits}, {kernels:?}: max error {err}");
            }
        }
    }
}
