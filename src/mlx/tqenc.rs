//! The TurboQuant KV encoder and the inverse value rotation as one MLX
//! primitive each on the CPU, where the MLX-op composition they replace
//! (`TurboCodec::encode` / `TurboCodec::unrotate`, src/cache/turbo.rs, which
//! owns the codec and its definition) takes some 60 and 2 graph nodes per
//! layer and step. They repeat MLX's CPU arithmetic operation for operation,
//! so their outputs have the same bits (see tqenc.cc; tested in
//! tqenc_tests.rs). `None` where they do not apply: the caller runs the ops.

use super::array::{ArrVec, Array, Result};
use super::tqenc_sys::ffi;

/// The TurboQuant codec's constants the primitives need.
pub struct TurboTables<'a> {
    pub key_bits: i32,
    pub value_bits: i32,
    /// `1 / sqrt(Dv)`, the Hadamard transform's scale.
    pub norm: f32,
    /// The value rotation's ±1 sign table (`Dv` entries).
    pub signs: &'a [f32],
    /// The `2^value_bits - 1` ascending codebook boundaries.
    pub boundaries: &'a [f32],
}

/// The five cache planes of keys `k` `[B, H, L, Dk]` and values `v` `[B, H,
/// L, Dv]` (f32): key indices, scales, zeros, value indices, scales, with
/// the dtypes and shapes of `TurboCodec::encode`. `None` off the CPU, for
/// other dtypes, or widths and head dims the codec refuses.
pub fn turbo_encode(k: &Array, v: &Array, t: &TurboTables) -> Result<Option<Vec<Array>>> {
    let p = ffi::turbo_encode(k.raw(), v.raw(), t.key_bits, t.value_bits, t.norm, t.signs, t.boundaries)?;
    if p.is_null() {
        return Ok(None);
    }
    Ok(Some(ArrVec(p).into_arrays()?))
}

/// `hadamard_transform(y, norm) * signs` along the last axis of `y` (f32):
/// the inverse value rotation. `None` where it does not apply.
pub fn turbo_unrotate(y: &Array, norm: f32, signs: &[f32]) -> Result<Option<Array>> {
    let p = ffi::turbo_unrotate(y.raw(), norm, signs)?;
    Ok((!p.is_null()).then(|| Array(p)))
}

/// Whether `a` is an output of one of these primitives.
pub fn is_tqenc_node(a: &Array) -> bool {
    ffi::is_tqenc_node(a.raw())
}
