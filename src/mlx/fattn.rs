//! Float scaled-dot-product attention: MLX's
//! `fast::scaled_dot_product_attention` as one fused mlxrt primitive on the
//! CPU (AVX-512 / AVX2 / portable kernels, see fattn.cc), MLX's own kernel
//! everywhere else.
//!
//! Semantics (both paths, MLX 0.32's): `q` is multiplied by `scale` first;
//! query head `i` reads KV head `i / (Hq / Hkv)`; causal means query `i` of
//! `L` sees keys `0..=T - L + i`; a bool mask replaces masked scores by
//! `f32::MIN` (so a fully masked row averages all values), any other float
//! mask is added; the softmax is f32. The fused kernel never builds the
//! score matrix or a causal/window mask: tiles wholly outside them are
//! skipped.

use super::array::{Array, MlxError, Result};
use super::fattn_sys::ffi;
use super::ops::fast::{self, Mask};
use super::qmm::QmmIsa;
use super::qsdpa::mask_code;

/// `softmax(scale * q @ k.T + mask) @ v` with `q` `[B, Hq, L, D]`, `k`
/// `[B, Hkv, T, D]`, `v` `[B, Hkv, T, Dv]`, `Hq` a multiple of `Hkv`;
/// returns `[B, Hq, L, Dv]`. `mask`: `None`, `Causal`, or an array
/// broadcastable to `[B, Hq, L, T]`. `window` (causal only): each query also
/// sees at most its last `window` keys, itself included (a sliding-window
/// layer's mask over keys in temporal order).
///
/// On the CPU device, for f32 queries, f32 or f16 keys and values (both the
/// same), head sizes a whole number of vectors and masks with one head, this
/// is mlxrt's fused kernel (f16 widened exactly on load); otherwise
/// it is [`sdpa_stock`]. Invalid input gives `Err`.
pub fn fused_sdpa(q: &Array, k: &Array, v: &Array, scale: f32, mask: Mask, window: Option<i32>) -> Result<Array> {
    fused_sdpa_isa(q, k, v, scale, mask, window, QmmIsa::Auto)
}

/// [`fused_sdpa`] with an explicit kernel variant (tests and benchmarks).
/// Naming one the CPU cannot run is an error.
pub fn fused_sdpa_isa(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: Mask,
    window: Option<i32>,
    isa: QmmIsa,
) -> Result<Array> {
    match float_sdpa(q, k, v, scale, &mask, window, isa, false)? {
        Some(o) => Ok(o),
        None => sdpa_stock(q, k, v, scale, mask, window),
    }
}

/// [`fused_sdpa`] with the heads side by side: `[B, L, Hq * Dv]`, the input
/// of the output projection (the fused kernel writes it so, with no
/// transpose node after it).
pub fn fused_sdpa_merged(q: &Array, k: &Array, v: &Array, scale: f32, mask: Mask, window: Option<i32>) -> Result<Array> {
    if let Some(o) = float_sdpa(q, k, v, scale, &mask, window, QmmIsa::Auto, true)? {
        return Ok(o);
    }
    merge_heads(&sdpa_stock(q, k, v, scale, mask, window)?)
}

/// `[B, H, L, D]` attention output as `[B, L, H * D]`.
pub fn merge_heads(o: &Array) -> Result<Array> {
    let s = o.shape();
    o.transpose(&[0, 2, 1, 3])?.reshape(&[s[0], s[2], s[1] * s[3]])
}

/// The fused kernel's node, None where it does not apply.
#[allow(clippy::too_many_arguments)]
fn float_sdpa(q: &Array, k: &Array, v: &Array, scale: f32, mask: &Mask, window: Option<i32>, isa: QmmIsa, merged: bool) -> Result<Option<Array>> {
    let (kind, m) = mask_code(mask, q);
    let w = match (mask, window) {
        (Mask::Causal, Some(w)) if w > 0 => w,
        (_, None) => 0,
        (_, Some(w)) => return Err(MlxError(format!("fused_sdpa: window {w} needs a causal mask"))),
    };
    let out = ffi::float_sdpa(q.raw(), k.raw(), v.raw(), scale, kind, m.raw(), w, isa as u8, merged)?;
    Ok((!out.is_null()).then(|| Array(out)))
}

/// MLX's own attention with the same arguments (the window as a bool mask):
/// the path off the CPU, for other dtypes, and under `Kernels::Stock`. Keys
/// and values of another dtype than `q` (a cache stored as f16) are cast to
/// `q`'s first.
pub fn sdpa_stock(q: &Array, k: &Array, v: &Array, scale: f32, mask: Mask, window: Option<i32>) -> Result<Array> {
    let (k, v) = (&k.astype(q.dtype())?, &v.astype(q.dtype())?);
    match (mask, window) {
        (Mask::Causal, Some(w)) => {
            let (l, t) = (q.dim(2), k.dim(2));
            let qi = Array::arange(t - l, t)?.reshape(&[l, 1])?;
            let ki = Array::arange(0, t)?.reshape(&[1, t])?;
            let near = ki.add(&Array::scalar_i32(w)?)?.greater(&qi)?;
            let m = qi.greater_equal(&ki)?.logical_and(&near)?;
            fast::scaled_dot_product_attention(q, k, v, scale, Mask::Array(&m))
        }
        (mask, None) => fast::scaled_dot_product_attention(q, k, v, scale, mask),
        (_, Some(w)) => Err(MlxError(format!("sdpa_stock: window {w} needs a causal mask"))),
    }
}

/// The kernel variant that computes `a`, or `None` when `a` is not the
/// output of mlxrt's fused float attention.
pub fn fattn_isa_of(a: &Array) -> Option<QmmIsa> {
    QmmIsa::from_code(ffi::fattn_node_isa(a.raw())).filter(|i| *i != QmmIsa::Auto)
}
