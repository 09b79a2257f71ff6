//! Attention over an affine-quantized KV cache: exactly mlx-lm 0.32.2's
//! `quantized_scaled_dot_product_attention` (models/base.py), written with
//! MLX ops. This is the one place quantized attention is computed; a fused
//! CPU kernel with the same semantics may replace its body.

use super::AttnMask;
use crate::error::Result;
use crate::mlx::{quantized_matmul, Array};

/// `softmax(scale·q·Kᵀ masked)·V` with K and V given as `[w, scales,
/// biases]` planes (`[B, kv_heads, T, ·]`, `mx.quantize` along the head
/// dimension). `queries` is `[B, heads, L, D]`; the result `[B, heads, L, Dv]`.
///
/// As mlx-lm: the scale multiplies the queries (not the scores); grouped
/// heads attend as `[B, kv_heads, repeats, L, D]`; a boolean mask sets the
/// scores it excludes to the smallest finite f32 (so a fully masked row, a
/// padding query, stays finite); the softmax is computed in full precision.
pub fn quantized_attention(
    queries: &Array,
    keys: &[Array; 3],
    values: &[Array; 3],
    scale: f32,
    mask: &AttnMask,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    let s = queries.shape();
    let (b, heads, l, d) = (s[0], s[1], s[2], s[3]);
    let kv_heads = keys[0].dim(-3);
    let repeats = heads / kv_heads;
    let mut q = queries.multiply(&queries.scalar_like(scale)?)?;
    let grouped = |p: &[Array; 3]| -> Result<[Array; 3]> {
        Ok([p[0].expand_dims(-3)?, p[1].expand_dims(-3)?, p[2].expand_dims(-3)?])
    };
    let (k, v) = if repeats > 1 {
        q = q.reshape(&[b, kv_heads, repeats, l, d])?;
        (grouped(keys)?, grouped(values)?)
    } else {
        (keys.each_ref().map(Array::share), values.each_ref().map(Array::share))
    };
    let mut scores = quantized_matmul(&q, &k[0], &k[1], &k[2], true, group_size, bits)?;
    let mask = match mask {
        AttnMask::None => None,
        AttnMask::Causal => {
            let sh = scores.shape();
            let (ql, kl) = (sh[sh.len() - 2], sh[sh.len() - 1]);
            let qi = Array::arange(kl - ql, kl)?.reshape(&[ql, 1])?;
            let ki = Array::arange(0, kl)?.reshape(&[1, kl])?;
            Some(qi.greater_equal(&ki)?)
        }
        AttnMask::Array(m) if repeats > 1 && m.ndim() > 3 => Some(m.expand_dims(-3)?),
        AttnMask::Array(m) => Some(m.share()),
    };
    if let Some(m) = mask {
        let min = scores.scalar_like(f32::MIN)?;
        scores = Array::select(&m, &scores, &min)?;
    }
    let p = scores.softmax(-1, true)?;
    let out = quantized_matmul(&p, &v[0], &v[1], &v[2], false, group_size, bits)?;
    Ok(if repeats > 1 { out.reshape(&[b, heads, l, -1])? } else { out })
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
            for mask in [AttnMask::None, AttnMask::Causal, AttnMask::Array(m)] {
                let got = quantized_attention(&q, &[kw.share(), ks.share(), kb.share()], &[vw.share(), vs.share(), vb.share()], 0.125, &mask, 64, bits).unwrap();
                let want = fast::scaled_dot_product_attention(&q, &kd, &vd, 0.125, mask.as_mask()).unwrap();
                assert_eq!(got.shape(), want.shape());
                let (g, w) = (got.to_vec_f32().unwrap(), want.to_vec_f32().unwrap());
                let err = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(err < 1e-4, "bits {bits}: max error {err}");
            }
        }
    }
}
