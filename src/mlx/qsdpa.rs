//! Attention over an affine-quantized KV cache: mlx-lm 0.32.2's
//! `quantized_scaled_dot_product_attention`, as one fused mlxrt primitive on
//! the CPU (AVX-512 / AVX2 / portable kernels, see qsdpa.cc) and as that
//! function's MLX-op composition everywhere else.
//!
//! Semantics (both paths): `q` is multiplied by `scale` first; query head
//! `i` reads KV head `i / (Hq / Hkv)`; a bool mask replaces masked scores by
//! `f32::MIN` (mlx-lm's `finfo.min`, never -inf, so a fully masked row stays
//! finite: it averages all values), any other mask dtype is added; causal
//! means query `i` of `L` sees keys `0..=T - L + i`; the softmax is f32.

use super::array::{Array, Dtype, MlxError, Result};
use super::ops::{fast::Mask, quantized_matmul};
use super::qmm::QmmIsa;
use super::qsdpa_sys::ffi;

/// `softmax(scale * q @ dequant(K).T + mask) @ dequant(V)` with
/// `q` `[B, Hq, L, D]`, `k`/`v` = (packed `w` uint32 `[B, Hkv, T, D * bits / 32]`,
/// `scales`, `biases` `[B, Hkv, T, D / group_size]`), `Hq` a multiple of `Hkv`;
/// returns `[B, Hq, L, Dv]`. `mask`: `None`, `Causal`, or an array
/// broadcastable to `[B, 1, L, T]` (bool, or additive).
///
/// On the CPU device, for f32 `q`, scales and biases, 4 or 8 bits and group
/// size 32, 64 or 128, this is mlxrt's fused kernel (keys and values read
/// packed, never dequantized to memory; the keys split over the thread
/// pool); otherwise it is [`quantized_sdpa_ops`]. Invalid input gives `Err`.
#[allow(clippy::too_many_arguments)]
pub fn quantized_sdpa(
    q: &Array,
    k: [&Array; 3],
    v: [&Array; 3],
    scale: f32,
    mask: Mask,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    quantized_sdpa_isa(q, k, v, scale, mask, group_size, bits, QmmIsa::Auto)
}

/// [`quantized_sdpa`] with an explicit kernel variant (tests and
/// benchmarks). Naming one the CPU cannot run is an error.
#[allow(clippy::too_many_arguments)]
pub fn quantized_sdpa_isa(
    q: &Array,
    k: [&Array; 3],
    v: [&Array; 3],
    scale: f32,
    mask: Mask,
    group_size: i32,
    bits: i32,
    isa: QmmIsa,
) -> Result<Array> {
    let (kind, m) = mask_code(&mask, q);
    let out = ffi::quantized_sdpa(
        q.raw(),
        k[0].raw(),
        k[1].raw(),
        k[2].raw(),
        v[0].raw(),
        v[1].raw(),
        v[2].raw(),
        scale,
        kind,
        m.raw(),
        group_size,
        bits,
        isa as u8,
    )?;
    if out.is_null() {
        return quantized_sdpa_ops(q, k, v, scale, mask, group_size, bits);
    }
    Ok(Array(out))
}

/// The bridges' `mask_kind` code of `mask` and the array they get as `mask`
/// (`q`, unread, when there is none).
pub(super) fn mask_code<'a>(mask: &Mask<'a>, q: &'a Array) -> (u8, &'a Array) {
    match mask {
        Mask::None => (0, q),
        Mask::Causal => (1, q),
        Mask::Array(m) => (2, m),
    }
}

/// [`quantized_sdpa`] as MLX ops, op for op mlx-lm's
/// `quantized_scaled_dot_product_attention` (two `quantized_matmul`s and a
/// precise softmax): the path off the CPU and under `Kernels::Stock`.
#[allow(clippy::too_many_arguments)]
pub fn quantized_sdpa_ops(
    q: &Array,
    k: [&Array; 3],
    v: [&Array; 3],
    scale: f32,
    mask: Mask,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    let &[b, hq, l, d] = &q.shape()[..] else {
        return Err(MlxError(format!("quantized_sdpa: queries must be 4-D, got {:?}", q.shape())));
    };
    if k[0].ndim() < 3 {
        return Err(MlxError("quantized_sdpa: keys must be [B, H, T, D/el]".into()));
    }
    let hkv = k[0].dim(-3);
    let rep = if hkv > 0 { hq / hkv } else { 0 };
    let mut q = q.multiply(&q.scalar_like(scale)?)?;
    let expand = |planes: [&Array; 3]| -> Result<Vec<Array>> {
        planes.iter().map(|a| if rep > 1 { a.expand_dims(-3) } else { Ok(a.share()) }).collect()
    };
    let (k, v) = (expand(k)?, expand(v)?);
    if rep > 1 {
        q = q.reshape(&[b, hkv, rep, l, d])?;
    }
    let mut scores = quantized_matmul(&q, &k[0], &k[1], &k[2], true, group_size, bits)?;
    let keep_where = |m: &Array, s: &Array| -> Result<Array> {
        Array::select(m, s, &s.scalar_like(finfo_min(s.dtype()))?)
    };
    match mask {
        Mask::None => {}
        Mask::Causal => {
            let (ql, kl) = (scores.dim(-2), scores.dim(-1));
            let qi = Array::arange(kl - ql, kl)?.reshape(&[ql, 1])?;
            let ki = Array::arange(0, kl)?.reshape(&[1, kl])?;
            scores = keep_where(&qi.greater_equal(&ki)?, &scores)?;
        }
        Mask::Array(m) => {
            let m = if rep > 1 && m.ndim() > 3 { m.expand_dims(-3)? } else { m.share() };
            scores = if m.dtype() == Dtype::Bool { keep_where(&m, &scores)? } else { scores.add(&m)? };
        }
    }
    let p = scores.softmax(-1, true)?;
    let out = quantized_matmul(&p, &v[0], &v[1], &v[2], false, group_size, bits)?;
    if rep > 1 {
        let dv = out.dim(-1);
        return out.reshape(&[b, hq, l, dv]);
    }
    Ok(out)
}

/// `mx.finfo(dtype).min` for the float dtypes attention runs in.
fn finfo_min(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::F16 => -65504.0,
        Dtype::BF16 => -3.389_531_4e38,
        _ => f32::MIN,
    }
}

/// The kernel variant that computes `a`, or `None` when `a` is not the
/// output of mlxrt's fused quantized attention.
pub fn qsdpa_isa_of(a: &Array) -> Option<QmmIsa> {
    QmmIsa::from_code(ffi::qsdpa_node_isa(a.raw())).filter(|i| *i != QmmIsa::Auto)
}
