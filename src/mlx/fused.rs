//! RMSNorm and RoPE as one MLX primitive each on the CPU, where MLX composes
//! them from generic ops (some 7 and 20 graph nodes). The primitives repeat
//! MLX's CPU arithmetic operation for operation, so their outputs have the
//! same bits (see fused.cc; tested in fused_tests.rs); other devices and
//! dtypes get MLX's `fast::rms_norm` / `fast::rope`.

use super::array::{wrap, Array, Result};
use super::fused_sys::ffi;
use super::ops::fast;

fn optional(r: std::result::Result<cxx::UniquePtr<ffi::array>, cxx::Exception>) -> Result<Option<Array>> {
    let p = r?;
    Ok((!p.is_null()).then(|| Array(p)))
}

/// `fast::rms_norm(x, w, eps)`: mlxrt's primitive for f32 on the CPU.
pub fn fused_rms_norm(x: &Array, w: &Array, eps: f32) -> Result<Array> {
    match optional(ffi::fused_rms_norm(x.raw(), w.raw(), eps))? {
        Some(y) => Ok(y),
        None => fast::rms_norm(x, w, eps),
    }
}

/// The inverse frequencies MLX's RoPE uses for `dims` rotated features and
/// `base`, computed by MLX's own ops (lazy; evaluate once and keep).
pub fn rope_inv_freqs(dims: i32, base: f32) -> Result<Array> {
    wrap(ffi::rope_inv_freqs(dims, base))
}

/// The inverse of explicit RoPE frequencies `freqs` (`[dims / 2]`).
pub fn rope_inv_freqs_of(freqs: &Array) -> Result<Array> {
    wrap(ffi::rope_inv_freqs_of(freqs.raw()))
}

/// RoPE of `x` (`[B, ..., T, D]`) for positions `offset + t` (times
/// `scale`), given [`rope_inv_freqs`]: mlxrt's primitive for f32 on the CPU,
/// None where it does not apply (use `fast::rope` there).
pub fn fused_rope(x: &Array, dims: i32, traditional: bool, scale: f32, offset: i32, inv_freqs: &Array) -> Result<Option<Array>> {
    optional(ffi::fused_rope(x.raw(), dims, traditional, scale, offset, inv_freqs.raw()))
}

/// [`fused_rope`] with one start position per batch row (`offsets`: `[B]`).
pub fn fused_rope_at(
    x: &Array,
    dims: i32,
    traditional: bool,
    scale: f32,
    offsets: &Array,
    inv_freqs: &Array,
) -> Result<Option<Array>> {
    optional(ffi::fused_rope_at(x.raw(), dims, traditional, scale, offsets.raw(), inv_freqs.raw()))
}

/// Whether `a` is the output of mlxrt's RMSNorm or RoPE primitive.
pub fn is_fused_node(a: &Array) -> bool {
    ffi::is_fused_node(a.raw())
}
